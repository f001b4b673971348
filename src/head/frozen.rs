//! Versions opened for reading, and [`Opened`]: what a front-end holds for
//! "a live head, or a version of the volume" (a read-write export or mount
//! against a read-only one).
//!
//! Every [`Frozen`] is counted in its store's [`Readers`] while it lives
//! (what reads a version tree without one, the FUSE history tree and
//! diffs, is not):
//! a version deleted while a reader has it open (on this host, or on
//! another host of a shared store) keeps its data until the last reader
//! closes it, since GC and the absorption of other hosts' GC mark from
//! these roots too (`graph::reach::roots_with_readers`).

use super::blockmap::{BlockMap, Piece};
use super::fs::FsReader;
use super::overlay::Space;
use super::{BlockHead, FsHead, View};
use crate::cas::ChunkStore;
use crate::error::{Error, ErrorKind, Result};
use crate::map::MapRoot;
use crate::records::{VersionRecord, VolumeKind};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The versions this process has open for reading: the roots of every
/// live [`Frozen`], whether or not a record still names them.
#[derive(Default)]
pub struct Readers {
    open: Mutex<HashMap<u64, (VolumeKind, MapRoot)>>,
    next: AtomicU64,
}

impl Readers {
    /// Counts `record`'s root as open until the returned value is dropped.
    fn hold(self: &Arc<Self>, record: &VersionRecord) -> Held {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.lock().insert(token, (record.kind, record.root));
        Held { readers: self.clone(), token }
    }

    /// The root of every version open now, with its volume's kind.
    pub fn roots(&self) -> Vec<(VolumeKind, MapRoot)> {
        self.open.lock().values().copied().collect()
    }
}

/// One open version in [`Readers`].
struct Held {
    readers: Arc<Readers>,
    token: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.readers.open.lock().remove(&self.token);
    }
}

/// A version opened for reading: its record and the chunk store its tree
/// lives in. Cheap to clone; never changes.
#[derive(Clone)]
pub struct Frozen {
    chunks: Arc<ChunkStore>,
    record: VersionRecord,
    /// Counted open (in its store's [`Readers`]) while any clone lives.
    _held: Arc<Held>,
}

impl Frozen {
    /// Opens `record` of the store `storage` is. Counted open first, then
    /// looked up again: a GC or absorption that marks before the count
    /// does so while the record still names the version, and one that
    /// forgets it before then makes this fail as deleted.
    pub fn new(storage: &super::Storage, record: VersionRecord) -> Result<Frozen> {
        let held = Arc::new(storage.readers.hold(&record));
        storage.records.version(&record.id)?;
        Ok(Frozen { chunks: storage.chunks.clone(), record, _held: held })
    }

    pub fn record(&self) -> &VersionRecord {
        &self.record
    }

    fn block_map(&self) -> Result<BlockMap<'_>> {
        if self.record.kind != VolumeKind::Block {
            return Err(Error::invalid("not a block volume version"));
        }
        Ok(frozen_blocks(&self.chunks, self.record.root, self.record.block_size))
    }

    /// Reads `buf.len()` bytes at `offset` of a block volume's version.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let map = self.block_map()?;
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.record.size) {
            return Err(Error::new(ErrorKind::NoSpace, "read beyond the end of the version"));
        }
        map.read(offset, buf)
    }

    /// [`FrozenReader::read_at`] as pieces ([`BlockMap::read_pieces`]).
    pub fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>> {
        let map = self.block_map()?;
        if offset.checked_add(len).is_none_or(|e| e > self.record.size) {
            return Err(Error::new(ErrorKind::NoSpace, "read beyond the end of the version"));
        }
        map.read_pieces(offset, len)
    }

    /// Block indexes in `first..=last` of a block volume's version that
    /// hold data, in order.
    pub fn allocated_blocks_in(&self, first: u64, last: u64) -> Result<Vec<u64>> {
        self.block_map()?.allocated(first, last)
    }

    /// A reader of an fs volume's version.
    pub fn fs(&self) -> FsReader<'_> {
        FsReader::frozen(&self.chunks, self.record.root, self.record.block_size)
    }
}

/// The blocks of a frozen block-volume root.
fn frozen_blocks(chunks: &ChunkStore, root: MapRoot, block_size: u32) -> BlockMap<'_> {
    BlockMap {
        view: View::Frozen(chunks),
        space: Space::Root,
        owner: 0,
        base: root,
        block_size: block_size as u64,
    }
}

/// Block indexes that hold data in a frozen block-volume root.
pub(crate) fn allocated_in_root(
    chunks: &ChunkStore,
    root: MapRoot,
    block_size: u32,
) -> Result<Vec<u64>> {
    frozen_blocks(chunks, root, block_size).allocated(0, u64::MAX)
}

/// A live head (read-write) or a frozen version (read-only) of a volume.
#[derive(Clone)]
pub enum Opened<H> {
    Live(H),
    Version(Frozen),
}

fn read_only() -> Error {
    Error::read_only("a version is read-only")
}

impl Opened<BlockHead> {
    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        match self {
            Opened::Live(h) => h.read_at(offset, buf),
            Opened::Version(v) => v.read_at(offset, buf),
        }
    }

    /// Reads `len` bytes at `offset` as pieces, sharing what is in memory
    /// ([`BlockMap::read_pieces`]).
    pub fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>> {
        match self {
            Opened::Live(h) => h.read_pieces(offset, len),
            Opened::Version(v) => v.read_pieces(offset, len),
        }
    }

    /// Block indexes in `first..=last` that hold data, in order.
    pub fn allocated_blocks_in(&self, first: u64, last: u64) -> Result<Vec<u64>> {
        match self {
            Opened::Live(h) => h.allocated_blocks_in(first, last),
            Opened::Version(v) => v.allocated_blocks_in(first, last),
        }
    }

    /// (size in bytes, block size).
    pub fn geometry(&self) -> (u64, u32) {
        match self {
            Opened::Live(h) => (h.record().size, h.record().block_size),
            Opened::Version(v) => (v.record.size, v.record.block_size),
        }
    }

    /// The head to write to (read-only for a version).
    pub fn live(&self) -> Result<&BlockHead> {
        match self {
            Opened::Live(h) => Ok(h),
            Opened::Version(_) => Err(read_only()),
        }
    }
}

impl Opened<FsHead> {
    /// A reader of the state shown (of a live head: see [`FsHead::reader`]).
    pub fn reader(&self) -> FsReader<'_> {
        match self {
            Opened::Live(h) => h.reader(),
            Opened::Version(v) => v.fs(),
        }
    }

    /// Runs `read` on a reader of the state shown, from one state (see
    /// [`FsHead::read`]).
    pub fn read<T>(&self, mut read: impl FnMut(FsReader<'_>) -> Result<T>) -> Result<T> {
        match self {
            Opened::Live(h) => h.read(read),
            Opened::Version(v) => read(v.fs()),
        }
    }

    pub fn block_size(&self) -> u32 {
        match self {
            Opened::Live(h) => h.record().block_size,
            Opened::Version(v) => v.record.block_size,
        }
    }

    /// The head to change (read-only for a version).
    pub fn live(&self) -> Result<&FsHead> {
        match self {
            Opened::Live(h) => Ok(h),
            Opened::Version(_) => Err(read_only()),
        }
    }
}
