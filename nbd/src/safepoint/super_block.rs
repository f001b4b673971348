//! The btrfs primary superblock: where its fields are and when it is valid.
//!
//! Layout of `struct btrfs_super_block` (packed, little-endian), from
//! btrfs-progs `kernel-shared/uapi/btrfs_tree.h` (a copy of the kernel's
//! `include/uapi/linux/btrfs_tree.h`), constants from `kernel-shared/ctree.h`
//! (`BTRFS_SUPER_INFO_OFFSET` 65536, `BTRFS_SUPER_INFO_SIZE` 4096,
//! `BTRFS_MAGIC` 0x4D5F53665248425F = "_BHRfS_M", `BTRFS_MAGIC_TEMPORARY`
//! "!BHRfS_M" that mkfs writes until it is done) and `kernel-shared/disk-io.h`
//! (mirror `i` at 16 KiB << 12·i: 64 MiB, 256 GiB):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 32 | `csum`: the first `csum size` bytes are the checksum of bytes 32..4096 |
//! | 32 | 16 | `fsid` |
//! | 48 | 8 | `bytenr`: where this copy lives (65536 for the primary) |
//! | 56 | 8 | `flags` |
//! | 64 | 8 | `magic` |
//! | 72 | 8 | `generation` |
//! | 80, 88 | 8 each | `root`, `chunk_root` |
//! | 96 | 8 | `log_root`: non-zero after a tree-log sync (fsync) |
//! | 196 | 2 | `csum_type`: 0 crc32c, 1 xxhash64, 2 sha256, 3 blake2b-256 |
//!
//! Checksums as btrfs-progs `crypto/hash.c` and `btrfs_check_super`
//! (`kernel-shared/disk-io.c`) compute and compare them: crc32c stored as
//! little-endian u32 (4 bytes), xxh64 with seed 0 as little-endian u64 (8),
//! sha256 (32), blake2b with a 32-byte digest (32; not truncated blake2b-512).
//! Offsets and all four algorithms are also checked against superblocks that
//! mkfs.btrfs 6.2 and kernel 6.18 wrote (the replay fixtures).

use blake2::Blake2b;
use blake2::digest::consts::U32;
use sha2::{Digest, Sha256};
use std::fmt;

/// Byte offset of the primary superblock on the disk.
pub const SUPER_OFFSET: u64 = 65536;
/// Size of a superblock copy.
pub const SUPER_SIZE: usize = 4096;
/// Where the mirror copies live; writes there are never safe points.
#[cfg(test)]
pub const MIRROR_OFFSETS: [u64; 2] = [64 << 20, 256 << 30];
pub const MAGIC: &[u8; 8] = b"_BHRfS_M";

const CSUM_LEN: usize = 32;
const FSID: usize = 32;
const BYTENR: usize = 48;
pub const MAGIC_AT: usize = 64;
const GENERATION: usize = 72;
const LOG_ROOT: usize = 96;
const CSUM_TYPE: usize = 196;

/// The fields of a valid primary superblock that the detector uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Super {
    pub fsid: [u8; 16],
    pub generation: u64,
    /// Non-zero when written by a tree-log sync rather than a commit.
    pub log_root: u64,
}

/// Why the 4 KiB at 65536 is not (yet) a valid primary superblock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("superblock partly unknown: {known} of 4096 bytes known")]
    Incomplete { known: usize },
    #[error("no btrfs magic at offset 64")]
    BadMagic,
    #[error("bytenr {0} is not the primary superblock's 65536")]
    WrongBytenr(u64),
    #[error("unsupported checksum type {0}")]
    UnsupportedCsum(u16),
    #[error("{0} checksum mismatch")]
    BadCsum(CsumType),
    #[error("generation {generation} is older than the last safe point's {last}")]
    GenerationWentBack { generation: u64, last: u64 },
}

/// The superblock checksum algorithms (`enum btrfs_csum_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsumType {
    Crc32c,
    Xxhash64,
    Sha256,
    Blake2b,
}

impl CsumType {
    pub fn from_raw(raw: u16) -> Option<CsumType> {
        match raw {
            0 => Some(CsumType::Crc32c),
            1 => Some(CsumType::Xxhash64),
            2 => Some(CsumType::Sha256),
            3 => Some(CsumType::Blake2b),
            _ => None,
        }
    }

