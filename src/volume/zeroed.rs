//! Range tombstones for block volumes: zeroing or trimming a large run of
//! whole blocks records one range instead of one overlay entry per block,
//! so discarding a whole 1 TiB device (mkfs does) costs a few RocksDB
//! operations, not 16 million.
//!
//! Stored as overlay entries in [`Space::Zeroed`] (key = first block,
//! value = end block, exclusive), kept disjoint and merged, and mirrored in
//! memory. Block entries written after a range override it (the range's
//! creation deleted every older block entry inside it with a range delete).

use super::Head;
use crate::error::{Error, Result};
use crate::index::CF_OVERLAY;
use crate::map::Map;
use crate::overlay::{self, Dirty, Space};
use bytes::Bytes;
use rocksdb::WriteBatch;
use std::collections::BTreeMap;

/// Runs of at least this many whole blocks become one range tombstone.
pub const RANGE_MIN_BLOCKS: u64 = 256;

pub(crate) fn load(head: &Head) -> Result<BTreeMap<u64, u64>> {
    let mut out = BTreeMap::new();
    for (start, d) in head.overlay().scan(Space::Zeroed, 0, 0, u64::MAX)? {
        let Dirty::Value(v) = d else {
            return Err(Error::corrupt("zeroed range entry is not a value"));
        };
        let end = u64::from_le_bytes(
            v[..].try_into().map_err(|_| Error::corrupt("zeroed range end is not 8 bytes"))?,
        );
        out.insert(start, end);
    }
    Ok(out)
}

impl Head {
    /// Whether block `idx` lies in a range zeroed since the last checkpoint.
    pub(crate) fn in_zeroed(&self, idx: u64) -> bool {
        let z = self.zeroed.read();
        z.range(..=idx).next_back().is_some_and(|(_, end)| idx < *end)
    }

    /// Adds to `batch` the zeroing of blocks `[first, end)` as one range:
    /// drops their block entries and merges the range with its neighbours.
    /// Returns the merged range to publish with [`Head::publish_zeroed`]
    /// once the batch is written. The caller holds every block stripe.
    pub(crate) fn zero_blocks(&self, batch: &mut WriteBatch, first: u64, end: u64) -> (u64, u64) {
        let cf = self.store.index().cf(CF_OVERLAY);
        let vol = self.record().id;
        batch.delete_range_cf(
            cf,
            &overlay::key(vol, Space::Root, 0, first)[..],
            &overlay::key(vol, Space::Root, 0, end)[..],
        );
        let (mut a, mut b) = (first, end);
        let z = self.zeroed.read();
        for (&s, &e) in z.range(..=end) {
            if e >= first {
                a = a.min(s);
                b = b.max(e);
                batch.delete_cf(cf, overlay::key(vol, Space::Zeroed, 0, s));
            }
        }
        let d = Dirty::Value(Bytes::copy_from_slice(&b.to_le_bytes()));
        self.overlay().put(batch, Space::Zeroed, 0, a, &d);
        (a, b)
    }

    pub(crate) fn publish_zeroed(&self, (a, b): (u64, u64)) {
        let mut z = self.zeroed.write();
        let overlapping: Vec<u64> =
            z.range(..=b).filter(|(_, e)| **e >= a).map(|(s, _)| *s).collect();
        for s in overlapping {
            z.remove(&s);
        }
        z.insert(a, b);
    }

    /// Forgets the ranges (their entries went with the overlay).
    pub(crate) fn clear_zeroed(&self) {
        self.zeroed.write().clear();
    }

    /// Keys of `base` that the zeroed ranges cover: deletes for the fold,
    /// changes for a diff. Cost: the blocks that exist there.
    pub(crate) fn zeroed_base_keys(&self, base: crate::map::MapRoot) -> Result<Vec<u64>> {
        let ranges: Vec<(u64, u64)> = self.zeroed.read().iter().map(|(s, e)| (*s, *e)).collect();
        let map = Map::new(self.store.chunks().as_ref());
        let mut keys = Vec::new();
        for (s, e) in ranges {
            map.range(base, s, e - 1, &mut |k, _| {
                keys.push(k);
                true
            })?;
        }
        Ok(keys)
    }
}
