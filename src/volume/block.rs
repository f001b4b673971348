//! The block volume API: byte-addressed read, write, trim and write-zeroes
//! over fixed-size blocks (default 64 KiB). Used by the NBD server.

use super::{BlockMap, Head, View};
use crate::error::{Error, Result};
use crate::overlay::Space;
use crate::version::VolumeKind;
use rocksdb::WriteBatch;

impl Head {
    fn block_map(&self) -> Result<BlockMap<'_>> {
        if self.kind() != VolumeKind::Block {
            return Err(Error::invalid(format!(
                "volume {} is not a block volume",
                self.record().name
            )));
        }
        Ok(BlockMap {
            view: View::Live(self),
            space: Space::Root,
            owner: 0,
            base: self.state().root,
            block_size: self.record().block_size as u64,
        })
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.record().size;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::new(
                crate::ErrorKind::NoSpace,
                format!("range {offset}+{len} is beyond the end of the volume ({size} bytes)"),
            )),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let _gate = self.gate.read();
        self.check_live()?;
        self.block_map()?.read(offset, buf)
    }

    /// Writes `data` at `offset`. Durable after [`Head::flush`] or a
    /// checkpoint, or with deferred persistence after [`Head::seal`].
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mutate(offset, data.len() as u64, Some(data))
    }

    /// Zeroes a range; whole blocks become holes without writing data, and
    /// large runs of them one range tombstone.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let bs = self.record().block_size as u64;
        let (first, end) = (offset.div_ceil(bs), offset.saturating_add(len) / bs);
        if end.saturating_sub(first) < super::zeroed::RANGE_MIN_BLOCKS {
            return self.mutate(offset, len, None);
        }
        self.check_range(offset, len)?;
        let _gate = self.gate.read();
        self.check_live()?;
        let m = self.block_map()?;
        // Every stripe: no read-modify-write may see the range half published.
        let _stripes = self.lock_block_range(0, first, end);
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
        for (k, d) in &edges {
            self.overlay().put(&mut b, Space::Root, 0, *k, d);
        }
        let range = self.zero_blocks(&mut b, first, end);
        self.store.index().write(b, false)?;
        self.publish_zeroed(range);
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
        self.wait_for_uploads();
        let _gate = self.gate.read();
        self.check_live()?;
        let map = self.block_map()?;
        let bs = map.block_size;
        let (first, last) = (offset / bs, (offset + len - 1) / bs);
        let _stripes = self.lock_block_range(0, first, last);
        let entries = map.patch_entries(offset, len, data)?;
        if self.defer_blocks(&entries, len)? {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for (k, d) in &entries {
            self.overlay().put(&mut batch, Space::Root, 0, *k, d);
        }
        self.store.index().write(batch, false)
    }

    /// Makes every acknowledged write durable on local disk.
    pub fn flush(&self) -> Result<()> {
        self.store.sync()
    }

    /// Volume size in bytes.
    pub fn size(&self) -> u64 {
        self.record().size
    }
}

impl Head {
    /// Indexes of blocks that hold data (not holes), in order.
    pub fn allocated_blocks(&self) -> Result<Vec<u64>> {
        self.allocated_blocks_in(0, u64::MAX)
    }

    /// Indexes of blocks in `first..=last` that hold data, in order.
    pub fn allocated_blocks_in(&self, first: u64, last: u64) -> Result<Vec<u64>> {
        let _gate = self.gate.read();
        self.block_map()?.allocated(first, last)
    }
}

/// Reads from a frozen version of a block volume.
pub fn read_version(
    store: &crate::store::Store,
    version: &crate::version::VersionRecord,
    offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    if version.kind != VolumeKind::Block {
        return Err(Error::invalid("not a block volume version"));
    }
    let end = offset.checked_add(buf.len() as u64);
    if end.is_none_or(|e| e > version.size) {
        return Err(Error::new(crate::ErrorKind::NoSpace, "read beyond the end of the version"));
    }
    let map = BlockMap {
        view: View::Frozen(store),
        space: Space::Root,
        owner: 0,
        base: version.root,
        block_size: version.block_size as u64,
    };
    map.read(offset, buf)
}

/// Block indexes of a frozen version that hold data.
pub fn allocated_in_version(
    store: &crate::store::Store,
    version: &crate::version::VersionRecord,
) -> Result<Vec<u64>> {
    allocated_in_version_range(store, version, 0, u64::MAX)
}

/// Block indexes in `first..=last` of a frozen version that hold data.
pub fn allocated_in_version_range(
    store: &crate::store::Store,
    version: &crate::version::VersionRecord,
    first: u64,
    last: u64,
) -> Result<Vec<u64>> {
    allocated_in_root_range(store, version.root, version.block_size, first, last)
}

/// Block indexes that hold data in a frozen block-volume root.
pub fn allocated_in_root(
    store: &crate::store::Store,
    root: crate::map::MapRoot,
    block_size: u32,
) -> Result<Vec<u64>> {
    allocated_in_root_range(store, root, block_size, 0, u64::MAX)
}

fn allocated_in_root_range(
    store: &crate::store::Store,
    root: crate::map::MapRoot,
    block_size: u32,
    first: u64,
    last: u64,
) -> Result<Vec<u64>> {
    let map = BlockMap {
        view: View::Frozen(store),
        space: Space::Root,
        owner: 0,
        base: root,
        block_size: block_size as u64,
    };
    map.allocated(first, last)
}
