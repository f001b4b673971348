//! The on-disk chunk cache of a store whose objects are remote: chunks
//! (decompressed) under `<store>/cache/<first byte>/<id>`, at most a byte
//! limit of them, the least recently used going first. What it returns is
//! checked against the chunk's id (blake3); an entry that fails is deleted
//! and the chunk fetched again, never served. Files are written to a
//! temporary name and renamed, so a crash leaves whole entries or strays
//! that the next open removes; nothing here is ever the only copy.

use crate::id::ChunkId;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub struct DiskCache {
    dir: PathBuf,
    limit: u64,
    state: Mutex<State>,
    /// Makes each temporary file name unique (threads may cache one chunk
    /// at the same time).
    tmp_seq: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct State {
    /// id -> (bytes, last use).
    entries: HashMap<ChunkId, (u64, u64)>,
    /// last use -> id: the eviction order.
    order: BTreeMap<u64, ChunkId>,
    bytes: u64,
    clock: u64,
}

impl State {
    fn touch(&mut self, id: ChunkId, len: u64) {
        self.clock += 1;
        if let Some((old_len, t)) = self.entries.insert(id, (len, self.clock)) {
            self.order.remove(&t);
            self.bytes -= old_len;
        }
        self.order.insert(self.clock, id);
        self.bytes += len;
    }

    fn remove(&mut self, id: &ChunkId) -> bool {
        match self.entries.remove(id) {
            Some((len, t)) => {
                self.order.remove(&t);
                self.bytes -= len;
                true
            }
            None => false,
        }
    }
}

impl DiskCache {
    /// Opens (or creates) the cache in `dir`, taking over what an earlier
    /// process left there, oldest first.
    pub fn open(dir: &Path, limit: u64) -> std::io::Result<DiskCache> {
        std::fs::create_dir_all(dir)?;
        let mut found = Vec::new();
        for sub in std::fs::read_dir(dir)?.flatten() {
            let Ok(files) = std::fs::read_dir(sub.path()) else { continue };
            for f in files.flatten() {
                let name = f.file_name();
                let id = name.to_str().and_then(ChunkId::parse);
                match (id, f.metadata()) {
                    (Some(id), Ok(m)) if m.is_file() => {
                        found.push((m.modified().ok(), id, m.len()));
                    }
                    // A temporary file a crash left behind.
                    _ => {
                        let _ = std::fs::remove_file(f.path());
                    }
                }
            }
        }
        found.sort();
        let cache = DiskCache {
            dir: dir.to_path_buf(),
            limit,
            state: Mutex::default(),
            tmp_seq: Default::default(),
        };
        {
            let mut st = cache.state.lock();
            for (_, id, len) in found {
                st.touch(id, len);
            }
        }
        cache.evict();
        Ok(cache)
    }

    fn path(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_string();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// The chunk, if cached and intact.
    pub fn get(&self, id: &ChunkId) -> Option<Bytes> {
        let len = self.state.lock().entries.get(id)?.0;
        match std::fs::read(self.path(id)) {
            Ok(b) if b.len() as u64 == len && ChunkId::of(&b) == *id => {
                let mut st = self.state.lock();
                // Unless evicted meanwhile (then it is only served, not kept).
                if st.entries.contains_key(id) {
                    st.touch(*id, len);
                }
                Some(Bytes::from(b))
            }
            Ok(_) => {
                tracing::warn!(chunk = %id, "cached chunk fails its checksum; fetching it again");
                self.forget(id);
                None
            }
            Err(e) => {
                tracing::warn!(chunk = %id, error = %e, "cached chunk unreadable; fetching it again");
                self.forget(id);
                None
            }
        }
    }

    /// Keeps `plain` (already verified as chunk `id`).
    pub fn put(&self, id: &ChunkId, plain: &[u8]) {
        let len = plain.len() as u64;
        if len > self.limit / 4 || self.state.lock().entries.contains_key(id) {
            return;
        }
        let path = self.path(id);
        let seq = self.tmp_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{seq}", std::process::id()));
        let write = || {
            let mut f =
                crate::files::private_file().write(true).create(true).truncate(true).open(&tmp)?;
            std::io::Write::write_all(&mut f, plain)
        };
        // The 256 subdirectories are made as they are first needed.
        let written = match write() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path.parent().expect("has a parent")).and_then(|()| write())
            }
            r => r,
        }
        .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(chunk = %id, error = %e, "cannot cache a chunk on disk");
            return;
        }
        self.state.lock().touch(*id, len);
        self.evict();
    }

    /// Drops an entry (bad, or its chunk is gone).
    /// Files are deleted under the lock, so a concurrent `put` of the same
    /// chunk cannot have its fresh file deleted under a new entry.
    pub fn forget(&self, id: &ChunkId) {
        let mut st = self.state.lock();
        if st.remove(id) {
            let _ = std::fs::remove_file(self.path(id));
        }
    }

    fn evict(&self) {
        let mut st = self.state.lock();
        while st.bytes > self.limit {
            let Some((_, id)) = st.order.pop_first() else { return };
            st.remove(&id);
            let _ = std::fs::remove_file(self.path(&id));
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// (bytes, entries) cached now.
    pub fn usage(&self) -> (u64, usize) {
        let st = self.state.lock();
        (st.bytes, st.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(i: u8) -> (ChunkId, Vec<u8>) {
        let data = vec![i; 1000];
        (ChunkId::of(&data), data)
    }

    #[test]
    fn keeps_the_recently_used_within_its_limit_and_survives_reopening() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 4000).unwrap();
        let (a, b, x, y) = (chunk(1), chunk(2), chunk(3), chunk(4));
        for (id, data) in [&a, &b, &x] {
            c.put(id, data);
        }
        assert_eq!(c.get(&a.0).as_deref(), Some(&a.1[..]), "a is used: b is now the oldest");
        c.put(&y.0, &y.1);
        c.put(&chunk(5).0, &chunk(5).1);
        assert!(c.get(&b.0).is_none(), "the least recently used went first");
        assert!(c.get(&a.0).is_some());
        assert_eq!(c.usage(), (4000, 4));
        drop(c);
        let c = DiskCache::open(d.path(), 2000).unwrap();
        assert_eq!(c.usage().1, 2, "a smaller limit on reopening evicts");
    }

    #[test]
    fn a_damaged_entry_is_dropped_not_served() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 1 << 20).unwrap();
        let (id, data) = chunk(7);
        c.put(&id, &data);
        let mut bad = data.clone();
        bad[500] ^= 1;
        std::fs::write(c.path(&id), &bad).unwrap();
        assert!(c.get(&id).is_none());
        assert!(!c.path(&id).exists(), "the bad file is deleted");
        assert_eq!(c.usage(), (0, 0));
        // A stray temporary file from a crash is removed on open.
        std::fs::write(c.path(&id).with_extension("tmp1"), b"partial").unwrap();
        let c = DiskCache::open(d.path(), 1 << 20).unwrap();
        assert_eq!(c.usage(), (0, 0));
        assert!(!c.path(&id).with_extension("tmp1").exists());
    }
}
