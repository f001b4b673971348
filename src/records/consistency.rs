//! How a block volume's head persists: at every flush, or only at the
//! filesystem safe points the NBD server detects (`btrfs`; see
//! `head/block/deferred.rs` for the mechanism and nbd/src/safepoint for the
//! detection). A volume carries its mode; the operator can switch it, also
//! while the volume is served (through the control socket).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Consistency {
    /// FLUSH and FUA persist every acknowledged write.
    #[default]
    Flush,
    /// Persist only at btrfs commits and tree-log syncs; discard writes
    /// after the last one when a client goes away uncleanly.
    Btrfs,
}

impl std::str::FromStr for Consistency {
    type Err = Error;
    fn from_str(s: &str) -> Result<Consistency> {
        match s {
            "flush" => Ok(Consistency::Flush),
            "btrfs" => Ok(Consistency::Btrfs),
            _ => Err(Error::invalid(format!("unknown consistency mode {s:?} (flush or btrfs)"))),
        }
    }
}

impl std::fmt::Display for Consistency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Consistency::Flush => "flush",
            Consistency::Btrfs => "btrfs",
        })
    }
}
