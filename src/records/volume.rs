//! Volume and head records: what a volume is, and where its head stands.

use super::consistency::Consistency;
use super::retention::Policy;
use crate::id::{VersionId, VolumeId, VolumeName};
use crate::map::MapRoot;
use serde::{Deserialize, Serialize};

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

impl VolumeKind {
    /// "an fs volume", "a block volume".
    pub fn a_volume(self) -> &'static str {
        match self {
            VolumeKind::Fs => "an fs volume",
            VolumeKind::Block => "a block volume",
        }
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
    pub retention: Option<Policy>,
    /// Prune automatic versions after each automatic checkpoint.
    #[serde(default = "yes")]
    pub auto_prune: bool,
    /// How a block volume persists when served over NBD.
    #[serde(default)]
    pub consistency: Consistency,
    /// The most bytes an fs volume's files may take (`forkfs volume
    /// quota`); `None`: only the disk under the store limits them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
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
