//! When a live export's writes become durable.
//!
//! - `flush` mode: FLUSH and FUA persist every acknowledged write (the
//!   head's plain flush); versions are taken after flushes and on a timer.
//! - `btrfs` mode (`--consistency btrfs`, or the volume's setting): the
//!   head defers persistence (see forkfs `volume/deferred.rs`) and the
//!   [`Detector`] watches the write stream. A FLUSH or FUA write that
//!   completes a safe point seals the head (durable on local disk when the
//!   reply goes out); other FLUSHes are acknowledged at once. A disk with no
//!   btrfs superblock gets flush semantics (FLUSH seals), logged once.
//!   [`clients`] notes which client (the connections of one peer process,
//!   or of one TCP host) wrote and read which blocks since the last seal. A
//!   connection that ends without NBD_CMD_DISC discards the writes its
//!   client made since then, and those of every client entangled with them
//!   (that wrote the same blocks, or read them), records the rollback, and
//!   fails those clients' connections (their caches assume the discarded
//!   writes); other clients keep their writes and their connections. A
//!   server stop rolls the whole head back and fails everyone. The last
//!   client's clean NBD_CMD_DISC persists what it wrote.
//! - `naive-timer` (tests only): the negative control of the chaos test;
//!   FLUSH persists nothing and a timer persists pending blocks one by one.

pub mod clients;

use crate::safepoint::{Detector, SafePoint};
use clients::{Client, Clients, Peer};
use forkfs::{BlockHead, Consistency, Store, WeakBlockHead};
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The environment variable that admits the test-only modes.
pub const UNSAFE_MODES_ENV: &str = "FORKFS_UNSAFE_TEST_MODES";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Flush,
    Btrfs,
    /// Persists on a timer regardless of safe points (tests only).
    NaiveTimer,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "naive-timer" if std::env::var_os(UNSAFE_MODES_ENV).is_some() => Ok(Mode::NaiveTimer),
            "naive-timer" => Err(format!(
                "naive-timer corrupts filesystems on purpose; it exists for tests (set {UNSAFE_MODES_ENV}=1)"
            )),
            _ => s.parse::<Consistency>().map(Mode::from).map_err(|e| e.to_string()),
        }
    }
}

impl From<Consistency> for Mode {
    fn from(c: Consistency) -> Mode {
        match c {
            Consistency::Flush => Mode::Flush,
            Consistency::Btrfs => Mode::Btrfs,
        }
    }
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// NBD_CMD_DISC.
    Clean,
    /// The connection dropped (or broke its framing).
    Lost,
    /// The server is shutting down.
    Stopped,
}

/// Safe-point metrics of one export.
#[derive(Default, Debug)]
pub struct Stats {
    pub safe_points: AtomicU64,
    pub sealed_bytes: AtomicU64,
    pub rollbacks: AtomicU64,
    pub discarded_bytes: AtomicU64,
    /// Seal to committed version, the last and the largest (ms).
    pub commit_latency_last_ms: AtomicU64,
    pub commit_latency_max_ms: AtomicU64,
}

pub struct Persistence {
    head: BlockHead,
    store: Store,
    naive: bool,
    detector: Mutex<Detector>,
    /// Seals run one at a time, in the order their safe points were seen.
    seal_lock: Mutex<()>,
    not_btrfs_logged: AtomicBool,
    /// The clients attached and what they touched since the last seal.
    clients: Mutex<Clients>,
    /// A seal failed after `clients` forgot the writes it was to seal:
    /// until a seal succeeds, a lost client rolls everyone back.
    untracked: AtomicBool,
    /// Held shared by every request while it runs, exclusively by a
    /// rollback: requests of the clients a rollback fails are either
    /// finished before it (their writes are discarded with the rest) or
    /// refused after it; none can write, or seal, half way through.
    ops: RwLock<()>,
    /// Writes received but not yet finished, by arrival number (all
    /// connections): a FLUSH seals only once every write that arrived
    /// before it has landed.
    arrivals: Mutex<(u64, std::collections::BTreeSet<u64>)>,
    landed: Condvar,
    connections: AtomicU64,
    /// When the oldest seal not yet in a committed version happened.
    uncommitted_since: Mutex<Option<Instant>>,
    /// Seals so far (counted under `uncommitted_since`'s lock): a version
    /// committed holds the seals counted before its checkpoint began.
    seals: AtomicU64,
    pub stats: Stats,
    stop: Arc<AtomicBool>,
}

