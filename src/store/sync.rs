//! `forkfs sync`: everything acknowledged so far, durable where the store
//! keeps its objects.

use super::Store;
use crate::error::Result;
use crate::id::VersionId;
use serde::{Deserialize, Serialize};

/// What `sync` did for one volume.
#[derive(Serialize, Deserialize, Debug)]
pub struct Synced {
    pub volume: String,
    /// The version that now holds every write made before the sync.
    pub version: Option<VersionId>,
    /// A new version was recorded (else the head had nothing new).
    pub recorded: bool,
}

impl Store {
    /// Makes every write acknowledged so far durable where the store keeps
    /// its objects: each changed volume (a live head in this process, or
    /// one with writes left by an earlier process) gets an automatic
    /// version; the index and data log are synced; and on a remote store,
    /// the call returns once the upload queue is empty and every head is
    /// published (or fails once uploads make no progress for the read
    /// deadline, or names the volumes whose heads another host holds or
    /// took over; nothing is lost, it stays queued or local). Volumes this
    /// process has not opened and that hold nothing unsaved are not opened
    /// (on a remote store that would take their lease).
    pub fn sync(&self, volume: Option<&str>) -> Result<Vec<Synced>> {
        let recs = match volume {
            Some(v) => vec![self.volumes().get(v)?],
            None => self.volumes().list()?,
        };
        let mut out = Vec::new();
        for rec in recs {
            let before = self.volumes().head_base(&rec)?;
            let name = rec.name.to_string();
            let open = self.volumes().opened_id(rec.id).is_some();
            let unsaved = !self.storage().overlay(rec.id).is_empty()?;
            let version =
                if open || unsaved { Some(self.graph().auto_version(&name)?.id) } else { before };
            out.push(Synced { volume: name, version, recorded: version != before });
        }
        self.flush()?;
        self.sync_remote()?;
        Ok(out)
    }
}
