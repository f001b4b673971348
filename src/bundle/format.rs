//! The bundle stream (docs/FORMAT.md, "History bundles"): a magic, then
//! frames `kind (1 byte) | length (u32 LE) | payload`: one header, the
//! versions, their names, the chunks, and an end frame holding the blake3
//! of every byte before it. [`Reader`] checks everything a bundle can
//! check alone: framing, order, counts, each version's seal, each chunk's
//! hash, and the end hash, so a truncated or altered bundle fails before
//! anything it carries is used.

use crate::cas::codec::{self, Codec};
use crate::cas::pack::Entry;
use crate::error::{Error, Result};
use crate::graph::Foreign;
use crate::id::{ChunkId, VersionId};
use crate::records::{Consistency, Policy, VersionRecord, VolumeKind};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::{Read, Write};

/// `FORKFSB` and the format number.
pub const MAGIC: &[u8; 8] = b"FORKFSB\x01";

const HEADER: u8 = b'H';
const VERSION: u8 = b'V';
const NAME: u8 = b'N';
const CHUNK: u8 = b'C';
const END: u8 = b'E';

/// The largest record frame (header, version, name) read.
const MAX_RECORD: u32 = 1 << 20;
/// The largest chunk (plain bytes) read: a 16 MiB block and then some.
const MAX_CHUNK: u32 = 32 << 20;

/// What a bundle carries, said before it carries it.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Header {
    pub format: u8,
    pub volume: VolumeShape,
    /// The version the bundle builds on (`None`: a whole history).
    pub base: Option<Foreign>,
    pub versions: u64,
    pub names: u64,
    pub chunks: u64,
    pub created_at_ms: u64,
    /// The forkfs that wrote it.
    pub writer: String,
}

/// The volume the versions are of, as a new copy of it is created.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct VolumeShape {
    pub name: String,
    pub kind: VolumeKind,
    pub size: u64,
    pub block_size: u32,
    #[serde(default)]
    pub consistency: Consistency,
    #[serde(default)]
    pub retention: Option<Policy>,
    pub auto_prune: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct Name {
    name: String,
    version: VersionId,
}

/// Writes a bundle's frames, hashing every byte.
pub struct Writer<W: Write> {
    out: W,
    hash: blake3::Hasher,
    pub written: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W, header: &Header) -> Result<Writer<W>> {
        out.write_all(MAGIC)?;
        let mut w = Writer { out, hash: blake3::Hasher::new(), written: 0 };
        w.hash.update(MAGIC);
        w.written = MAGIC.len() as u64;
        w.frame(HEADER, &[&serde_json::to_vec(header)?])?;
        Ok(w)
    }

    fn frame(&mut self, kind: u8, parts: &[&[u8]]) -> Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(len).map_err(|_| Error::invalid("bundle frame over 4 GiB"))?;
        let mut head = [0u8; 5];
        head[0] = kind;
        head[1..].copy_from_slice(&len.to_le_bytes());
        for p in std::iter::once(&head[..]).chain(parts.iter().copied()) {
            self.hash.update(p);
            self.out.write_all(p)?;
        }
        self.written += 5 + len as u64;
        Ok(())
    }

    pub fn version(&mut self, v: &VersionRecord) -> Result<()> {
        self.frame(VERSION, &[&serde_json::to_vec(v)?])
    }

    pub fn name(&mut self, name: &str, version: VersionId) -> Result<()> {
        self.frame(NAME, &[&serde_json::to_vec(&Name { name: name.into(), version })?])
    }

    /// A chunk's plain bytes, compressed at `level` when that pays.
    pub fn chunk(&mut self, id: &ChunkId, plain: &[u8], level: i32) -> Result<()> {
        let (codec, stored) = codec::compress(plain, level);
        let plain_len =
            u32::try_from(plain.len()).map_err(|_| Error::invalid("chunk over 4 GiB"))?;
        self.frame(CHUNK, &[&id.0, &[codec as u8], &plain_len.to_le_bytes(), &stored])
    }

    /// The end frame; returns the output, flushed.
    pub fn finish(mut self) -> Result<W> {
        let sum = *self.hash.finalize().as_bytes();
        self.frame(END, &[&sum])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One item of a bundle, in stream order.
pub enum Item {
    Version(VersionRecord),
    Name(String, VersionId),
    Chunk(ChunkId, Bytes),
    /// The end frame matched: everything before it is the writer's.
    End,
}

/// Reads and checks a bundle, item by item.
pub struct Reader<R: Read> {
    input: R,
    hash: blake3::Hasher,
    pub header: Header,
    /// Items read so far, by kind.
    pub versions: u64,
    pub names: u64,
    pub chunks: u64,
    pub bytes_read: u64,
    pub plain_bytes: u64,
    version_ids: HashSet<VersionId>,
    chunk_ids: HashSet<ChunkId>,
    ended: bool,
}

fn damaged(why: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("the bundle is damaged: {why}"))
}

