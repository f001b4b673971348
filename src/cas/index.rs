//! The chunk index: where each chunk is (a cache of what the pack footers
//! say, so it can be rebuilt from the packs alone), and what is known of
//! each pack. Two column families of the local database:
//! - `chunks`: chunk id -> pack location (see [`Location`])
//! - `packs`:  pack id -> chunk count u32 | byte length u64 | indexed at (ms since epoch) u64

use super::pack::{Codec, Entry};
use crate::db::{Batch, CF_CHUNKS, CF_PACKS, Db};
use crate::error::{Error, Result};
use crate::id::{ChunkId, PackId};
use rocksdb::IteratorMode;
use std::sync::Arc;

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
    pub(crate) fn encode(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[0..4].copy_from_slice(&self.count.to_le_bytes());
        b[4..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..20].copy_from_slice(&self.created_ms.to_le_bytes());
        b
    }

    pub fn decode(v: &[u8]) -> Result<PackInfo> {
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

/// The chunk and pack column families of the store's database.
#[derive(Clone)]
pub struct ChunkIndex {
    db: Arc<Db>,
}

impl ChunkIndex {
    pub fn new(db: Arc<Db>) -> ChunkIndex {
        ChunkIndex { db }
    }

    pub fn get_chunk(&self, id: &ChunkId) -> Result<Option<Location>> {
        match self.db.raw().get_pinned_cf(self.db.cf(CF_CHUNKS), id.0)? {
            Some(v) => Ok(Some(Location::decode(&v)?)),
            None => Ok(None),
        }
    }

    pub fn has_chunk(&self, id: &ChunkId) -> Result<bool> {
        let cf = self.db.cf(CF_CHUNKS);
        if !self.db.raw().key_may_exist_cf(cf, id.0) {
            return Ok(false);
        }
        Ok(self.db.raw().get_pinned_cf(cf, id.0)?.is_some())
    }

    /// Records a sealed pack and all its chunks in one atomic, synced batch.
    pub(crate) fn add_pack(&self, pack: PackId, len: u64, entries: &[Entry]) -> Result<()> {
        let mut batch = Batch::default();
        self.put_pack(&mut batch, pack, len, entries);
        self.db.write(batch, true)
    }

    /// Writes a batch of index changes, synced.
    pub(crate) fn write(&self, batch: Batch) -> Result<()> {
        self.db.write(batch, true)
    }

    /// Adds to `batch` a pack and every chunk of it, pointing at it.
    pub(crate) fn put_pack(&self, batch: &mut Batch, pack: PackId, len: u64, entries: &[Entry]) {
        for e in entries {
            self.put_chunk(batch, e.id, &Location::of(pack, e));
        }
        let info =
            PackInfo { count: entries.len() as u32, len, created_ms: crate::clock::now_ms() };
        self.put_pack_info(batch, pack, &info);
    }

    pub(crate) fn put_pack_info(&self, batch: &mut Batch, pack: PackId, info: &PackInfo) {
        batch.put_cf(self.db.cf(CF_PACKS), pack.0, info.encode());
    }

    pub(crate) fn put_chunk(&self, batch: &mut Batch, id: ChunkId, loc: &Location) {
        batch.put_cf(self.db.cf(CF_CHUNKS), id.0, loc.encode());
    }

    pub(crate) fn delete_chunk(&self, batch: &mut Batch, id: &ChunkId) {
        batch.delete_cf(self.db.cf(CF_CHUNKS), id.0);
    }

    pub(crate) fn delete_pack(&self, batch: &mut Batch, id: &PackId) {
        batch.delete_cf(self.db.cf(CF_PACKS), id.0);
    }

    pub fn pack_info(&self, id: &PackId) -> Result<Option<PackInfo>> {
        match self.db.raw().get_pinned_cf(self.db.cf(CF_PACKS), id.0)? {
            Some(v) => Ok(Some(PackInfo::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// Every pack the index knows.
    pub fn packs(&self) -> Result<Vec<(PackId, PackInfo)>> {
        let mut out = Vec::new();
        for item in self.db.raw().iterator_cf(self.db.cf(CF_PACKS), IteratorMode::Start) {
            let (k, v) = item?;
            out.push((pack_key(&k)?, PackInfo::decode(&v)?));
        }
        Ok(out)
    }

    /// Calls `f` for every chunk entry, in id order. An entry that does not
    /// decode is passed as an error for the caller to report.
    pub fn for_each_chunk(
        &self,
        f: &mut dyn FnMut(ChunkId, Result<Location>) -> Result<()>,
    ) -> Result<()> {
        for item in self.db.raw().iterator_cf(self.db.cf(CF_CHUNKS), IteratorMode::Start) {
            let (k, v) = item?;
            let Ok(id) = ChunkId::from_slice(&k) else {
                return Err(Error::corrupt("chunk index key has the wrong length"));
            };
            f(id, Location::decode(&v))?;
        }
        Ok(())
    }
}

/// A pack id from its key in the `packs` column family.
pub fn pack_key(k: &[u8]) -> Result<PackId> {
    Ok(PackId(k.try_into().map_err(|_| Error::corrupt("pack index key has the wrong length"))?))
}
