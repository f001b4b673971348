//! Pack format: immutable objects holding many chunks, with a
//! self-describing footer so an index can be rebuilt from packs alone.
//!
//! ```text
//! header   "FKFSPACK" | version u8 = 1 | nonce [7]           (16 bytes)
//! body     chunk payloads, back to back (raw or zstd frames)
//! footer   count × { id [32] | offset u64 | stored_len u32 | plain_len u32 | codec u8 }
//! trailer  count u32 | footer_offset u64 | blake3(footer) [32] | "FKFSEND1"   (52 bytes)
//! ```
//! All integers little-endian. A chunk's payload is verified on read by
//! re-hashing its plain bytes against its id; the footer by its checksum.

pub use super::codec::{Codec, compress, decompress};
use crate::error::{Error, Result};
use crate::id::{ChunkId, PackId};
use crate::objects::Backend;
use bytes::Bytes;
use std::collections::HashMap;

pub const MAGIC: &[u8; 8] = b"FKFSPACK";
pub const END_MAGIC: &[u8; 8] = b"FKFSEND1";
pub const FORMAT_VERSION: u8 = 1;
pub const HEADER_LEN: usize = 16;
pub const ENTRY_LEN: usize = 49;
pub const TRAILER_LEN: usize = 52;

/// Where a chunk lives inside its pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: ChunkId,
    pub offset: u64,
    pub stored_len: u32,
    pub plain_len: u32,
    pub codec: Codec,
}

impl Entry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.0);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.plain_len.to_le_bytes());
        out.push(self.codec as u8);
    }

    pub fn decode(b: &[u8]) -> Result<Entry> {
        if b.len() != ENTRY_LEN {
            return Err(Error::corrupt("pack footer entry has the wrong length"));
        }
        Ok(Entry {
            id: ChunkId::from_slice(&b[0..32])?,
            offset: u64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
            stored_len: u32::from_le_bytes(b[40..44].try_into().expect("4 bytes")),
            plain_len: u32::from_le_bytes(b[44..48].try_into().expect("4 bytes")),
            codec: Codec::from_u8(b[48])?,
        })
    }
}

/// An open pack being filled in memory.
pub struct PackWriter {
    buf: Vec<u8>,
    entries: Vec<Entry>,
    by_id: HashMap<ChunkId, usize>,
}

impl Default for PackWriter {
    fn default() -> Self {
        PackWriter::new()
    }
}

impl PackWriter {
    pub fn new() -> PackWriter {
        // A random nonce: a pack is named by its hash, and two packs sealed
        // with the same chunks (content revived after a GC) must still get
        // different names, or deleting the old object could delete the new.
        PackWriter::with_nonce(rand::random::<[u8; 7]>())
    }

    /// A pack with a given nonce (the golden tests' fixed input).
    pub(crate) fn with_nonce(nonce: [u8; 7]) -> PackWriter {
        let mut buf = Vec::with_capacity(1 << 20);
        buf.extend_from_slice(MAGIC);
        buf.push(FORMAT_VERSION);
        buf.extend_from_slice(&nonce);
        PackWriter { buf, entries: Vec::new(), by_id: HashMap::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn contains(&self, id: &ChunkId) -> bool {
        self.by_id.contains_key(id)
    }

    /// Appends a chunk unless it is already in this pack.
    pub fn add(&mut self, id: ChunkId, plain_len: u32, codec: Codec, stored: &[u8]) {
        if self.by_id.contains_key(&id) {
            return;
        }
        let entry = Entry {
            id,
            offset: self.buf.len() as u64,
            stored_len: stored.len() as u32,
            plain_len,
            codec,
        };
        self.buf.extend_from_slice(stored);
        self.by_id.insert(id, self.entries.len());
        self.entries.push(entry);
    }

    /// Reads a chunk that has not been sealed yet.
    pub fn read(&self, id: &ChunkId) -> Option<Result<Bytes>> {
        let e = &self.entries[*self.by_id.get(id)?];
        let start = e.offset as usize;
        Some(decompress(e, &self.buf[start..start + e.stored_len as usize]))
    }

    /// Finishes the pack: appends footer and trailer, names it by its hash.
    pub fn seal(mut self) -> (PackId, Bytes, Vec<Entry>) {
        let footer_offset = self.buf.len() as u64;
        let mut footer = Vec::with_capacity(self.entries.len() * ENTRY_LEN);
        for e in &self.entries {
            e.encode(&mut footer);
        }
        let sum = blake3::hash(&footer);
        self.buf.extend_from_slice(&footer);
        self.buf.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&footer_offset.to_le_bytes());
        self.buf.extend_from_slice(sum.as_bytes());
        self.buf.extend_from_slice(END_MAGIC);
        let full = blake3::hash(&self.buf);
        let mut id = [0u8; 16];
        id.copy_from_slice(&full.as_bytes()[..16]);
        (PackId(id), Bytes::from(self.buf), self.entries)
    }
}

/// Parsed trailer of a pack: where its footer is.
#[derive(Debug, Clone, Copy)]
pub struct Trailer {
    pub count: u32,
    pub footer_offset: u64,
    pub checksum: [u8; 32],
}

impl Trailer {
    pub fn decode(b: &[u8], pack_len: u64) -> Result<Trailer> {
        if b.len() != TRAILER_LEN || &b[44..52] != END_MAGIC {
            return Err(Error::corrupt("pack trailer magic is missing"));
        }
        let count = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        let footer_offset = u64::from_le_bytes(b[4..12].try_into().expect("8 bytes"));
        let expected = footer_offset.checked_add(count as u64 * ENTRY_LEN as u64);
        if footer_offset < HEADER_LEN as u64 || expected != pack_len.checked_sub(TRAILER_LEN as u64)
        {
            return Err(Error::corrupt("pack trailer does not match the pack's length"));
        }
        Ok(Trailer { count, footer_offset, checksum: b[12..44].try_into().expect("32 bytes") })
    }

