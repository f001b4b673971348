//! Live heads: the mutable state of a volume, a base root plus the
//! overlay of everything written since, and the fold that turns them into a
//! new root at a checkpoint.
//!
//! - [`Head`] is the core both kinds share: the record, the committed state,
//!   the locks a checkpoint coordinates with, layered reads and the fold.
//! - [`BlockHead`] (`block/`) is a disk: byte-addressed reads and writes,
//!   range tombstones, deferred persistence for btrfs safe points.
//! - [`FsHead`] (`fs/`) is a directory tree: inodes, directories, files.
//! - [`Frozen`] reads a version; [`Opened`] is "a live head or a version".
//! - [`overlay`] keeps dirty entries in the database, [`datalog`] their
//!   block data in append-only segment files, [`blockmap`] reads and
//!   patches byte ranges over a map of blocks (disks and files alike),
//!   [`patch`] keeps writes smaller than a block as spans over it, and
//!   `layered.rs` reads through the layers and builds the entries a write
//!   puts over the ones it replaces.
//!
//! Reads look in the overlay, then in the base tree. Writers share the
//! `gate`; a checkpoint takes it exclusively only to start and to commit
//! (block volumes) or throughout (fs volumes), and folds a consistent view,
//! so a version contains exactly the writes acknowledged before a point.
//!
//! Uses the records, the map, the chunk store and the database below it.
//! Knows nothing of hosts, leases or the version graph: a head's right to
//! write arrives as a [`Fence`].

pub mod block;
pub mod blockmap;
pub mod datalog;
mod fold;
mod frozen;
pub mod fs;
#[cfg(test)]
mod golden;
mod layered;
pub mod overlay;
pub mod patch;
pub mod prior;

pub use block::{BlockHead, LayerStats, WeakBlockHead};
pub(crate) use fold::Folded;
pub(crate) use frozen::allocated_in_root;
pub use frozen::{Frozen, Opened, Readers};
pub use fs::FsHead;
pub(crate) use layered::Logged;

use crate::cas::ChunkStore;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::id::VolumeId;
use crate::map::{Map, MapRoot};
use crate::records::{HeadRecord, Records, VolumeKind, VolumeRecord, keys};
use bytes::Bytes;
use datalog::{DataLog, LogRef};
use overlay::{Overlay, Space};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// [`Head::quota`] when there is none.
const NO_QUOTA: u64 = u64::MAX;

const STRIPES: usize = 64;

/// The local storage every live head, and every layer above, works
/// through: the database, the chunk store, the data log and the records.
pub struct Storage {
    pub db: Arc<Db>,
    pub chunks: Arc<ChunkStore>,
    pub log: DataLog,
    pub records: Records,
    /// The versions this process has open for reading.
    pub readers: Arc<Readers>,
}

impl Storage {
    /// Durably syncs every write acknowledged so far: the data log first,
    /// then the WAL of the overlay entries that name it.
    pub fn sync(&self) -> Result<()> {
        let mut b = crate::db::Batch::default();
        self.sync_log(&mut b)?;
        if !b.is_empty() {
            self.db.write(b, false)?;
        }
        self.db.sync()
    }

    /// Syncs the data log and adds to `b` the durable marks it reached:
    /// written and synced with the WAL after it, they tell an acknowledged
    /// write from one that never was (see [`Head::read_logged`]).
    pub(crate) fn sync_log(&self, b: &mut crate::db::Batch) -> Result<()> {
        for m in self.log.sync()? {
            self.db.put_meta(b, &keys::durable(m.vol, m.seq), m.upto.to_string());
        }
        Ok(())
    }

    /// The first data log segment of `vol` the overlay may name (older
    /// ones went into the last version).
    pub(crate) fn log_floor(&self, vol: VolumeId) -> Result<u64> {
        Ok(self.db.get_json(&keys::log_floor(vol))?.unwrap_or(0))
    }

    /// Whether the data `r` names was acknowledged as durable: below the
    /// durable mark of its segment.
    pub(crate) fn was_durable(&self, vol: VolumeId, r: &LogRef) -> Result<bool> {
        let upto = self.durable_mark(vol, r.seq)?;
        Ok(upto.is_some_and(|upto| r.offset + r.len as u64 <= upto))
    }

    /// How far segment `seq` of `vol` is known durable, if recorded: from
    /// the data log for a segment of this process (its syncs are where
    /// the marks come from), else from the index.
    pub(crate) fn durable_mark(&self, vol: VolumeId, seq: u64) -> Result<Option<u64>> {
        if let Some(here) = self.log.durable_here(vol, seq) {
            return Ok(here);
        }
        let mark = self.db.get_meta(&keys::durable(vol, seq))?;
        Ok(mark.as_deref().and_then(|m| std::str::from_utf8(m).ok()?.parse::<u64>().ok()))
    }

