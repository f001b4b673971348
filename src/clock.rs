//! Wall-clock time as the store records it: milliseconds since the Unix
//! epoch (record timestamps, pack ages, lease expiries).

/// Milliseconds since the Unix epoch (0 on a clock set before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
