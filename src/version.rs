//! Records of the version graph: volumes, heads and immutable versions.
//! They are kept in RocksDB (`meta`) and written as objects too, so a store
//! can be rebuilt from its object store alone.

use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId, VolumeName};
use crate::map::MapRoot;
use serde::{Deserialize, Serialize};

pub const RECORD_FORMAT: u8 = 1;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeKind {
    /// A directory tree (FUSE workspaces).
    Fs,
    /// A block device (NBD disks).
    Block,
}

impl std::fmt::Display for VolumeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VolumeKind::Fs => "fs",
            VolumeKind::Block => "block",
        })
    }
}

/// Why a version exists; retention thins only `Auto` and `SafePoint`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    Manual,
    Auto,
    SafePoint,
    Restore,
    Fork,
    Import,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = serde_json::to_value(self).ok().and_then(|v| v.as_str().map(String::from));
        f.write_str(s.as_deref().unwrap_or("?"))
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    pub format: u8,
    pub id: VolumeId,
    pub name: VolumeName,
    pub kind: VolumeKind,
    /// Logical size in bytes (the device size of a block volume).
    pub size: u64,
    pub block_size: u32,
    pub created_at_ms: u64,
    /// The version this volume was forked from, if any.
    pub forked_from: Option<VersionId>,
    /// Retention of automatic versions; `None`: the default policy.
    #[serde(default)]
    pub retention: Option<crate::retention::Policy>,
    /// Prune automatic versions after each automatic checkpoint.
    #[serde(default = "yes")]
    pub auto_prune: bool,
    /// How a block volume persists when served over NBD.
    #[serde(default)]
    pub consistency: crate::consistency::Consistency,
}

fn yes() -> bool {
    true
}

/// The committed part of a volume head: its base version and root. The
/// overlay holds everything written since.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HeadRecord {
    pub base: Option<VersionId>,
    pub root: MapRoot,
    /// Sequence number the next version of this volume gets.
    pub next_seq: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct VersionRecord {
    pub format: u8,
    pub id: VersionId,
    pub volume: VolumeId,
    pub volume_name: VolumeName,
    /// Position in the volume's log (0, 1, 2, ...).
    pub seq: u64,
    pub parents: Vec<VersionId>,
    pub root: MapRoot,
    pub kind: VolumeKind,
    pub size: u64,
    pub block_size: u32,
    pub created_at_ms: u64,
    pub label: Option<String>,
    pub origin: Origin,
    pub pinned: bool,
    /// The btrfs generation of a safe point.
    pub generation: Option<u64>,
}

impl VersionRecord {
    /// Names the record by the hash of its content.
    pub fn seal(mut self) -> Result<VersionRecord> {
        self.id = VersionId([0; 16]);
        let bytes = serde_json::to_vec(&self)?;
        let mut id = [0u8; 16];
        id.copy_from_slice(&blake3::hash(&bytes).as_bytes()[..16]);
        self.id = VersionId(id);
        Ok(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<VersionRecord> {
        let r: VersionRecord = serde_json::from_slice(bytes)?;
        if r.format != RECORD_FORMAT {
            return Err(Error::corrupt(format!("version record format {} is unknown", r.format)));
        }
        Ok(r)
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Meta keys (the `meta` column family).
pub mod keys {
    use crate::id::{VersionId, VolumeId};

    pub const NEXT_VOLUME_ID: &str = "next-volume-id";
    pub fn volume(name: &str) -> String {
        format!("vol/{name}")
    }
    pub fn head(v: VolumeId) -> String {
        format!("head/{:016x}", v.0)
    }
    /// Remote stores: the head this host last published to (or took from)
    /// the object store; the local head differs while a publish is due.
    pub fn published(v: VolumeId) -> String {
        format!("published/{:016x}", v.0)
    }
    pub fn version(id: &VersionId) -> String {
        format!("ver/{id}")
    }
    pub fn log_prefix(v: VolumeId) -> String {
        format!("log/{:016x}/", v.0)
    }
    pub fn log(v: VolumeId, seq: u64) -> String {
        format!("log/{:016x}/{seq:016x}", v.0)
    }
    /// The first data log segment the volume's overlay may still name.
    pub fn log_floor(v: VolumeId) -> String {
        format!("logfloor/{:016x}", v.0)
    }
    /// Set by `fsck --repair` on a version that references missing data.
    pub fn damaged(id: &VersionId) -> String {
        format!("damaged/{id}")
    }
    /// Present while a deferred head holds unsealed writes (see
    /// `volume/deferred.rs`); found at open, it means a process died with them.
    pub fn unsealed(v: VolumeId) -> String {
        format!("unsealed/{:016x}", v.0)
    }
    pub const UNSEALED_PREFIX: &str = "unsealed/";
    pub fn rollback_prefix(v: VolumeId) -> String {
        format!("rollback/{:016x}/", v.0)
    }
    /// A rollback of the head to its last sealed state (see `rollback.rs`).
    pub fn rollback(v: VolumeId, at_ms: u64, seq: u64) -> String {
        format!("rollback/{:016x}/{at_ms:016x}-{seq:08x}", v.0)
    }
    pub fn tag_prefix(v: VolumeId) -> String {
        format!("tag/{:016x}/", v.0)
    }
    pub fn tag(v: VolumeId, name: &str) -> String {
        format!("tag/{:016x}/{name}", v.0)
    }
}
