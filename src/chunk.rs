//! The content-addressed chunk store: blake3 ids, zstd, packs in the object
//! store, the RocksDB index, and a bounded cache of decompressed chunks.
//!
//! Invariant: the index never names a pack that is not durable in the object
//! store (a pack is put and synced before its entries are indexed), so a
//! crash can leave an unindexed pack behind, never a dangling index entry.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::id::ChunkId;
use crate::index::Index;
use crate::pack::{self, PackWriter};
use crate::paths;
use bytes::Bytes;
use parking_lot::Mutex;
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

pub struct ChunkStore {
    backend: Arc<Backend>,
    index: Arc<Index>,
    open: Mutex<PackWriter>,
    cache: quick_cache::sync::Cache<ChunkId, Bytes, ByteWeight>,
    config: ChunkConfig,
    pub stats: ChunkStats,
}

impl ChunkStore {
    pub fn new(backend: Arc<Backend>, index: Arc<Index>, config: ChunkConfig) -> ChunkStore {
        let items = (config.cache_bytes / 4096).max(16) as usize;
        let cache = quick_cache::sync::Cache::with_weighter(items, config.cache_bytes, ByteWeight);
        ChunkStore {
            backend,
            index,
            open: Mutex::new(PackWriter::new()),
            cache,
            config,
            stats: ChunkStats::default(),
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
        if self.open.lock().contains(&id) || self.index.has_chunk(&id)? {
            self.stats.chunks_deduped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let plain_len =
            u32::try_from(data.len()).map_err(|_| Error::invalid("chunk over 4 GiB"))?;
        let (codec, stored) = pack::compress(data, self.config.zstd_level);
        let mut open = self.open.lock();
        if open.contains(&id) {
            return Ok(());
        }
        open.add(id, plain_len, codec, &stored);
        self.stats.chunks_written.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_plain_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.stats.bytes_stored_written.fetch_add(stored.len() as u64, Ordering::Relaxed);
        if open.len_bytes() >= self.config.pack_target {
            let full = std::mem::take(&mut *open);
            // Sealing under the lock keeps unsealed chunks readable at all
            // times; the background uploader of the remote issue lifts this.
            self.seal(full)?;
        }
        Ok(())
    }

    /// Seals the open pack, if any, making every chunk put so far durable.
    pub fn flush(&self) -> Result<()> {
        let mut open = self.open.lock();
        if open.is_empty() {
            return Ok(());
        }
        let full = std::mem::take(&mut *open);
        self.seal(full)
    }

    fn seal(&self, writer: PackWriter) -> Result<()> {
        let (pack_id, bytes, entries) = writer.seal();
        let len = bytes.len() as u64;
        self.backend.put(&paths::pack(&pack_id), bytes)?;
        self.index.add_pack(pack_id, len, &entries)?;
        self.stats.packs_written.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(pack = %pack_id, chunks = entries.len(), bytes = len, "sealed pack");
        Ok(())
    }

    /// Reads a chunk, verified against its id.
    pub fn get(&self, id: &ChunkId) -> Result<Bytes> {
        if let Some(b) = self.cache.get(id) {
            return Ok(b);
        }
        if let Some(r) = self.open.lock().read(id) {
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

    pub fn contains(&self, id: &ChunkId) -> Result<bool> {
        Ok(self.open.lock().contains(id) || self.index.has_chunk(id)?)
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}
