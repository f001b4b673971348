//! Version records: immutable, named by the hash of their content.

use super::RECORD_FORMAT;
use super::volume::VolumeKind;
use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId, VolumeName};
use crate::map::MapRoot;
use serde::{Deserialize, Serialize};

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
