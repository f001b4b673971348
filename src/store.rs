//! A store: its directory, configuration, index, chunk store and backend,
//! and the volumes in it. Version-graph operations live in `graph.rs`.
//!
//! Directory layout: `forkfs.json` (configuration), `index/` (RocksDB),
//! `objects/` (the embedded object store, when no remote is configured).

use crate::backend::Backend;
use crate::chunk::{ChunkConfig, ChunkStore};
use crate::datalog::DataLog;
use crate::error::{Error, ErrorKind, Result};
use crate::id::{VolumeId, VolumeName};
use crate::index::Index;
use crate::paths;
use crate::version::{HeadRecord, RECORD_FORMAT, VolumeKind, VolumeRecord, keys, now_ms};
use crate::volume::Head;
use bytes::Bytes;
use parking_lot::Mutex;
use rocksdb::WriteBatch;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

pub const CONFIG_FILE: &str = "forkfs.json";
pub const DEFAULT_BLOCK_SIZE: u32 = 64 << 10;
/// The capacity reported for fs volumes created without a size.
pub const DEFAULT_FS_SIZE: u64 = 1 << 40;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StoreConfig {
    pub format: u8,
    pub pack_target: usize,
    pub zstd_level: i32,
    pub cache_bytes: u64,
    pub default_block_size: u32,
    /// Objects live here instead of `<store>/objects` (`forkfs init --remote`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::remote::Remote>,
    /// Bytes of chunks a remote store keeps on local disk (`<store>/cache`);
    /// a setting of this host, not of the shared store.
    #[serde(default = "default_disk_cache")]
    pub disk_cache_bytes: u64,
}

fn default_disk_cache() -> u64 {
    8 << 30
}

impl Default for StoreConfig {
    fn default() -> Self {
        let c = ChunkConfig::default();
        StoreConfig {
            format: RECORD_FORMAT,
            pack_target: c.pack_target,
            zstd_level: c.zstd_level,
            cache_bytes: c.cache_bytes,
            default_block_size: DEFAULT_BLOCK_SIZE,
            remote: None,
            disk_cache_bytes: default_disk_cache(),
        }
    }
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub config: StoreConfig,
    pub index: Arc<Index>,
    pub chunks: Arc<ChunkStore>,
    pub datalog: DataLog,
    /// Serializes changes to volume records and counters.
    pub meta_lock: Mutex<()>,
    /// One GC at a time.
    pub gc_lock: Mutex<()>,
    pub heads: Mutex<HashMap<VolumeId, Weak<Head>>>,
    /// Called after each restore (see [`Store::on_restore`]).
    pub restore_hooks: Mutex<Vec<(u64, RestoreHook)>>,
    /// Front-end requests this process serves (see [`Store::serve_extension`]).
    pub extensions: Mutex<HashMap<String, ControlExtension>>,
    /// Remote stores: publishes heads behind the outbox (see `publish.rs`).
    pub publisher: Option<Arc<crate::publish::Publisher>>,
    pub publish_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let Some(p) = &self.publisher else { return };
        p.stop();
        if let Some(t) = self.publish_thread.lock().take() {
            let _ = t.join();
        }
        // Closing: what this process committed goes to the object store
        // now (what cannot, stays queued for the next open).
        // A process that wrote nothing leaves an earlier backlog alone.
        let wrote = self.chunks.backend().outbox().is_some_and(|o| o.queued_here());
        if wrote || p.committed_here() {
            let stall = stall(&self.config);
            if let Err(e) = sync_remote(&self.chunks, p, stall) {
                tracing::warn!(error = %e, "closing with uploads pending; they resume when the store is next opened");
            }
        }
        p.release_all();
    }
}

/// How long uploads may make no progress before a sync gives up (see
/// [`crate::remote::Remote::stall`]).
fn stall(config: &StoreConfig) -> std::time::Duration {
    config.remote.as_ref().map_or(crate::remote::DEFAULT_READ_DEADLINE, |r| r.stall())
}

fn sync_remote(
    chunks: &ChunkStore,
    publisher: &crate::publish::Publisher,
    stall: std::time::Duration,
) -> Result<()> {
    if let Some(o) = chunks.backend().outbox() {
        o.drain(stall)?;
    }
    publisher.publish(stall, true)
}

/// A front-end's handler of its own control requests: JSON in, JSON out.
pub type ControlExtension =
    Arc<dyn Fn(&serde_json::Value) -> Result<serde_json::Value> + Send + Sync>;

