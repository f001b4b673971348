//! A store: its directory, configuration and lock, and a thin handle over
//! the services that do the work: [`Volumes`], the version [`Graph`], the
//! [`ChunkStore`] and, on S3/GCS/Azure, the [`Remote`] side. Maintenance
//! (check, repair, gc, stats) adds its commands in `maint/`.
//!
//! Directory layout: `forkfs.json` (configuration), `lock` (held while
//! open), `index/` (RocksDB), `log/` (data log), `objects/` (the embedded
//! object store, when no remote is configured), `outbox/` and `cache/`
//! (remote stores).
//!
//! Uses every layer below it.

pub(crate) mod absorb;
pub mod config;
#[cfg(test)]
mod golden;
mod identity;
mod sync;

pub use config::{CONFIG_FILE, DEFAULT_BLOCK_SIZE, StoreConfig};
pub use sync::Synced;

use crate::cas::{ChunkConfig, ChunkIndex, ChunkStore};
use crate::config::Settings;
use crate::db::Db;
use crate::error::{Error, ErrorKind, Result};
use crate::files;
use crate::graph::{Graph, Volumes};
use crate::head::Storage;
use crate::head::datalog::DataLog;
use crate::objects::{Backend, keys};
use crate::progress::Progress;
use crate::records::{RECORD_FORMAT, Records, keys as meta_keys};
use crate::sync::Remote;
use identity::Opening;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Inner {
    dir: PathBuf,
    config: StoreConfig,
    graph: Graph,
    volumes: Arc<Volumes>,
    /// Dropped after the services that hold it: closing publishes what
    /// this process committed (see `sync/mod.rs`).
    remote: Option<Arc<Remote>>,
    storage: Arc<Storage>,
    /// One GC at a time.
    gc_lock: Mutex<()>,
    /// On a shared store: this host's name in GC acknowledgements.
    host_id: String,
    /// On a shared store: hosts silent for longer are taken for gone by GC.
    gc_host_timeout: std::time::Duration,
    /// See [`Settings::test_gc_unsafe_immediate_delete`].
    gc_unsafe_immediate_delete: bool,
}

