//! Volume heads: a base root plus the overlay of everything written since,
//! and the fold that turns them into a new root at a checkpoint.
//!
//! Reads look in the overlay, then in the base tree. Writers share the
//! `gate`; a checkpoint takes it exclusively only to start and to commit
//! (block volumes) or throughout (fs volumes), and folds a consistent view,
//! so a version contains exactly the writes acknowledged before a point.

pub mod block;
mod blockmap;
pub mod changes;
mod deferred;
pub mod fs;
pub mod fsops;
mod fstxn;
pub mod inode;
mod rename;
pub mod xattr;
mod zeroed;

use crate::error::{Error, Result};
use crate::map::{Map, MapRoot, Update};
use crate::overlay::{Dirty, Overlay, Space};
use crate::store::Store;
use crate::version::{HeadRecord, VolumeKind, VolumeRecord};
use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

pub use blockmap::BlockMap;
pub use deferred::LayerStats;

const STRIPES: usize = 64;

/// An open volume head, shared by everything in this process that uses the volume.
pub struct Head {
    pub(crate) store: Store,
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
    /// Union of the zeroed block ranges of a block volume (see `zeroed.rs`): start -> end.
    zeroed: RwLock<BTreeMap<u64, u64>>,
    /// Key of the next range entry.
    zero_seq: std::sync::atomic::AtomicU64,
    /// Deferred persistence (block volumes; see `deferred.rs`): `None`
    /// writes go straight to the overlay.
    deferred: Mutex<Option<deferred::Deferred>>,
    /// `deferred` is `Some` (written under its lock; read without it).
    on: AtomicBool,
    /// Remote stores: this host's right to write the volume.
    pub(crate) lease: Option<std::sync::Arc<crate::lease::Lease>>,
}

