//! Settings of one process and the parsers they share. The core never reads
//! the environment: the binaries fill [`Settings`] (from flags and
//! `FORKFS_*` variables, [`Settings::from_env`]) and pass it when they open
//! a store. Sizes are binary everywhere (`8G` = 8 GiB, as on the command
//! line); an environment variable that does not parse is ignored with a
//! warning.

use crate::error::{Error, Result};
use std::time::Duration;

/// How this process uses a store: overrides of the store's own settings
/// and tuning that belongs to the host, not to the shared store. `None`
/// everywhere means the store's configuration and the built-in defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Bytes a sequential read of a remote pack fetches ahead (0: off;
    /// `None`: [`DEFAULT_READAHEAD`]). `FORKFS_READAHEAD`.
    pub readahead: Option<u64>,
    /// How long a read may wait for the object store before it fails
    /// (0: no deadline; `None`: the store's). `FORKFS_READ_DEADLINE`.
    pub read_deadline: Option<Duration>,
    /// Bytes that may wait for upload before writers wait (`None`: the
    /// store's). `FORKFS_PENDING_LIMIT`.
    pub pending_limit: Option<u64>,
    /// The term of the volume leases this process takes on a remote store
    /// (`None`: [`DEFAULT_LEASE_TTL`]). `FORKFS_LEASE_TTL`.
    pub lease_ttl: Option<Duration>,
    /// Skip the data log's fdatasync: loses acknowledged writes on power
    /// loss, on purpose. Only the power-cut test's negative control sets
    /// it (`FORKFS_TEST_SKIP_LOG_SYNC=1`).
    #[doc(hidden)]
    pub test_skip_log_sync: bool,
    /// On a shared store, how long a host may go without acknowledging
    /// GC tombstones before GC takes it for gone and deletes what it
    /// retired without it (`None`: [`DEFAULT_GC_HOST_TIMEOUT`]).
    /// `FORKFS_GC_HOST_TIMEOUT`.
    pub gc_host_timeout: Option<Duration>,
    /// GC deletes retired packs at once even on a shared store, as before
    /// tombstones: loses other hosts' data, on purpose. Only the negative
    /// control of the multi-host GC test sets it, and only together with
    /// `FORKFS_TEST_UNSAFE=1` (`FORKFS_TEST_GC_UNSAFE_IMMEDIATE_DELETE=1`).
    #[doc(hidden)]
    pub test_gc_unsafe_immediate_delete: bool,
    /// Bytes of decompressed, verified chunks this process keeps in memory
    /// (`None`: the store's `cache_bytes`, whose 0 means [`auto_cache`]).
    /// `FORKFS_MEMORY_CACHE`.
    pub memory_cache: Option<u64>,
}

pub const DEFAULT_READAHEAD: u64 = 2 << 20;
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
pub const DEFAULT_GC_HOST_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Settings {
    /// The settings the `FORKFS_*` environment variables give.
    pub fn from_env() -> Settings {
        Settings {
            readahead: env("FORKFS_READAHEAD", parse_size),
            read_deadline: env("FORKFS_READ_DEADLINE", humantime::parse_duration),
            pending_limit: env("FORKFS_PENDING_LIMIT", parse_size),
            lease_ttl: env("FORKFS_LEASE_TTL", humantime::parse_duration),
            test_skip_log_sync: std::env::var("FORKFS_TEST_SKIP_LOG_SYNC").is_ok_and(|v| v == "1"),
            gc_host_timeout: env("FORKFS_GC_HOST_TIMEOUT", humantime::parse_duration),
            test_gc_unsafe_immediate_delete: std::env::var("FORKFS_TEST_UNSAFE")
                .is_ok_and(|v| v == "1")
                && std::env::var("FORKFS_TEST_GC_UNSAFE_IMMEDIATE_DELETE").is_ok_and(|v| v == "1"),
            memory_cache: env("FORKFS_MEMORY_CACHE", parse_size),
        }
    }

    /// The memory cache of chunks for a store configured with
    /// `cache_bytes` (0: sized by this host's memory).
    pub fn memory_cache(&self, cache_bytes: u64) -> u64 {
        match (self.memory_cache, cache_bytes) {
            (Some(n), _) => n,
            (None, 0) => auto_cache(),
            (None, n) => n,
        }
    }

    pub fn readahead(&self) -> u64 {
        self.readahead.unwrap_or(DEFAULT_READAHEAD)
    }

    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL)
    }

    pub fn gc_host_timeout(&self) -> Duration {
        self.gc_host_timeout.unwrap_or(DEFAULT_GC_HOST_TIMEOUT)
    }
}

/// The memory cache of a store that leaves it to the host: 1/16 of the
/// machine's memory, from 256 MiB to 4 GiB (1.5 GiB on 24 GiB). Hits skip
/// the pack read, decompression and hash check a miss pays.
pub fn auto_cache() -> u64 {
    const MIN: u64 = 256 << 20;
    const MAX: u64 = 4 << 30;
    // SAFETY: sysinfo fills the struct it is given and touches nothing else.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return MIN;
    }
    let total = (si.totalram as u64).saturating_mul(u64::from(si.mem_unit).max(1));
    (total.min(cgroup_memory_max().unwrap_or(u64::MAX)) / 16).clamp(MIN, MAX)
}

/// The memory limit of this process's cgroup (v2 `memory.max`, v1
/// `memory.limit_in_bytes`), if it has one: in a container it, not the
/// machine, is what the process may use.
fn cgroup_memory_max() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut limits = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        match controllers {
            "" => limits.push(format!("/sys/fs/cgroup/{path}/memory.max")),
            c if c.split(',').any(|c| c == "memory") => {
                limits.push(format!("/sys/fs/cgroup/memory/{path}/memory.limit_in_bytes"))
            }
            _ => {}
        }
    }
    limits.iter().filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse().ok()).min()
}

/// Parses sizes like `64G`, `512MiB`, `1T`, `4096` (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| Error::invalid(format!("bad size {s:?}: {e}")))
}

/// The value of environment variable `name` if `parse` accepts it; one it
/// does not accept is ignored, with a warning.
fn env<T, E: std::fmt::Display>(
    name: &str,
    parse: impl Fn(&str) -> std::result::Result<T, E>,
) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    match parse(&raw) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e, "{name} is not valid; ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_are_binary_and_bad_ones_are_invalid() {
        assert_eq!(super::parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(super::parse_size("4096").unwrap(), 4096);
        let e = super::parse_size("12zz").unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_memory_cache_is_the_settings_then_the_stores_then_sized_by_memory() {
        use super::{Settings, auto_cache};
        let none = Settings::default();
        assert_eq!(none.memory_cache(64 << 20), 64 << 20);
        let set = Settings { memory_cache: Some(1 << 30), ..Default::default() };
        assert_eq!(set.memory_cache(64 << 20), 1 << 30);
        assert_eq!(set.memory_cache(0), 1 << 30);
        let auto = none.memory_cache(0);
        assert_eq!(auto, auto_cache());
        assert!((256 << 20..=4 << 30).contains(&auto), "{auto}");
    }
}
