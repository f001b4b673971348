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
//!   patches byte ranges over a map of blocks (disks and files alike).
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
pub mod overlay;
pub mod patch;
pub mod prior;

pub use block::{BlockHead, LayerStats, WeakBlockHead};
pub(crate) use frozen::allocated_in_root;
pub use frozen::{Frozen, Opened, Readers};
pub use fs::FsHead;

use crate::cas::ChunkStore;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::id::{VolumeId, VolumeName};
use crate::map::{Map, MapRoot};
use crate::records::{HeadRecord, Records, VolumeKind, VolumeRecord, keys};
use bytes::Bytes;
use datalog::{DataLog, LogRef, Read};
use overlay::{Dirty, Overlay, Space};
use parking_lot::{Mutex, MutexGuard, RwLock};
use patch::Patch;
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

    /// Whether the data `r` names was acknowledged as durable: below the
    /// durable mark of its segment.
    /// The first data log segment of `vol` the overlay may name (older
    /// ones went into the last version).
    pub(crate) fn log_floor(&self, vol: VolumeId) -> Result<u64> {
        Ok(self.db.get_json(&keys::log_floor(vol))?.unwrap_or(0))
    }

    pub(crate) fn was_durable(&self, vol: VolumeId, r: &LogRef) -> Result<bool> {
        let upto = self.durable_mark(vol, r.seq)?;
        Ok(upto.is_some_and(|upto| r.offset + r.len as u64 <= upto))
    }

    /// How far segment `seq` of `vol` is known durable, if recorded.
    pub(crate) fn durable_mark(&self, vol: VolumeId, seq: u64) -> Result<Option<u64>> {
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
        }
        Ok(head)
    }

    pub fn record(&self) -> &VolumeRecord {
        &self.record
    }

    pub fn kind(&self) -> VolumeKind {
        self.record.kind
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

    /// Looks a key up in the overlay (for block volumes, after the pending
    /// layer), then in `base`.
    pub(crate) fn lookup(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
    ) -> Result<Option<Found>> {
        match self.lookup_part(space, owner, key, base, None)? {
            Part::Found(f) => Ok(f),
            Part::Filled => Err(Error::corrupt("a whole-block lookup was answered in part")),
        }
    }

    /// [`Head::lookup`], except that with `part` (an offset in the block
    /// and a buffer) data this process logged is read straight into the
    /// buffer ([`DataLog::read_part`]): a small read of a large block
    /// reads and copies only its own bytes, once (unchecked: no crash came
    /// between that write and now; everything else is read as before).
    pub(crate) fn lookup_part(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
        mut part: Option<(u64, &mut [u8])>,
    ) -> Result<Part> {
        let found = |f: Option<Found>| Ok(Part::Found(f));
        let block = self.block.as_ref().filter(|_| space == Space::Root);
        if let Some(b) = block {
            match b.pending_lookup(key) {
                block::PendingLookup::Absent => {}
                block::PendingLookup::Zero => return found(None),
                // Written by this process since the seal: lost data is damage.
                block::PendingLookup::Entry(Dirty::Logged(r) | Dirty::Over(r, _)) => {
                    if self.read_part(&r, &mut part)? {
                        return Ok(Part::Filled);
                    }
                    return match self.storage.log.read(self.record.id, &r)? {
                        Read::Data(d) => found(Some(Found::Data(d))),
                        Read::Lost(why) => Err(Error::corrupt(format!(
                            "volume {}: a write of this process is lost: {why}",
                            self.record.name
                        ))),
                    };
                }
                block::PendingLookup::Entry(Dirty::Patch(p)) => {
                    return self.read_patch(&p, key, base, part);
                }
                block::PendingLookup::Entry(d) => return found(self.entry_found(&d, key, base)?),
            }
        }
        match self.overlay().get(space, owner, key)? {
            // Logged by this process: there, whatever came before it.
            Some(Dirty::Logged(r) | Dirty::Over(r, _)) if self.read_part(&r, &mut part)? => {
                Ok(Part::Filled)
            }
            Some(Dirty::Patch(p)) => self.read_patch(&p, key, base, part),
            Some(d) => found(self.entry_found(&d, key, base)?),
            None if block.is_some_and(|b| b.in_zeroed(key)) => found(None),
            None => found(self.map().get(base, key)?.map(Found::Value)),
        }
    }

    /// Reads the bytes `part` asks for of logged block data `r` straight
    /// into its buffer, if this process logged it ([`DataLog::read_part`]).
    fn read_part(&self, r: &LogRef, part: &mut Option<(u64, &mut [u8])>) -> Result<bool> {
        match part.as_mut() {
            Some((within, out)) => self.storage.log.read_part(self.record.id, r, *within, out),
            None => Ok(false),
        }
    }

    /// What an entry other than a patch reads as (`None`: a hole), with
    /// the base map's value at `key` under it.
    fn entry_found(&self, d: &Dirty, key: u64, base: MapRoot) -> Result<Option<Found>> {
        let from_base = || Ok::<_, Error>(self.map().get(base, key)?.map(Found::Value));
        match d {
            Dirty::Delete => Ok(None),
            Dirty::Value(v) => Ok(Some(Found::Value(v.clone()))),
            Dirty::Logged(r) => match self.read_logged(r)? {
                Some(d) => Ok(Some(Found::Data(d))),
                None => from_base(),
            },
            Dirty::Over(r, prior) => match self.read_over(r, prior)? {
                Logged::Data(d) => Ok(Some(Found::Data(d))),
                Logged::Hole => Ok(None),
                Logged::Value(v) => Ok(Some(Found::Value(v))),
                Logged::Base => from_base(),
            },
            Dirty::Patch(_) => Err(Error::corrupt("a patch under a patch")),
        }
    }

    /// Reads a patched block (see `patch.rs`): the entry under it, then
    /// its spans in order. With `part`, bytes that the newest span
    /// touching them holds whole, and that this process logged, are read
    /// straight into the buffer; bytes no span touches are read from the
    /// entry under the spans alone.
    pub(crate) fn read_patch(
        &self,
        p: &Patch,
        key: u64,
        base: MapRoot,
        mut part: Option<(u64, &mut [u8])>,
    ) -> Result<Part> {
        let bs = u64::from(self.record.block_size);
        let floor = self.log_floor.load(Ordering::Acquire);
        // Spans below the floor, and the entry under them, went into the
        // base (a checkpoint folded them; this entry was written after).
        let folded = p.spans.iter().take_while(|s| s.r.seq < floor).count();
        let under_folded = p.under.as_ref().and_then(Dirty::log_ref).is_some_and(|r| r.seq < floor);
        let under = p.under.as_ref().filter(|_| folded == 0 && !under_folded);
        if let Some((lo, out)) = part.as_ref() {
            let (lo, hi) = (*lo, *lo + out.len() as u64);
            let newest = p.spans[folded..].iter().rev().find(|s| s.start() < hi && lo < s.end());
            match newest {
                Some(s) if s.start() <= lo && hi <= s.end() => {
                    let mut inner = part.take().map(|(_, out)| (lo - s.start(), out));
                    if self.read_part(&s.r, &mut inner)? {
                        return Ok(Part::Filled);
                    }
                }
                // No span touches the bytes asked for: they are the entry
                // under the spans' (read only in part if this process
                // logged it), or the base's.
                None => {
                    return match under {
                        Some(Dirty::Logged(r) | Dirty::Over(r, _))
                            if self.read_part(r, &mut part)? =>
                        {
                            Ok(Part::Filled)
                        }
                        Some(d) => Ok(Part::Found(self.entry_found(d, key, base)?)),
                        None => Ok(Part::Found(self.map().get(base, key)?.map(Found::Value))),
                    };
                }
                Some(_) => {}
            }
        }
        let under = match under {
            Some(d) => self.entry_found(d, key, base)?,
            None => self.map().get(base, key)?.map(Found::Value),
        };
        let mut block = match under {
            None => vec![0u8; bs as usize],
            Some(Found::Data(d)) => d.to_vec(),
            Some(Found::Value(v)) => {
                blockmap::stored_block(&self.storage.chunks, &v, key, bs)?.to_vec()
            }
        };
        if block.len() as u64 != bs {
            return Err(Error::corrupt(format!(
                "block {key} is {} bytes, expected {bs}",
                block.len()
            )));
        }
        for s in &p.spans[folded..] {
            if s.end() > bs {
                return Err(Error::corrupt(format!("block {key}: a span ends past the block")));
            }
            // A span lost before any flush acknowledged it is skipped.
            if let Some(d) = self.read_logged(&s.r)? {
                block[s.start() as usize..s.end() as usize].copy_from_slice(&d);
            }
        }
        Ok(Part::Found(Some(Found::Data(Bytes::from(block)))))
    }

    /// Drops what no read of `p` can need any more ([`Patch::rebase`],
    /// [`Patch::prune`]). The caller holds the gate (the floor cannot
    /// move) and the block's stripe.
    pub(crate) fn prune_patch(&self, p: &mut Patch) -> Result<()> {
        p.rebase(self.log_floor.load(Ordering::Acquire));
        let mut marks = std::collections::HashMap::new();
        let id = self.record.id;
        p.prune(u64::from(self.record.block_size), &mut |r| {
            let (mark, started) = match marks.get(&r.seq) {
                Some(m) => *m,
                None => {
                    let m = self.storage.durable_mark(id, r.seq)?.unwrap_or(0);
                    // Read after the mark: a sync that wrote it started before.
                    let started = self.storage.log.sync_started(id, r.seq);
                    *marks.entry(r.seq).or_insert((m, started))
                }
            };
            let end = r.offset + u64::from(r.len);
            Ok(patch::Ack { durable: end <= mark, maybe: end <= mark.max(started) })
        })
    }

    /// Reads a logged entry written over earlier states (see `prior.rs`):
    /// its data, else the newest earlier state still there.
    pub(crate) fn read_over(&self, r: &LogRef, prior: &prior::Prior) -> Result<Logged> {
        if let Some(d) = self.read_logged(r)? {
            return Ok(Logged::Data(d));
        }
        let floor = self.log_floor.load(Ordering::Acquire);
        for e in &prior.chain {
            match e {
                prior::Earlier::Hole => return Ok(Logged::Hole),
                prior::Earlier::Value(v) => return Ok(Logged::Value(v.clone())),
                // Below the floor: folded into the base by a checkpoint.
                prior::Earlier::Logged(q) if q.seq < floor => return Ok(Logged::Base),
                prior::Earlier::Logged(q) => {
                    if let Some(d) = self.read_logged(q)? {
                        return Ok(Logged::Data(d));
                    }
                }
            }
        }
        if prior.cut {
            return Err(Error::corrupt(format!(
                "volume {}: a block's unflushed writes are lost and what it held before \
                 them is unknown (more than {} rewrites since its last durable state); \
                 `forkfs fsck --repair` drops them",
                self.record.name,
                prior::MAX_CHAIN
            )));
        }
        Ok(Logged::Base)
    }

    /// `d` as it goes into the overlay over the entry at (space, owner,
    /// key): logged data carries what it replaces, for power loss.
    /// A whole block logged over a patch is its newest span.
    pub(crate) fn over(&self, space: Space, owner: u64, key: u64, d: Dirty) -> Result<Dirty> {
        let Dirty::Logged(r) = d else { return Ok(d) };
        let id = self.record.id;
        let prior = match self.overlay().get(space, owner, key)? {
            Some(Dirty::Patch(p)) => {
                let mut p = *p;
                p.spans.push(patch::Span { at: 0, r });
                self.prune_patch(&mut p)?;
                return Ok(Dirty::Patch(Box::new(p)));
            }
            None => prior::Prior::default(),
            Some(Dirty::Delete) => prior::Prior::chained(prior::Earlier::Hole, None),
            Some(Dirty::Value(v)) => prior::Prior::chained(prior::Earlier::Value(v), None),
            Some(Dirty::Logged(p)) => prior::Prior::chained(prior::Earlier::Logged(p), None),
            // Known durable: nothing older is needed.
            Some(Dirty::Over(p, _)) if self.storage.was_durable(id, &p)? => {
                prior::Prior::chained(prior::Earlier::Logged(p), None)
            }
            Some(Dirty::Over(p, older)) => {
                prior::Prior::chained(prior::Earlier::Logged(p), Some(&older))
            }
        };
        Ok(Dirty::Over(r, prior))
    }

    /// Reads dirty data from the log. Data whose overlay entry outlived it
    /// (power lost before any flush made it durable) reads as `None`: that
    /// write was never acknowledged as durable, so the older content stands.
    /// Lost data that *was* acknowledged (below its segment's durable mark)
    /// is damage: an error, never older content; an I/O failure is an error.
    pub(crate) fn read_logged(&self, r: &LogRef) -> Result<Option<Bytes>> {
        match self.storage.log.read(self.record.id, r)? {
            Read::Data(d) => Ok(Some(d)),
            Read::Lost(why) if self.storage.was_durable(self.record.id, r)? => {
                Err(lost_acknowledged(&self.record.name, &why))
            }
            Read::Lost(why) => {
                tracing::warn!(volume = %self.record.name, why, "dropping an unflushed write lost in a crash");
                Ok(None)
            }
        }
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

/// What a logged entry reads as (see [`Head::read_over`]).
pub(crate) enum Logged {
    Data(Bytes),
    Hole,
    Value(Bytes),
    /// The base map's value.
    Base,
}

/// The error for acknowledged data that is gone.
pub(crate) fn lost_acknowledged(volume: &VolumeName, why: &str) -> Error {
    Error::corrupt(format!(
        "volume {volume}: a write acknowledged as durable is lost ({why}); `forkfs fsck` \
         lists the damage, `forkfs fsck --repair` drops the lost writes (their blocks go back \
         to the last version)"
    ))
}

/// True when every byte is zero (such blocks are stored as holes).
pub fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(16);
    words.all(|c| u128::from_ne_bytes(c.try_into().expect("16 bytes")) == 0)
        && words.remainder().iter().all(|x| *x == 0)
}
