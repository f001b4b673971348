//! Byte-addressed reads and writes over a map of fixed-size blocks (block
//! index -> chunk id, absent = zeros) seen through a head's overlay. Serves
//! both a block volume (one map) and the files of an fs volume (a map each).

use super::overlay::{Dirty, Space};
use super::patch::{Patch, Span};
use super::{Found, Part, View, is_zero};
use crate::cas::ChunkStore;
use crate::error::{Error, Result};
use crate::id::ChunkId;
use crate::map::{Map, MapRoot};
use bytes::Bytes;
use rocksdb::WriteBatch;

/// A piece of a read ([`BlockMap::read_pieces`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes, shared with the caches where they came from.
    Bytes(Bytes),
    /// This many zero bytes (a hole).
    Zeros(usize),
}

impl Piece {
    pub fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Zeros(n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The data of block `idx`, stored as the chunk a map value names.
pub(crate) fn stored_block(
    chunks: &ChunkStore,
    v: &[u8],
    idx: u64,
    block_size: u64,
) -> Result<Bytes> {
    let data = chunks.get(&ChunkId::from_slice(v)?)?;
    if data.len() as u64 != block_size {
        return Err(Error::corrupt(format!(
            "block {idx} is {} bytes, expected {block_size}",
            data.len()
        )));
    }
    Ok(data)
}

/// One block map seen through a view: `(space, owner)` names its overlay
/// group and `base` its committed root.
pub struct BlockMap<'a> {
    pub view: View<'a>,
    pub space: Space,
    pub owner: u64,
    pub base: MapRoot,
    pub block_size: u64,
}

impl BlockMap<'_> {
    /// The current content of one block; `None` is a hole (zeros).
    pub fn block(&self, idx: u64) -> Result<Option<Bytes>> {
        self.resolve(idx, self.entry(idx)?)
    }

    /// A block's content from its entry (chunk ids are fetched).
    fn resolve(&self, idx: u64, entry: Option<Found>) -> Result<Option<Bytes>> {
        match entry {
            None => Ok(None),
            Some(Found::Data(d)) => Ok(Some(d)),
            Some(Found::Value(v)) => {
                Ok(Some(stored_block(self.view.chunks(), &v, idx, self.block_size)?))
            }
        }
    }

    /// One block as stored: its chunk id, or data not yet stored as a
    /// chunk; `None` is a hole.
    pub fn entry(&self, idx: u64) -> Result<Option<Found>> {
        self.view.lookup(self.space, self.owner, idx, self.base)
    }

