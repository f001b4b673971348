//! Names of versions: resolving `VOL`, `VOL@NAME`, `VOL@ID-PREFIX` and
//! `VOL@~N`; logs, tags, and deleting a version.

use super::{Graph, SnapshotOptions, Target};
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::id::VersionId;
use crate::objects::keys as objects;
use crate::records::{Origin, VersionRecord, VolumeRecord, keys};

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
        let mut b = Batch::default();
        self.db().put_meta(&mut b, &key, version.id.to_string());
        self.db().write(b, true)
    }

    pub fn untag(&self, volume: &VolumeRecord, name: &str) -> Result<()> {
        let key = keys::tag(volume.id, name);
        if self.db().get_meta(&key)?.is_none() {
            return Err(Error::not_found(format!("{} has no version named {name}", volume.name)));
        }
        let mut b = Batch::default();
        self.db().delete_meta(&mut b, &key);
        self.db().write(b, true)
    }

    /// Deletes a version record (and its tags). Data it alone referenced is
    /// reclaimed by the next GC; a head based on it keeps its root.
    pub fn delete_version(&self, version: &VersionRecord) -> Result<()> {
        let volume = self.volumes.get(version.volume_name.as_str())?;
        let db = self.db();
        let mut b = Batch::default();
        db.delete_meta(&mut b, &keys::version(&version.id));
        db.delete_meta(&mut b, &keys::damaged(&version.id));
        db.delete_meta(&mut b, &keys::log(volume.id, version.seq));
        for (name, id) in self.tags(&volume)? {
            if id == version.id {
                db.delete_meta(&mut b, &keys::tag(volume.id, &name));
            }
        }
        db.write(b, true)?;
        self.storage.chunks.backend().delete(&objects::version(&version.id))
    }
}

pub(super) fn check_tag(name: &str) -> Result<()> {
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
