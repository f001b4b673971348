//! Wall-clock time as the store records it: milliseconds since the Unix
//! epoch (record timestamps, pack ages, lease expiries); and the name of
//! this machine, which records of who did what carry beside the time.

/// Milliseconds since the Unix epoch (0 on a clock set before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// This machine's host name (`unknown-host` if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}
