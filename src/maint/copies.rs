//! The object copies of the records: every volume, version and head the
//! index holds must have its object in the object store, and say the same
//! (a store is rebuilt from them when its index is lost).

use crate::error::ErrorKind;
use crate::objects::keys as objects;
use crate::records::{HeadRecord, VersionRecord, VolumeRecord};
use crate::store::Store;

impl Store {
    /// Problems with the object copies of records, one line each.
    pub(crate) fn check_copies(&self) -> crate::error::Result<Vec<String>> {
        let backend = self.chunks().backend();
        let records = &self.storage().records;
        let mut problems = Vec::new();
        let mut fetch = |what: String, key: &object_store::path::Path| match backend.get(key) {
            Ok(raw) => Some(raw),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                problems.push(format!("{what}: its object {key} is missing"));
                None
            }
            Err(e) => {
                problems.push(format!("{what}: its object {key} cannot be read: {e}"));
                None
            }
        };
        let mut found = Vec::new();
        for vol in self.volumes().list()? {
            let what = format!("volume {}", vol.name);
            if let Some(raw) = fetch(what.clone(), &objects::volume(vol.id)) {
                found.push((
                    what,
                    serde_json::from_slice::<VolumeRecord>(&raw).ok() == Some(vol.clone()),
                ));
            }
            for v in records.log(&vol)? {
                let what = format!("{}@{}", vol.name, v.id.short());
                if let Some(raw) = fetch(what.clone(), &objects::version(&v.id)) {
                    found.push((what, VersionRecord::decode(&raw).ok().as_ref() == Some(&v)));
                }
            }
            // A remote store's head object follows its local head (it is
            // published later, or another host advanced it): only a local
            // store's must hold the local head.
            if self.remote().is_none() {
                let head = records.head(vol.id)?;
                let what = format!("{} head", vol.name);
                if let Some(raw) = fetch(what.clone(), &objects::head(vol.id)) {
                    let theirs = serde_json::from_slice::<HeadRecord>(&raw).ok();
                    // Ahead of the index: a checkpoint stopped between its
                    // head object and its commit; the next one replaces it.
                    let ahead = theirs
                        .as_ref()
                        .and_then(|h| h.base)
                        .is_some_and(|b| records.version(&b).is_err());
                    found.push((what, theirs.as_ref() == Some(&head) || ahead));
                }
            }
        }
        for (what, same) in found {
            if !same {
                problems.push(format!("{what}: its object differs from the index"));
            }
        }
        Ok(problems)
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
    /// next id; a deletion removes the volume's object first.
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
        let mut candidates = Vec::new();
        for o in backend.list(objects::VOLUMES)? {
            let id = o.location.filename().and_then(|f| f.strip_suffix(".json"));
            let Some(id) = id.and_then(|h| u64::from_str_radix(h, 16).ok()) else { continue };
            if id < next && !known.contains_key(&VolumeId(id)) {
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
