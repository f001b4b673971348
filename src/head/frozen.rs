//! Versions opened for reading, and [`Opened`]: what a front-end holds for
//! "a live head, or a version of the volume" (a read-write export or mount
//! against a read-only one).

use super::blockmap::BlockMap;
use super::fs::FsReader;
use super::overlay::Space;
use super::{BlockHead, FsHead, View};
use crate::cas::ChunkStore;
use crate::error::{Error, ErrorKind, Result};
use crate::map::MapRoot;
use crate::records::{VersionRecord, VolumeKind};
use std::sync::Arc;

/// A version opened for reading: its record and the chunk store its tree
/// lives in. Cheap to clone; never changes.
#[derive(Clone)]
pub struct Frozen {
    chunks: Arc<ChunkStore>,
    record: VersionRecord,
}

impl Frozen {
    pub fn new(chunks: Arc<ChunkStore>, record: VersionRecord) -> Frozen {
        Frozen { chunks, record }
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
    /// A reader of the state shown.
    pub fn reader(&self) -> FsReader<'_> {
        match self {
            Opened::Live(h) => h.reader(),
            Opened::Version(v) => v.fs(),
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
