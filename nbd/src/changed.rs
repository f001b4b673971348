//! The `forkfs:changed-since:` answers: the ranges where an export differs
//! from a base version, computed once (a Merkle diff, tens to hundreds of
//! milliseconds) and served to every BLOCK_STATUS until the export's head
//! changes. Entries are keyed by (export, base version, the export's
//! change count, the server's restore count), so a write or a restore
//! makes the old entry unreachable and it ages out; the cache is an LRU
//! bounded by the bytes of its ranges.

use forkfs::{Result, VersionId};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of cached ranges over all exports.
pub const CAPACITY: u64 = 64 << 20;

/// Changed byte ranges `(offset, len)`, sorted by offset.
pub type Ranges = Vec<(u64, u64)>;

type Key = (u64, VersionId, u64, u64);

#[derive(Clone)]
struct Weight;

impl quick_cache::Weighter<Key, Arc<Ranges>> for Weight {
    fn weight(&self, _: &Key, r: &Arc<Ranges>) -> u64 {
        64 + 16 * r.len() as u64
    }
}

pub struct ChangedCache {
    cache: quick_cache::sync::Cache<Key, Arc<Ranges>, Weight>,
    next_key: AtomicU64,
    restores: AtomicU64,
}

impl ChangedCache {
    pub fn new(bytes: u64) -> ChangedCache {
        let items = (bytes / 4096).max(16) as usize;
        ChangedCache {
            cache: quick_cache::sync::Cache::with_weighter(items, bytes, Weight),
            next_key: AtomicU64::new(1),
            restores: AtomicU64::new(0),
        }
    }

    /// A key for a newly opened export (an export reopened later is new).
    pub fn new_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// A volume was restored: every entry is stale.
    pub fn restored(&self) {
        self.restores.fetch_add(1, Ordering::AcqRel);
    }

    /// The ranges of `export` against `base` at change count `at`, from the
    /// cache or `compute`d (once, however many ask at the same time).
    pub fn get_or_compute(
        &self,
        export: u64,
        base: VersionId,
        at: u64,
        compute: impl FnOnce() -> Result<Ranges>,
    ) -> Result<Arc<Ranges>> {
        let key = (export, base, at, self.restores.load(Ordering::Acquire));
        self.cache.get_or_insert_with(&key, || compute().map(Arc::new))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computed_once_per_state_and_bounded() {
        let c = ChangedCache::new(1 << 20);
        let v = VersionId([7; 16]);
        let mut runs = 0;
        for _ in 0..3 {
            let r = c.get_or_compute(1, v, 0, || {
                runs += 1;
                Ok(vec![(0, 4096)])
            });
            assert_eq!(*r.unwrap(), vec![(0, 4096)]);
        }
        assert_eq!(runs, 1);
        // A change (or a restore) is a new state: computed again.
        c.get_or_compute(1, v, 1, || {
            runs += 1;
            Ok(vec![])
        })
        .unwrap();
        c.restored();
        c.get_or_compute(1, v, 1, || {
            runs += 1;
            Ok(vec![])
        })
        .unwrap();
        assert_eq!(runs, 3);
        // Errors are not cached.
        assert!(c.get_or_compute(2, v, 0, || Err(forkfs::Error::invalid("x"))).is_err());
        assert!(c.get_or_compute(2, v, 0, || Ok(vec![])).is_ok());
        // A megabyte holds about 65,000 ranges, not 200 entries of 10,000.
        for at in 0..200 {
            c.get_or_compute(3, v, at, || Ok(vec![(0, 1); 10_000])).unwrap();
        }
        assert!(c.cache.weight() <= 1 << 20, "{}", c.cache.weight());
        assert!(c.len() < 20, "{}", c.len());
    }
}