    /// Reads `len` bytes from byte `offset` as pieces, one per block
    /// touched, in order: a whole block's bytes as the store holds them
    /// (shared with the chunk cache when they are there), whole holes
    /// counted, not written. A part of a block (of a hole too) is read
    /// into a buffer of its own size, as [`BlockMap::read`] reads it, so
    /// a piece never holds more than it shows.
    pub fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>> {
        let bs = self.block_size;
        let mut out = Vec::with_capacity(len.div_ceil(bs) as usize + 1);
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let (idx, within) = (pos / bs, pos % bs);
            let n = (bs - within).min(len - done);
            done += n;
            out.push(if n == bs {
                self.block(idx)?.map_or(Piece::Zeros(n as usize), Piece::Bytes)
            } else {
                // A part is copied, never a slice of the block shared: the
                // reader would hold the whole block for the part it asked for.
                let mut part = vec![0u8; n as usize];
                self.read(pos, &mut part)?;
                Piece::Bytes(Bytes::from(part))
            });
        }
        Ok(out)
    }

    /// Fills `buf` from byte `offset`; holes read as zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let bs = self.block_size;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (idx, within) = (pos / bs, (pos % bs) as usize);
            let n = ((bs as usize) - within).min(buf.len() - done);
            let out = &mut buf[done..done + n];
            // Bytes this process logged are read straight into `out`.
            let at = (self.space, self.owner, idx, self.base);
            let entry = match self.view.lookup_part(at.0, at.1, at.2, at.3, (within as u64, out))? {
                Part::Filled => {
                    done += n;
                    continue;
                }
                Part::Found(f) => f,
            };
            match self.resolve(idx, entry)? {
                Some(data) => out.copy_from_slice(&data[within..within + n]),
                None => out.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Adds to `batch` the writes of `data` at `offset` (see
    /// [`BlockMap::patch_entries`]); the caller holds their stripes.
    pub fn write(&self, batch: &mut WriteBatch, offset: u64, data: &[u8]) -> Result<()> {
        self.patch(batch, offset, data.len() as u64, Some(data))
    }

    /// Adds to `batch` the zeroing of `len` bytes at `offset`: whole blocks
    /// become holes (metadata only), partial ones are patched.
    pub fn zero(&self, batch: &mut WriteBatch, offset: u64, len: u64) -> Result<()> {
        self.patch(batch, offset, len, None)
    }

    fn patch(
        &self,
        batch: &mut WriteBatch,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<()> {
        let head = self.view.head()?;
        let overlay = head.overlay();
        for (idx, dirty) in self.patch_entries(offset, len, data)? {
            let dirty = head.over(self.space, self.owner, idx, dirty)?;
            overlay.put(batch, self.space, self.owner, idx, &dirty);
        }
        Ok(())
    }

    /// The block entries that write `data` (zeros if `None`) over `len`
    /// bytes at `offset`: whole blocks are logged as they are; data for
    /// part of a block (of a block volume's map or of a file) is a span
    /// added to its patch (`patch.rs`); zeros for part of one, or data
    /// for a full patch's, read, patch and log the whole block. The
    /// caller holds the blocks' stripes.
    pub(crate) fn patch_entries(
        &self,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<Vec<(u64, Dirty)>> {
        let bs = self.block_size;
        let head = self.view.head()?;
        let vol = head.record().id;
        let mut out = Vec::with_capacity(len.div_ceil(bs) as usize + 1);
        let log = |data: &[u8]| -> Result<Dirty> {
            Ok(Dirty::Logged(head.storage.log.append(vol, data)?))
        };
        // Whole blocks of data in a row go to the log in one write: the
        // first block's index and its offset in `data`, and how many.
        let mut run: Option<(u64, usize, usize)> = None;
        let end_run = |run: &mut Option<(u64, usize, usize)>, out: &mut Vec<(u64, Dirty)>| {
            let Some((first, at, count)) = run.take() else { return Ok(()) };
            let bytes = &data.expect("runs are of data")[at..at + count * bs as usize];
            let refs = head.storage.log.append_blocks(vol, bytes, bs as usize)?;
            out.extend(
                refs.into_iter().enumerate().map(|(i, r)| (first + i as u64, Dirty::Logged(r))),
            );
            Ok::<_, Error>(())
        };
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let (idx, within) = (pos / bs, pos % bs);
            let n = (bs - within).min(len - done);
            let src = data.map(|d| &d[done as usize..(done + n) as usize]);
            if n == bs && src.is_some_and(|s| !is_zero(s)) {
                // Anything else ended the run: it reaches this block.
                match run.as_mut() {
                    Some((_, _, count)) => *count += 1,
                    None => run = Some((idx, done as usize, 1)),
                }
                done += n;
                continue;
            }
            end_run(&mut run, &mut out)?;
            let dirty = if n == bs {
                Dirty::Delete
            } else if let (Some(s), Some(mut patch)) = (src, self.patchable(idx)?) {
                let at = u32::try_from(within).map_err(|_| Error::invalid("block over 4 GiB"))?;
                patch.spans.push(Span { at, r: head.storage.log.append(vol, s)? });
                head.prune_patch(&mut patch)?;
                Dirty::Patch(Box::new(patch))
            } else {
                let mut block = match self.block(idx)? {
                    Some(b) => b.to_vec(),
                    None => vec![0u8; bs as usize],
                };
                let range = within as usize..(within + n) as usize;
                match src {
                    Some(s) => block[range].copy_from_slice(s),
                    None => block[range].fill(0),
                }
                if is_zero(&block) { Dirty::Delete } else { log(&block)? }
            };
            out.push((idx, dirty));
            done += n;
        }
        end_run(&mut run, &mut out)?;
        Ok(out)
    }

    /// The patch a write of part of block `idx` adds its span to, if it
    /// may (see `patch.rs`): blocks of a block volume's map or of a file,
    /// while the patch has room; `None`: the write logs the whole block.
    /// The caller holds the block's stripe.
    fn patchable(&self, idx: u64) -> Result<Option<Patch>> {
        let head = self.view.head()?;
        let cur = match (self.space, head.block()) {
            (Space::Root, Some(_)) => head.block_entry(idx)?,
            (Space::File, None) => head.overlay().get(Space::File, self.owner, idx)?,
            _ => return Ok(None),
        };
        let patch = Patch::over(cur);
        Ok(patch.has_room().then_some(patch))
    }

    /// Adds to `batch` the removal of every block at or after `first`
    /// (truncation). Cost: the blocks that exist there.
    pub fn drop_from(&self, batch: &mut WriteBatch, first: u64) -> Result<()> {
        let overlay = self.view.head()?.overlay();
        let mut keys = Vec::new();
        Map::new(self.view.chunks()).range(self.base, first, u64::MAX, &mut |k, _| {
            keys.push(k);
            true
        })?;
        for (k, _) in overlay.scan(self.space, self.owner, first, u64::MAX)? {
            keys.push(k);
        }
        for k in keys {
            overlay.put(batch, self.space, self.owner, k, &Dirty::Delete);
        }
        Ok(())
    }

    /// Block indexes that may hold data (overlay or base), in order.
    pub fn allocated(&self, first: u64, last: u64) -> Result<Vec<u64>> {
        let mut set = std::collections::BTreeSet::new();
        Map::new(self.view.chunks()).range(self.base, first, last, &mut |k, _| {
            set.insert(k);
            true
        })?;
        let View::Live(head) = self.view else { return Ok(set.into_iter().collect()) };
        if self.space == Space::Root {
            if let Some(b) = head.block() {
                set.retain(|k| !b.in_zeroed(*k));
            }
        }
        for (k, d) in head.overlay().scan(self.space, self.owner, first, last)? {
            match d {
                Dirty::Delete => set.remove(&k),
                _ => set.insert(k),
            };
        }
        if self.space == Space::Root {
            if let Some(b) = head.block() {
                b.pending_allocated(&mut set, first, last);
            }
        }
        Ok(set.into_iter().collect())
    }

    /// How many blocks of `[first, last]` may hold data, as
    /// [`BlockMap::allocated`] finds them, without collecting them: the
    /// overlay's entries are gathered, the stored map's streamed. `None`
    /// once more than `max` are counted. For file block maps.
    pub fn count_allocated(&self, first: u64, last: u64, max: u64) -> Result<Option<u64>> {
        if self.space == Space::Root {
            let n = self.allocated(first, last)?.len() as u64;
            return Ok((n <= max).then_some(n));
        }
        let mut over = std::collections::BTreeMap::new();
        if let View::Live(head) = self.view {
            for (k, d) in head.overlay().scan(self.space, self.owner, first, last)? {
                over.insert(k, !matches!(d, Dirty::Delete));
            }
        }
        let mut n = over.values().filter(|held| **held).count() as u64;
        Map::new(self.view.chunks()).range(self.base, first, last, &mut |k, _| {
            if !over.contains_key(&k) {
                n += 1;
            }
            n <= max
        })?;
        Ok((n <= max).then_some(n))
    }

    /// The first block at or after `first` (up to `last`) that may hold
    /// data (`data`) or that is a hole (`!data`); `None` if there is none
    /// up to `last`. Cost: the allocated blocks passed over.
    pub fn next(&self, first: u64, last: u64, data: bool) -> Result<Option<u64>> {
        const WINDOW: u64 = 4096;
        let mut at = first;
        while at <= last {
            let end = at.saturating_add(WINDOW - 1).min(last);
            let found = self.allocated(at, end)?;
            let hit = if data {
                found.first().copied()
            } else {
                // The first index of the window missing from the list.
                let mut want = at;
                for k in found {
                    if k != want {
                        break;
                    }
                    want += 1;
                }
                (want <= end).then_some(want)
            };
            if hit.is_some() || end == u64::MAX {
                return Ok(hit);
            }
            at = end + 1;
        }
        Ok(None)
    }
}
