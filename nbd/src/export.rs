//! An export: what a client attaches to. `VOL` is a block volume's live head
//! (read-write); `VOL@VERSION` is one of its versions (read-only). All I/O
//! is blocking core calls; sessions run them on tokio's blocking pool.
//! Core errors become NBD errnos in exactly one place, [`errno`], and
//! option-reply errors (an export that cannot be opened) in one, [`refusal`].

use crate::changed::{ChangedCache, Ranges};
use crate::persist::clients::{Client, Peer};
use crate::persist::{End, Mode, Persistence, Touch};
use crate::proto::{CmdFlags, Command, Errno, OptionReplyType, Request};
use forkfs::{
    BlockHead, ErrorKind, Opened, SnapshotOptions, Store, Target, VersionRecord, VolumeKind,
};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The one mapping from core error kinds to NBD errnos.
pub fn errno(e: &forkfs::Error) -> Errno {
    match e.kind() {
        ErrorKind::InvalidInput => Errno::Inval,
        ErrorKind::NoSpace => Errno::NoSpc,
        ErrorKind::ReadOnly => Errno::Perm,
        ErrorKind::NotFound | ErrorKind::Corrupt | ErrorKind::Unavailable | ErrorKind::Conflict => {
            Errno::Io
        }
    }
}

/// The one mapping from core error kinds to the option reply that refuses
/// an export during negotiation: a missing export is unknown, a malformed
/// name invalid, one another writer holds (or that is read-only where
/// writing was asked) refused by policy; any other failure (storage
/// unavailable or damaged) is the spec's "export not available". The
/// message says which.
pub fn refusal(e: &forkfs::Error) -> OptionReplyType {
    match e.kind() {
        ErrorKind::NotFound => OptionReplyType::ErrUnknown,
        ErrorKind::InvalidInput => OptionReplyType::ErrInvalid,
        ErrorKind::Conflict | ErrorKind::ReadOnly => OptionReplyType::ErrPolicy,
        ErrorKind::Unavailable | ErrorKind::Corrupt | ErrorKind::NoSpace => {
            OptionReplyType::ErrUnknown
        }
    }
}

/// Per-export counters, logged when sessions end and at shutdown.
#[derive(Default, Debug)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub flushes: AtomicU64,
    pub zeroes: AtomicU64,
    pub errors: AtomicU64,
    pub checkpoints: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

pub struct Export {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub block_size: u32,
    pub read_only: bool,
    store: Store,
    /// What the export names (the head, or the version).
    target: Target,
    backing: Opened<BlockHead>,
    pub counters: Counters,
    /// Request latencies, by kind (`--metrics`).
    pub latency: crate::metrics::Latency,
    /// When the version graph last advanced (flush mode checkpoints).
    last_checkpoint: Mutex<Instant>,
    /// Held while a checkpoint runs: a trigger that need not wait for it
    /// (a FLUSH, the timer) skips it instead of queueing behind it.
    checkpointing: Mutex<()>,
    /// Live exports: when writes become durable.
    persist: Option<Arc<Persistence>>,
    /// The last metrics report: when, and the safe point count then.
    reported: Mutex<(Instant, u64)>,
    /// This export in the changed-since cache.
    key: u64,
    /// Bumped after every change to the head's content (writes, zeroes,
    /// flushes and disconnects, which may roll back): a cached diff is
    /// valid for the count it was computed at.
    changes: AtomicU64,
    changed: Arc<ChangedCache>,
}

impl Export {
    /// Opens what `target` names; `mode` gives a live volume's consistency.
    pub fn open(
        store: &Store,
        name: &str,
        target: Target,
        mode: impl FnOnce(&forkfs::VolumeRecord) -> Mode,
        changed: Arc<ChangedCache>,
    ) -> forkfs::Result<Export> {
        let kind = match &target {
            Target::Head(v) => v.kind,
            Target::Version(v) => v.kind,
        };
        if kind != VolumeKind::Block {
            return Err(forkfs::Error::invalid(format!("{name} is not a block volume")));
        }
        let backing = store.graph().open_block(&target)?;
        let mut persist = None;
        let description = match &backing {
            Opened::Live(h) => {
                let mode = mode(h.record());
                persist = Some(Persistence::new(h.clone(), store.clone(), mode)?);
                format!("forkfs volume {name} (live, {mode:?} consistency)")
            }
            Opened::Version(v) => {
                let v = v.record();
                format!("forkfs version {}@{} (read-only)", v.volume_name, v.id.short())
            }
        };
        let (size, block_size) = backing.geometry();
        Ok(Export {
            name: name.to_string(),
            description,
            size,
            block_size,
            read_only: matches!(backing, Opened::Version(_)),
            store: store.clone(),
            target,
            backing,
            counters: Counters::default(),
            latency: Default::default(),
            last_checkpoint: Mutex::new(Instant::now()),
            checkpointing: Mutex::new(()),
            persist,
            reported: Mutex::new((Instant::now(), 0)),
            key: changed.new_key(),
            changes: AtomicU64::new(0),
            changed,
        })
    }

