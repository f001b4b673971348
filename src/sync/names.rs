//! Names of versions on a shared store: one meaning per name on every host.
//!
//! A tag is the object `tags/<volume>/<name>`, holding the version id,
//! created only if absent (a conditional put): two hosts naming two
//! versions alike get one winner and, on the other, a clear error, never
//! two meanings of one name. Untagging deletes it. Each host records the
//! ETag of every tag object it wrote or took (`tagseen/…` in its index),
//! so an import reads only tag objects that are new or changed, and drops
//! a local tag whose object it had seen and that is gone (untagged or
//! deleted on another host). Tags made before names were shared (a local
//! tag with no ETag recorded) are put in the bucket by the first import.
//!
//! One lock per process orders a tag's object and its index records
//! against imports, which would otherwise see one without the other.

use crate::db::Batch;
use crate::error::{Error, ErrorKind, Result};
use crate::head::Storage;
use crate::id::{VersionId, VolumeId};
use crate::objects::keys as objects;
use crate::records::{keys, parse_id};
use parking_lot::Mutex;
use std::collections::HashMap;

static NAMES: Mutex<()> = Mutex::new(());

/// Names version `id` of `vol` `name` in the bucket, then in the index.
/// A name another host gave to another version is a conflict.
pub(crate) fn set(storage: &Storage, vol: VolumeId, name: &str, id: &VersionId) -> Result<()> {
    let _one = NAMES.lock();
    let etag = claim(storage, vol, name, id)?;
    let db = &storage.db;
    let mut b = Batch::default();
    db.put_meta(&mut b, &keys::tag(vol, name), id.to_string());
    db.put_meta(&mut b, &keys::tag_seen(vol, name), etag);
    db.write(b, true)
}

/// Takes `name` for version `id` of `vol` in the bucket only, for a caller
/// that records it in the index itself (with the returned ETag, under
/// `keys::tag_seen`): a snapshot commits its name with the version.
pub(crate) fn claim(
    storage: &Storage,
    vol: VolumeId,
    name: &str,
    id: &VersionId,
) -> Result<String> {
    let key = objects::tag(vol, name);
    let body = bytes::Bytes::from(id.to_string());
    match storage.chunks.backend().put_or_same(&key, body, None) {
        Ok(v) => Ok(v.e_tag.unwrap_or_default()),
        Err(e) if e.kind() == ErrorKind::Conflict => Err(Error::conflict(format!(
            "the name {name} was given to another version (on another host); pick another"
        ))),
        Err(e) => Err(e),
    }
}

/// Removes the name from the bucket, then from the index.
pub(crate) fn remove(storage: &Storage, vol: VolumeId, name: &str) -> Result<()> {
    let _one = NAMES.lock();
    storage.chunks.backend().delete(&objects::tag(vol, name))?;
    let db = &storage.db;
    let mut b = Batch::default();
    db.delete_meta(&mut b, &keys::tag(vol, name));
    db.delete_meta(&mut b, &keys::tag_seen(vol, name));
    db.write(b, true)
}

/// Brings the index's names up to the bucket's (see the module
/// documentation); returns how many changed. Names of versions this host
/// does not have yet wait for a later import.
pub(super) fn import(storage: &Storage) -> Result<usize> {
    let _one = NAMES.lock();
    let backend = storage.chunks.backend();
    let (db, records) = (&storage.db, &storage.records);
    let mut listed: HashMap<(VolumeId, String), String> = HashMap::new();
    for o in backend.list(objects::TAGS)? {
        if let Some(k) = objects::parse_tag(&o.location) {
            listed.insert(k, o.e_tag.unwrap_or_default());
        }
    }
    let mut b = Batch::default();
    let mut n = 0;
    for ((vol, name), etag) in &listed {
        let seen = db.get_meta(&keys::tag_seen(*vol, name))?;
        if !etag.is_empty() && seen.as_deref() == Some(etag.as_bytes()) {
            continue;
        }
        let raw = match backend.get(&objects::tag(*vol, name)) {
            Ok(raw) => raw,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let Ok(id) = parse_id(&raw, "tag object") else { continue };
        if records.version(&id).is_err() {
            continue;
        }
        db.put_meta(&mut b, &keys::tag(*vol, name), id.to_string());
        db.put_meta(&mut b, &keys::tag_seen(*vol, name), etag);
        n += 1;
    }
    for vol in records.volumes()? {
        for (name, id) in records.tags(&vol)? {
            if listed.contains_key(&(vol.id, name.clone())) {
                continue;
            }
            if db.get_meta(&keys::tag_seen(vol.id, &name))?.is_some() {
                // Seen in the bucket once, gone now: removed elsewhere.
                db.delete_meta(&mut b, &keys::tag(vol.id, &name));
                db.delete_meta(&mut b, &keys::tag_seen(vol.id, &name));
                n += 1;
                continue;
            }
            // From before names were shared: into the bucket.
            let body = bytes::Bytes::from(id.to_string());
            match backend.put_or_same(&objects::tag(vol.id, &name), body, None) {
                Ok(v) => {
                    db.put_meta(&mut b, &keys::tag_seen(vol.id, &name), v.e_tag.unwrap_or_default())
                }
                Err(e) if e.kind() == ErrorKind::Conflict => {
                    tracing::warn!(volume = %vol.name, name, "another host gave this name to another version; this host's name is replaced by it");
                }
                Err(e) => return Err(e),
            }
        }
    }
    db.write(b, true)?;
    Ok(n)
}
