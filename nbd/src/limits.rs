//! What one server lets its clients hold: the largest request, the memory
//! of requests and replies in flight (per connection and for the whole
//! server), and how long a connection may sit in its handshake or idle.
//!
//! Memory is charged when a request is admitted (before its payload is
//! read) and released when its reply has been written to the socket, not
//! when the reply is queued: a client that does not read its replies stops
//! being read itself once its budget is taken (back-pressure), instead of
//! growing the server.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// The smallest allowed `--max-request` (and the most one can ask for).
pub const MIN_MAX_REQUEST: u32 = 1 << 20;
pub const MAX_MAX_REQUEST: u32 = 1 << 30;
/// The most request threads a connection may have.
pub const MAX_THREADS: usize = 256;
/// Request threads per connection on a local store unless `--threads`
/// says otherwise: 16 measured the same as 4 there (docs/BENCHMARKS.md,
/// "Threads"), and 8 is between.
pub const LOCAL_THREADS: usize = 8;
/// The same on a store in a bucket, where a cold read waits on a GET,
/// one per thread: fio's random 64 KiB cold reads at a queue depth of 16
/// went from 707-784 IOPS with 8 to 850-1,277 with 16 (docs/BENCHMARKS.md,
/// "Cold reads against s3s-fs").
pub const REMOTE_THREADS: usize = 16;

/// The request threads a connection gets: `--threads` if given, else
/// the default for the store's kind.
pub fn default_threads(given: Option<usize>, remote: bool) -> usize {
    given.unwrap_or(if remote { REMOTE_THREADS } else { LOCAL_THREADS })
}
/// Charged for every request on top of its data: the task, the reply
/// header and chunks, so that many tiny requests are bounded too.
pub const REQUEST_OVERHEAD: u32 = 4096;
/// Charged for a BLOCK_STATUS reply (up to 4096 descriptors per context).
pub const STATUS_REPLY: u32 = 64 << 10;

#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest READ or WRITE payload (advertised in NBD_INFO_BLOCK_SIZE).
    pub max_request: u32,
    /// Bytes of requests and replies in flight on one connection.
    pub connection_memory: u32,
    /// The same over every connection of the server.
    pub memory: Arc<Semaphore>,
    pub memory_total: u32,
    /// From accept to the end of the handshake.
    pub handshake_timeout: Duration,
    /// A connection with nothing in flight that sends no request for this
    /// long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Connections at once (handshaking or attached); more are refused.
    pub max_connections: usize,
    /// Request threads per connection (`session/workers.rs`).
    pub threads: usize,
}

impl Limits {
    /// Checks the flags' values against each other; the message names the flag.
    pub fn new(
        max_request: u64,
        connection_memory: u64,
        memory: u64,
        handshake_timeout: Duration,
        idle_timeout: Duration,
        max_connections: usize,
        threads: usize,
    ) -> Result<Limits, String> {
        if !(u64::from(MIN_MAX_REQUEST)..=u64::from(MAX_MAX_REQUEST)).contains(&max_request) {
            return Err(format!(
                "--max-request must be between {} and {} MiB",
                MIN_MAX_REQUEST >> 20,
                MAX_MAX_REQUEST >> 20
            ));
        }
        let one = max_request + u64::from(REQUEST_OVERHEAD);
        if connection_memory < one || connection_memory > u64::from(u32::MAX) {
            return Err(format!(
                "--connection-memory must hold one largest request ({one} bytes) and be under 4 GiB"
            ));
        }
        if memory < connection_memory || memory > u64::from(u32::MAX) {
            return Err("--memory must be at least --connection-memory and under 4 GiB".into());
        }
        if handshake_timeout.is_zero() {
            return Err("--handshake-timeout must be above zero".into());
        }
        if max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if !(1..=MAX_THREADS).contains(&threads) {
            return Err(format!("--threads must be between 1 and {MAX_THREADS}"));
        }
        Ok(Limits {
            max_request: max_request as u32,
            connection_memory: connection_memory as u32,
            memory: Arc::new(Semaphore::new(memory as usize)),
            memory_total: memory as u32,
            handshake_timeout,
            idle_timeout: (!idle_timeout.is_zero()).then_some(idle_timeout),
            max_connections,
            threads,
        })
    }

    /// A new connection's budget.
    pub fn budget(&self) -> Budget {
        Budget {
            conn: Arc::new(Semaphore::new(self.connection_memory as usize)),
            conn_total: self.connection_memory,
            global: self.memory.clone(),
            global_total: self.memory_total,
        }
    }
}

