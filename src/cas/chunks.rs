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

use super::diskcache::DiskCache;
use super::index::{ChunkIndex, Location};
use super::pack::{self, Entry, PackWriter};
use super::readahead::ReadAhead;
use super::tracking::GcTrack;
use crate::error::{Error, ErrorKind, Result};
use crate::id::{ChunkId, PackId};
use crate::objects::{Backend, keys, outbox};
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
    /// A directory and byte limit for chunks fetched from a remote backend.
    pub disk_cache: Option<(std::path::PathBuf, u64)>,
    /// Bytes a sequential remote read fetches ahead (0: off).
    pub readahead: u64,
    /// Other hosts share the object store: a pack that went missing may
    /// have been retired by their GC (see `tombstone.rs`).
    pub shared: bool,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig {
            pack_target: 16 << 20,
            zstd_level: 1,
            cache_bytes: 256 << 20,
            disk_cache: None,
            readahead: crate::config::DEFAULT_READAHEAD,
            shared: false,
        }
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
    index: ChunkIndex,
    open: Mutex<PackWriter>,
    shared: Arc<Shared>,
    queue: Option<crossbeam::channel::Sender<Arc<Sealed>>>,
    uploader: Option<std::thread::JoinHandle<()>>,
    cache: quick_cache::sync::Cache<ChunkId, Bytes, ByteWeight>,
    /// Chunks of a remote backend kept on local disk.
    disk: Option<Arc<DiskCache>>,
    /// Sequential fetches from remote packs read ahead (with `disk`).
    readahead: ReadAhead,
    config: ChunkConfig,
    pub stats: Arc<ChunkStats>,
    pub(super) gc: GcTrack,
}

fn open_disk_cache(config: &ChunkConfig) -> Option<Arc<DiskCache>> {
    let (dir, limit) = config.disk_cache.as_ref()?;
    match DiskCache::open(dir, *limit) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no on-disk chunk cache");
            None
        }
    }
}

/// What this host wrote stays readable while the object store is out of
/// reach: a pack's chunks go to the disk cache once it is uploaded (its
/// local copy is about to go).
fn keep_written(disk: Arc<DiskCache>) -> outbox::UploadedHook {
    Arc::new(move |key, data| {
        if keys::parse_pack(key).is_none() {
            return;
        }
        let entries = match pack::parse(data) {
            Ok(e) => e,
            Err(e) => return tracing::warn!(%key, error = %e, "uploaded pack does not parse"),
        };
        for e in &entries {
            let start = e.offset as usize;
            let stored = data.get(start..start + e.stored_len as usize);
            match stored.map(|s| pack::decompress(e, s)) {
                Some(Ok(plain)) => disk.put(&e.id, &plain),
                _ => tracing::warn!(%key, chunk = %e.id, "uploaded pack has a bad chunk"),
            }
        }
    })
}

impl ChunkStore {
    pub fn new(backend: Arc<Backend>, index: ChunkIndex, config: ChunkConfig) -> ChunkStore {
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
                        .put(&keys::pack(&sealed.id), sealed.bytes.clone())
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
        let disk = open_disk_cache(&config);
        if let (Some(o), Some(d)) = (backend.outbox(), &disk) {
            o.on_uploaded(keep_written(d.clone()));
        }
        ChunkStore {
            backend,
            index,
            open: Mutex::new(PackWriter::new()),
            shared,
            queue: Some(tx),
            uploader: Some(uploader),
            cache,
            readahead: ReadAhead::new(config.readahead, disk.clone()),
            disk,
            config,
            stats,
            gc: GcTrack::default(),
        }
    }

    /// Whether a pack is sealed and on its way to the object store but not
    /// yet indexed (GC must not take its object for an orphan).
    pub(crate) fn is_in_flight(&self, pack: &PackId) -> bool {
        self.shared.uploads.lock().packs.iter().any(|p| p.id == *pack)
    }

    /// Stores `data` (once: identical data is deduplicated) and returns its id.
    /// The chunk is durable only after the next [`ChunkStore::flush`].
    pub fn put(&self, data: &[u8]) -> Result<ChunkId> {
        let id = ChunkId::of(data);
        self.put_with_id(id, data)?;
        Ok(id)
    }

