//! Rollback records: what a deferred head threw away when no safe point
//! sealed it (see `graph/rollback.rs`).

use crate::id::{VersionId, VolumeId, VolumeName};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RollbackRecord {
    pub volume: VolumeId,
    pub volume_name: VolumeName,
    pub at_ms: u64,
    pub reason: String,
    /// Bytes written, zeroed or trimmed since the last seal (`None`: not
    /// known, the process that held them died).
    pub discarded_bytes: Option<u64>,
    pub discarded_blocks: Option<u64>,
    /// When the first discarded write arrived.
    pub unsealed_since_ms: Option<u64>,
    /// The head kept: its last version and the generation of its last seal.
    pub head_base: Option<VersionId>,
    pub sealed_generation: Option<u64>,
}
