//! The object copies of the records: every volume, version and head the
//! index holds must have its object in the object store, and say the same
//! (a store is rebuilt from them when its index is lost). `fsck --repair`
//! writes back the copies that are missing or differ, from the index.

use crate::error::ErrorKind;
use crate::objects::keys as objects;
use crate::records::{HeadRecord, VersionRecord, VolumeRecord};
use crate::store::Store;
use bytes::Bytes;

/// An object copy that is missing or differs from the index.
pub(crate) struct BadCopy {
    pub problem: String,
    /// What it is ("volume disk", "disk@1a2b…", "disk head").
    pub what: String,
    pub key: object_store::path::Path,
    /// The record from the index, to write back; `None` when it must not
    /// be (a version record that does not verify against its id, or a
    /// remote store's volume object, created by other rules).
    pub record: Option<Bytes>,
}

impl Store {
    /// Problems with the object copies of records, one line each.
    pub(crate) fn check_copies(&self) -> crate::error::Result<Vec<String>> {
        Ok(self.bad_copies()?.into_iter().map(|c| c.problem).collect())
    }

    /// Writes back, from the index, the object copies that are missing or
    /// differ; returns what was restored.
    pub(crate) fn restore_copies(&self) -> crate::error::Result<Vec<String>> {
        let backend = self.chunks().backend();
        let mut restored = Vec::new();
        for c in self.bad_copies()? {
            if let Some(raw) = c.record {
                backend.put(&c.key, raw)?;
                restored.push(format!("{}: {}", c.what, c.key));
            }
        }
        Ok(restored)
    }

    fn bad_copies(&self) -> crate::error::Result<Vec<BadCopy>> {
        let backend = self.chunks().backend();
        let records = &self.storage().records;
        let local = self.remote().is_none();
        let mut bad = Vec::new();
        // Each copy: (what, key, the index's record as its object holds it,
        // whether the object's content is the index's).
        let mut check = |what: String,
                         key: object_store::path::Path,
                         record: Option<Bytes>,
                         same: &dyn Fn(&[u8]) -> bool|
         -> crate::error::Result<()> {
            // Read again before a mismatch counts: a record put again
            // writes over its spare, which a read that began two puts
            // earlier may still be reading (`objects/local.rs`).
            let read = match backend.get(&key) {
                Ok(raw) if !same(&raw) => backend.get(&key),
                read => read,
            };
            let problem = match read {
                Ok(raw) if same(&raw) => return Ok(()),
                Ok(_) => format!("{what}: its object differs from the index"),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    format!("{what}: its object {key} is missing")
                }
                Err(e) => format!("{what}: its object {key} cannot be read: {e}"),
            };
            bad.push(BadCopy { problem, what, key, record });
            Ok(())
        };
        for vol in self.volumes().list()? {
            let rec = local.then(|| crate::records::encode(&vol)).transpose()?;
            let same =
                |raw: &[u8]| serde_json::from_slice::<VolumeRecord>(raw).ok() == Some(vol.clone());
            check(format!("volume {}", vol.name), objects::volume(vol.id), rec, &same)?;
            for v in records.log(&vol)? {
                let what = format!("{}@{}", vol.name, v.id.short());
                // Only a record that is the one its id names is written back.
                let sound = self.version_record_checked(&v.id).is_ok_and(|c| c == v);
                let rec = sound.then(|| crate::records::encode(&v)).transpose()?;
                let same = |raw: &[u8]| VersionRecord::decode(raw).ok().as_ref() == Some(&v);
                check(what, objects::version(&v.id), rec, &same)?;
            }
            // A remote store's head object follows its local head (it is
            // published later, or another host advanced it): only a local
            // store's must hold the local head.
            if local {
                let head = records.head(vol.id)?;
                let same = |raw: &[u8]| {
                    let theirs = serde_json::from_slice::<HeadRecord>(raw).ok();
                    // Ahead of the index: a checkpoint stopped between its
                    // head object and its commit; the next one replaces it.
                    let ahead = theirs
                        .as_ref()
                        .and_then(|h| h.base)
                        .is_some_and(|b| records.version(&b).is_err());
                    theirs.as_ref() == Some(&head) || ahead
                };
                let rec = Some(crate::records::encode(&head)?);
                check(format!("{} head", vol.name), objects::head(vol.id), rec, &same)?;
            }
        }
        Ok(bad)
    }
}

impl Store {
    /// Records the object store holds that the index has lost (an index
    /// restored from an old copy): versions of known volumes whose log slot
    /// is empty below the head, and volumes, numbered below the next id,
    /// that the index does not know. What a crash leaves between an object
    /// and its commit is not counted: an interrupted snapshot's version
    /// sits at or above the head's next number, or its slot holds the
    /// version that replaced it; an interrupted creation's volume holds the
    /// next id, or has no head object (a rebuild since took its id out of
    /// use); a deletion removes the volume's object first.
    pub(crate) fn records_missing_from_index(&self) -> crate::error::Result<Vec<String>> {
        use crate::id::{VersionId, VolumeId};
        use crate::records::keys;
        let backend = self.chunks().backend();
        let records = &self.storage().records;
        let db = self.db();
        // Read in the order writers commit, so that work committing
        // meanwhile is never counted: the next ids before what they bound.
        let next: u64 = db.get_json(keys::NEXT_VOLUME_ID)?.unwrap_or(1);
        let known: std::collections::HashMap<VolumeId, VolumeRecord> =
            self.volumes().list()?.into_iter().map(|v| (v.id, v)).collect();
        let mut next_seq = std::collections::HashMap::new();
        for id in known.keys() {
            next_seq.insert(*id, records.head(*id)?.next_seq);
        }
        let has = |key: &object_store::path::Path| match backend.head(key) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        };
        let mut candidates = Vec::new();
        for o in backend.list(objects::VOLUMES)? {
            let id = o.location.filename().and_then(|f| f.strip_suffix(".json"));
            let Some(id) = id.and_then(|h| u64::from_str_radix(h, 16).ok()) else { continue };
            // Without its head object (the creation's commit point) it
            // is a creation a crash cut short, which a rebuild skips too.
            if id < next && !known.contains_key(&VolumeId(id)) && has(&objects::head(VolumeId(id)))?
            {
                candidates.push((o.location, format!("volume record {id:x}")));
            }
        }
        for o in backend.list(objects::VERSIONS)? {
            let named = o.location.filename().and_then(|f| f.strip_suffix(".json"));
            let Some(id) = named.and_then(VersionId::parse) else { continue };
            if db.get_meta(&keys::version(&id))?.is_some() {
                continue;
            }
            let bytes = match backend.get(&o.location) {
                Ok(b) => b,
                Err(e) if e.kind() == crate::error::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let Ok(v) = VersionRecord::decode(&bytes) else { continue };
            let (Some(vol), Some(n)) = (known.get(&v.volume), next_seq.get(&v.volume)) else {
                continue;
            };
            let slot_empty = db.get_meta(&keys::log(vol.id, v.seq))?.is_none();
            if slot_empty && v.seq < *n {
                candidates
                    .push((o.location, format!("version record {}@{}", vol.name, id.short())));
            }
        }
        // A deletion removes the object before the index entry: one gone
        // by now was being deleted, not lost.
        let mut missing = Vec::new();
        for (location, what) in candidates {
            match backend.get(&location) {
                Ok(_) => missing.push(what),
                Err(e) if e.kind() == crate::error::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(missing)
    }
}