    /// The overlay of volume `vol`.
    pub fn overlay(&self, vol: VolumeId) -> Overlay<'_> {
        Overlay::new(&self.db, vol)
    }

    /// Maps whose nodes live in the chunk store.
    pub fn map(&self) -> Map<'_, ChunkStore> {
        Map::new(self.chunks.as_ref())
    }

    /// Adds to `b` the removal of everything this index holds of volume
    /// `rec`, whose versions are `versions`: its record, head, log, names,
    /// rollbacks, overlay and data log marks (its objects are the caller's;
    /// after the write, `log.drop_below(rec.id, u64::MAX)` removes its
    /// data log segments).
    pub(crate) fn forget_volume(
        &self,
        b: &mut crate::db::Batch,
        rec: &crate::records::VolumeRecord,
        versions: &[crate::records::VersionRecord],
    ) -> Result<()> {
        let db = &self.db;
        for key in [
            keys::volume(rec.name.as_str()),
            keys::head(rec.id),
            keys::published(rec.id),
            keys::head_seen(rec.id),
            keys::log_floor(rec.id),
            keys::unsealed(rec.id),
        ] {
            db.delete_meta(b, &key);
        }
        for prefix in [
            keys::log_prefix(rec.id),
            keys::tag_prefix(rec.id),
            keys::tag_seen_prefix(rec.id),
            keys::rollback_prefix(rec.id),
            keys::durable_prefix(rec.id),
        ] {
            for (k, _) in db.scan_meta(&prefix)? {
                db.delete_meta(b, &k);
            }
        }
        for v in versions {
            db.delete_meta(b, &keys::version(&v.id));
            db.delete_meta(b, &keys::damaged(&v.id));
        }
        self.overlay(rec.id).clear(b);
        Ok(())
    }
}

/// A writer's right to change a volume, checked before every change: on a
/// remote store, the volume's lease (see `sync/lease.rs`).
pub trait Fence: Send + Sync {
    /// Fails once the right is lost.
    fn check(&self) -> Result<()>;
}

/// An open volume head, shared by everything in this process that uses
/// the volume: the core of [`BlockHead`] and [`FsHead`].
pub struct Head {
    pub(crate) storage: Arc<Storage>,
    record: VolumeRecord,
    state: RwLock<HeadRecord>,
    /// Shared by writers, exclusive for checkpoints and restores.
    pub(crate) gate: RwLock<()>,
    /// Moves at every commit that replaces the overlay with a new base
    /// (a checkpoint, a restore, an adoption): odd while one is written.
    /// fs reads do not take the gate; one that spans such a commit may
    /// have read the old base and then the emptied overlay, and is
    /// retried ([`Head::read_consistent`]).
    published: AtomicU64,
    /// fs volumes: inodes numbered from here were made after the last
    /// promise of durability (an fsync of the volume, a checkpoint, a
    /// restore), so nothing of theirs was ever promised: a file among them
    /// that outgrows its inline bytes need not sync the data log first
    /// (`Txn::moved_inline`). Only grows.
    pub(crate) fresh_from: AtomicU64,
    /// Serialize read-modify-write of the same block.
    stripes: Vec<Mutex<()>>,
    /// Serializes namespace and inode-record changes of an fs volume.
    pub(crate) ns: Mutex<()>,
    /// One checkpoint (or restore) of this head at a time.
    pub(crate) checkpoint: Mutex<()>,
    deleted: AtomicBool,
    /// Every change since the last checkpoint is an access time (an fs
    /// volume read under relatime): an automatic version skips the head
    /// as if clean, so reads alone make no versions (the access times
    /// stay in the overlay until the next change is saved). Found from
    /// the overlay when the volume is opened; kept by every fs
    /// transaction; false after a checkpoint or restore clears it.
    pub(crate) accessed_only: AtomicBool,
    /// The first data log segment the overlay may name (see
    /// [`Storage::log_floor`]), kept in memory for reads: a checkpoint
    /// sets it with its commit, under the gate.
    log_floor: AtomicU64,
    /// The fs volume's quota in bytes ([`NO_QUOTA`]: none), from its
    /// record and kept by `forkfs volume quota` while the head is open.
    quota: AtomicU64,
    /// The state only block volumes have (range tombstones, deferred
    /// persistence); `None` for fs volumes.
    block: Option<block::State>,
    /// This process's right to write the volume (remote stores).
    fence: Option<Arc<dyn Fence>>,
}