    /// The checksum of `data`, zero-padded to the 32-byte csum field; only
    /// the first `len()` bytes are compared (btrfs leaves the rest alone).
    pub fn compute(self, data: &[u8]) -> ([u8; CSUM_LEN], usize) {
        let mut out = [0u8; CSUM_LEN];
        let len = match self {
            CsumType::Crc32c => {
                out[..4].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
                4
            }
            CsumType::Xxhash64 => {
                out[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, 0).to_le_bytes());
                8
            }
            CsumType::Sha256 => {
                out.copy_from_slice(&Sha256::digest(data));
                32
            }
            CsumType::Blake2b => {
                out.copy_from_slice(&Blake2b::<U32>::digest(data));
                32
            }
        };
        (out, len)
    }
}

impl fmt::Display for CsumType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CsumType::Crc32c => "crc32c",
            CsumType::Xxhash64 => "xxhash64",
            CsumType::Sha256 => "sha256",
            CsumType::Blake2b => "blake2b",
        })
    }
}

fn le64(image: &[u8; SUPER_SIZE], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&image[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Checks a fully known image as the primary superblock: magic, bytenr,
/// checksum. (Whether its generation may follow the last one is the
/// detector's business.)
pub fn parse(image: &[u8; SUPER_SIZE]) -> Result<Super, Invalid> {
    if &image[MAGIC_AT..MAGIC_AT + 8] != MAGIC {
        return Err(Invalid::BadMagic);
    }
    let bytenr = le64(image, BYTENR);
    if bytenr != SUPER_OFFSET {
        return Err(Invalid::WrongBytenr(bytenr));
    }
    let raw = u16::from_le_bytes([image[CSUM_TYPE], image[CSUM_TYPE + 1]]);
    let csum_type = CsumType::from_raw(raw).ok_or(Invalid::UnsupportedCsum(raw))?;
    let (want, len) = csum_type.compute(&image[CSUM_LEN..]);
    if image[..len] != want[..len] {
        return Err(Invalid::BadCsum(csum_type));
    }
    let mut fsid = [0u8; 16];
    fsid.copy_from_slice(&image[FSID..FSID + 16]);
    Ok(Super { fsid, generation: le64(image, GENERATION), log_root: le64(image, LOG_ROOT) })
}

/// Builds valid superblocks for tests: the fields above set, bytes 1024..4000
/// (where the system chunk array and the backup roots live) filled from the
/// generation so that two generations differ all along, the rest zero.
#[cfg(test)]
pub fn make(generation: u64, log_root: u64, csum_type: u16) -> Vec<u8> {
    let mut b = vec![0u8; SUPER_SIZE];
    for (i, x) in b[1024..4000].iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(generation | 1).wrapping_add(generation) as u8;
    }
    b[FSID..FSID + 16].copy_from_slice(&[0x42; 16]);
    b[BYTENR..BYTENR + 8].copy_from_slice(&SUPER_OFFSET.to_le_bytes());
    b[MAGIC_AT..MAGIC_AT + 8].copy_from_slice(MAGIC);
    b[GENERATION..GENERATION + 8].copy_from_slice(&generation.to_le_bytes());
    b[LOG_ROOT..LOG_ROOT + 8].copy_from_slice(&log_root.to_le_bytes());
    b[CSUM_TYPE..CSUM_TYPE + 2].copy_from_slice(&csum_type.to_le_bytes());
    reseal(&mut b);
    b
}

/// Recomputes the checksum of a test superblock after a field was changed.
#[cfg(test)]
pub fn reseal(b: &mut [u8]) {
    let raw = u16::from_le_bytes([b[CSUM_TYPE], b[CSUM_TYPE + 1]]);
    if let Some(t) = CsumType::from_raw(raw) {
        let (sum, _) = t.compute(&b[CSUM_LEN..SUPER_SIZE]);
        b[..CSUM_LEN].copy_from_slice(&sum);
    }
}

/// Sets the fsid of a test superblock (and reseals it).
#[cfg(test)]
pub fn set_fsid(b: &mut [u8], fsid: [u8; 16]) {
    b[FSID..FSID + 16].copy_from_slice(&fsid);
    reseal(b);
}

/// Sets the bytenr of a test superblock (and reseals it).
#[cfg(test)]
pub fn set_bytenr(b: &mut [u8], bytenr: u64) {
    b[BYTENR..BYTENR + 8].copy_from_slice(&bytenr.to_le_bytes());
    reseal(b);
}
