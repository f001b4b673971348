//! The local database: one RocksDB per store, holding the chunk index (a
//! cache of what the pack footers say) and the store's local state
//! (volume, head and version records, the overlays of live heads).
//!
//! This layer owns opening, column families, batches and durability; the
//! layers above own the keys and values of their column families:
//! - `chunks`, `packs`: the chunk index (`cas::index`)
//! - `meta`: string keys -> JSON records (`records::keys`)
//! - `overlay`: dirty entries of live heads (`head::overlay`)
//!
//! One process opens a store at a time: [`lock::DirLock`], held as long as
//! the database is open.
//!
//! Uses only the foundation (errors).

pub mod lock;
pub use lock::Holder;

use crate::error::{Error, Result};
use rocksdb::{
    BlockBasedOptions, ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options,
    WriteBatch, WriteOptions,
};
use std::path::Path;

pub use rocksdb::WriteBatch as Batch;

/// What [`Db::watch_meta`] calls after a matching write.
pub type MetaHook = std::sync::Arc<dyn Fn() + Send + Sync>;

struct Watch {
    id: u64,
    prefixes: Vec<String>,
    hook: MetaHook,
}

pub const CF_CHUNKS: &str = "chunks";
pub const CF_PACKS: &str = "packs";
pub const CF_META: &str = "meta";
pub const CF_OVERLAY: &str = "overlay";

/// The database directory inside a store.
pub const DIR: &str = "index";

pub struct Db {
    db: DB,
    /// Called after a write that put or deleted a `meta` key under a
    /// watched prefix ([`Db::watch_meta`]).
    watches: parking_lot::RwLock<Vec<Watch>>,
    /// Released after the database closes (fields drop in order), and
    /// after whatever else holds it (see [`Db::lock`]).
    lock: std::sync::Arc<lock::DirLock>,
}

impl Db {
    /// Takes the lock of the store at `store_dir` (failing as "in use" if
    /// another process holds it), then opens or creates its database. With
    /// the lock held, RocksDB's own lock never meets another forkfs
    /// process: what fails after it is the database itself, by kind.
    pub fn open(store_dir: &Path) -> Result<Db> {
        let lock = lock::DirLock::take(store_dir)?;
        Db::open_locked(store_dir, lock)
    }

    /// [`Db::open`] with a new, empty database; one already there is moved
    /// aside (`index.lost-<ms>`) first, under the lock.
    pub fn open_fresh(store_dir: &Path) -> Result<Db> {
        let lock = lock::DirLock::take(store_dir)?;
        let path = store_dir.join(DIR);
        if path.exists() {
            let aside = store_dir.join(format!("{DIR}.lost-{}", crate::clock::now_ms()));
            std::fs::rename(&path, &aside)?;
            tracing::warn!(from = %path.display(), to = %aside.display(), "moved the old index aside");
        }
        Db::open_locked(store_dir, lock)
    }