/// One connection's share of reply memory, and the server's.
pub struct Budget {
    conn: Arc<Semaphore>,
    conn_total: u32,
    global: Arc<Semaphore>,
    global_total: u32,
}

/// Bytes held until the reply they pay for has been written (or dropped).
#[derive(Debug)]
pub struct Charge {
    _conn: OwnedSemaphorePermit,
    _global: OwnedSemaphorePermit,
}

impl Budget {
    /// Waits until `bytes` are free in both budgets.
    pub async fn charge(&self, bytes: u32) -> Charge {
        let conn = bytes.min(self.conn_total);
        let global = bytes.min(self.global_total);
        // Neither semaphore is ever closed.
        let c = self.conn.clone().acquire_many_owned(conn).await.expect("never closed");
        let g = self.global.clone().acquire_many_owned(global).await.expect("never closed");
        Charge { _conn: c, _global: g }
    }

    /// `bytes` if they are free in both budgets now.
    pub fn try_charge(&self, bytes: u32) -> Option<Charge> {
        let (conn, global) = (bytes.min(self.conn_total), bytes.min(self.global_total));
        let c = self.conn.clone().try_acquire_many_owned(conn).ok()?;
        let g = self.global.clone().try_acquire_many_owned(global).ok()?;
        Some(Charge { _conn: c, _global: g })
    }

    /// As [`Budget::charge`], from a thread outside `rt`; `None` once
    /// `stop` is set.
    pub fn charge_blocking(
        &self,
        bytes: u32,
        stop: &watch::Receiver<bool>,
        rt: &tokio::runtime::Handle,
    ) -> Option<Charge> {
        if let Some(c) = self.try_charge(bytes) {
            return Some(c);
        }
        let mut stop = stop.clone();
        rt.block_on(async {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => None,
                c = self.charge(bytes) => Some(c),
            }
        })
    }

    /// Whether nothing of this connection is in flight or unsent.
    pub fn idle(&self) -> bool {
        self.conn.available_permits() == self.conn_total as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(conn: u64, all: u64) -> Limits {
        Limits::new(1 << 20, conn, all, Duration::from_secs(1), Duration::ZERO, 1, 8).unwrap()
    }

    #[tokio::test]
    async fn a_charge_is_held_until_dropped_and_waits_when_the_budget_is_taken() {
        let l = limits(3 << 20, 4 << 20);
        let (a, b) = (l.budget(), l.budget());
        let held = a.charge(3 << 20).await;
        assert!(!a.idle());
        // The connection budget is full: a second charge waits.
        let wait = tokio::time::timeout(Duration::from_millis(50), a.charge(1));
        assert!(wait.await.is_err());
        // The other connection is bounded by what is left globally.
        let _b1 = b.charge(1 << 20).await;
        let wait = tokio::time::timeout(Duration::from_millis(50), b.charge(1));
        assert!(wait.await.is_err());
        drop(held);
        assert!(a.idle());
        let _again = tokio::time::timeout(Duration::from_secs(5), a.charge(2 << 20)).await.unwrap();
    }

    #[test]
    fn flags_that_cannot_work_together_are_refused_by_name() {
        let l = |req, conn, all| {
            Limits::new(req, conn, all, Duration::from_secs(1), Duration::ZERO, 8, 8).err()
        };
        assert!(l(512 << 10, 8 << 20, 8 << 20).unwrap().contains("--max-request"));
        assert!(l(8 << 20, 8 << 20, 64 << 20).unwrap().contains("--connection-memory"));
        assert!(l(8 << 20, 16 << 20, 8 << 20).unwrap().contains("--memory"));
        assert!(l(8 << 20, 16 << 20, 64 << 20).is_none());
        let threads = |n| {
            Limits::new(8 << 20, 16 << 20, 64 << 20, Duration::from_secs(1), Duration::ZERO, 8, n)
                .err()
        };
        assert!(threads(0).unwrap().contains("--threads"));
        assert!(threads(MAX_THREADS + 1).unwrap().contains("--threads"));
        assert!(threads(MAX_THREADS).is_none());
    }

    #[test]
    fn a_store_in_a_bucket_gets_more_request_threads_unless_told() {
        assert_eq!(default_threads(None, false), LOCAL_THREADS);
        assert_eq!(default_threads(None, true), REMOTE_THREADS);
        assert_eq!(default_threads(Some(3), true), 3);
        assert_eq!(default_threads(Some(3), false), 3);
    }
}
