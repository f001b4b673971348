//! Block volumes: byte-addressed read, write, trim and write-zeroes over
//! fixed-size blocks (default 64 KiB). What the NBD server serves.
//!
//! Beyond the shared core, a block head keeps range tombstones
//! ([`zeroed`]) and, in btrfs consistency mode, a pending layer of writes
//! not yet sealed by a safe point ([`deferred`]).

mod deferred;
mod zeroed;

pub use zeroed::merge_into as merge_range;

pub use deferred::LayerStats;
pub(crate) use deferred::PendingLookup;
pub(crate) use zeroed::{base_keys, range_of};

use super::blockmap::{BlockMap, Piece};
use super::overlay::{Dirty, Space};
use super::{Head, View};
use crate::error::{Error, ErrorKind, Result};
use crate::records::VolumeKind;
use parking_lot::{Mutex, RwLock};
use rocksdb::WriteBatch;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

/// What only a block head keeps (see [`Head::block`]).
#[derive(Default)]
pub(crate) struct State {
    /// Union of the zeroed block ranges (see `zeroed.rs`): start -> end.
    zeroed: RwLock<BTreeMap<u64, u64>>,
    /// Key of the next range entry.
    zero_seq: AtomicU64,
    /// Deferred persistence (see `deferred.rs`): `None` writes go straight
    /// to the overlay.
    deferred: Mutex<Option<deferred::Deferred>>,
    /// `deferred` is `Some` (written under its lock; read without it).
    on: AtomicBool,
}

/// A live block volume, shared by everything in this process that uses it.
#[derive(Clone)]
pub struct BlockHead(Arc<Head>);

impl BlockHead {
    /// The block API of `head`; fails for an fs volume.
    pub(crate) fn new(head: Arc<Head>) -> Result<BlockHead> {
        head.expect_kind(VolumeKind::Block)?;
        Ok(BlockHead(head))
    }

    /// The shared core (record, state, checkpoint locks).
    pub fn head(&self) -> &Arc<Head> {
        &self.0
    }

    pub fn record(&self) -> &crate::records::VolumeRecord {
        self.0.record()
    }

    fn state(&self) -> &State {
        self.0.block().expect("a BlockHead is made of block volumes only")
    }