/// An open store; cheap to clone, safe to share between threads.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl Store {
    /// Creates a new store in `dir` (which may exist but must not hold a store).
    pub fn init(dir: &Path, config: StoreConfig) -> Result<Store> {
        Store::init_with(dir, config, &Settings::default())
    }

    /// [`Store::init`] for a process with `settings`.
    pub fn init_with(dir: &Path, config: StoreConfig, settings: &Settings) -> Result<Store> {
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
        config.id.get_or_insert_with(identity::new_id);
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
                config.id.get_or_insert_with(identity::new_id);
                existing = true;
            } else {
                let shared = StoreConfig { remote: None, ..config.clone() };
                backend.put(&keys::store_config(), crate::records::encode(&shared)?)?;
            }
        }
        files::private_dir(dir)?;
        let tmp = dir.join(format!("{CONFIG_FILE}.tmp"));
        files::write_private(&tmp, &serde_json::to_vec_pretty(&config)?)?;
        let store = Store::open_config(dir, &config, settings, Opening::Create)?;
        if existing {
            let publisher = store.remote().map(|r| r.publisher());
            let attached = crate::sync::attach(store.storage(), publisher, &crate::progress::Quiet);
            if let Err(e) = attached {
                drop(store);
                let _ = std::fs::remove_dir_all(dir.join(crate::db::DIR));
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
        Store::open_with(dir, &Settings::default())
    }

    /// [`Store::open`] for a process with `settings`.
    pub fn open_with(dir: &Path, settings: &Settings) -> Result<Store> {
        Store::open_config(dir, &read_config(dir)?, settings, Opening::Existing)
    }

    /// Opens a store whose index is lost (missing, empty or another
    /// store's, [`Error::is_index_lost`]) with a new index rebuilt from the
    /// object store: volume, head, version and tag records from their
    /// objects, the chunk index from the pack footers. The old index is
    /// moved aside (`index.lost-<ms>`), not deleted. Writes that were in
    /// no version are lost with it.
    pub fn rebuild(dir: &Path, settings: &Settings, progress: &dyn Progress) -> Result<Store> {
        let store = Store::open_config(dir, &read_config(dir)?, settings, Opening::Rebuild)?;
        let publisher = store.remote().map(|r| r.publisher());
        let report = crate::sync::attach(store.storage(), publisher, progress)?;
        let tags = store.graph().import_tags()?;
        let groups = store.graph().import_groups()?;
        tracing::warn!(?report, tags, groups, "rebuilt the index from the object store");
        Ok(store)
    }

    fn open_config(
        dir: &Path,
        config: &StoreConfig,
        settings: &Settings,
        opening: Opening,
    ) -> Result<Store> {
        let mut config = config.clone();
        keep_private(dir)?;
        if opening == Opening::Existing && !dir.join(crate::db::DIR).exists() {
            return Err(identity::index_lost(dir, "is missing"));
        }
        // Before the index starts its threads (see `prepare_io`).
        crate::objects::prepare_io()?;
        let db = match opening {
            Opening::Rebuild => Db::open_fresh(dir),
            _ => Db::open(dir),
        };
        let db = Arc::new(db.map_err(|e| match e.detail() {
            // A database that does not open is as good as lost: rebuilt
            // from the object store by `fsck --repair`.
            Some(crate::error::Detail::Db(rocksdb::ErrorKind::Corruption)) => {
                identity::index_lost(dir, &format!("is damaged ({e})"))
            }
            _ => e,
        })?);
        identity::settle(dir, &mut config, &db, opening)?;
        let stall = config.remote.as_ref().map(|r| r.stall(settings));
        let backend = Arc::new(
            match &config.remote {
                None => Backend::local(dir.join("objects"))?,
                Some(r) => {
                    let (os, root) = r.open()?;
                    let local = root.is_some();
                    let b = Backend::new(os, root, r.url.clone())?
                        .with_read_deadline(r.read_deadline(settings));
                    // A `file://` remote takes its puts durably at once.
                    if local {
                        b
                    } else {
                        b.with_outbox(dir.join("outbox"), r.pending_limit(settings))?
                    }
                }
            }
            .with_guard(db.lock()),
        );
        let chunk_config = ChunkConfig {
            pack_target: config.pack_target,
            zstd_level: config.zstd_level,
            cache_bytes: settings.memory_cache(config.cache_bytes),
            disk_cache: config
                .remote
                .as_ref()
                .map(|_| (dir.join("cache"), config.disk_cache_bytes)),
            readahead: settings.readahead(),
            shared: config.remote.is_some(),
        };
        let index = ChunkIndex::new(db.clone());
        let chunks = Arc::new(ChunkStore::new(backend.clone(), index, chunk_config));
        let storage = Arc::new(Storage {
            db: db.clone(),
            chunks,
            log: match DataLog::open(dir.join("log"))? {
                log if settings.test_skip_log_sync => log.without_sync(),
                log => log,
            },
            records: Records::new(db.clone(), backend.clone()),
            readers: Default::default(),
        });
        // A store on a remote (S3/GCS/Azure, or a `file://` directory that
        // other store directories may share) has a remote side: leases,
        // publishing, imports, one graph for every host.
        let remote = match stall {
            Some(stall) => Some(Remote::start(storage.clone(), stall, settings.lease_ttl())?),
            None => None,
        };
        // Every host of a shared store takes part in its GC: registered
        // before it indexes anything, then absorbing tombstones at the pace
        // of lease renewals (`absorb.rs`).
        let host_id = match &remote {
            Some(_) => identity::host_id(&db)?,
            None => String::new(),
        };
        if let Some(r) = &remote {
            let host = host_id.clone();
            // A host that cannot reach the bucket works on what it has;
            // it imports nothing until a registration succeeded (the
            // ticker retries), so every GC waits for it first.
            let timeout = settings.gc_host_timeout();
            let registered = r.registration();
            match absorb::register(&storage, &host, timeout) {
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    tracing::warn!(error = %e, "the bucket is out of reach: working on this host's view");
                    registered.store(false, std::sync::atomic::Ordering::SeqCst);
                }
                r => r?,
            }
            let (s, stall) = (storage.clone(), r.stall());
            let every = (settings.lease_ttl() / 3).max(std::time::Duration::from_millis(100));
            let import = r.importer();
            r.start_ticker(
                every,
                Box::new(move || {
                    use std::sync::atomic::Ordering::SeqCst;
                    if !registered.load(SeqCst) {
                        match absorb::register(&s, &host, timeout) {
                            Ok(()) => registered.store(true, SeqCst),
                            Err(e) => {
                                tracing::warn!(error = %e, "not registered with the bucket's gc yet");
                                return;
                            }
                        }
                    }
                    // Deletions made elsewhere first: their data is then
                    // not this host's to keep (`sync/view.rs`).
                    if let Err(e) = import() {
                        tracing::warn!(error = %e, "other hosts' changes not imported yet");
                    }
                    if let Err(e) = absorb::absorb(&s, &host, stall) {
                        tracing::warn!(error = %e, "gc tombstones not absorbed yet");
                    }
                }),
            )?;
        }
        let volumes =
            Arc::new(Volumes::new(storage.clone(), remote.clone(), config.default_block_size));
        let graph = Graph::new(storage.clone(), volumes.clone());
        let store = Store {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                config,
                graph,
                volumes,
                remote,
                storage,
                gc_lock: Mutex::new(()),
                host_id,
                gc_host_timeout: settings.gc_host_timeout(),
                gc_unsafe_immediate_delete: settings.test_gc_unsafe_immediate_delete,
            }),
        };
        // Segments below a volume's floor were folded by a checkpoint whose
        // cleanup a crash may have cut short.
        for vol in store.storage().records.volumes()? {
            if let Some(floor) = db.get_json::<u64>(&meta_keys::log_floor(vol.id))? {
                store.storage().log.drop_below(vol.id, floor)?;
            }
        }
        store.graph().recover_unsealed()?;
        store.graph().finish_deletions()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Create, open, change and delete volumes.
    pub fn volumes(&self) -> &Volumes {
        &self.inner.volumes
    }

    /// Snapshot, fork, restore, diff, log, tags, retention.
    pub fn graph(&self) -> &Graph {
        &self.inner.graph
    }

    /// The content-addressed chunks (and through them the object store).
    pub fn chunks(&self) -> &Arc<ChunkStore> {
        &self.inner.storage.chunks
    }

    /// The remote side of a store on S3, GCS or Azure.
    pub(crate) fn remote(&self) -> Option<&Arc<Remote>> {
        self.inner.remote.as_ref()
    }

    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.inner.storage
    }

    pub(crate) fn db(&self) -> &Db {
        &self.inner.storage.db
    }

    pub(crate) fn gc_lock(&self) -> &Mutex<()> {
        &self.inner.gc_lock
    }

    /// This host's id in a shared store's GC (empty on a store of one host).
    pub(crate) fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    /// On a shared store, how long a silent host still counts for GC.
    pub(crate) fn gc_host_timeout(&self) -> std::time::Duration {
        self.inner.gc_host_timeout
    }

    /// GC deletes at once on a shared store (the negative control only).
    pub(crate) fn gc_unsafe_immediate_delete(&self) -> bool {
        self.inner.gc_unsafe_immediate_delete
    }

    /// Durably syncs every write acknowledged so far: the data log first,
    /// then the WAL of the overlay entries that name it.
    pub fn flush(&self) -> Result<()> {
        self.inner.storage.sync()
    }

    /// Whether data may have to come from an object store over the network
    /// (a read may then wait on a fetch).
    pub fn is_remote(&self) -> bool {
        self.remote().is_some()
    }

    /// Waits until everything committed so far is in the object store
    /// (a no-op for local stores; see [`Remote::sync`]).
    pub fn sync_remote(&self) -> Result<()> {
        match self.remote() {
            Some(r) => r.sync(),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.inner.dir.display())
    }
}

/// The store directory is its owner's only (0700): a store made by an
/// older forkfs, or whose mode was changed, is made so again.
fn keep_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{:o}", mode & 0o777), "the store directory was open to other users; made 0700");
        files::private_dir(dir)?;
    }
    Ok(())
}

/// The configuration of the store at `dir`.
fn read_config(dir: &Path) -> Result<StoreConfig> {
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
    Ok(config)
}

/// The settings of the store a remote already holds (its `store.json`).
fn remote_config(backend: &Backend) -> Result<Option<StoreConfig>> {
    match backend.get(&keys::store_config()) {
        Ok(raw) => Ok(Some(
            serde_json::from_slice(&raw)
                .map_err(|e| Error::corrupt(format!("{}: {e}", keys::store_config())))?,
        )),
        Err(e) if e.kind() == crate::error::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
