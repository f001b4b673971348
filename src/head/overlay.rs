//! The dirty state of a volume head, kept in RocksDB until a checkpoint
//! folds it into a new Merkle root.
//!
//! Key: volume id u64 BE | space u8 | owner u64 BE | key u64 BE (25 bytes), so
//! one volume's entries are contiguous and each (space, owner) group is a
//! sorted run ready for [`crate::map::Map::apply`].
//! Value: tag u8 then payload: 0 delete, 1 literal map value, 2 reference
//! to dirty data in the data log, to be stored as a chunk whose id becomes
//! the map value, 3 such a reference followed by the block's earlier
//! states (see `prior.rs`), 4 spans of the block written over an earlier
//! entry (see `patch.rs`).

use super::datalog::LogRef;
use super::patch::Patch;
use super::prior::Prior;
use crate::db::{CF_OVERLAY, Db};
use crate::error::{Error, Result};
use crate::id::VolumeId;
use bytes::Bytes;
use rocksdb::{Direction, IteratorMode, WriteBatch};

/// Which map of a volume an entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Space {
    /// The volume's root map: blocks of a block volume, inodes of an fs volume.
    Root = 0,
    /// The entries of directory `owner`.
    Dir = 1,
    /// The blocks of file `owner`.
    File = 2,
    /// Ranges of blocks of a block volume zeroed since the last checkpoint.
    Zeroed = 3,
}

impl Space {
    fn from_u8(b: u8) -> Result<Space> {
        match b {
            0 => Ok(Space::Root),
            1 => Ok(Space::Dir),
            2 => Ok(Space::File),
            3 => Ok(Space::Zeroed),
            _ => Err(Error::corrupt(format!("overlay space {b} is unknown"))),
        }
    }
}

/// One dirty entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dirty {
    Delete,
    Value(Bytes),
    /// Block data waiting in the data log.
    Logged(LogRef),
    /// Block data waiting in the data log, written over the block's
    /// earlier states (its fallback if power loss takes this data).
    Over(LogRef, Prior),
    /// Parts of the block written over an earlier entry.
    Patch(Box<Patch>),
}

impl Dirty {
    /// The data log reference of a whole block's logged entry.
    pub fn log_ref(&self) -> Option<&LogRef> {
        match self {
            Dirty::Logged(r) | Dirty::Over(r, _) => Some(r),
            _ => None,
        }
    }

    /// Every data log reference the entry reads first: a logged entry's,
    /// or a patch's spans and the entry under them.
    pub fn log_refs(&self) -> Vec<LogRef> {
        match self {
            Dirty::Patch(p) => {
                let under = p.under.as_ref().and_then(Dirty::log_ref).copied();
                under.into_iter().chain(p.spans.iter().map(|s| s.r)).collect()
            }
            d => d.log_ref().copied().into_iter().collect(),
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let (tag, payload): (u8, &[u8]) = match self {
            Dirty::Delete => (0, &[]),
            Dirty::Value(v) => (1, v),
            Dirty::Logged(r) => return [&[2u8][..], &r.encode()].concat(),
            Dirty::Over(r, prior) => {
                let mut out = [&[3u8][..], &r.encode()].concat();
                prior.encode(&mut out);
                return out;
            }
            Dirty::Patch(p) => {
                let mut out = vec![4u8];
                p.encode(&mut out);
                return out;
            }
        };
        let mut out = Vec::with_capacity(1 + payload.len());
        out.push(tag);
        out.extend_from_slice(payload);
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Dirty> {
        match b.split_first() {
            Some((0, _)) => Ok(Dirty::Delete),
            Some((1, v)) => Ok(Dirty::Value(Bytes::copy_from_slice(v))),
            Some((2, r)) => Ok(Dirty::Logged(LogRef::decode(r)?)),
            Some((3, r)) if r.len() >= LogRef::LEN => Ok(Dirty::Over(
                LogRef::decode(&r[..LogRef::LEN])?,
                Prior::decode(&r[LogRef::LEN..])?,
            )),
            Some((4, p)) => Ok(Dirty::Patch(Box::new(Patch::decode(p)?))),
            _ => Err(Error::corrupt("overlay entry has an unknown tag")),
        }
    }
}

pub const KEY_LEN: usize = 25;

/// [`Overlay::clear_stopped`] deletes at most this many entries one by one.
pub const ONE_BY_ONE: usize = 1024;

pub fn key(vol: VolumeId, space: Space, owner: u64, key: u64) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[0..8].copy_from_slice(&vol.0.to_be_bytes());
    k[8] = space as u8;
    k[9..17].copy_from_slice(&owner.to_be_bytes());
    k[17..25].copy_from_slice(&key.to_be_bytes());
    k
}

/// Decodes a stored entry of any volume: (volume, space, owner, key, entry).
pub fn decode_raw(k: &[u8], v: &[u8]) -> Result<(VolumeId, Space, u64, u64, Dirty)> {
    if k.len() != KEY_LEN {
        return Err(Error::corrupt("overlay key has the wrong length"));
    }
    Ok((
        VolumeId(u64::from_be_bytes(k[0..8].try_into().expect("8 bytes"))),
        Space::from_u8(k[8])?,
        u64::from_be_bytes(k[9..17].try_into().expect("8 bytes")),
        u64::from_be_bytes(k[17..25].try_into().expect("8 bytes")),
        Dirty::decode(v)?,
    ))
}

/// An entry exactly as stored (key, value).
pub type RawEntry = (Box<[u8]>, Box<[u8]>);

/// A decoded overlay entry.
#[derive(Clone, Debug)]
pub struct Entry {
    pub space: Space,
    pub owner: u64,
    pub key: u64,
    pub dirty: Dirty,
    /// The stored key and value, to tell later whether the entry changed.
    pub raw: RawEntry,
}

/// The overlay of one volume.
#[derive(Clone, Copy)]
pub struct Overlay<'a> {
    db: &'a Db,
    vol: VolumeId,
}