/// A front-end's reaction to a restore of a volume it serves.
pub type RestoreHook = Arc<dyn Fn(&Restored<'_>) + Send + Sync>;

/// A restore that has happened: the head of `volume` moved from the state
/// kept as `before` (the pre-restore version) to the state of `to`.
pub struct Restored<'a> {
    pub volume: &'a str,
    pub before: &'a crate::version::VersionRecord,
    pub to: &'a crate::version::VersionRecord,
}

/// An open store; cheap to clone, safe to share between threads.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl Store {
    /// Creates a new store in `dir` (which may exist but must not hold a store).
    pub fn init(dir: &Path, config: StoreConfig) -> Result<Store> {
        let cfg_path = dir.join(CONFIG_FILE);
        if cfg_path.exists() {
            return Err(Error::conflict(format!("a store already exists at {}", dir.display())));
        }
        if config.pack_target < 4096 || config.default_block_size < 4096 {
            return Err(Error::invalid("pack target and block size must be at least 4 KiB"));
        }
        if !config.default_block_size.is_power_of_two() {
            return Err(Error::invalid("block size must be a power of two"));
        }
        let mut config = config;
        let mut existing = false;
        if let Some(r) = &config.remote {
            r.validate()?;
            // A remote that holds a store already: join it, with its settings.
            let (os, root) = r.open()?;
            let backend = Backend::new(os, root, r.url.clone())?;
            if let Some(theirs) = remote_config(&backend)? {
                config = StoreConfig {
                    remote: config.remote.clone(),
                    disk_cache_bytes: config.disk_cache_bytes,
                    ..theirs
                };
                existing = true;
            } else {
                let shared = StoreConfig { remote: None, ..config.clone() };
                backend.put(
                    &paths::store_config(),
                    Bytes::from(serde_json::to_vec_pretty(&shared)?),
                )?;
            }
        }
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{CONFIG_FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&config)?)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        let store = Store::open_with(dir, &config)?;
        if existing {
            if let Err(e) = store.attach_remote(&crate::progress::Quiet) {
                drop(store);
                let _ = std::fs::remove_dir_all(dir.join("index"));
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
        // The store exists once its config is in place, after the attach.
        std::fs::rename(&tmp, &cfg_path)?;
        Ok(store)
    }

    /// Opens an existing store, taking its exclusive lock.
    pub fn open(dir: &Path) -> Result<Store> {
        let cfg_path = dir.join(CONFIG_FILE);
        let raw = std::fs::read(&cfg_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::not_found(format!(
                "no forkfs store at {} (create one with `forkfs init`)",
                dir.display()
            )),
            _ => e.into(),
        })?;
        let config: StoreConfig = serde_json::from_slice(&raw)
            .map_err(|e| Error::corrupt(format!("{}: {e}", cfg_path.display())))?;
        if config.format != RECORD_FORMAT {
            return Err(Error::corrupt(format!("store format {} is not supported", config.format)));
        }
        Store::open_with(dir, &config)
    }

    fn open_with(dir: &Path, config: &StoreConfig) -> Result<Store> {
        let config = config.clone();
        let index = Arc::new(Index::open(&dir.join("index"))?);
        let backend = Arc::new(match &config.remote {
            None => Backend::local(dir.join("objects"))?,
            Some(r) => {
                let (os, root) = r.open()?;
                let local = root.is_some();
                let b =
                    Backend::new(os, root, r.url.clone())?.with_read_deadline(r.read_deadline());
                // A `file://` remote takes its puts durably at once.
                if local { b } else { b.with_outbox(dir.join("outbox"), r.pending_limit())? }
            }
        });
        let publisher = backend
            .outbox()
            .map(|_| Arc::new(crate::publish::Publisher::new(backend.clone(), index.clone())));
        let chunk_config = ChunkConfig {
            pack_target: config.pack_target,
            zstd_level: config.zstd_level,
            cache_bytes: config.cache_bytes,
            disk_cache: config
                .remote
                .as_ref()
                .map(|_| (dir.join("cache"), config.disk_cache_bytes)),
        };
        let chunks = Arc::new(ChunkStore::new(backend, index.clone(), chunk_config));
        let datalog = DataLog::open(dir.join("log"))?;
        let store = Store {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                config,
                index,
                chunks,
                datalog,
                meta_lock: Mutex::new(()),
                gc_lock: Mutex::new(()),
                heads: Mutex::new(HashMap::new()),
                restore_hooks: Mutex::new(Vec::new()),
                extensions: Mutex::new(HashMap::new()),
                publisher,
                publish_thread: Mutex::new(None),
            }),
        };
        if let Some(p) = &store.inner.publisher {
            *store.inner.publish_thread.lock() = Some(p.spawn()?);
            p.kick(); // heads an earlier process left unpublished
        }
        // Segments below a volume's floor were folded by a checkpoint whose
        // cleanup a crash may have cut short.
        for vol in store.volumes()? {
            if let Some(floor) = store.get_json::<u64>(&keys::log_floor(vol.id))? {
                store.inner.datalog.drop_below(vol.id, floor)?;
            }
        }
        store.recover_unsealed()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    pub fn chunks(&self) -> &Arc<ChunkStore> {
        &self.inner.chunks
    }

    pub(crate) fn index(&self) -> &Index {
        &self.inner.index
    }

    pub(crate) fn datalog(&self) -> &DataLog {
        &self.inner.datalog
    }

    pub(crate) fn get_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.index().get_meta(key)? {
            Some(v) => Ok(Some(serde_json::from_slice(&v)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn put_json<T: Serialize>(
        &self,
        b: &mut WriteBatch,
        key: &str,
        v: &T,
    ) -> Result<()> {
        b.put_cf(self.index().cf(crate::index::CF_META), key.as_bytes(), serde_json::to_vec(v)?);
        Ok(())
    }

    pub fn volume(&self, name: &str) -> Result<VolumeRecord> {
        if let Some(v) = self.get_json(&keys::volume(name))? {
            return Ok(v);
        }
        // Another host may have created it since.
        if !self.chunks().backend().is_local() && self.sync_from_remote()? > 0 {
            if let Some(v) = self.get_json(&keys::volume(name))? {
                return Ok(v);
            }
        }
        Err(Error::not_found(format!("no volume named {name:?}")))
    }

    pub fn volumes(&self) -> Result<Vec<VolumeRecord>> {
        self.index()
            .scan_meta("vol/")?
            .into_iter()
            .map(|(_, v)| Ok(serde_json::from_slice(&v)?))
            .collect()
    }

    pub(crate) fn head_record(&self, vol: VolumeId) -> Result<HeadRecord> {
        self.get_json(&keys::head(vol))?
            .ok_or_else(|| Error::corrupt(format!("volume {} has no head record", vol.0)))
    }

    /// Creates an empty volume. `size` is required for block volumes.
    pub fn create_volume(
        &self,
        name: &str,
        kind: VolumeKind,
        size: Option<u64>,
        block_size: Option<u32>,
    ) -> Result<VolumeRecord> {
        let name = VolumeName::new(name)?;
        let block_size = block_size.unwrap_or(self.config().default_block_size);
        if !block_size.is_power_of_two() || !(4096..=(1 << 24)).contains(&block_size) {
            return Err(Error::invalid("block size must be a power of two from 4 KiB to 16 MiB"));
        }
        let size = match (kind, size) {
            (VolumeKind::Block, None) => {
                return Err(Error::invalid("a block volume needs a size (e.g. --size 64G)"));
            }
            (VolumeKind::Block, Some(s)) if s == 0 || s % block_size as u64 != 0 => {
                return Err(Error::invalid(format!(
                    "size {s} is not a positive multiple of the block size {block_size}"
                )));
            }
            (_, Some(s)) => s,
            (VolumeKind::Fs, None) => DEFAULT_FS_SIZE,
        };
        let _session = self.chunks().write_session();
        let root = match kind {
            VolumeKind::Fs => crate::volume::fs::initial_root(self.chunks().as_ref())?,
            VolumeKind::Block => None,
        };
        self.insert_volume(
            name,
            kind,
            size,
            block_size,
            None,
            HeadRecord { base: None, root, next_seq: 0 },
        )
    }

    /// Writes a new volume record and head in one batch.
    pub(crate) fn insert_volume(
        &self,
        name: VolumeName,
        kind: VolumeKind,
        size: u64,
        block_size: u32,
        forked_from: Option<crate::id::VersionId>,
        head: HeadRecord,
    ) -> Result<VolumeRecord> {
        if !self.chunks().backend().is_local() {
            self.sync_from_remote()?; // names and ids other hosts took
        }
        let _session = self.chunks().write_session();
        let _g = self.inner.meta_lock.lock();
        if self.index().get_meta(&keys::volume(name.as_str()))?.is_some() {
            return Err(Error::conflict(format!("a volume named {name} already exists")));
        }
        let next: u64 = self.get_json(keys::NEXT_VOLUME_ID)?.unwrap_or(1);
        let rec = VolumeRecord {
            format: RECORD_FORMAT,
            id: VolumeId(next),
            name,
            kind,
            size,
            block_size,
            created_at_ms: now_ms(),
            forked_from,
            retention: None,
            auto_prune: true,
            consistency: Default::default(),
        };
        // Nodes of a new root must be durable before anything names them.
        self.chunks().flush()?;
        let obj = Bytes::from(serde_json::to_vec_pretty(&rec)?);
        let backend = self.chunks().backend();
        if backend.is_local() {
            backend.put(&paths::volume(rec.id), obj)?;
        } else {
            // Hosts number volumes from what they have seen: never take an
            // id another host took meanwhile.
            backend.put_or_same(&paths::volume(rec.id), obj, None).map_err(|e| {
                if e.kind() == ErrorKind::Conflict {
                    Error::conflict("another host created a volume at the same moment; try again")
                } else {
                    e
                }
            })?;
        }
        // The head object is the creation's commit point (see attach.rs),
        // put at once: until it is, other hosts do not see the volume, and
        // could take its name. On a remote store it follows the objects
        // it names, and is created only if absent.
        let obj = Bytes::from(serde_json::to_vec_pretty(&head)?);
        let key = paths::head(rec.id);
        let mut b = WriteBatch::default();
        match self.publisher() {
            None => self.chunks().backend().put(&key, obj)?,
            Some(p) => {
                self.uploaded_so_far()?;
                let v = backend.put_or_same(&key, obj, None).map_err(|e| {
                    if e.kind() == ErrorKind::Conflict {
                        Error::conflict(format!(
                            "volume id {} was taken by another host; try again",
                            rec.id.0
                        ))
                    } else {
                        e
                    }
                })?;
                p.saw(rec.id, Some(v));
                p.set_published(&mut b, rec.id, &head);
            }
        }
        self.put_json(&mut b, keys::NEXT_VOLUME_ID, &(next + 1))?;
        self.put_json(&mut b, &keys::volume(rec.name.as_str()), &rec)?;
        self.put_json(&mut b, &keys::head(rec.id), &head)?;
        self.index().write(b, true)?;
        Ok(rec)
    }

    /// Opens a volume's head for reading and writing. All callers in this
    /// process share one head per volume.
    pub fn open_volume(&self, name: &str) -> Result<Arc<Head>> {
        let rec = self.volume(name)?;
        let mut heads = self.inner.heads.lock();
        if let Some(h) = heads.get(&rec.id).and_then(Weak::upgrade) {
            return Ok(h);
        }
        let backend = self.chunks().backend();
        let (state, lease) = if backend.is_local() {
            (self.head_record(rec.id)?, None)
        } else {
            // Another host may hold it; once ours, start from the remote
            // head. The publisher keeps the lease until the head is out.
            let p = self
                .publisher()
                .ok_or_else(|| Error::invalid("a remote store without a publisher"))?;
            let lease = p.lease(&rec)?;
            (self.refresh_from_remote(&rec)?, Some(lease))
        };
        let head = Arc::new(Head::new(self.clone(), rec.clone(), state, lease)?);
        heads.insert(rec.id, Arc::downgrade(&head));
        Ok(head)
    }

    /// Writes the head object other hosts (and a rebuild) read, before
    /// the local commit of `rec`: stores that upload in the background
    /// publish it after the commit instead (see [`Store::head_committed`]).
    pub(crate) fn publish_head(&self, head: &Head, rec: &HeadRecord) -> Result<()> {
        if self.inner.publisher.is_some() {
            return Ok(());
        }
        let obj = Bytes::from(serde_json::to_vec_pretty(rec)?);
        self.chunks().backend().put(&paths::head(head.record().id), obj)
    }

    /// A head changed in the local index: publish it (remote stores).
    pub(crate) fn head_committed(&self) {
        if let Some(p) = &self.inner.publisher {
            p.committed();
        }
    }

    pub(crate) fn publisher(&self) -> Option<&crate::publish::Publisher> {
        self.inner.publisher.as_deref()
    }

    /// Waits until every object put so far is in the object store (not
    /// only queued on local disk); a no-op for local stores.
    pub(crate) fn uploaded_so_far(&self) -> Result<()> {
        let Some(o) = self.chunks().backend().outbox() else { return Ok(()) };
        let stall = stall(self.config());
        o.drain(stall)
    }

    /// Waits until everything committed so far is in the object store:
    /// queued uploads, then the heads that name them. Fails (nothing is
    /// lost; it stays queued) once uploads make no progress for the
    /// remote's read deadline. A no-op for local stores.
    pub fn sync_remote(&self) -> Result<()> {
        let Some(p) = &self.inner.publisher else { return Ok(()) };
        let stall = stall(self.config());
        sync_remote(self.chunks(), p, stall)
    }

    /// Changes a volume record (object copy first, then the index).
    pub(crate) fn update_volume(
        &self,
        name: &str,
        f: impl FnOnce(&mut VolumeRecord) -> Result<()>,
    ) -> Result<VolumeRecord> {
        let _g = self.inner.meta_lock.lock();
        let mut rec = self.volume(name)?;
        f(&mut rec)?;
        let obj = bytes::Bytes::from(serde_json::to_vec_pretty(&rec)?);
        self.chunks().backend().put(&paths::volume(rec.id), obj)?;
        let mut b = WriteBatch::default();
        self.put_json(&mut b, &keys::volume(name), &rec)?;
        self.index().write(b, true)?;
        Ok(rec)
    }

    /// The version a volume's head is based on (no lease needed).
    pub fn head_base(&self, vol: &VolumeRecord) -> Result<Option<crate::id::VersionId>> {
        Ok(self.head_record(vol.id)?.base)
    }

    /// The head of `name` if this process has it open.
    pub(crate) fn open_head(&self, name: &str) -> Option<Arc<Head>> {
        let rec = self.volume(name).ok()?;
        self.inner.heads.lock().get(&rec.id).and_then(Weak::upgrade)
    }

    /// Deletes a volume with its head, overlay, tags and versions. Space is
    /// reclaimed by the next GC.
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        let rec = self.volume(name)?;
        let head = self.open_volume(name)?;
        let _one = head.checkpoint.lock();
        let _gate = head.gate.write();
        // No publishing pass may put the head object back after this.
        let _pass = self.publisher().map(|p| p.pass.lock());
        let _g = self.inner.meta_lock.lock();
        let versions = self.log(&rec)?;
        let mut b = WriteBatch::default();
        let meta = self.index().cf(crate::index::CF_META);
        b.delete_cf(meta, keys::volume(name));
        b.delete_cf(meta, keys::head(rec.id));
        b.delete_cf(meta, keys::published(rec.id));
        b.delete_cf(meta, keys::log_floor(rec.id));
        b.delete_cf(meta, keys::unsealed(rec.id));
        for prefix in
            [keys::log_prefix(rec.id), keys::tag_prefix(rec.id), keys::rollback_prefix(rec.id)]
        {
            for (k, _) in self.index().scan_meta(&prefix)? {
                b.delete_cf(meta, k);
            }
        }
        for v in &versions {
            b.delete_cf(meta, keys::version(&v.id));
            b.delete_cf(meta, keys::damaged(&v.id));
        }
        crate::overlay::Overlay::new(self.index(), rec.id).clear(&mut b);
        self.index().write(b, true)?;
        let backend = self.chunks().backend();
        for v in &versions {
            backend.delete(&paths::version(&v.id))?;
        }
        backend.delete(&paths::head(rec.id))?;
        backend.delete(&paths::volume(rec.id))?;
        if let Some(p) = self.publisher() {
            p.saw(rec.id, None);
        }
        head.mark_deleted();
        self.datalog().drop_below(rec.id, u64::MAX)
    }

    /// Calls `hook` after every restore in this process (a mount drops
    /// what the kernel cached of the part of the tree that changed), until
    /// [`Store::drop_restore_hook`] with the number returned.
    pub fn on_restore(&self, hook: RestoreHook) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.restore_hooks.lock().push((id, hook));
        id
    }

    pub fn drop_restore_hook(&self, id: u64) {
        self.inner.restore_hooks.lock().retain(|(n, _)| *n != id);
    }

    /// Serves control requests named `name` in this process with `handler`
    /// (a mount hosts further mounts of the store it holds this way).
    pub fn serve_extension(&self, name: &str, handler: ControlExtension) {
        self.inner.extensions.lock().insert(name.to_string(), handler);
    }

    pub(crate) fn extension(&self, name: &str) -> Option<ControlExtension> {
        self.inner.extensions.lock().get(name).cloned()
    }

    /// Durably syncs every write acknowledged so far: the data log first,
    /// then the WAL of the overlay entries that name it.
    pub fn sync(&self) -> Result<()> {
        self.datalog().sync()?;
        self.index().sync()
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.inner.dir.display())
    }
}

/// The settings of the store a remote already holds (its `store.json`).
fn remote_config(backend: &Backend) -> Result<Option<StoreConfig>> {
    match backend.get(&paths::store_config()) {
        Ok(raw) => Ok(Some(
            serde_json::from_slice(&raw)
                .map_err(|e| Error::corrupt(format!("{}: {e}", paths::store_config())))?,
        )),
        Err(e) if e.kind() == crate::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
