//! Range tombstones for block volumes: zeroing or trimming a large run of
//! whole blocks records one range instead of one overlay entry per block,
//! so discarding a whole 1 TiB device (mkfs does) costs a few RocksDB
//! operations, not 16 million.
//!
//! Stored as overlay entries in [`Space::Zeroed`], one per operation (key =
//! a sequence number, value = first block | end block), never merged or
//! changed; memory holds their union for lookups. Block entries written
//! after a range override it (the range's creation deleted every older
//! block entry inside it with a range delete).

use super::{BlockHead, State};
use crate::cas::ChunkStore;
use crate::db::CF_OVERLAY;
use crate::error::{Error, Result};
use crate::head::Head;
use crate::head::overlay::{self, Dirty, Space};
use crate::map::{Map, MapRoot};
use bytes::Bytes;
use rocksdb::WriteBatch;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// Runs of at least this many whole blocks become one range tombstone.
pub const RANGE_MIN_BLOCKS: u64 = 256;

/// Reads the range entries of a head: their union (for lookups) and the
/// next free entry key.
fn load(head: &Head) -> Result<(BTreeMap<u64, u64>, u64)> {
    let mut union = BTreeMap::new();
    let mut next = 0;
    for (seq, d) in head.overlay().scan(Space::Zeroed, 0, 0, u64::MAX)? {
        let Dirty::Value(v) = d else {
            return Err(Error::corrupt("zeroed range entry is not a value"));
        };
        let (a, b) = range_of(&v)?;
        merge_into(&mut union, a, b);
        next = next.max(seq + 1);
    }
    Ok((union, next))
}

/// Adds `[a, b)` to a union of disjoint ranges (start -> end), joining
/// the ranges it touches.
pub fn merge_into(z: &mut BTreeMap<u64, u64>, a: u64, b: u64) {
    let (mut lo, mut hi) = (a, b);
    let touching: Vec<(u64, u64)> =
        z.range(..=b).filter(|(_, e)| **e >= a).map(|(s, e)| (*s, *e)).collect();
    for (s, e) in touching {
        lo = lo.min(s);
        hi = hi.max(e);
        z.remove(&s);
    }
    z.insert(lo, hi);
}

/// Removes `[a, b)` from a union of disjoint ranges, cutting the ranges
/// it overlaps at its edges.
pub(super) fn subtract_from(z: &mut BTreeMap<u64, u64>, a: u64, b: u64) {
    if b <= a {
        return;
    }
    let hit: Vec<(u64, u64)> =
        z.range(..b).filter(|(_, e)| **e > a).map(|(s, e)| (*s, *e)).collect();
    for (s, e) in hit {
        z.remove(&s);
        if s < a {
            z.insert(s, a);
        }
        if b < e {
            z.insert(b, e);
        }
    }
}

impl State {
    /// Whether block `idx` lies in a range zeroed since the last checkpoint.
    pub(crate) fn in_zeroed(&self, idx: u64) -> bool {
        let z = self.zeroed.read();
        z.range(..=idx).next_back().is_some_and(|(_, end)| idx < *end)
    }

    pub(crate) fn publish_zeroed(&self, (a, b): (u64, u64)) {
        merge_into(&mut self.zeroed.write(), a, b);
    }

    /// Keys of `base` that the zeroed ranges cover (changes for a diff).
    pub(crate) fn zeroed_base_keys(
        &self,
        map: Map<'_, ChunkStore>,
        base: MapRoot,
    ) -> Result<Vec<u64>> {
        let ranges: Vec<(u64, u64)> = self.zeroed.read().iter().map(|(s, e)| (*s, *e)).collect();
        base_keys(map, base, &ranges)
    }
}

impl BlockHead {
    /// Adds to `batch` the zeroing of blocks `[first, end)` as one range
    /// entry: drops the block entries inside it and records the range under
    /// a key of its own. Range entries are never changed or merged on disk,
    /// so every block entry inside a range is newer than the range, and a
    /// checkpoint can fold them in any order. Publish the range with
    /// [`State::publish_zeroed`] once the batch is written; the caller holds
    /// every block stripe.
    pub(crate) fn zero_blocks(&self, batch: &mut WriteBatch, first: u64, end: u64) -> (u64, u64) {
        let head = self.head();
        let cf = head.db().cf(CF_OVERLAY);
        let vol = head.record().id;
        batch.delete_range_cf(
            cf,
            &overlay::key(vol, Space::Root, 0, first)[..],
            &overlay::key(vol, Space::Root, 0, end)[..],
        );
        let seq = self.state().zero_seq.fetch_add(1, Ordering::Relaxed);
        let mut v = first.to_le_bytes().to_vec();
        v.extend_from_slice(&end.to_le_bytes());
        head.overlay().put(batch, Space::Zeroed, 0, seq, &Dirty::Value(Bytes::from(v)));
        (first, end)
    }
}

impl Head {
    /// Re-reads a block volume's ranges from the overlay after a commit
    /// changed it (nothing to do for an fs volume).
    pub(crate) fn reload_zeroed(&self) -> Result<()> {
        let Some(state) = self.block() else { return Ok(()) };
        let (union, next) = load(self)?;
        *state.zeroed.write() = union;
        state.zero_seq.fetch_max(next, Ordering::Relaxed);
        Ok(())
    }
}

/// The blocks `[start, end)` of a range entry's value (start u64 | end u64).
pub(crate) fn range_of(v: &[u8]) -> Result<(u64, u64)> {
    if v.len() != 16 {
        return Err(Error::corrupt("zeroed range entry is not 16 bytes"));
    }
    let a = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(v[8..].try_into().expect("8 bytes"));
    if b <= a {
        return Err(Error::corrupt("zeroed range entry is empty"));
    }
    Ok((a, b))
}

/// Keys of `base` inside the ranges `[start, end)`. Cost: the blocks that exist there.
pub(crate) fn base_keys(
    map: Map<'_, ChunkStore>,
    base: MapRoot,
    ranges: &[(u64, u64)],
) -> Result<Vec<u64>> {
    let mut keys = Vec::new();
    for &(s, e) in ranges {
        if e <= s {
            return Err(Error::corrupt("empty zeroed range"));
        }
        map.range(base, s, e - 1, &mut |k, _| {
            keys.push(k);
            true
        })?;
    }
    Ok(keys)
}
