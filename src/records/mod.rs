//! The records of the version graph: volumes, heads, versions, tags and
//! rollbacks. Each lives in the `meta` column family of the local database
//! and, for volumes, heads and versions, as an object too, so a store can
//! be rebuilt from its object store alone (see docs/FORMAT.md).
//!
//! [`Records`] reads them and writes their object copies; the layers above
//! decide when records change and commit them in their own batches.
//!
//! Uses the database, the object stores and the map's root type.

pub mod consistency;
#[cfg(test)]
mod golden;
pub mod group;
pub mod keys;
pub mod retention;
pub mod rollback;
pub mod version;
pub mod volume;

pub use consistency::Consistency;
pub use group::{GroupRecord, GroupVersion, Member};
pub use retention::{Policy, PolicyChange};
pub use rollback::RollbackRecord;
pub use version::{Origin, VersionRecord};
pub use volume::{HeadRecord, VolumeKind, VolumeRecord};

use crate::db::Db;
use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId};
use crate::objects::Backend;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The format number every record carries.
pub const RECORD_FORMAT: u8 = 1;

/// Reads the records of a store, and writes their object copies.
#[derive(Clone)]
pub struct Records {
    db: Arc<Db>,
    backend: Arc<Backend>,
    /// Decoded version records by id. A record never changes (its id is
    /// the hash of its content), so [`Records::log`] decodes each once:
    /// every automatic checkpoint prunes by the whole log, and decoding
    /// it was most of a fork of a head with 1,000 versions (BENCHMARKS).
    /// Only `log` reads through it: it names versions by log entries,
    /// which go with their records, so a deleted version is never served
    /// from here.
    decoded: Arc<Mutex<HashMap<VersionId, VersionRecord>>>,
}

/// The most version records [`Records::decoded`] keeps (a few hundred
/// bytes each); past it, it starts again empty.
const DECODED: usize = 65_536;

impl Records {
    pub fn new(db: Arc<Db>, backend: Arc<Backend>) -> Records {
        Records { db, backend, decoded: Arc::default() }
    }

    /// The volume named `name`, as this host knows it.
    pub fn volume_named(&self, name: &str) -> Result<Option<VolumeRecord>> {
        self.db.get_json(&keys::volume(name))
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> Result<Vec<VolumeRecord>> {
        self.db
            .scan_meta(keys::VOLUME_PREFIX)?
            .into_iter()
            .map(|(k, v)| {
                serde_json::from_slice(&v).map_err(|e| Error::corrupt(format!("record {k}: {e}")))
            })
            .collect()
    }

    /// The committed head of a volume.
    pub fn head(&self, vol: VolumeId) -> Result<HeadRecord> {
        self.db
            .get_json(&keys::head(vol))?
            .ok_or_else(|| Error::corrupt(format!("volume {} has no head record", vol.0)))
    }

    pub fn version(&self, id: &VersionId) -> Result<VersionRecord> {
        self.db
            .get_json(&keys::version(id))?
            .ok_or_else(|| Error::not_found(format!("no version {}", id.short())))
    }

    /// The versions of a volume, oldest first.
    pub fn log(&self, volume: &VolumeRecord) -> Result<Vec<VersionRecord>> {
        let mut out = Vec::new();
        for (_, id) in self.db.scan_meta(&keys::log_prefix(volume.id))? {
            let id = parse_id(&id, "log entry")?;
            let known = self.decoded.lock().get(&id).cloned();
            let v = match known {
                Some(v) => v,
                None => {
                    let v = self.version(&id)?;
                    let mut decoded = self.decoded.lock();
                    if decoded.len() >= DECODED {
                        decoded.clear();
                    }
                    decoded.insert(id, v.clone());
                    v
                }
            };
            out.push(v);
        }
        Ok(out)
    }

    /// Tags of a volume: name -> version.
    pub fn tags(&self, volume: &VolumeRecord) -> Result<Vec<(String, VersionId)>> {
        let prefix = keys::tag_prefix(volume.id);
        let mut out = Vec::new();
        for (k, v) in self.db.scan_meta(&prefix)? {
            out.push((k[prefix.len()..].to_string(), parse_id(&v, "tag")?));
        }
        Ok(out)
    }

    /// The version tagged `name` in `vol`.
    pub fn tagged(&self, vol: VolumeId, name: &str) -> Result<Option<VersionId>> {
        self.db.get_meta(&keys::tag(vol, name))?.map(|v| parse_id(&v, "tag")).transpose()
    }

    /// What `fsck --repair` found missing under a version, if anything.
    pub fn damaged(&self, id: &VersionId) -> Result<Option<String>> {
        Ok(self.db.get_meta(&keys::damaged(id))?.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The rollbacks of a volume, oldest first.
    pub fn rollbacks(&self, volume: &VolumeRecord) -> Result<Vec<RollbackRecord>> {
        let mut out = Vec::new();
        for (k, v) in self.db.scan_meta(&keys::rollback_prefix(volume.id))? {
            out.push(
                serde_json::from_slice(&v)
                    .map_err(|e| Error::corrupt(format!("rollback record {k}: {e}")))?,
            );
        }
        Ok(out)
    }

    /// Writes the object copy of a record (pretty JSON, as other hosts and
    /// a rebuild read it), durably.
    pub fn put_object<T: serde::Serialize>(
        &self,
        key: &object_store::path::Path,
        record: &T,
    ) -> Result<()> {
        self.backend.put(key, encode(record)?)
    }
}

/// A record as its object holds it.
pub fn encode<T: serde::Serialize>(record: &T) -> Result<Bytes> {
    Ok(Bytes::from(serde_json::to_vec_pretty(record)?))
}

/// A version id stored as text (log entries, tags).
pub fn parse_id(raw: &[u8], what: &str) -> Result<VersionId> {
    std::str::from_utf8(raw)
        .ok()
        .and_then(VersionId::parse)
        .ok_or_else(|| Error::corrupt(format!("{what} does not name a version id")))
}