impl<'a> Overlay<'a> {
    pub fn new(db: &'a Db, vol: VolumeId) -> Self {
        Overlay { db, vol }
    }

    pub fn get(&self, space: Space, owner: u64, k: u64) -> Result<Option<Dirty>> {
        let cf = self.db.cf(CF_OVERLAY);
        match self.db.raw().get_pinned_cf(cf, key(self.vol, space, owner, k))? {
            Some(v) => Ok(Some(Dirty::decode(&v)?)),
            None => Ok(None),
        }
    }

    pub fn put(&self, batch: &mut WriteBatch, space: Space, owner: u64, k: u64, d: &Dirty) {
        batch.put_cf(self.db.cf(CF_OVERLAY), key(self.vol, space, owner, k), d.encode());
    }

    /// Entries of one (space, owner) group with `lo <= key <= hi`, in key order.
    pub fn scan(&self, space: Space, owner: u64, lo: u64, hi: u64) -> Result<Vec<(u64, Dirty)>> {
        self.scan_limit(space, owner, lo, hi, usize::MAX)
    }

    /// [`Overlay::scan`], stopping after `limit` entries.
    pub fn scan_limit(
        &self,
        space: Space,
        owner: u64,
        lo: u64,
        hi: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Dirty)>> {
        let start = key(self.vol, space, owner, lo);
        let end = key(self.vol, space, owner, hi);
        let mut out = Vec::new();
        let cf = self.db.cf(CF_OVERLAY);
        for item in self.db.raw().iterator_cf(cf, IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = item?;
            if k.len() != KEY_LEN || k[..] > end[..] || out.len() >= limit {
                break;
            }
            let kk = u64::from_be_bytes(k[17..25].try_into().expect("8 bytes"));
            out.push((kk, Dirty::decode(&v)?));
        }
        Ok(out)
    }

    /// Calls `f` for every entry of the volume, grouped and sorted by
    /// (space, owner, key).
    pub fn for_each(&self, f: &mut dyn FnMut(Entry) -> Result<()>) -> Result<()> {
        self.for_each_in(None, f)
    }

