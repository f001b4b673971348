//! How a chunk's bytes are stored: zstd when it pays, raw otherwise, and
//! verified against the chunk's id (blake3 of the plain bytes) on every
//! decode.

use super::pack::Entry;
use crate::error::{Error, Result};
use crate::id::ChunkId;
use bytes::Bytes;

/// How a chunk's payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    Raw = 0,
    Zstd = 1,
}

impl Codec {
    pub fn from_u8(b: u8) -> Result<Codec> {
        match b {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Zstd),
            _ => Err(Error::corrupt(format!("unknown chunk codec {b}"))),
        }
    }
}

thread_local! {
    /// zstd contexts are costly to create (about 1 MiB each); keep one per thread.
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Encodes `plain` for storage: zstd when it saves at least 1/32, raw otherwise.
pub fn compress(plain: &[u8], level: i32) -> (Codec, Vec<u8>) {
    let z = COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = zstd::bulk::Compressor::new(level).ok().map(|z| (level, z));
        }
        c.as_mut().and_then(|(_, z)| z.compress(plain).ok())
    });
    match z {
        Some(z) if z.len() < plain.len() - plain.len() / 32 => (Codec::Zstd, z),
        _ => (Codec::Raw, plain.to_vec()),
    }
}

/// Decodes a stored payload and verifies it against its id.
pub fn decompress(entry: &Entry, stored: &[u8]) -> Result<Bytes> {
    let plain = match entry.codec {
        Codec::Raw => stored.to_vec(),
        Codec::Zstd => DECOMPRESSOR
            .with(|d| {
                let mut d = d.borrow_mut();
                if d.is_none() {
                    *d = zstd::bulk::Decompressor::new().ok();
                }
                match d.as_mut() {
                    Some(d) => d.decompress(stored, entry.plain_len as usize),
                    None => Err(std::io::Error::other("no zstd context")),
                }
            })
            .map_err(|e| Error::corrupt(format!("chunk {} does not decompress: {e}", entry.id)))?,
    };
    if plain.len() != entry.plain_len as usize || ChunkId::of(&plain) != entry.id {
        return Err(Error::corrupt(format!("chunk {} fails its checksum", entry.id)));
    }
    Ok(Bytes::from(plain))
}