impl<R: Read> Reader<R> {
    pub fn new(mut input: R) -> Result<Reader<R>> {
        let mut magic = [0u8; 8];
        read_exact(&mut input, &mut magic, "in its first bytes")?;
        if magic[..7] != MAGIC[..7] {
            return Err(Error::invalid("not a forkfs bundle (it does not start with FORKFSB)"));
        }
        if magic[7] != MAGIC[7] {
            return Err(Error::invalid(format!(
                "bundle format {} is not one this forkfs reads (it reads {})",
                magic[7], MAGIC[7]
            )));
        }
        let mut hash = blake3::Hasher::new();
        hash.update(&magic);
        let (kind, payload) = read_frame(&mut input, &mut hash, "in its header")?;
        if kind != HEADER {
            return Err(damaged("it has no header"));
        }
        let header: Header =
            serde_json::from_slice(&payload).map_err(|e| damaged(format!("header: {e}")))?;
        if header.format != MAGIC[7] {
            return Err(damaged(format!("header format {}", header.format)));
        }
        Ok(Reader {
            input,
            hash,
            header,
            versions: 0,
            names: 0,
            chunks: 0,
            bytes_read: (magic.len() + 5 + payload.len()) as u64,
            plain_bytes: 0,
            version_ids: HashSet::new(),
            chunk_ids: HashSet::new(),
            ended: false,
        })
    }

    fn where_(&self) -> String {
        format!(
            "after {} of {} versions, {} of {} names and {} of {} chunks",
            self.versions,
            self.header.versions,
            self.names,
            self.header.names,
            self.chunks,
            self.header.chunks
        )
    }

    /// The next item, checked; `End` once, then errors.
    pub fn next_item(&mut self) -> Result<Item> {
        if self.ended {
            return Err(Error::invalid("the bundle has ended"));
        }
        let at = self.where_();
        let (kind, payload) = read_frame(&mut self.input, &mut self.hash, &at)?;
        self.bytes_read += 5 + payload.len() as u64;
        let h = &self.header;
        // Versions, then names, then chunks, each as many as the header says.
        let in_order = match kind {
            VERSION => self.versions < h.versions,
            NAME => self.versions == h.versions && self.names < h.names,
            CHUNK => self.versions == h.versions && self.names == h.names && self.chunks < h.chunks,
            END => self.versions == h.versions && self.names == h.names && self.chunks == h.chunks,
            _ => false,
        };
        if !in_order {
            return Err(damaged(format!(
                "a frame '{}' out of order {}",
                kind as char,
                self.where_()
            )));
        }
        match kind {
            VERSION => {
                let v = VersionRecord::decode(&payload).map_err(damaged)?;
                self.check_version(&v)?;
                self.versions += 1;
                Ok(Item::Version(v))
            }
            NAME => {
                let n: Name = serde_json::from_slice(&payload).map_err(damaged)?;
                if !self.version_ids.contains(&n.version) {
                    return Err(damaged(format!("name {} is of no version it carries", n.name)));
                }
                self.names += 1;
                Ok(Item::Name(n.name, n.version))
            }
            CHUNK => {
                let (id, plain) = decode_chunk(&payload)?;
                if !self.chunk_ids.insert(id) {
                    return Err(damaged(format!("chunk {id} twice")));
                }
                self.chunks += 1;
                self.plain_bytes += plain.len() as u64;
                Ok(Item::Chunk(id, plain))
            }
            _ => {
                if payload[..] != self.hash.finalize().as_bytes()[..] {
                    return Err(damaged("its checksum does not match its contents"));
                }
                let mut more = [0u8; 1];
                if self.input.read(&mut more)? != 0 {
                    return Err(damaged("bytes follow its end"));
                }
                self.ended = true;
                Ok(Item::End)
            }
        }
    }

    fn check_version(&mut self, v: &VersionRecord) -> Result<()> {
        let shape = &self.header.volume;
        if v.clone().seal()?.id != v.id {
            return Err(damaged(format!("version {} does not match its id", v.id.short())));
        }
        if v.kind != shape.kind || v.block_size != shape.block_size || v.size != shape.size {
            return Err(damaged(format!("version {} is not of its volume", v.id.short())));
        }
        if !self.version_ids.insert(v.id) {
            return Err(damaged(format!("version {} twice", v.id.short())));
        }
        Ok(())
    }
}

/// The next frame: kind and payload (hashed, unless it is the end).
fn read_frame(input: &mut impl Read, hash: &mut blake3::Hasher, at: &str) -> Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    read_exact(input, &mut head, at)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    let max = match head[0] {
        CHUNK => MAX_CHUNK + 64,
        END => 32,
        HEADER | VERSION | NAME => MAX_RECORD,
        k => return Err(damaged(format!("unknown frame kind {k} {at}"))),
    };
    if len > max {
        return Err(damaged(format!("a frame of {len} bytes {at}")));
    }
    let mut payload = vec![0u8; len as usize];
    read_exact(input, &mut payload, at)?;
    if head[0] != END {
        hash.update(&head);
        hash.update(&payload);
    }
    Ok((head[0], payload))
}

fn read_exact(input: &mut impl Read, buf: &mut [u8], at: impl std::fmt::Display) -> Result<()> {
    input.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::corrupt(format!("the bundle is truncated: it ends {at}"))
        } else {
            Error::from(e)
        }
    })
}

fn decode_chunk(p: &[u8]) -> Result<(ChunkId, Bytes)> {
    if p.len() < 37 {
        return Err(damaged("a chunk frame too short"));
    }
    let id = ChunkId::from_slice(&p[..32])?;
    let codec = Codec::from_u8(p[32]).map_err(damaged)?;
    let plain_len = u32::from_le_bytes([p[33], p[34], p[35], p[36]]);
    if plain_len > MAX_CHUNK {
        return Err(damaged(format!("chunk {id} of {plain_len} bytes")));
    }
    let stored = &p[37..];
    let entry = Entry { id, offset: 0, stored_len: stored.len() as u32, plain_len, codec };
    let plain = codec::decompress(&entry, stored).map_err(damaged)?;
    Ok((id, plain))
}