    /// [`Overlay::for_each`] as of a RocksDB snapshot (`None`: now).
    pub fn for_each_in(
        &self,
        snap: Option<&rocksdb::Snapshot<'_>>,
        f: &mut dyn FnMut(Entry) -> Result<()>,
    ) -> Result<()> {
        let prefix = self.vol.0.to_be_bytes();
        let cf = self.db.cf(CF_OVERLAY);
        let mode = IteratorMode::From(&prefix, Direction::Forward);
        let iter = match snap {
            Some(s) => s.iterator_cf(cf, mode),
            None => self.db.raw().iterator_cf(cf, mode),
        };
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            if k.len() != KEY_LEN {
                return Err(Error::corrupt("overlay key has the wrong length"));
            }
            f(Entry {
                space: Space::from_u8(k[8])?,
                owner: u64::from_be_bytes(k[9..17].try_into().expect("8 bytes")),
                key: u64::from_be_bytes(k[17..25].try_into().expect("8 bytes")),
                dirty: Dirty::decode(&v)?,
                raw: (k, v),
            })?;
        }
        Ok(())
    }

    /// Adds to `batch` the removal of each entry still stored exactly as
    /// given (entries rewritten since stay: they are newer).
    pub fn delete_unchanged(&self, batch: &mut WriteBatch, entries: &[RawEntry]) -> Result<()> {
        let cf = self.db.cf(CF_OVERLAY);
        for (k, v) in entries {
            if self.db.raw().get_pinned_cf(cf, k)?.is_some_and(|cur| cur[..] == v[..]) {
                batch.delete_cf(cf, k);
            }
        }
        Ok(())
    }

    /// True when the volume has no dirty entries.
    pub fn is_empty(&self) -> Result<bool> {
        let prefix = self.vol.0.to_be_bytes();
        let cf = self.db.cf(CF_OVERLAY);
        let mut it = self.db.raw().iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward));
        match it.next() {
            Some(item) => Ok(!item?.0.starts_with(&prefix)),
            None => Ok(true),
        }
    }

    /// Adds to `batch` the removal of every entry of this volume, written
    /// or not yet: one range deletion.
    pub fn clear(&self, batch: &mut WriteBatch) {
        let from = key(self.vol, Space::Root, 0, 0);
        let to = (self.vol.0 + 1).to_be_bytes();
        batch.delete_range_cf(self.db.cf(CF_OVERLAY), &from[..], &to[..]);
    }

    /// [`Overlay::clear`] for a caller that holds the volume's gate
    /// exclusively (no entry is written until the batch is): up to
    /// [`ONE_BY_ONE`] entries are deleted one by one, and only more with
    /// a range deletion. After each range deletion RocksDB rebuilds its
    /// list of the memtable's range deletions at the next read, and every
    /// read of the memtable steps through it until it flushes: with one
    /// per checkpoint, that was 9% of a mount's CPU in a loop of snapshots
    /// (`perf`), growing with every snapshot.
    pub fn clear_stopped(&self, batch: &mut WriteBatch) -> Result<()> {
        let prefix = self.vol.0.to_be_bytes();
        let cf = self.db.cf(CF_OVERLAY);
        let mut keys: Vec<Box<[u8]>> = Vec::new();
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_iterate_upper_bound((self.vol.0 + 1).to_be_bytes());
        let mut it = self.db.raw().raw_iterator_cf_opt(cf, opts);
        it.seek(prefix);
        while let Some(k) = it.key() {
            if keys.len() == ONE_BY_ONE {
                self.clear(batch);
                return Ok(());
            }
            keys.push(k.into());
            it.next();
        }
        it.status()?;
        for k in keys {
            batch.delete_cf(cf, k);
        }
        Ok(())
    }

    /// After a checkpoint removed `removed` entries of the volume (`None`:
    /// unknown, a restore's clear): when they are many, or the
    /// overlay's memtable holds many entries, asks RocksDB to flush it in
    /// the background. Until a flush drops them, removed entries stay in
    /// the memtable (as tombstones, or under a range deletion) and every
    /// scan of the volume (an emptiness check, a fold, a directory
    /// listing) steps over them one by one; once flushed, a range deletion
    /// is a table of its own that a scan seeks past. A clean snapshot of a
    /// workspace that had just created 100k files took 80 ms, all of it
    /// there; an fs checkpoint's 30k entries stayed below the 50k mark.
    pub fn cleared(&self, removed: Option<usize>) {
        const DEAD_ENTRIES: u64 = 50_000;
        const REMOVED: usize = 10_000;
        let cf = self.db.cf(CF_OVERLAY);
        let n = self.db.raw().property_int_value_cf(cf, "rocksdb.num-entries-active-mem-table");
        // Unknown: all of the memtable may be under the deletion.
        let limit = if removed.is_some() { DEAD_ENTRIES } else { REMOVED as u64 };
        let many = removed.is_some_and(|r| r >= REMOVED);
        if many || matches!(n, Ok(Some(n)) if n >= limit) {
            let mut fo = rocksdb::FlushOptions::default();
            fo.set_wait(false);
            if let Err(e) = self.db.raw().flush_cf_opt(cf, &fo) {
                tracing::warn!(error = %e, "overlay flush request failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(o: &Overlay<'_>) -> usize {
        let mut n = 0;
        o.for_each(&mut |_| {
            n += 1;
            Ok(())
        })
        .unwrap();
        n
    }

    /// Point deletions in the memtable (a range deletion is not one).
    fn deletes(db: &Db) -> u64 {
        let p = "rocksdb.num-deletes-active-mem-table";
        db.raw().property_int_value_cf(db.cf(CF_OVERLAY), p).unwrap().unwrap()
    }

    /// A clear with the writers stopped deletes a few entries one by one (a range deletion costs
    /// every later read of the memtable), many with one range deletion,
    /// and only the volume's own either way.
    #[test]
    fn a_clear_deletes_few_entries_one_by_one_and_many_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let (mine, other) = (Overlay::new(&db, VolumeId(7)), Overlay::new(&db, VolumeId(8)));
        for (n, one_by_one) in [(ONE_BY_ONE, ONE_BY_ONE as u64), (ONE_BY_ONE + 1, 0)] {
            let mut b = WriteBatch::default();
            for k in 0..n as u64 {
                mine.put(&mut b, Space::Dir, 1, k, &Dirty::Value(Bytes::from_static(b"x")));
            }
            other.put(&mut b, Space::Root, 0, 1, &Dirty::Delete);
            db.write(b, false).unwrap();
            assert_eq!(entries(&mine), n);
            let before = deletes(&db);
            let mut b = WriteBatch::default();
            mine.clear_stopped(&mut b).unwrap();
            db.write(b, false).unwrap();
            assert_eq!(entries(&mine), 0, "{n} entries: some left");
            assert_eq!(entries(&other), 1, "another volume's entry went too");
            assert_eq!(deletes(&db) - before, one_by_one, "{n} entries");
        }
    }
}