    /// The head changed (or may have): cached diffs against it are stale.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The bytes at `offset`, as pieces shared with the store's caches
    /// (the reply writes them from there).
    pub fn read(&self, offset: u64, len: u32) -> forkfs::Result<Vec<forkfs::Piece>> {
        let pieces = self.backing.read_pieces(offset, u64::from(len))?;
        Counters::add(&self.counters.reads, 1);
        Counters::add(&self.counters.bytes_read, len as u64);
        Ok(pieces)
    }

    fn head(&self) -> forkfs::Result<&BlockHead> {
        self.backing.live()
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> forkfs::Result<()> {
        let done = self.head()?.write_at(offset, data);
        self.changed();
        done?;
        Counters::add(&self.counters.writes, 1);
        Counters::add(&self.counters.bytes_written, data.len() as u64);
        self.persist()?.after_write(offset, Some(data), data.len() as u64, fua)
    }

    /// TRIM and WRITE_ZEROES: metadata only (holes, range tombstones).
    pub fn zero(&self, offset: u64, len: u64, fua: bool) -> forkfs::Result<()> {
        let done = self.head()?.write_zeroes(offset, len);
        self.changed();
        done?;
        Counters::add(&self.counters.zeroes, 1);
        self.persist()?.after_write(offset, None, len, fua)
    }

    /// NBD_CMD_FLUSH: every acknowledged write durable on local disk (flush
    /// mode), or what the consistency mode makes of it.
    pub fn flush(&self) -> forkfs::Result<()> {
        if let Some(p) = &self.persist {
            let done = p.flush();
            self.changed();
            done?;
            Counters::add(&self.counters.flushes, 1);
        }
        Ok(())
    }

    fn persist(&self) -> forkfs::Result<&Persistence> {
        self.persist
            .as_deref()
            .ok_or_else(|| forkfs::Error::read_only("this export is a read-only version"))
    }

    /// A connection from `peer` attaches: its client (live exports).
    pub fn attach(&self, peer: Peer) -> Option<Client> {
        self.persist.as_ref().map(|p| p.attach(peer))
    }

    /// Whether `req` runs in the time of a local disk access: reads,
    /// writes and zeroing on a local store without FUA; not a FLUSH or a
    /// FUA request (an fsync), a BLOCK_STATUS (which may diff versions)
    /// nor anything a remote store may fetch for.
    pub fn is_quick(&self, req: &Request) -> bool {
        use Command::*;
        matches!(req.command, Read | Write | Trim | WriteZeroes | Cache)
            && !req.flags.contains(CmdFlags::FUA)
            && !self.store.is_remote()
    }

    /// Records a received request's arrival (live exports; see
    /// [`Persistence::arrive`]).
    pub fn arrive(&self, write: bool) -> Option<crate::persist::Arrival> {
        self.persist.as_ref().map(|p| p.arrive(write))
    }

    /// Before a FLUSH runs: every write that arrived before it has finished.
    pub fn wait_for_earlier_writes(&self, flush: &crate::persist::Arrival) -> forkfs::Result<()> {
        match &self.persist {
            Some(p) => p.wait_for_earlier_writes(flush),
            None => Ok(()),
        }
    }

    /// Admits a request of `client` (see [`Persistence::begin`]); hold the
    /// guard while it runs.
    pub fn begin(
        &self,
        client: Option<&Client>,
    ) -> forkfs::Result<Option<parking_lot::RwLockReadGuard<'_, ()>>> {
        match (&self.persist, client) {
            (Some(p), Some(c)) => p.begin(c).map(Some),
            _ => Ok(None),
        }
    }

    /// Notes what an admitted request of `client` touches (see
    /// [`Persistence::touch`]); hold the value while it runs.
    pub fn touch(
        &self,
        client: Option<&Client>,
        write: bool,
        offset: u64,
        len: u64,
    ) -> Option<Touch> {
        match (&self.persist, client) {
            (Some(p), Some(c)) => p.touch(c, write, offset, len),
            _ => None,
        }
    }

    /// A connection of `client` ended: in btrfs mode an unclean end rolls
    /// back the client's writes since the last safe point.
    pub fn detach(&self, client: Option<&Client>, end: End) {
        if let (Some(p), Some(c)) = (&self.persist, client) {
            let done = p.detach(c, end);
            self.changed();
            if let Err(e) = done {
                tracing::error!(export = %self.name, error = %e, "persisting after disconnect failed");
            }
        }
    }

    /// At shutdown, after every connection ended: flush mode persists.
    pub fn shutdown(&self) -> forkfs::Result<()> {
        match &self.persist {
            Some(p) if !p.deferred() => p.flush(),
            _ => Ok(()),
        }
    }