impl Persistence {
    pub fn new(head: BlockHead, store: Store, mode: Mode) -> forkfs::Result<Arc<Persistence>> {
        head.set_deferred(mode != Mode::Flush)?;
        let detector = Detector::new(read_super(&head).as_deref());
        let p = Arc::new(Persistence {
            head,
            store,
            naive: mode == Mode::NaiveTimer,
            detector: Mutex::new(detector),
            seal_lock: Mutex::new(()),
            not_btrfs_logged: AtomicBool::new(false),
            clients: Mutex::new(Clients::default()),
            untracked: AtomicBool::new(false),
            ops: RwLock::new(()),
            arrivals: Mutex::new((0, std::collections::BTreeSet::new())),
            landed: Condvar::new(),
            connections: AtomicU64::new(0),
            uncommitted_since: Mutex::new(None),
            seals: AtomicU64::new(0),
            stats: Stats::default(),
            stop: Arc::new(AtomicBool::new(false)),
        });
        if mode != Mode::Flush {
            let d = p.detector.lock();
            tracing::info!(
                volume = %p.head.record().name,
                ?mode,
                btrfs = d.is_btrfs(),
                generation = d.last_generation(),
                "persisting at safe points"
            );
        }
        if p.naive {
            tracing::warn!(volume = %p.head.record().name, "naive-timer mode: FLUSH persists nothing (a test's negative control)");
            spawn_naive_timer(p.head.downgrade(), p.stop.clone());
        }
        Ok(p)
    }

    /// Whether persistence waits for safe points (the operator can switch
    /// a volume's mode while it is served).
    pub fn deferred(&self) -> bool {
        self.head.is_deferred()
    }

    /// A connection from `peer` attaches: the client it belongs to.
    pub fn attach(&self, peer: Peer) -> Client {
        self.connections.fetch_add(1, Ordering::SeqCst);
        self.clients.lock().attach(peer)
    }

    /// A request has been received (for a write, with its payload): its
    /// place in the order of arrivals across every connection. A write's
    /// arrival is outstanding until the returned value is dropped.
    pub fn arrive(self: &Arc<Self>, write: bool) -> Arrival {
        let mut a = self.arrivals.lock();
        a.0 += 1;
        let n = a.0;
        if write {
            a.1.insert(n);
        }
        Arrival { p: self.clone(), n, write }
    }

