//! Volume groups: volumes checkpointed, restored and forked together, and
//! the group versions that record one version per member, all taken at
//! one cut (`graph/group.rs`).

use super::version::Origin;
use crate::id::{VersionId, VolumeName};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GroupRecord {
    pub format: u8,
    pub name: String,
    pub members: Vec<VolumeName>,
    pub created_at_ms: u64,
}

/// One member's version in a group version.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub volume: VolumeName,
    pub version: VersionId,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GroupVersion {
    pub format: u8,
    pub group: String,
    /// Position in the group's log (0, 1, 2, ...).
    pub seq: u64,
    /// A name for it, unique in the group.
    pub name: Option<String>,
    pub label: Option<String>,
    pub origin: Origin,
    pub created_at_ms: u64,
    pub members: Vec<Member>,
}
