//! The local RocksDB database: the chunk index (a cache of what the pack
//! footers say) plus the store's mutable local state (volume records, heads,
//! version records, overlays).
//!
//! Column families:
//! - `chunks`:  chunk id -> pack location (see [`Location`])
//! - `packs`:   pack id -> chunk count u32 | byte length u64 | indexed at (ms since epoch) u64
//! - `meta`:    string keys -> JSON records (volumes, heads, versions, tags, counters)
//! - `overlay`: volume id | space | owner | key -> dirty entry (see `overlay.rs`)

use crate::error::{Error, Result};
use crate::id::{ChunkId, PackId};
use crate::pack::{Codec, Entry};
use rocksdb::{
    BlockBasedOptions, ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options,
    WriteBatch, WriteOptions,
};
use std::path::Path;

pub const CF_CHUNKS: &str = "chunks";
pub const CF_PACKS: &str = "packs";
pub const CF_META: &str = "meta";
pub const CF_OVERLAY: &str = "overlay";

/// Where a chunk is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub pack: PackId,
    pub offset: u64,
    pub stored_len: u32,
    pub plain_len: u32,
    pub codec: Codec,
}

impl Location {
    const LEN: usize = 33;

    pub fn of(pack: PackId, e: &Entry) -> Location {
        Location {
            pack,
            offset: e.offset,
            stored_len: e.stored_len,
            plain_len: e.plain_len,
            codec: e.codec,
        }
    }

    pub fn entry(&self, id: ChunkId) -> Entry {
        Entry {
            id,
            offset: self.offset,
            stored_len: self.stored_len,
            plain_len: self.plain_len,
            codec: self.codec,
        }
    }

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..16].copy_from_slice(&self.pack.0);
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.stored_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.plain_len.to_le_bytes());
        b[32] = self.codec as u8;
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Location> {
        if b.len() != Self::LEN {
            return Err(Error::corrupt("chunk index entry has the wrong length"));
        }
        Ok(Location {
            pack: PackId(b[0..16].try_into().expect("16 bytes")),
            offset: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            stored_len: u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")),
            plain_len: u32::from_le_bytes(b[28..32].try_into().expect("4 bytes")),
            codec: Codec::from_u8(b[32])?,
        })
    }
}

/// What the index records about a pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackInfo {
    /// Chunks its footer lists.
    pub count: u32,
    /// Object length in bytes.
    pub len: u64,
    /// When it was indexed; GC's grace period counts from here.
    pub created_ms: u64,
}

impl PackInfo {
    fn encode(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[0..4].copy_from_slice(&self.count.to_le_bytes());
        b[4..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..20].copy_from_slice(&self.created_ms.to_le_bytes());
        b
    }

    pub(crate) fn decode(v: &[u8]) -> Result<PackInfo> {
        if v.len() != 20 {
            return Err(Error::corrupt("pack index entry has the wrong length"));
        }
        Ok(PackInfo {
            count: u32::from_le_bytes(v[0..4].try_into().expect("4 bytes")),
            len: u64::from_le_bytes(v[4..12].try_into().expect("8 bytes")),
            created_ms: u64::from_le_bytes(v[12..20].try_into().expect("8 bytes")),
        })
    }
}

pub struct Index {
    db: DB,
}