/// What a reader sees: a live head (overlay over base) or a frozen
/// version (its root alone, read from the chunk store).
#[derive(Clone, Copy)]
pub enum View<'a> {
    Live(&'a Head),
    Frozen(&'a ChunkStore),
}

impl<'a> View<'a> {
    pub fn chunks(&self) -> &'a ChunkStore {
        match self {
            View::Live(h) => &h.storage.chunks,
            View::Frozen(c) => c,
        }
    }

    /// The head to write to; versions are read-only.
    pub fn head(&self) -> Result<&'a Head> {
        match self {
            View::Live(h) => Ok(h),
            View::Frozen(_) => Err(Error::read_only("versions are read-only")),
        }
    }

    pub fn lookup(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
    ) -> Result<Option<Found>> {
        match self {
            View::Live(h) => h.lookup(space, owner, key, base),
            View::Frozen(c) => Ok(Map::new(*c).get(base, key)?.map(Found::Value)),
        }
    }

    /// [`View::lookup`] that may read logged bytes straight into `part`'s
    /// buffer (see [`Head::lookup_part`]).
    pub(crate) fn lookup_part(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
        part: (u64, &mut [u8]),
    ) -> Result<Part> {
        match self {
            View::Live(h) => h.lookup_part(space, owner, key, base, Some(part)),
            View::Frozen(_) => Ok(Part::Found(self.lookup(space, owner, key, base)?)),
        }
    }
}

/// What [`Head::lookup_part`] did: found the entry, or read the bytes
/// asked for straight into the caller's buffer.
pub(crate) enum Part {
    Found(Option<Found>),
    Filled,
}

/// A value found in the layered (overlay over base) view of a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Value(Bytes),
    /// Dirty data not yet stored as a chunk.
    Data(Bytes),
}

impl Head {
    pub(crate) fn new(
        storage: Arc<Storage>,
        record: VolumeRecord,
        state: HeadRecord,
        fence: Option<Arc<dyn Fence>>,
    ) -> Result<Head> {
        let block = (record.kind == VolumeKind::Block).then(block::State::default);
        let quota = AtomicU64::new(record.quota.unwrap_or(NO_QUOTA));
        let storage_floor = storage.log_floor(record.id)?;
        let head = Head {
            storage,
            record,
            state: RwLock::new(state),
            gate: RwLock::new(()),
            published: AtomicU64::new(0),
            fresh_from: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            ns: Mutex::new(()),
            checkpoint: Mutex::new(()),
            deleted: AtomicBool::new(false),
            accessed_only: AtomicBool::new(false),
            log_floor: AtomicU64::new(storage_floor),
            quota,
            block,
            fence,
        };
        head.reload_zeroed()?;
        if head.record.kind == VolumeKind::Fs {
            // What the overlay holds after a remount or restart: only
            // access times, or more. A failure to tell means more.
            let only = fs::only_accesses(&head).unwrap_or(false);
            head.accessed_only.store(only, Ordering::Release);
            // Everything there may have been promised by an earlier process.
            head.promised();
        }
        Ok(head)
    }

    pub fn record(&self) -> &VolumeRecord {
        &self.record
    }

    pub fn kind(&self) -> VolumeKind {
        self.record.kind
    }

    /// The first data log segment the overlay may name.
    pub(crate) fn log_floor(&self) -> u64 {
        self.log_floor.load(Ordering::Acquire)
    }

    /// Records the log floor a checkpoint just committed; call with the
    /// gate held exclusively.
    pub(crate) fn set_log_floor(&self, floor: u64) {
        self.log_floor.store(floor, Ordering::Release);
    }

