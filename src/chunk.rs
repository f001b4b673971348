//! The content-addressed chunk store: blake3 ids, zstd, packs in the object
//! store, the RocksDB index, and a bounded cache of decompressed chunks.
//!
//! Writers fill an open pack in memory; a full pack is sealed and handed to
//! an uploader thread, so hashing and compressing the next pack overlaps
//! with writing this one. Sealed packs stay readable from memory until they
//! are indexed. [`ChunkStore::flush`] waits until every pack is durable.
//!
//! Invariant: the index never names a pack that is not durable in the object
//! store (a pack is put and synced before its entries are indexed), so a
//! crash can leave an unindexed pack behind, never a dangling index entry.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::id::{ChunkId, PackId};
use crate::index::Index;
use crate::pack::{self, Entry, PackWriter};
use crate::paths;
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Debug)]
pub struct ChunkConfig {
    /// A pack is sealed once it holds this many bytes.
    pub pack_target: usize,
    pub zstd_level: i32,
    /// Bytes of decompressed chunks kept in memory.
    pub cache_bytes: u64,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig { pack_target: 16 << 20, zstd_level: 1, cache_bytes: 256 << 20 }
    }
}

#[derive(Clone)]
struct ByteWeight;

impl quick_cache::Weighter<ChunkId, Bytes> for ByteWeight {
    fn weight(&self, _: &ChunkId, v: &Bytes) -> u64 {
        v.len() as u64 + 64
    }
}

/// Counters for status output and benchmarks.
#[derive(Default, Debug)]
pub struct ChunkStats {
    pub chunks_written: AtomicU64,
    pub chunks_deduped: AtomicU64,
    pub bytes_plain_written: AtomicU64,
    pub bytes_stored_written: AtomicU64,
    pub packs_written: AtomicU64,
}

/// A sealed pack on its way to the object store.
struct Sealed {
    id: PackId,
    bytes: Bytes,
    entries: Vec<Entry>,
    by_id: HashMap<ChunkId, usize>,
}

impl Sealed {
    fn read(&self, id: &ChunkId) -> Option<Result<Bytes>> {
        let e = &self.entries[*self.by_id.get(id)?];
        let start = e.offset as usize;
        Some(pack::decompress(e, &self.bytes[start..start + e.stored_len as usize]))
    }
}

/// Packs sealed but not yet indexed, and the first upload error since the last flush.
#[derive(Default)]
struct Uploads {
    packs: Vec<Arc<Sealed>>,
    error: Option<Error>,
}

struct Shared {
    uploads: Mutex<Uploads>,
    done: Condvar,
}

pub struct ChunkStore {
    backend: Arc<Backend>,
    index: Arc<Index>,
    open: Mutex<PackWriter>,
    shared: Arc<Shared>,
    queue: Option<crossbeam::channel::Sender<Arc<Sealed>>>,
    uploader: Option<std::thread::JoinHandle<()>>,
    cache: quick_cache::sync::Cache<ChunkId, Bytes, ByteWeight>,
    config: ChunkConfig,
    pub stats: Arc<ChunkStats>,
}

impl ChunkStore {
    pub fn new(backend: Arc<Backend>, index: Arc<Index>, config: ChunkConfig) -> ChunkStore {
        let items = (config.cache_bytes / 4096).max(16) as usize;
        let cache = quick_cache::sync::Cache::with_weighter(items, config.cache_bytes, ByteWeight);
        let shared =
            Arc::new(Shared { uploads: Mutex::new(Uploads::default()), done: Condvar::new() });
        let stats = Arc::new(ChunkStats::default());
        // Two packs in flight at most: sealing a third waits (backpressure).
        let (tx, rx) = crossbeam::channel::bounded::<Arc<Sealed>>(1);
        let (b, i, s, st) = (backend.clone(), index.clone(), shared.clone(), stats.clone());
        let uploader = std::thread::Builder::new()
            .name("forkfs-packs".into())
            .spawn(move || {
                for sealed in rx {
                    let res = b
                        .put(&paths::pack(&sealed.id), sealed.bytes.clone())
                        .and_then(|()| i.add_pack(sealed.id, sealed.bytes.len() as u64, &sealed.entries));
                    let mut u = s.uploads.lock();
                    u.packs.retain(|p| !Arc::ptr_eq(p, &sealed));
                    match res {
                        Ok(()) => {
                            st.packs_written.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(pack = %sealed.id, chunks = sealed.entries.len(), "sealed pack");
                        }
                        Err(e) => {
                            tracing::error!(pack = %sealed.id, error = %e, "pack upload failed");
                            u.error.get_or_insert(e);
                        }
                    }
                    s.done.notify_all();
                }
            })
            .expect("spawning the pack uploader thread");
        ChunkStore {
            backend,
            index,
            open: Mutex::new(PackWriter::new()),
            shared,
            queue: Some(tx),
            uploader: Some(uploader),
            cache,
            config,
            stats,
        }
    }