    fn open_locked(store_dir: &Path, lock: lock::DirLock) -> Result<Db> {
        let path = store_dir.join(DIR);
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.increase_parallelism(2);
        // A torn tail (a crash mid-write, never synced) is dropped; damage
        // anywhere else fails the open, loudly, instead of silently
        // recovering to the point before it (which would lose synced,
        // acknowledged writes behind it).
        opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::TolerateCorruptedTailRecords);
        // The machine's hard limit is 20,000 fds, shared with FUSE and NBD clients.
        opts.set_max_open_files(512);
        let mut point = BlockBasedOptions::default();
        point.set_bloom_filter(10.0, false);
        let mut chunks = Options::default();
        chunks.set_block_based_table_factory(&point);
        // Dirty block data is large and short-lived: keep it out of the LSM
        // in blob files so compactions do not rewrite it.
        let mut overlay = Options::default();
        overlay.set_block_based_table_factory(&point);
        overlay.set_enable_blob_files(true);
        overlay.set_min_blob_size(1024);
        overlay.set_enable_blob_gc(true);
        overlay.set_write_buffer_size(64 << 20);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_CHUNKS, chunks),
            ColumnFamilyDescriptor::new(CF_PACKS, Options::default()),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_OVERLAY, overlay),
        ];
        let db = DB::open_cf_descriptors(&opts, &path, cfs)
            .map_err(|e| Error::from(e).context(format!("opening {}", path.display())))?;
        Ok(Db { db, watches: Default::default(), lock: std::sync::Arc::new(lock) })
    }

    /// The store's lock, for what must stop before another process may
    /// open the store (the upload workers of the outbox).
    pub fn lock(&self) -> std::sync::Arc<lock::DirLock> {
        self.lock.clone()
    }

    pub fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    /// The RocksDB handle, for iterators and snapshots.
    pub fn raw(&self) -> &DB {
        &self.db
    }

    /// A synced write also checks that the store's directory is still
    /// where it was opened ([`lock::DirLock::check`]): it is durable only
    /// if it is in the store.
    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        let hooks = self.watching(&batch);
        self.db.write_opt(batch, &wo)?;
        // In the database now, whatever the check below says.
        for h in hooks {
            h();
        }
        if sync {
            self.lock.check()?;
        }
        Ok(())
    }

    /// Calls `hook` after every write of a batch that puts or deletes a
    /// `meta` key starting with one of `prefixes` (on the writing thread,
    /// once the write is in the database), until [`Db::unwatch_meta`]
    /// with the number returned. A batch is matched by its bytes: one
    /// that holds a prefix elsewhere (in another key or a value) calls
    /// the hook too, which must be harmless (dropping a cache).
    pub fn watch_meta(&self, prefixes: &[&str], hook: MetaHook) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefixes = prefixes.iter().map(|p| p.to_string()).collect();
        self.watches.write().push(Watch { id, prefixes, hook });
        id
    }

    pub fn unwatch_meta(&self, id: u64) {
        self.watches.write().retain(|w| w.id != id);
    }

    /// The hooks of the watches `batch` matches.
    fn watching(&self, batch: &WriteBatch) -> Vec<MetaHook> {
        let watches = self.watches.read();
        if watches.is_empty() {
            return Vec::new();
        }
        let data = batch.data();
        let found = |p: &String| memchr::memmem::find(data, p.as_bytes()).is_some();
        watches.iter().filter(|w| w.prefixes.iter().any(found)).map(|w| w.hook.clone()).collect()
    }

    /// Makes everything written so far durable (syncs the WAL), in the
    /// store's directory (checked as by a synced [`Db::write`]).
    pub fn sync(&self) -> Result<()> {
        self.db.flush_wal(true)?;
        self.lock.check()
    }

    /// Writes every memtable to SST files (synced by RocksDB), so that
    /// nothing the store holds is only in the WAL.
    pub fn flush_memtables(&self) -> Result<()> {
        let cfs: Vec<&ColumnFamily> =
            [CF_CHUNKS, CF_PACKS, CF_META, CF_OVERLAY].iter().map(|n| self.cf(n)).collect();
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(true);
        Ok(self.db.flush_cfs_opt(&cfs, &fo)?)
    }

    pub fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_cf(self.cf(CF_META), key.as_bytes())?)
    }

    /// All `meta` entries whose key starts with `prefix`, in key order.
    pub fn scan_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        let mode = IteratorMode::From(prefix.as_bytes(), Direction::Forward);
        for item in self.db.iterator_cf(self.cf(CF_META), mode) {
            let (k, v) = item?;
            if !k.starts_with(prefix.as_bytes()) {
                break;
            }
            let key = String::from_utf8(k.to_vec())
                .map_err(|_| Error::corrupt("meta key is not UTF-8"))?;
            out.push((key, v.to_vec()));
        }
        Ok(out)
    }

    /// A `meta` record, decoded.
    pub fn get_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.get_meta(key)? {
            Some(v) => Ok(Some(
                serde_json::from_slice(&v)
                    .map_err(|e| Error::corrupt(format!("record {key}: {e}")))?,
            )),
            None => Ok(None),
        }
    }

    /// Adds a `meta` record to `batch`.
    pub fn put_json<T: serde::Serialize>(
        &self,
        b: &mut WriteBatch,
        key: &str,
        v: &T,
    ) -> Result<()> {
        b.put_cf(self.cf(CF_META), key.as_bytes(), serde_json::to_vec(v)?);
        Ok(())
    }

    pub fn put_meta(&self, b: &mut WriteBatch, key: &str, v: impl AsRef<[u8]>) {
        b.put_cf(self.cf(CF_META), key.as_bytes(), v);
    }

    pub fn delete_meta(&self, b: &mut WriteBatch, key: &str) {
        b.delete_cf(self.cf(CF_META), key.as_bytes());
    }
}

impl Drop for Db {
    /// A clean close leaves nothing only the WAL holds: a WAL lost after
    /// it (deleted, or on a disk that lost it) loses no write. A crash
    /// still leaves the last writes in the WAL alone (docs/RELIABILITY.md).
    fn drop(&mut self) {
        if let Err(e) = self.flush_memtables() {
            // Nothing is lost (the WAL keeps them): not worth a second line
            // under the error that usually caused it (a full disk).
            tracing::debug!(error = %e, "closing the index: memtables not flushed (the WAL keeps them)");
        }
    }
}