/// What a reader sees: a live head (overlay over base) or a frozen
/// version (its root alone).
#[derive(Clone, Copy)]
pub enum View<'a> {
    Live(&'a Head),
    Frozen(&'a Store),
}

impl<'a> View<'a> {
    pub fn store(&self) -> &'a Store {
        match self {
            View::Live(h) => &h.store,
            View::Frozen(s) => s,
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
            View::Frozen(s) => Ok(Map::new(s.chunks().as_ref()).get(base, key)?.map(Found::Value)),
        }
    }
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
        store: Store,
        record: VolumeRecord,
        state: HeadRecord,
        lease: Option<std::sync::Arc<crate::lease::Lease>>,
    ) -> Result<Head> {
        let head = Head {
            store,
            record,
            state: RwLock::new(state),
            gate: RwLock::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            ns: Mutex::new(()),
            checkpoint: Mutex::new(()),
            deleted: AtomicBool::new(false),
            zeroed: RwLock::new(BTreeMap::new()),
            zero_seq: std::sync::atomic::AtomicU64::new(0),
            deferred: Mutex::new(None),
            on: AtomicBool::new(false),
            lease,
        };
        head.reload_zeroed()?;
        Ok(head)
    }

    pub fn record(&self) -> &VolumeRecord {
        &self.record
    }

    pub fn kind(&self) -> VolumeKind {
        self.record.kind
    }

    pub fn state(&self) -> HeadRecord {
        self.state.read().clone()
    }

    pub(crate) fn set_state(&self, s: HeadRecord) {
        *self.state.write() = s;
    }

    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::SeqCst);
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        if self.deleted.load(Ordering::SeqCst) {
            return Err(Error::not_found(format!("volume {} was deleted", self.record.name)));
        }
        match &self.lease {
            Some(l) => l.check(),
            None => Ok(()),
        }
    }

    /// Backpressure: a writer waits here (before any lock a checkpoint
    /// needs) while a remote store's uploads are over their pending limit.
    pub(crate) fn wait_for_uploads(&self) {
        if let Some(o) = self.store.chunks().backend().outbox() {
            o.wait_for_room();
        }
    }

    pub(crate) fn overlay(&self) -> Overlay<'_> {
        Overlay::new(self.store.index(), self.record.id)
    }

    pub(crate) fn map(&self) -> Map<'_, crate::chunk::ChunkStore> {
        Map::new(self.store.chunks().as_ref())
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

    /// Looks a key up in the overlay, then in `base`.
    pub(crate) fn lookup(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
    ) -> Result<Option<Found>> {
        if space == Space::Root {
            match self.pending_lookup(key) {
                deferred::PendingLookup::Absent => {}
                deferred::PendingLookup::Zero | deferred::PendingLookup::Entry(Dirty::Delete) => {
                    return Ok(None);
                }
                deferred::PendingLookup::Entry(Dirty::Value(v)) => {
                    return Ok(Some(Found::Value(v)));
                }
                // Written by this process since the seal: a failed check is damage.
                deferred::PendingLookup::Entry(Dirty::Logged(r)) => {
                    return Ok(Some(Found::Data(self.store.datalog().read(self.record.id, &r)?)));
                }
            }
        }
        match self.overlay().get(space, owner, key)? {
            Some(Dirty::Delete) => Ok(None),
            Some(Dirty::Value(v)) => Ok(Some(Found::Value(v))),
            Some(Dirty::Logged(r)) => match self.read_logged(&r)? {
                Some(d) => Ok(Some(Found::Data(d))),
                None => Ok(self.map().get(base, key)?.map(Found::Value)),
            },
            None if space == Space::Root && self.in_zeroed(key) => Ok(None),
            None => Ok(self.map().get(base, key)?.map(Found::Value)),
        }
    }

    /// Reads dirty data from the log. Data whose overlay entry outlived it
    /// (power lost before any flush made it durable) reads as `None`: that
    /// write was never acknowledged as durable, so the older content stands.
    fn read_logged(&self, r: &crate::datalog::LogRef) -> Result<Option<Bytes>> {
        match self.store.datalog().read(self.record.id, r) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == crate::ErrorKind::Corrupt => {
                tracing::warn!(volume = %self.record.name, error = %e, "dropping unflushed write lost in a crash");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// True when nothing was written since the last checkpoint.
    pub fn is_clean(&self) -> Result<bool> {
        self.overlay().is_empty()
    }

    /// Folds the overlay into a new root and returns it with the entries it
    /// folded. Cost: O(dirty entries).
    ///
    /// fs volumes: call with the gate held exclusively; the caller clears
    /// the whole overlay in its commit batch. Block volumes may be folded
    /// while writers go on (the overlay is read through one consistent
    /// iterator and the base root does not move); the commit then deletes
    /// only the folded entries that are still unchanged.
    ///
    /// Also returns the generation of the last seal the fold includes
    /// (deferred heads).
    pub(crate) fn fold(&self) -> Result<(MapRoot, Vec<crate::overlay::RawEntry>, Option<u64>)> {
        let base = self.state.read().root;
        match self.record.kind {
            VolumeKind::Block => {
                let mut ups = BTreeMap::new();
                let mut ranges = Vec::new();
                let mut folded = Vec::new();
                // A cut between seals, and the generation of the last one.
                let db = self.store.index().db();
                let (snap, generation) = self.with_sealed(|g| (db.snapshot(), g));
                self.overlay().for_each_in(Some(&snap), &mut |e| {
                    match (e.space, e.owner, &e.dirty) {
                        (Space::Root, 0, _) => {
                            if let Some(u) = self.resolve(e.dirty)? {
                                ups.insert(e.key, u);
                            }
                        }
                        (Space::Zeroed, 0, Dirty::Value(v)) => ranges.push(zeroed::range_of(v)?),
                        _ => {
                            return Err(Error::corrupt(
                                "block volume overlay holds a non-block entry",
                            ));
                        }
                    }
                    folded.push(e.raw);
                    Ok(())
                })?;
                // Blocks written after a range was zeroed have entries and win.
                for k in zeroed::base_keys(self.map(), base, &ranges)? {
                    ups.entry(k).or_insert(None);
                }
                let ups: Vec<Update> = ups.into_iter().collect();
                Ok((self.map().apply(base, &ups)?, folded, generation))
            }
            VolumeKind::Fs => Ok((self.fold_fs(base)?, Vec::new(), None)),
        }
    }

    /// Turns a dirty entry into a map update (`None`: no update), storing
    /// data as a chunk. All-zero data becomes a delete: absent blocks read as zeros.
    fn resolve(&self, d: Dirty) -> Result<Option<Option<Bytes>>> {
        Ok(match d {
            Dirty::Delete => Some(None),
            Dirty::Value(v) => Some(Some(v)),
            Dirty::Logged(r) => match self.read_logged(&r)? {
                None => None,
                Some(data) if is_zero(&data) => Some(None),
                Some(data) => {
                    let id = self.store.chunks().put(&data)?;
                    Some(Some(Bytes::copy_from_slice(&id.0)))
                }
            },
        })
    }

    fn fold_fs(&self, base: MapRoot) -> Result<MapRoot> {
        // Sub-maps (directories, file blocks) first, then the inode records
        // that point at their new roots.
        let mut inode_ups: BTreeMap<u64, Option<Bytes>> = BTreeMap::new();
        let mut groups: BTreeMap<(Space, u64), Vec<Update>> = BTreeMap::new();
        self.overlay().for_each(&mut |e| {
            match e.space {
                Space::Root => {
                    if let Some(u) = self.resolve(e.dirty)? {
                        inode_ups.insert(e.key, u);
                    }
                }
                // Root entries come first: entries of an inode deleted
                // since the last checkpoint are skipped, not stored.
                _ if matches!(inode_ups.get(&e.owner), Some(None)) => {}
                s => {
                    if let Some(u) = self.resolve(e.dirty)? {
                        groups.entry((s, e.owner)).or_default().push((e.key, u));
                    }
                }
            }
            Ok(())
        })?;
        for ((space, ino), ups) in groups {
            let current = match inode_ups.get(&ino) {
                Some(Some(v)) => v.clone(),
                Some(None) => continue, // skipped above; kept for safety
                None => match self.map().get(base, ino)? {
                    Some(v) => v,
                    None => continue,
                },
            };
            let mut inode = inode::Inode::decode(&current)?;
            let sub = inode.content_root(space)?;
            let new_sub = self.map().apply(sub, &ups)?;
            inode.set_content_root(space, new_sub)?;
            inode_ups.insert(ino, Some(Bytes::from(inode.encode())));
        }
        let ups: Vec<Update> = inode_ups.into_iter().collect();
        self.map().apply(base, &ups)
    }
}

/// True when every byte is zero (such blocks are stored as holes).
pub fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(16);
    words.all(|c| u128::from_ne_bytes(c.try_into().expect("16 bytes")) == 0)
        && words.remainder().iter().all(|x| *x == 0)
}