impl Index {
    pub fn open(path: &Path) -> Result<Index> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.increase_parallelism(2);
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
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| {
            if e.to_string().contains("lock") {
                Error::conflict(format!(
                    "the store at {} is in use by another forkfs process",
                    path.parent().unwrap_or(path).display()
                ))
            } else {
                e.into()
            }
        })?;
        Ok(Index { db })
    }

    pub fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    pub fn db(&self) -> &DB {
        &self.db
    }

    pub fn get_chunk(&self, id: &ChunkId) -> Result<Option<Location>> {
        match self.db.get_pinned_cf(self.cf(CF_CHUNKS), id.0)? {
            Some(v) => Ok(Some(Location::decode(&v)?)),
            None => Ok(None),
        }
    }

    pub fn has_chunk(&self, id: &ChunkId) -> Result<bool> {
        if !self.db.key_may_exist_cf(self.cf(CF_CHUNKS), id.0) {
            return Ok(false);
        }
        Ok(self.db.get_pinned_cf(self.cf(CF_CHUNKS), id.0)?.is_some())
    }

    /// Records a sealed pack and all its chunks in one atomic, synced batch.
    pub fn add_pack(&self, pack: PackId, len: u64, entries: &[Entry]) -> Result<()> {
        let mut batch = WriteBatch::default();
        self.put_pack(&mut batch, pack, len, entries);
        self.write(batch, true)
    }

    /// Adds to `batch` a pack and every chunk of it, pointing at it.
    pub(crate) fn put_pack(
        &self,
        batch: &mut WriteBatch,
        pack: PackId,
        len: u64,
        entries: &[Entry],
    ) {
        for e in entries {
            self.put_chunk(batch, e.id, &Location::of(pack, e));
        }
        let info =
            PackInfo { count: entries.len() as u32, len, created_ms: crate::version::now_ms() };
        self.put_pack_info(batch, pack, &info);
    }

    pub(crate) fn put_pack_info(&self, batch: &mut WriteBatch, pack: PackId, info: &PackInfo) {
        batch.put_cf(self.cf(CF_PACKS), pack.0, info.encode());
    }

    pub(crate) fn put_chunk(&self, batch: &mut WriteBatch, id: ChunkId, loc: &Location) {
        batch.put_cf(self.cf(CF_CHUNKS), id.0, loc.encode());
    }

    pub(crate) fn delete_chunk(&self, batch: &mut WriteBatch, id: &ChunkId) {
        batch.delete_cf(self.cf(CF_CHUNKS), id.0);
    }

    pub(crate) fn delete_pack(&self, batch: &mut WriteBatch, id: &PackId) {
        batch.delete_cf(self.cf(CF_PACKS), id.0);
    }

    pub fn pack_info(&self, id: &PackId) -> Result<Option<PackInfo>> {
        match self.db.get_pinned_cf(self.cf(CF_PACKS), id.0)? {
            Some(v) => Ok(Some(PackInfo::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// Every pack the index knows.
    pub fn packs(&self) -> Result<Vec<(PackId, PackInfo)>> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(CF_PACKS), IteratorMode::Start) {
            let (k, v) = item?;
            let id = PackId(
                k[..]
                    .try_into()
                    .map_err(|_| Error::corrupt("pack index key has the wrong length"))?,
            );
            out.push((id, PackInfo::decode(&v)?));
        }
        Ok(out)
    }

    /// Calls `f` for every chunk entry, in id order. An entry that does not
    /// decode is passed as an error for the caller to report.
    pub fn for_each_chunk(
        &self,
        f: &mut dyn FnMut(ChunkId, Result<Location>) -> Result<()>,
    ) -> Result<()> {
        for item in self.db.iterator_cf(self.cf(CF_CHUNKS), IteratorMode::Start) {
            let (k, v) = item?;
            let Ok(id) = ChunkId::from_slice(&k) else {
                return Err(Error::corrupt("chunk index key has the wrong length"));
            };
            f(id, Location::decode(&v))?;
        }
        Ok(())
    }

    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        Ok(self.db.write_opt(batch, &wo)?)
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

    /// After the overlay of a volume was cleared: when the overlay's
    /// memtable holds many entries, asks RocksDB to flush it in the
    /// background. Until a flush drops them, the entries a range deletion
    /// covers stay in the memtable and every iterator steps over them one
    /// by one (a clean snapshot of a workspace that had just created 100k
    /// files took 80 ms, all of it there).
    pub fn overlay_cleared(&self) {
        const DEAD_ENTRIES: u64 = 50_000;
        let cf = self.cf(CF_OVERLAY);
        let n = self.db.property_int_value_cf(cf, "rocksdb.num-entries-active-mem-table");
        if matches!(n, Ok(Some(n)) if n >= DEAD_ENTRIES) {
            let mut fo = rocksdb::FlushOptions::default();
            fo.set_wait(false);
            if let Err(e) = self.db.flush_cf_opt(cf, &fo) {
                tracing::warn!(error = %e, "overlay flush request failed");
            }
        }
    }

    /// Makes everything written so far durable (syncs the WAL).
    pub fn sync(&self) -> Result<()> {
        Ok(self.db.flush_wal(true)?)
    }
}