    fn block_map(&self) -> BlockMap<'_> {
        BlockMap {
            view: View::Live(&self.0),
            space: Space::Root,
            owner: 0,
            base: self.0.state().root,
            block_size: self.record().block_size as u64,
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.record().size;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::new(
                ErrorKind::NoSpace,
                format!("range {offset}+{len} is beyond the end of the volume ({size} bytes)"),
            )),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let _gate = self.0.gate.read();
        self.0.check_live()?;
        self.block_map().read(offset, buf)
    }

    /// Reads `len` bytes at `offset` as pieces, sharing what is in memory
    /// ([`crate::head::blockmap::BlockMap::read_pieces`]).
    pub fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>> {
        self.check_range(offset, len)?;
        let _gate = self.0.gate.read();
        self.0.check_live()?;
        self.block_map().read_pieces(offset, len)
    }

    /// Writes `data` at `offset`. Durable after [`BlockHead::flush`] or a
    /// checkpoint, or with deferred persistence after [`BlockHead::seal`].
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mutate(offset, data.len() as u64, Some(data))
    }

    /// Zeroes a range; whole blocks become holes without writing data, and
    /// large runs of them one range tombstone.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let bs = self.record().block_size as u64;
        let (first, end) = (offset.div_ceil(bs), offset.saturating_add(len) / bs);
        if end.saturating_sub(first) < zeroed::RANGE_MIN_BLOCKS {
            return self.mutate(offset, len, None);
        }
        self.check_range(offset, len)?;
        let head = &self.0;
        let _gate = head.gate.read();
        head.check_live()?;
        let m = self.block_map();
        // Every stripe: no read-modify-write may see the range half published.
        let _stripes = head.lock_block_range(0, first, end);
        let mut edges = Vec::new();
        if offset < first * bs {
            edges.extend(m.patch_entries(offset, first * bs - offset, None)?);
        }
        if end * bs < offset + len {
            edges.extend(m.patch_entries(end * bs, offset + len - end * bs, None)?);
        }
        if self.defer_zero_range(first, end, len)? {
            self.defer_blocks(&edges, 0)?;
            return Ok(());
        }
        let mut b = WriteBatch::default();
        for (k, d) in edges {
            let d = head.over(Space::Root, 0, k, d)?;
            head.overlay().put(&mut b, Space::Root, 0, k, &d);
        }
        let range = self.zero_blocks(&mut b, first, end);
        head.db().write(b, false)?;
        self.state().publish_zeroed(range);
        Ok(())
    }

    /// Discards a range. forkfs always reads discarded ranges as zeros.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len)
    }

    /// Writes `data` (zeros if `None`) over `len` bytes at `offset`.
    fn mutate(&self, offset: u64, len: u64, data: Option<&[u8]>) -> Result<()> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let head = &self.0;
        head.wait_for_uploads();
        let _gate = head.gate.read();
        head.check_live()?;
        let map = self.block_map();
        let bs = map.block_size;
        let (first, last) = (offset / bs, (offset + len - 1) / bs);
        let _stripes = head.lock_block_range(0, first, last);
        let entries = map.patch_entries(offset, len, data)?;
        if self.defer_blocks(&entries, len)? {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for (k, d) in entries {
            let d = head.over(Space::Root, 0, k, d)?;
            head.overlay().put(&mut batch, Space::Root, 0, k, &d);
        }
        head.db().write(batch, false)
    }

    /// Makes every acknowledged write durable on local disk.
    pub fn flush(&self) -> Result<()> {
        self.0.flush()
    }

    /// True when nothing was written since the last checkpoint.
    pub fn is_clean(&self) -> Result<bool> {
        self.0.is_clean()
    }

    /// Volume size in bytes.
    pub fn size(&self) -> u64 {
        self.record().size
    }

    /// Whether writes wait in the pending layer for a seal (btrfs mode).
    pub fn is_deferred(&self) -> bool {
        self.state().is_deferred()
    }

    /// Bytes written since the last seal (0 when not deferred).
    pub fn pending_bytes(&self) -> u64 {
        self.state().pending_bytes()
    }

    /// The generation of the last seal, if it named one.
    pub fn sealed_generation(&self) -> Option<u64> {
        self.state().sealed_generation()
    }

    /// Indexes of blocks that hold data (not holes), in order.
    pub fn allocated_blocks(&self) -> Result<Vec<u64>> {
        self.allocated_blocks_in(0, u64::MAX)
    }

    /// Indexes of blocks in `first..=last` that hold data, in order.
    pub fn allocated_blocks_in(&self, first: u64, last: u64) -> Result<Vec<u64>> {
        let _gate = self.0.gate.read();
        self.block_map().allocated(first, last)
    }
}

/// A [`BlockHead`] that does not keep the head open.
#[derive(Clone)]
pub struct WeakBlockHead(std::sync::Weak<Head>);

impl WeakBlockHead {
    pub fn upgrade(&self) -> Option<BlockHead> {
        self.0.upgrade().map(BlockHead)
    }
}

impl BlockHead {
    pub fn downgrade(&self) -> WeakBlockHead {
        WeakBlockHead(Arc::downgrade(&self.0))
    }
}

impl Head {
    /// The entry a write to block `key` of a block volume goes over: the
    /// pending layer's, else the overlay's (a zeroed block's is a hole);
    /// `None`: the base map's value.
    pub(crate) fn block_entry(&self, key: u64) -> Result<Option<Dirty>> {
        let state = self.block().ok_or_else(|| Error::invalid("not a block volume"))?;
        match state.pending_lookup(key) {
            PendingLookup::Entry(d) => return Ok(Some(d)),
            PendingLookup::Zero => return Ok(Some(Dirty::Delete)),
            PendingLookup::Absent => {}
        }
        match self.overlay().get(Space::Root, 0, key)? {
            None if state.in_zeroed(key) => Ok(Some(Dirty::Delete)),
            cur => Ok(cur),
        }
    }

    /// The block API of this head, if it is a block volume's.
    pub(crate) fn as_block(self: &Arc<Self>) -> Option<BlockHead> {
        BlockHead::new(self.clone()).ok()
    }
}