    /// The volume's quota in bytes, if it has one (fs volumes).
    pub fn quota(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Acquire)).filter(|q| *q != NO_QUOTA)
    }

    /// Sets the quota this head enforces (the record is the caller's).
    pub(crate) fn set_quota(&self, quota: Option<u64>) {
        self.quota.store(quota.unwrap_or(NO_QUOTA), Ordering::Release);
    }

    /// Fails (invalid input) unless this is a volume of `kind`.
    pub(crate) fn expect_kind(&self, kind: VolumeKind) -> Result<()> {
        if self.record.kind == kind {
            return Ok(());
        }
        Err(Error::invalid(format!("volume {} is not {}", self.record.name, kind.a_volume())))
    }

    /// The committed state: base version and root.
    pub fn state(&self) -> HeadRecord {
        self.state.read().clone()
    }

    pub(crate) fn set_state(&self, s: HeadRecord) {
        *self.state.write() = s;
    }

    /// Runs `commit`, a write that replaces the overlay with a new base
    /// and sets the state naming it, so that a read beside it
    /// ([`Head::read_consistent`]) is retried. Call with the gate held
    /// exclusively.
    pub(crate) fn publish<T>(&self, commit: impl FnOnce() -> Result<T>) -> Result<T> {
        /// Makes the counter even again however the commit ends (a panic
        /// too: an odd counter would hold every read forever).
        struct Done<'a>(&'a AtomicU64);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.published.fetch_add(1, Ordering::SeqCst);
        let out = {
            let _done = Done(&self.published);
            commit()
        };
        if self.record.kind == VolumeKind::Fs {
            // A version, or a restored tree, is durable.
            self.promised();
        }
        out
    }

    /// fs volumes: every inode that exists now may have had bytes promised
    /// durable (see `fresh_from`). Call at the start of a promise, under
    /// the namespace lock or the gate held exclusively, so that no
    /// transaction that took the old mark commits after it. When the fs
    /// record cannot be read, every inode counts as promised.
    pub(crate) fn promised(&self) {
        let next = self.read_consistent(|| fs::FsReader::live(self).meta()).map(|m| m.next_ino);
        self.fresh_from.fetch_max(next.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// Runs `read` (reads of the base and the overlay, without the gate)
    /// until no commit ([`Head::publish`]) came during it: its result is
    /// then that of one state. A read that spans a commit may have failed
    /// or seen a mix; it is run again, which a checkpoint's commit makes
    /// rare (they are milliseconds long, seconds apart).
    pub(crate) fn read_consistent<T>(&self, mut read: impl FnMut() -> Result<T>) -> Result<T> {
        loop {
            let before = self.published.load(Ordering::SeqCst);
            if before % 2 == 1 {
                // A commit is being written, under the gate held
                // exclusively (so this thread does not hold it): wait.
                drop(self.gate.read());
                continue;
            }
            let out = read();
            if self.published.load(Ordering::SeqCst) == before {
                return out;
            }
        }
    }

    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::SeqCst);
    }

    /// Fails once the volume was deleted or this process lost the right
    /// to write it.
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.deleted.load(Ordering::SeqCst) {
            return Err(Error::not_found(format!("volume {} was deleted", self.record.name)));
        }
        match &self.fence {
            Some(f) => f.check(),
            None => Ok(()),
        }
    }

    /// Backpressure: a writer waits here (before any lock a checkpoint
    /// needs) while a remote store's uploads are over their pending limit.
    pub(crate) fn wait_for_uploads(&self) {
        if let Some(o) = self.storage.chunks.backend().outbox() {
            o.wait_for_room();
        }
    }

    pub(crate) fn overlay(&self) -> Overlay<'_> {
        self.storage.overlay(self.record.id)
    }

    pub(crate) fn map(&self) -> Map<'_, ChunkStore> {
        self.storage.map()
    }

    pub(crate) fn db(&self) -> &Db {
        &self.storage.db
    }

    /// The state of a block volume; `None` for fs volumes.
    pub(crate) fn block(&self) -> Option<&block::State> {
        self.block.as_ref()
    }

    /// Locks the stripes of blocks `first..=last` of map `owner`, in a fixed
    /// order, so overlapping read-modify-writes never interleave.
    pub(crate) fn lock_block_range(
        &self,
        owner: u64,
        first: u64,
        last: u64,
    ) -> Vec<MutexGuard<'_, ()>> {
        let stripe = |k: u64| {
            ((k ^ owner.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
        };
        let mut idx: Vec<usize> = if last - first >= STRIPES as u64 {
            (0..STRIPES).collect()
        } else {
            (first..=last).map(stripe).collect()
        };
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.stripes[i].lock()).collect()
    }

    /// True when nothing was written since the last checkpoint.
    pub fn is_clean(&self) -> Result<bool> {
        self.overlay().is_empty()
    }

    /// Nothing but access times changed since the last checkpoint (see
    /// `accessed_only`): an automatic version need not be taken.
    pub fn is_clean_but_accesses(&self) -> Result<bool> {
        Ok(self.accessed_only.load(std::sync::atomic::Ordering::Acquire) || self.is_clean()?)
    }

    /// Makes every acknowledged write durable on local disk.
    pub fn flush(&self) -> Result<()> {
        self.storage.sync()
    }
}

/// True when every byte is zero (such blocks are stored as holes).
pub fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(16);
    words.all(|c| u128::from_ne_bytes(c.try_into().expect("16 bytes")) == 0)
        && words.remainder().iter().all(|x| *x == 0)
}