    /// The byte range of the footer inside the pack.
    pub fn footer_range(&self) -> std::ops::Range<u64> {
        self.footer_offset..self.footer_offset + self.count as u64 * ENTRY_LEN as u64
    }
}

/// Decodes and verifies a footer against its trailer.
pub fn decode_footer(trailer: &Trailer, footer: &[u8]) -> Result<Vec<Entry>> {
    if blake3::hash(footer).as_bytes() != &trailer.checksum {
        return Err(Error::corrupt("pack footer fails its checksum"));
    }
    let entries: Vec<Entry> =
        footer.chunks_exact(ENTRY_LEN).map(Entry::decode).collect::<Result<_>>()?;
    for e in &entries {
        let end = e.offset.checked_add(e.stored_len as u64);
        if e.offset < HEADER_LEN as u64 || end.is_none_or(|end| end > trailer.footer_offset) {
            return Err(Error::corrupt(format!("pack entry for {} points outside the body", e.id)));
        }
    }
    Ok(entries)
}

/// Reads and verifies the footer of the pack object `key` of length `len`:
/// two ranged reads, never the body.
pub fn read_footer(
    backend: &Backend,
    key: &object_store::path::Path,
    len: u64,
) -> Result<Vec<Entry>> {
    let tail = backend.get_range(key, len.saturating_sub(TRAILER_LEN as u64)..len)?;
    let trailer = Trailer::decode(&tail, len)?;
    let footer = backend.get_range(key, trailer.footer_range())?;
    decode_footer(&trailer, &footer)
}

/// Parses a whole pack held in memory (used by fsck and index rebuilds).
pub fn parse(pack: &[u8]) -> Result<Vec<Entry>> {
    if pack.len() < HEADER_LEN + TRAILER_LEN || &pack[..8] != MAGIC {
        return Err(Error::corrupt("pack header magic is missing"));
    }
    if pack[8] != FORMAT_VERSION {
        return Err(Error::corrupt(format!("pack format version {} is not supported", pack[8])));
    }
    let trailer = Trailer::decode(&pack[pack.len() - TRAILER_LEN..], pack.len() as u64)?;
    let r = trailer.footer_range();
    decode_footer(&trailer, &pack[r.start as usize..r.end as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (PackId, Bytes, Vec<Entry>) {
        let mut w = PackWriter::new();
        for data in [&b"hello hello hello hello hello hello"[..], &[0u8; 4096], b"x"] {
            let (codec, stored) = compress(data, 1);
            w.add(ChunkId::of(data), data.len() as u32, codec, &stored);
        }
        w.seal()
    }

    #[test]
    fn sealed_pack_parses_back_to_its_entries() {
        let (id, bytes, entries) = sample();
        assert_eq!(parse(&bytes).unwrap(), entries);
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].codec, Codec::Zstd);
        assert_eq!(entries[2].codec, Codec::Raw);
        assert_eq!(id.0[..], blake3::hash(&bytes).as_bytes()[..16], "named by its hash");
        let (id2, _, _) = sample();
        assert_ne!(id, id2, "the nonce makes each sealed pack's name unique");
        for e in &entries {
            let s = e.offset as usize;
            let plain = decompress(e, &bytes[s..s + e.stored_len as usize]).unwrap();
            assert_eq!(ChunkId::of(&plain), e.id);
        }
    }

    #[test]
    fn every_single_byte_flip_in_the_footer_is_caught() {
        let (_, bytes, _) = sample();
        let start = bytes.len() - TRAILER_LEN - 3 * ENTRY_LEN;
        for i in start..bytes.len() {
            let mut bad = bytes.to_vec();
            bad[i] ^= 0x40;
            assert!(parse(&bad).is_err(), "flip at {i} not detected");
        }
    }

    #[test]
    fn corrupt_payload_is_caught_by_the_chunk_id() {
        let (_, bytes, entries) = sample();
        let e = entries[0];
        let mut stored =
            bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize].to_vec();
        stored[0] ^= 1;
        assert!(decompress(&e, &stored).is_err());
    }

    #[test]
    fn truncated_packs_are_rejected_not_panicking() {
        let (_, bytes, _) = sample();
        for len in 0..bytes.len() {
            assert!(parse(&bytes[..len]).is_err());
        }
    }
}