    /// Stores `data` (once: identical data is deduplicated) and returns its id.
    /// The chunk is durable only after the next [`ChunkStore::flush`].
    pub fn put(&self, data: &[u8]) -> Result<ChunkId> {
        let id = ChunkId::of(data);
        self.put_with_id(id, data)?;
        Ok(id)
    }

    /// Like [`ChunkStore::put`] for a caller that already hashed the data.
    pub fn put_with_id(&self, id: ChunkId, data: &[u8]) -> Result<()> {
        if self.contains(&id)? {
            self.stats.chunks_deduped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let plain_len =
            u32::try_from(data.len()).map_err(|_| Error::invalid("chunk over 4 GiB"))?;
        let (codec, stored) = pack::compress(data, self.config.zstd_level);
        let full = {
            let mut open = self.open.lock();
            if open.contains(&id) {
                return Ok(());
            }
            open.add(id, plain_len, codec, &stored);
            (open.len_bytes() >= self.config.pack_target).then(|| std::mem::take(&mut *open))
        };
        self.stats.chunks_written.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_plain_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.stats.bytes_stored_written.fetch_add(stored.len() as u64, Ordering::Relaxed);
        if let Some(writer) = full {
            self.submit(writer)?;
        }
        Ok(())
    }

    /// Seals a pack and queues it for upload; it stays readable meanwhile.
    fn submit(&self, writer: PackWriter) -> Result<()> {
        let (id, bytes, entries) = writer.seal();
        let by_id = entries.iter().enumerate().map(|(i, e)| (e.id, i)).collect();
        let sealed = Arc::new(Sealed { id, bytes, entries, by_id });
        self.shared.uploads.lock().packs.push(sealed.clone());
        let queue = self.queue.as_ref().expect("the queue lives until drop");
        queue
            .send(sealed)
            .map_err(|_| Error::new(crate::ErrorKind::Unavailable, "pack uploader stopped"))
    }

    /// Seals the open pack and waits until every pack is durable and
    /// indexed. Returns the first upload error since the last flush.
    pub fn flush(&self) -> Result<()> {
        let full = {
            let mut open = self.open.lock();
            (!open.is_empty()).then(|| std::mem::take(&mut *open))
        };
        if let Some(writer) = full {
            self.submit(writer)?;
        }
        let mut u = self.shared.uploads.lock();
        while !u.packs.is_empty() {
            self.shared.done.wait(&mut u);
        }
        match u.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads a chunk, verified against its id.
    pub fn get(&self, id: &ChunkId) -> Result<Bytes> {
        if let Some(b) = self.cache.get(id) {
            return Ok(b);
        }
        if let Some(r) = self.open.lock().read(id) {
            return r;
        }
        let sealed =
            self.shared.uploads.lock().packs.iter().find(|p| p.by_id.contains_key(id)).cloned();
        if let Some(r) = sealed.and_then(|p| p.read(id)) {
            return r;
        }
        let loc = self
            .index
            .get_chunk(id)?
            .ok_or_else(|| Error::not_found(format!("chunk {id} is not in the store")))?;
        let range = loc.offset..loc.offset + loc.stored_len as u64;
        let stored = self.backend.get_range(&paths::pack(&loc.pack), range)?;
        let plain = pack::decompress(&loc.entry(*id), &stored)?;
        self.cache.insert(*id, plain.clone());
        Ok(plain)
    }

    /// Whether the store holds (or is writing) this chunk.
    pub fn contains(&self, id: &ChunkId) -> Result<bool> {
        if self.open.lock().contains(id) {
            return Ok(true);
        }
        if self.shared.uploads.lock().packs.iter().any(|p| p.by_id.contains_key(id)) {
            return Ok(true);
        }
        self.index.has_chunk(id)
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for ChunkStore {
    fn drop(&mut self) {
        // Closing the queue ends the uploader after the packs already queued.
        self.queue.take();
        if let Some(t) = self.uploader.take() {
            let _ = t.join();
        }
    }
}