    /// Like [`ChunkStore::put`] for a caller that already hashed the data;
    /// whether the chunk was new to the store (false: deduplicated).
    pub fn put_with_id(&self, id: ChunkId, data: &[u8]) -> Result<bool> {
        let exists = if self.gc.active.load(Ordering::SeqCst) {
            // Under the lock a GC sweeps under: either it sees this id, or
            // this put sees the chunk gone and stores it again.
            let mut reached = self.gc.reached.lock();
            reached.insert(id);
            self.contains(&id)?
        } else {
            self.contains(&id)?
        };
        if exists {
            self.stats.chunks_deduped.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let plain_len =
            u32::try_from(data.len()).map_err(|_| Error::invalid("chunk over 4 GiB"))?;
        let (codec, stored) = pack::compress(data, self.config.zstd_level);
        let full = {
            let mut open = self.open.lock();
            if open.contains(&id) {
                return Ok(false);
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
        Ok(true)
    }

    /// Seals a pack and queues it for upload; it stays readable meanwhile.
    fn submit(&self, writer: PackWriter) -> Result<()> {
        let (id, bytes, entries) = writer.seal();
        let by_id = entries.iter().enumerate().map(|(i, e)| (e.id, i)).collect();
        let sealed = Arc::new(Sealed { id, bytes, entries, by_id });
        self.shared.uploads.lock().packs.push(sealed.clone());
        let queue = self.queue.as_ref().expect("the queue lives until drop");
        queue.send(sealed).map_err(|_| Error::new(ErrorKind::Unavailable, "pack uploader stopped"))
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
        if let Some(plain) = self.disk.as_ref().and_then(|d| d.get(id)) {
            self.cache.insert(*id, plain.clone());
            return Ok(plain);
        }
        let mut loc = self.locate(id)?;
        let mut repaired = false;
        let stored = loop {
            match self.fetch_stored(id, &loc) {
                Ok(b) => break b,
                // GC may have moved the chunk to a new pack since we looked
                // (this host's, or on a shared store another host's: then
                // its tombstone names where the chunk went).
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let mut now = self.locate(id)?;
                    if now == loc && self.config.shared && !repaired {
                        repaired = true;
                        if self.repair_from_tombstone(&loc.pack) {
                            now = self.locate(id)?;
                        }
                    }
                    if now == loc {
                        return Err(e.context(format!(
                            "chunk {id}: its pack {} is gone from the object store",
                            loc.pack
                        )));
                    }
                    loc = now;
                }
                Err(e) => return Err(e),
            }
        };
        let plain = pack::decompress(&loc.entry(*id), &stored)?;
        if let Some(d) = &self.disk {
            d.put(id, &plain);
        }
        self.cache.insert(*id, plain.clone());
        Ok(plain)
    }

    /// The stored bytes of chunk `id` at `loc`; from a remote store with
    /// read-ahead, the chunks after it go to the disk cache, verified
    /// (`readahead.rs`).
    fn fetch_stored(&self, id: &ChunkId, loc: &Location) -> Result<Bytes> {
        let key = keys::pack(&loc.pack);
        if self.disk.is_none() {
            let range = loc.offset..loc.offset + loc.stored_len as u64;
            return self.backend.get_range(&key, range);
        }
        let e = loc.entry(*id);
        let pack_len = || Ok(self.index.pack_info(&loc.pack)?.map(|p| p.len));
        match self.readahead.fetch(&self.backend, loc.pack, &key, pack_len, &e) {
            // A damaged footer must not fail a chunk that is itself intact
            // (an unreachable store fails the chunk alike: no second wait).
            Err(err) if err.kind() == ErrorKind::Corrupt => {
                tracing::warn!(pack = %loc.pack, error = %err, "read-ahead failed; reading the chunk alone");
                let range = loc.offset..loc.offset + loc.stored_len as u64;
                self.backend.get_range(&key, range)
            }
            r => r,
        }
    }

    fn locate(&self, id: &ChunkId) -> Result<Location> {
        self.index
            .get_chunk(id)?
            .ok_or_else(|| Error::not_found(format!("chunk {id} is not in the store")))
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

    /// Where each chunk is.
    pub(crate) fn index(&self) -> &ChunkIndex {
        &self.index
    }

    pub fn config(&self) -> &ChunkConfig {
        &self.config
    }

    /// The on-disk cache (remote backends only).
    pub fn disk_cache(&self) -> Option<&DiskCache> {
        self.disk.as_deref()
    }

    /// Forgets a cached chunk (after its pack was found damaged).
    pub(crate) fn evict(&self, id: &ChunkId) {
        self.cache.remove(id);
        if let Some(d) = &self.disk {
            d.forget(id);
        }
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