    /// In btrfs mode: the safe points persisted and the rollbacks so far.
    pub fn safe_points(&self) -> Option<(u64, u64)> {
        let p = self.persist.as_ref().filter(|p| p.deferred())?;
        let s = &p.stats;
        Some((s.safe_points.load(Ordering::Relaxed), s.rollbacks.load(Ordering::Relaxed)))
    }

    /// Logs safe-point metrics (deferred exports).
    pub fn report(&self, per: Duration) {
        if let Some(p) = &self.persist {
            p.report(per, &self.reported);
        }
    }

    /// Records the head as an automatic version if it changed and at least
    /// `min_interval` passed since the last one, after any checkpoint
    /// running now. Returns whether it did.
    pub fn checkpoint(&self, min_interval: Duration) -> forkfs::Result<bool> {
        let _one = self.checkpointing.lock();
        self.checkpoint_locked(min_interval)
    }

    /// Whether [`Export::checkpoint_unless_running`] would look at the
    /// head now: none is running and `min_interval` passed since the last.
    /// Cheap, so a FLUSH starts no task when it would do nothing.
    pub fn checkpoint_due(&self, min_interval: Duration) -> bool {
        matches!(self.backing, Opened::Live(_))
            && !self.checkpointing.is_locked()
            && self.last_checkpoint.lock().elapsed() >= min_interval
    }

    /// As [`Export::checkpoint`], but does nothing while one is running:
    /// every FLUSH during a long checkpoint used to start a blocking task
    /// that waited for it (tokio's pool grew to its 512 threads) and then
    /// took a checkpoint of its own.
    pub fn checkpoint_unless_running(&self, min_interval: Duration) -> forkfs::Result<bool> {
        let Some(_one) = self.checkpointing.try_lock() else { return Ok(false) };
        self.checkpoint_locked(min_interval)
    }

    fn checkpoint_locked(&self, min_interval: Duration) -> forkfs::Result<bool> {
        let Opened::Live(h) = &self.backing else { return Ok(false) };
        let seals = self.persist.as_ref().map_or(0, |p| p.seals());
        {
            let mut last = self.last_checkpoint.lock();
            if last.elapsed() < min_interval {
                return Ok(false);
            }
            // Deferred heads change only at seals: no need to look (the
            // overlay scan can cost milliseconds of tombstones after a fold).
            if self.persist.as_ref().is_some_and(|p| p.deferred() && !p.sealed_since_commit()) {
                return Ok(false);
            }
            // Looked at most once per interval: after a fold the scan
            // skips thousands of tombstones.
            if h.is_clean()? {
                *last = Instant::now();
                if let Some(p) = &self.persist {
                    p.committed(seals);
                }
                return Ok(false);
            }
        }
        // A deferred head's overlay is always a sealed safe point.
        let origin = if h.is_deferred() { forkfs::Origin::SafePoint } else { forkfs::Origin::Auto };
        let opts =
            SnapshotOptions { origin: Some(origin), skip_if_clean: true, ..Default::default() };
        self.store.graph().snapshot(h.record().name.as_str(), &opts)?;
        if let Some(p) = &self.persist {
            p.committed(seals);
        }
        *self.last_checkpoint.lock() = Instant::now();
        Counters::add(&self.counters.checkpoints, 1);
        Ok(true)
    }

    /// Indexes of blocks in `first..=last` holding data.
    pub fn allocated(&self, first: u64, last: u64) -> forkfs::Result<Vec<u64>> {
        self.backing.allocated_blocks_in(first, last)
    }

    /// Byte ranges changed between version `since` and this export's
    /// state, sorted: from the cache while the head has not changed since
    /// they were computed.
    pub fn changed_since(&self, since: &VersionRecord) -> forkfs::Result<Arc<Ranges>> {
        // Read before diffing: a change that lands during the diff bumps
        // the count after it, so this entry is never found again.
        let at = self.changes.load(Ordering::Acquire);
        self.changed.get_or_compute(self.key, since.id, at, || {
            match self.store.graph().diff(&Target::Version(since.clone()), &self.target)? {
                forkfs::Diff::Block { ranges, .. } => {
                    let mut r: Ranges = ranges.iter().map(|r| (r.offset, r.len)).collect();
                    r.sort_unstable();
                    Ok(r)
                }
                forkfs::Diff::Fs { .. } => Err(forkfs::Error::invalid("not a block volume")),
            }
        })
    }

    /// Resolves a version of this export's volume (for meta contexts).
    pub fn resolve_version(&self, spec: &str) -> forkfs::Result<VersionRecord> {
        let vol = self.target.volume_name();
        match self.store.graph().resolve(&format!("{vol}@{spec}"))? {
            Target::Version(v) => Ok(v),
            Target::Head(_) => Err(forkfs::Error::invalid("name a version")),
        }
    }
}