    /// Waits until every write that arrived before `flush` has finished.
    /// NBD promises a FLUSH covers the writes completed before it was
    /// sent; with several connections such a write may still be running
    /// here, and a seal without it would persist a superblock ahead of the
    /// blocks it names. Call without holding a request guard.
    pub fn wait_for_earlier_writes(&self, flush: &Arrival) -> forkfs::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut a = self.arrivals.lock();
        while a.1.first().is_some_and(|first| *first < flush.n) {
            if self.landed.wait_until(&mut a, deadline).timed_out() {
                return Err(forkfs::Error::new(
                    forkfs::ErrorKind::Unavailable,
                    "a FLUSH waited 30 s for earlier writes to finish",
                ));
            }
        }
        Ok(())
    }

    /// Admits one request of `client`: the guard keeps rollbacks out until
    /// the request is done. Fails the requests of a client that fell in a
    /// rollback.
    pub fn begin(&self, client: &Client) -> forkfs::Result<RwLockReadGuard<'_, ()>> {
        let guard = self.ops.read();
        if !client.failed() {
            return Ok(guard);
        }
        Err(forkfs::Error::new(
            forkfs::ErrorKind::Unavailable,
            "the disk was rolled back to its last safe point after a connection of this client (or of one whose writes it shares) was lost; re-attach and mount afresh",
        ))
    }

    /// Notes that an admitted request of `client` (inside [`Self::begin`]'s
    /// guard, before it touches the head) reads or writes `offset..+len`;
    /// the note lasts until the returned value is dropped (see
    /// [`clients`]). Nothing is noted unless persistence is deferred.
    pub fn touch(
        self: &Arc<Self>,
        client: &Client,
        write: bool,
        offset: u64,
        len: u64,
    ) -> Option<Touch> {
        if !self.deferred() || len == 0 {
            return None;
        }
        let bs = self.head.record().block_size as u64;
        let (first, end) = (offset / bs, offset.saturating_add(len).div_ceil(bs));
        let bytes = if write { len } else { 0 };
        let key = self.clients.lock().begin(client.id, write, first, end, bytes);
        Some(Touch { p: self.clone(), key })
    }

    /// After an acknowledged write or zeroing that touched `offset..+len`.
    pub fn after_write(
        &self,
        offset: u64,
        data: Option<&[u8]>,
        len: u64,
        fua: bool,
    ) -> forkfs::Result<()> {
        let sp = if crate::safepoint::touches_super(offset, len) {
            let mut d = self.detector.lock();
            match data {
                Some(data) => d.on_write(offset, data, fua),
                None => d.on_zero(offset, len, fua),
            }
        } else {
            None
        };
        if !self.deferred() {
            return if fua { self.head.flush() } else { Ok(()) };
        }
        if self.naive {
            return Ok(());
        }
        match sp {
            Some(sp) => self.seal(Some(sp)),
            None if fua && !self.is_btrfs() => self.seal(None),
            None => Ok(()),
        }
    }

    /// NBD_CMD_FLUSH.
    pub fn flush(&self) -> forkfs::Result<()> {
        let sp = {
            let mut d = self.detector.lock();
            let sp = d.on_flush();
            if sp.is_none() && d.is_btrfs() {
                tracing::trace!(volume = %self.head.record().name, state = ?d.invalid_reason(), "flush without a safe point");
            }
            sp
        };
        if !self.deferred() {
            return self.head.flush();
        }
        if self.naive {
            return Ok(());
        }
        match sp {
            Some(sp) => self.seal(Some(sp)),
            None if !self.is_btrfs() => self.seal(None),
            // Mid-transaction: acknowledged without persisting.
            None => Ok(()),
        }
    }

    fn is_btrfs(&self) -> bool {
        let yes = self.detector.lock().is_btrfs();
        if !yes && !self.not_btrfs_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(volume = %self.head.record().name, "no btrfs superblock on this disk: FLUSH persists everything (flush semantics) until one appears");
        }
        yes
    }

    fn seal(&self, sp: Option<SafePoint>) -> forkfs::Result<()> {
        let _one = self.seal_lock.lock();
        let at = Instant::now();
        // Before the seal moves anything: a write that finished is sealed.
        self.clients.lock().sealing();
        let st = match self.head.seal(sp.map(|s| s.generation)) {
            Ok(st) => st,
            Err(e) => {
                self.untracked.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        self.untracked.store(false, Ordering::SeqCst);
        self.stats.safe_points.fetch_add(1, Ordering::Relaxed);
        self.stats.sealed_bytes.fetch_add(st.bytes, Ordering::Relaxed);
        {
            let mut u = self.uncommitted_since.lock();
            u.get_or_insert(at);
            self.seals.fetch_add(1, Ordering::SeqCst);
        }
        tracing::debug!(
            volume = %self.head.record().name,
            generation = sp.map(|s| s.generation),
            tree_log = sp.is_some_and(|s| s.tree_log),
            bytes = st.bytes,
            sync_ms = at.elapsed().as_millis() as u64,
            "safe point"
        );
        Ok(())
    }

    /// Whether a seal happened since the last committed version.
    pub fn sealed_since_commit(&self) -> bool {
        self.uncommitted_since.lock().is_some()
    }

    /// Seals so far: read before a checkpoint begins, and given to
    /// [`Persistence::committed`] after it.
    pub fn seals(&self) -> u64 {
        self.seals.load(Ordering::SeqCst)
    }

    /// A version was committed of the head as it was after `seals` seals:
    /// what it contains is no longer only local. A seal since (during the
    /// checkpoint, which may not hold it) leaves the head uncommitted, so
    /// the next trigger takes a version of it.
    pub fn committed(&self, seals: u64) {
        let mut u = self.uncommitted_since.lock();
        if self.seals.load(Ordering::SeqCst) != seals {
            return;
        }
        if let Some(t) = u.take() {
            let ms = t.elapsed().as_millis() as u64;
            self.stats.commit_latency_last_ms.store(ms, Ordering::Relaxed);
            self.stats.commit_latency_max_ms.fetch_max(ms, Ordering::Relaxed);
        }
    }

    /// A connection of `client` ended.
    pub fn detach(&self, client: &Client, end: End) -> forkfs::Result<()> {
        let others = self.connections.fetch_sub(1, Ordering::SeqCst) - 1;
        self.clients.lock().detach(client);
        if !self.deferred() {
            return if end == End::Clean { self.head.flush() } else { Ok(()) };
        }
        match end {
            // The last client left on purpose: what it wrote stands (a
            // client that unmounted ended on a safe point anyway). Others
            // still attached keep writing.
            End::Clean => {
                if others > 0 || self.naive {
                    Ok(())
                } else {
                    self.seal(None)
                }
            }
            End::Lost if self.untracked.load(Ordering::SeqCst) => self.roll_back_all(
                "a connection ended without NBD_CMD_DISC after a failed seal (which client wrote what is not known)",
            ),
            End::Lost => self.roll_back_client(client),
            End::Stopped => self.roll_back_all("the server stopped while a client was attached"),
        }
    }

    /// Discards every write since the last safe point; every client falls.
    fn roll_back_all(&self, reason: &str) -> forkfs::Result<()> {
        let _all = self.ops.write();
        self.clients.lock().fall_all();
        let st = self.store.graph().roll_back(&self.head, reason)?;
        self.rolled_back(st, true);
        Ok(())
    }

    /// `client` lost a connection: it and the clients entangled with it
    /// fall (see [`clients`]); their writes since the last safe point are
    /// discarded, the others' kept.
    fn roll_back_client(&self, client: &Client) -> forkfs::Result<()> {
        // Every request of every connection in flight finishes first.
        let _all = self.ops.write();
        let fall = self.clients.lock().fall(client);
        if fall.blocks.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = fall.clients.iter().map(|p| p.to_string()).collect();
        let reason = format!(
            "a connection of client {} ended without NBD_CMD_DISC; discarded the writes of {}",
            client.peer,
            names.join(", ")
        );
        let st = if fall.others_wrote {
            let st = self.store.graph().roll_back_blocks(
                &self.head,
                &fall.blocks,
                fall.bytes,
                &reason,
            )?;
            tracing::info!(volume = %self.head.record().name, fell = ?names, "other clients keep their writes since the last safe point");
            st
        } else {
            // Nobody else wrote since the seal: the whole layer goes, as
            // exact as a discard can be.
            self.store.graph().roll_back(&self.head, &reason)?
        };
        let (at, len) = crate::safepoint::SUPER_RANGE;
        let bs = self.head.record().block_size as u64;
        let touches_super =
            fall.blocks.iter().any(|&(a, e)| a * bs < at + len && at < e.saturating_mul(bs));
        self.rolled_back(st, !fall.others_wrote || touches_super);
        Ok(())
    }

    /// Accounts for a rollback; with `reread`, the detector follows the
    /// disk back to its last safe point (it keeps its state when the
    /// superblock's blocks were not rolled back).
    fn rolled_back(&self, st: forkfs::LayerStats, reread: bool) {
        if reread {
            *self.detector.lock() = Detector::new(read_super(&self.head).as_deref());
        }
        if st.since_ms.is_some() {
            self.stats.rollbacks.fetch_add(1, Ordering::Relaxed);
            self.stats.discarded_bytes.fetch_add(st.bytes, Ordering::Relaxed);
        }
    }

    /// Logs the safe-point metrics (every checkpoint interval and at exit).
    pub fn report(&self, per: Duration, last: &Mutex<(Instant, u64)>) {
        if !self.deferred() {
            return;
        }
        let s = &self.stats;
        let points = s.safe_points.load(Ordering::Relaxed);
        let (since, before) = {
            let mut l = last.lock();
            let prev = *l;
            *l = (Instant::now(), points);
            prev
        };
        let minutes = since.elapsed().max(per).as_secs_f64() / 60.0;
        let sealed = s.sealed_bytes.load(Ordering::Relaxed);
        tracing::info!(
            volume = %self.head.record().name,
            safe_points_per_minute = format!("{:.1}", (points - before) as f64 / minutes),
            safe_points = points,
            bytes_per_safe_point = sealed.checked_div(points).unwrap_or(0),
            seal_to_commit_ms = s.commit_latency_last_ms.load(Ordering::Relaxed),
            seal_to_commit_max_ms = s.commit_latency_max_ms.load(Ordering::Relaxed),
            rollbacks = s.rollbacks.load(Ordering::Relaxed),
            discarded_bytes = s.discarded_bytes.load(Ordering::Relaxed),
            "safe points"
        );
    }
}

impl Drop for Persistence {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The primary superblock area as the head reads now (None if the disk is
/// too small or unreadable).
fn read_super(head: &BlockHead) -> Option<Vec<u8>> {
    let (at, len) = crate::safepoint::SUPER_RANGE;
    if head.size() < at + len {
        return None;
    }
    let mut buf = vec![0u8; len as usize];
    head.read_at(at, &mut buf).ok()?;
    Some(buf)
}

/// naive-timer: every 50 ms, persist pending blocks one at a time.
fn spawn_naive_timer(head: WeakBlockHead, stop: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new().name("forkfs-naive".into()).spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
            let Some(h) = head.upgrade() else { return };
            while !stop.load(Ordering::SeqCst) && h.persist_one_unsealed_block().unwrap_or(false) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });
}

/// An admitted request's note in [`Clients`] (see [`Persistence::touch`]).
pub struct Touch {
    p: Arc<Persistence>,
    key: u64,
}

impl Drop for Touch {
    fn drop(&mut self) {
        self.p.clients.lock().done(self.key);
    }
}

/// A received request's place in the arrival order (see
/// [`Persistence::arrive`]).
pub struct Arrival {
    p: Arc<Persistence>,
    n: u64,
    write: bool,
}

impl Drop for Arrival {
    fn drop(&mut self) {
        if self.write {
            self.p.arrivals.lock().1.remove(&self.n);
            self.p.landed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seal that lands while a checkpoint runs is not in its version:
    /// the head stays uncommitted after that checkpoint, so the next
    /// trigger versions it (a FLUSH during a running checkpoint starts
    /// none of its own). On a disk without btrfs every FLUSH seals.
    #[test]
    fn a_seal_during_a_checkpoint_leaves_the_head_uncommitted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path(), forkfs::StoreConfig::default()).unwrap();
        store.volumes().create("d", forkfs::VolumeKind::Block, Some(1 << 20), None).unwrap();
        let head = store.volumes().open_block("d").unwrap();
        let p = Persistence::new(head.clone(), store.clone(), Mode::Btrfs).unwrap();
        head.write_at(0, &[1u8; 4096]).unwrap();
        p.flush().unwrap();
        assert!(p.sealed_since_commit());
        // A checkpoint begins here; another write is sealed during it.
        let seen = p.seals();
        head.write_at(4096, &[2u8; 4096]).unwrap();
        p.flush().unwrap();
        p.committed(seen);
        assert!(p.sealed_since_commit(), "the seal during the checkpoint was taken as committed");
        p.committed(p.seals());
        assert!(!p.sealed_since_commit());
    }
}
