//! Names of versions: resolving `VOL`, `VOL@NAME`, `VOL@ID-PREFIX` and
//! `VOL@~N`; logs, tags, and deleting a version.

use super::{Graph, SnapshotOptions, Target};
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId};
use crate::objects::keys as objects;
use crate::records::{Origin, VersionRecord, VolumeRecord, keys, parse_id};

impl Graph {
    pub fn version(&self, id: &VersionId) -> Result<VersionRecord> {
        self.storage.records.version(id)
    }

    /// The versions of a volume, oldest first.
    pub fn log(&self, volume: &VolumeRecord) -> Result<Vec<VersionRecord>> {
        self.storage.records.log(volume)
    }

    /// Tags of a volume: name -> version.
    pub fn tags(&self, volume: &VolumeRecord) -> Result<Vec<(String, VersionId)>> {
        self.storage.records.tags(volume)
    }

    /// What `fsck --repair` found missing under a version, if anything.
    pub fn damaged(&self, id: &VersionId) -> Result<Option<String>> {
        self.storage.records.damaged(id)
    }

    /// Resolves `VOL` (the live head) or `VOL@REF`, where REF is a tag, a
    /// version id or unique prefix of one (4+ hex digits), or `~N` (the N-th
    /// version back from the newest; `~0` is the newest).
    pub fn resolve(&self, spec: &str) -> Result<Target> {
        let Some((vol, r)) = spec.split_once('@') else {
            return Ok(Target::Head(self.volumes.get(spec)?));
        };
        let volume = self.volumes.get(vol)?;
        if let Some(id) = self.storage.records.tagged(volume.id, r)? {
            return Ok(Target::Version(self.version(&id)?));
        }
        let log = self.log(&volume)?;
        if let Some(n) = r.strip_prefix('~') {
            let n: usize = n
                .parse()
                .map_err(|_| Error::invalid(format!("bad relative version {r:?}: use ~N")))?;
            return log
                .iter()
                .rev()
                .nth(n)
                .cloned()
                .map(Target::Version)
                .ok_or_else(|| Error::not_found(format!("{vol} has only {} versions", log.len())));
        }
        let lower = r.to_ascii_lowercase();
        if lower.len() < 4 || !lower.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(Error::not_found(format!("{vol} has no version named {r:?}")));
        }
        let matches: Vec<&VersionRecord> =
            log.iter().filter(|v| v.id.to_string().starts_with(&lower)).collect();
        match matches.as_slice() {
            [one] => Ok(Target::Version((*one).clone())),
            [] if !self.db().scan_meta(&keys::deleted_prefix(&lower))?.is_empty() => {
                Err(Error::not_found(format!("version {r} of {vol} was deleted on another host")))
            }
            [] => Err(Error::not_found(format!("{vol} has no version {r}"))),
            _ => Err(Error::invalid(format!("version prefix {r} is ambiguous"))),
        }
    }

    /// Resolves a spec that must name a version; a bare volume name is
    /// snapshotted first (skipped when clean) so it names its current state.
    pub fn resolve_version(&self, spec: &str) -> Result<VersionRecord> {
        match self.resolve(spec)? {
            Target::Version(v) => Ok(v),
            Target::Head(vol) => self.auto_version(vol.name.as_str()),
        }
    }

    /// An automatic version of `volume`, unless nothing changed since its
    /// last one (then that one).
    pub fn auto_version(&self, volume: &str) -> Result<VersionRecord> {
        let opts = SnapshotOptions {
            skip_if_clean: true,
            origin: Some(Origin::Auto),
            ..Default::default()
        };
        self.snapshot(volume, &opts)
    }

    pub fn tag(&self, version: &VersionRecord, name: &str) -> Result<()> {
        check_tag(name)?;
        let key = keys::tag(version.volume, name);
        if self.db().get_meta(&key)?.is_some() {
            return Err(Error::conflict(format!(
                "{} already has a version named {name}",
                version.volume_name
            )));
        }
        if let Some(r) = self.volumes.remote() {
            crate::sync::names::set(&self.storage, version.volume, name, &version.id)?;
            r.bump();
            return Ok(());
        }
        self.put_tag_object(version.volume, name, &version.id)?;
        let mut b = Batch::default();
        self.db().put_meta(&mut b, &key, version.id.to_string());
        self.db().write(b, true)
    }

    pub fn untag(&self, volume: &VolumeRecord, name: &str) -> Result<()> {
        let key = keys::tag(volume.id, name);
        if self.db().get_meta(&key)?.is_none() {
            return Err(Error::not_found(format!("{} has no version named {name}", volume.name)));
        }
        if let Some(r) = self.volumes.remote() {
            crate::sync::names::remove(&self.storage, volume.id, name)?;
            r.bump();
            return Ok(());
        }
        // The object copy goes first: a crash in between must not let a
        // rebuilt index bring the name back.
        self.delete_tag_object(volume.id, name)?;
        let mut b = Batch::default();
        self.db().delete_meta(&mut b, &key);
        self.db().write(b, true)
    }

    /// Deletes a version record (and its tags). Data it alone referenced is
    /// reclaimed by the next GC; a head based on it keeps its root.
    pub fn delete_version(&self, version: &VersionRecord) -> Result<()> {
        let volume = self.volumes.get(version.volume_name.as_str())?;
        if let Some(g) = self.in_group_version(&version.id)? {
            return Err(Error::conflict(format!(
                "version {} of {} is part of group version {}; `forkfs group delete {}` \
                 forgets the group's versions",
                version.id.short(),
                volume.name,
                super::group::describe(&g),
                g.group
            )));
        }
        let db = self.db();
        // The intent first: a crash before the index records go leaves a
        // deletion the next open finishes, not a version without its object.
        let mut intent = Batch::default();
        db.put_meta(&mut intent, &keys::deleting(&version.id), volume.name.to_string());
        db.write(intent, true)?;
        let mut b = Batch::default();
        db.delete_meta(&mut b, &keys::deleting(&version.id));
        db.delete_meta(&mut b, &keys::version(&version.id));
        db.delete_meta(&mut b, &keys::damaged(&version.id));
        db.delete_meta(&mut b, &keys::log(volume.id, version.seq));
        let mut names = Vec::new();
        for (name, id) in self.tags(&volume)? {
            if id == version.id {
                db.delete_meta(&mut b, &keys::tag(volume.id, &name));
                names.push(name);
            }
        }
        // Objects first: a record object the index no longer names makes
        // GC refuse (it looks like an index that lost records), while an
        // index record whose object is gone (a crash in between) is one
        // `fsck --repair` writes back. A shared store's names go from the
        // bucket and the index together.
        for name in names {
            match self.volumes.is_shared() {
                true => crate::sync::names::remove(&self.storage, volume.id, &name)?,
                false => self.delete_tag_object(volume.id, &name)?,
            }
        }
        let backend = self.storage.chunks.backend();
        // On a shared store, the deletion record goes before the record
        // object: every other host then forgets the version (and skips
        // its object, should this deletion be cut short).
        if let Some(r) = self.volumes.remote() {
            backend.put(&objects::deleted_version(&version.id), volume.name.to_string().into())?;
            backend.delete(&objects::version(&version.id))?;
            db.write(b, true)?;
            r.bump();
            return Ok(());
        }
        backend.delete(&objects::version(&version.id))?;
        db.write(b, true)
    }

    /// At open: finishes the deletions a crash interrupted (see
    /// [`Graph::delete_version`]).
    pub(crate) fn finish_deletions(&self) -> Result<()> {
        for (k, _) in self.db().scan_meta(keys::DELETING_PREFIX)? {
            let id = VersionId::parse(&k[keys::DELETING_PREFIX.len()..]);
            match id.map(|id| self.storage.records.version(&id)) {
                Some(Ok(v)) => {
                    tracing::info!(version = %v.id.short(), "finishing a deletion a crash interrupted");
                    self.delete_version(&v)?;
                }
                Some(Err(e)) if e.kind() != crate::error::ErrorKind::NotFound => return Err(e),
                // Its records are gone already (or the key is not ours).
                _ => {
                    let mut b = Batch::default();
                    self.db().delete_meta(&mut b, &k);
                    self.db().write(b, true)?;
                }
            }
        }
        Ok(())
    }

    /// Writes the object copy of a tag, so a lost index comes back with
    /// its names (stores without a remote side; a shared store's names are
    /// `sync/names.rs`'s).
    pub(super) fn put_tag_object(&self, vol: VolumeId, name: &str, id: &VersionId) -> Result<()> {
        let obj = bytes::Bytes::from(id.to_string());
        self.storage.chunks.backend().put(&objects::tag(vol, name), obj)
    }

    fn delete_tag_object(&self, vol: VolumeId, name: &str) -> Result<()> {
        self.storage.chunks.backend().delete(&objects::tag(vol, name))
    }

    /// Takes the names of versions from their objects, where the index
    /// does not have them (rebuilding a lost index); returns how many.
    pub(crate) fn import_tags(&self) -> Result<usize> {
        let backend = self.storage.chunks.backend();
        let db = self.db();
        let mut b = Batch::default();
        let mut n = 0;
        for o in backend.list(objects::TAGS)? {
            let Some((vol, name)) = objects::parse_tag(&o.location) else { continue };
            let Ok(id) = parse_id(&backend.get(&o.location)?, "tag object") else { continue };
            let key = keys::tag(vol, &name);
            if check_tag(&name).is_err()
                || db.get_meta(&key)?.is_some()
                || self.version(&id).is_err()
            {
                continue;
            }
            db.put_meta(&mut b, &key, id.to_string());
            n += 1;
        }
        db.write(b, true)?;
        Ok(n)
    }
}

pub(crate) fn check_tag(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('~')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !ok {
        return Err(Error::invalid(format!(
            "invalid version name {name:?}: use 1-128 characters of A-Z a-z 0-9 . _ -"
        )));
    }
    Ok(())
}
