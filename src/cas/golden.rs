//! Golden tests of the chunk layer's formats (docs/FORMAT.md: Pack, the
//! `chunks` and `packs` column families): fixed inputs encoded by the real
//! code are compared byte for byte with `tests/golden/`, and the checked-in
//! bytes decode to the inputs. `FORKFS_BLESS=1` rewrites the files (see
//! `files::golden`).

use super::index::{Location, PackInfo};
use super::pack::{self, Codec, PackWriter};
use crate::files::golden;
use crate::id::{ChunkId, PackId};
use bytes::Bytes;

/// A raw chunk and a zstd one. The zstd frame is checked in rather than
/// compared: a newer zstd may compress differently, but must still read it.
fn chunks() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let raw = b"forkfs raw chunk".to_vec();
    let plain = b"forkfs zstd chunk, forkfs zstd chunk, forkfs zstd chunk".to_vec();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/chunk-zstd.bin");
    if std::env::var_os("FORKFS_BLESS").is_some() {
        let frame = zstd::bulk::compress(&plain, 1).expect("compress");
        golden("chunk-zstd.bin", &frame);
    }
    let frame = std::fs::read(&path).expect("tests/golden/chunk-zstd.bin");
    (raw, plain, frame)
}

#[test]
fn golden_pack() {
    let (raw, plain, frame) = chunks();
    let mut w = PackWriter::with_nonce(*b"golden!");
    w.add(ChunkId::of(&raw), raw.len() as u32, Codec::Raw, &raw);
    w.add(ChunkId::of(&plain), plain.len() as u32, Codec::Zstd, &frame);
    let (id, bytes, entries) = w.seal();
    let want = golden("pack.bin", &bytes);
    // Decoding the checked-in pack: its name, footer and chunks.
    assert_eq!(&blake3::hash(&want).as_bytes()[..16], &id.0[..]);
    assert_eq!(&want[..8], b"FKFSPACK");
    assert_eq!(want[8], 1, "pack format version");
    assert_eq!(&want[9..16], b"golden!");
    let parsed = pack::parse(&want).expect("the golden pack parses");
    assert_eq!(parsed, entries);
    let read = |i: usize| {
        let e = &parsed[i];
        let s = &want[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
        pack::decompress(e, s).expect("chunk verifies")
    };
    assert_eq!(read(0), Bytes::from(raw));
    assert_eq!(read(1), Bytes::from(plain));
    assert_eq!(parsed[1].codec, Codec::Zstd);
}

#[test]
fn golden_chunk_index_values() {
    let raw = b"forkfs raw chunk".to_vec();
    let mut w = PackWriter::with_nonce([0; 7]);
    w.add(ChunkId::of(&raw), raw.len() as u32, Codec::Raw, &raw);
    let (_, _, entries) = w.seal();
    let loc = Location::of(PackId([0xa5; 16]), &entries[0]);
    let want = golden("index-chunk-location.bin", &loc.encode());
    assert_eq!(Location::decode(&want).expect("decodes"), loc);
    let info = PackInfo { count: 2, len: 0x0102_0304_0506, created_ms: 1_790_000_000_000 };
    let want = golden("index-pack-info.bin", &info.encode());
    assert_eq!(PackInfo::decode(&want).expect("decodes"), info);
}
