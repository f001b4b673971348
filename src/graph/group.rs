//! Volume groups: an environment's volumes (a workspace, the database
//! disk under it) checkpointed at one cut, and restored or forked as one.
//!
//! The cut: every member's head is opened in this process (the one holding
//! the store), then each one's checkpoint lock and gate are taken, in
//! volume id order, before any member is snapshotted. A write holds its
//! head's gate shared until it is acknowledged, so every write
//! acknowledged before the last gate is taken is in its member's version,
//! and none that is acknowledged after. Writers wait for the snapshots
//! (milliseconds for a workspace; a block volume's fold of what it wrote
//! since its last version).
//!
//! Member versions are ordinary manual versions (volume retention never
//! thins them) and cannot be deleted while a group version names them;
//! `prune_group` (`graph/prune.rs`) thins group versions, each with its
//! members, as units.

use super::refs::check_tag;
use super::{Graph, SnapshotOptions, Target};
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeName};
use crate::objects::keys as objects;
use crate::records::{
    GroupRecord, GroupVersion, Member, Origin, RECORD_FORMAT, VersionRecord, keys,
};
use std::collections::HashSet;

impl Graph {
    /// Creates group `name` of `members` (existing volumes).
    pub fn group_create(&self, name: &str, members: &[String]) -> Result<GroupRecord> {
        VolumeName::new(name).map_err(|_| {
            Error::invalid(format!("invalid group name {name:?}: use A-Z a-z 0-9 . _ -"))
        })?;
        let _g = self.volumes.groups_lock();
        if self.db().get_meta(&keys::group(name))?.is_some() {
            return Err(Error::conflict(format!("a group named {name} already exists")));
        }
        let rec = GroupRecord {
            format: RECORD_FORMAT,
            name: name.to_string(),
            members: self.members(members)?,
            created_at_ms: crate::clock::now_ms(),
        };
        self.put_group(&rec)?;
        Ok(rec)
    }

    /// Adds and removes members of group `name`.
    pub fn group_change(
        &self,
        name: &str,
        add: &[String],
        remove: &[String],
    ) -> Result<GroupRecord> {
        // Two changes at once would each write its own copy of the list.
        let _g = self.volumes.groups_lock();
        let mut rec = self.group(name)?;
        for r in remove {
            if !rec.members.iter().any(|m| m.as_str() == r) {
                return Err(Error::not_found(format!("{r} is not a member of group {name}")));
            }
        }
        rec.members.retain(|m| !remove.iter().any(|r| r == m.as_str()));
        let mut all: Vec<String> = rec.members.iter().map(|m| m.to_string()).collect();
        all.extend(add.iter().cloned());
        rec.members = self.members(&all)?;
        self.put_group(&rec)?;
        Ok(rec)
    }

    /// Checks `names` name distinct existing volumes.
    fn members(&self, names: &[String]) -> Result<Vec<VolumeName>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for n in names {
            if !seen.insert(n.as_str()) {
                return Err(Error::invalid(format!("{n} is named twice")));
            }
            out.push(self.volumes.get(n)?.name);
        }
        if out.is_empty() {
            return Err(Error::invalid("a group needs at least one member"));
        }
        Ok(out)
    }

    fn put_group(&self, rec: &GroupRecord) -> Result<()> {
        self.storage.records.put_object(&objects::group(&rec.name), rec)?;
        let mut b = Batch::default();
        self.db().put_json(&mut b, &keys::group(&rec.name), rec)?;
        self.db().write(b, true)
    }

    pub fn group(&self, name: &str) -> Result<GroupRecord> {
        self.db()
            .get_json(&keys::group(name))?
            .ok_or_else(|| Error::not_found(format!("no group named {name:?}")))
    }

    pub fn groups(&self) -> Result<Vec<GroupRecord>> {
        self.db()
            .scan_meta(keys::GROUP_PREFIX)?
            .into_iter()
            .map(|(_, v)| Ok(serde_json::from_slice(&v)?))
            .collect()
    }

    /// Deletes a group and its group versions; the members' versions stay.
    pub fn group_delete(&self, name: &str) -> Result<()> {
        let _g = self.volumes.groups_lock();
        let log = self.group_log(name)?;
        let backend = self.storage.chunks.backend();
        for g in &log {
            backend.delete(&objects::group_version(name, g.seq))?;
        }
        backend.delete(&objects::group(name))?;
        let mut b = Batch::default();
        for g in &log {
            self.db().delete_meta(&mut b, &keys::group_log(name, g.seq));
        }
        self.db().delete_meta(&mut b, &keys::group(name));
        self.db().write(b, true)
    }

    /// The group versions of `name`, oldest first.
    pub fn group_log(&self, name: &str) -> Result<Vec<GroupVersion>> {
        self.group(name)?;
        self.db()
            .scan_meta(&keys::group_log_prefix(name))?
            .into_iter()
            .map(|(_, v)| Ok(serde_json::from_slice(&v)?))
            .collect()
    }

    /// A group version by name, `~N` (N back from the newest) or number.
    pub fn group_version(&self, name: &str, r: &str) -> Result<GroupVersion> {
        let log = self.group_log(name)?;
        let found = match r.strip_prefix('~') {
            Some(n) => n.parse::<usize>().ok().and_then(|n| log.iter().rev().nth(n)),
            None => log
                .iter()
                .find(|g| g.name.as_deref() == Some(r))
                .or_else(|| r.parse::<u64>().ok().and_then(|s| log.iter().find(|g| g.seq == s))),
        };
        found.cloned().ok_or_else(|| Error::not_found(format!("group {name} has no version {r}")))
    }

    /// Whether a group version names `version` (it then cannot be deleted).
    pub(crate) fn in_group_version(&self, version: &VersionId) -> Result<Option<GroupVersion>> {
        for (_, v) in self.db().scan_meta(keys::GROUP_LOG_PREFIX)? {
            let g: GroupVersion = serde_json::from_slice(&v)?;
            if g.members.iter().any(|m| m.version == *version) {
                return Ok(Some(g));
            }
        }
        Ok(None)
    }

    /// One version of every member of group `name`, at one cut.
    pub fn group_snapshot(&self, name: &str, opts: &SnapshotOptions) -> Result<GroupVersion> {
        // Taken before any head's locks; nothing takes it under them.
        let held = self.volumes.groups_lock();
        let group = self.group(name)?;
        self.check_group_name(name, opts.name.as_deref())?;
        let mut heads = Vec::new();
        for m in &group.members {
            heads.push(self.volumes.open(m.as_str())?);
        }
        heads.sort_by_key(|h| h.record().id);
        let _ones: Vec<_> = heads.iter().map(|h| h.checkpoint.lock()).collect();
        let _gates: Vec<_> = heads.iter().map(|h| h.gate.write()).collect();
        for h in &heads {
            h.check_live()?;
        }
        let label = opts.label.clone().unwrap_or_else(|| format!("group {name}"));
        let member_opts = SnapshotOptions {
            label: Some(label.clone()),
            origin: Some(Origin::Manual),
            ..Default::default()
        };
        let mut members = Vec::new();
        for h in &heads {
            let v = self.checkpoint(h, &member_opts, true).map_err(|e| {
                e.context(format!(
                    "group {name}: no group version taken (the snapshot of {} failed)",
                    h.record().name
                ))
            })?;
            members.push(Member { volume: v.volume_name.clone(), version: v.id });
        }
        members.sort_by(|a, b| a.volume.as_str().cmp(b.volume.as_str()));
        let g = Some(label);
        self.record_group_version(&held, name, opts.name.clone(), g, Origin::Manual, members)
    }

    fn check_group_name(&self, group: &str, name: Option<&str>) -> Result<()> {
        if let Some(n) = name {
            check_tag(n)?;
            if self.group_log(group)?.iter().any(|g| g.name.as_deref() == Some(n)) {
                return Err(Error::conflict(format!(
                    "group {group} already has a version named {n}"
                )));
            }
        }
        Ok(())
    }

    /// Appends a group version to the log of `group` (`_held`: the lock
    /// of groups, so two appends never take one number).
    fn record_group_version(
        &self,
        _held: &parking_lot::MutexGuard<'_, ()>,
        group: &str,
        name: Option<String>,
        label: Option<String>,
        origin: Origin,
        members: Vec<Member>,
    ) -> Result<GroupVersion> {
        let seq = self.group_log(group)?.last().map_or(0, |g| g.seq + 1);
        let g = GroupVersion {
            format: RECORD_FORMAT,
            group: group.to_string(),
            seq,
            name,
            label,
            origin,
            created_at_ms: crate::clock::now_ms(),
            members,
        };
        self.storage.records.put_object(&objects::group_version(group, seq), &g)?;
        let mut b = Batch::default();
        self.db().put_json(&mut b, &keys::group_log(group, seq), &g)?;
        self.db().write(b, true)?;
        tracing::info!(group, seq, "group snapshot");
        Ok(g)
    }

    /// Restores every member of group `name` to its version in `to`, at
    /// one cut: every member's locks are taken (as a snapshot takes them)
    /// and every version checked to fit before any member changes. Each
    /// member's old head is kept as a version; together they are a group
    /// version too, so the whole restore can be undone; returned.
    pub fn group_restore(&self, name: &str, to: &GroupVersion) -> Result<GroupVersion> {
        let held = self.volumes.groups_lock();
        let versions = self.member_versions(to)?;
        let mut heads = Vec::new();
        for v in &versions {
            let head = self.volumes.open(v.volume_name.as_str())?;
            super::restore::check_fits(&head, v)?;
            heads.push((head, v));
        }
        heads.sort_by_key(|(h, _)| h.record().id);
        let mut before = Vec::new();
        let failed = {
            let _ones: Vec<_> = heads.iter().map(|(h, _)| h.checkpoint.lock()).collect();
            let _gates: Vec<_> = heads.iter().map(|(h, _)| h.gate.write()).collect();
            // A member deleted meanwhile fails the restore before any changes.
            for (h, _) in &heads {
                h.check_live()?;
            }
            let mut failed = None;
            for (h, v) in &heads {
                match self.restore_held(h, v) {
                    Ok(pre) => before.push((pre, *v)),
                    Err(e) => {
                        failed = Some(e.context(format!(
                            "group {name}: the restore of {} failed ({} of {} members restored \
                             before it)",
                            h.record().name,
                            before.len(),
                            heads.len()
                        )));
                        break;
                    }
                }
            }
            failed
        };
        // The members restored have their new trees whether or not the
        // rest followed: whoever caches them (a mount) must hear of it.
        for (pre, v) in &before {
            self.restored(v.volume_name.as_str(), pre, v);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut members: Vec<Member> = before
            .iter()
            .map(|(pre, _)| Member { volume: pre.volume_name.clone(), version: pre.id })
            .collect();
        members.sort_by(|a, b| a.volume.as_str().cmp(b.volume.as_str()));
        let label = format!("before restore to {}", describe(to));
        self.record_group_version(&held, name, None, Some(label), Origin::Restore, members)
    }

    /// Forks every member of `to` as `NEW.MEMBER`, in a new group `new`.
    pub fn group_fork(&self, to: &GroupVersion, new: &str) -> Result<GroupRecord> {
        if self.db().get_meta(&keys::group(new))?.is_some() {
            return Err(Error::conflict(format!("a group named {new} already exists")));
        }
        let versions = self.member_versions(to)?;
        let mut names = Vec::new();
        for v in &versions {
            let name = format!("{new}.{}", v.volume_name);
            self.fork(v, &name)?;
            names.push(name);
        }
        self.group_create(new, &names)
    }

    /// The member versions of a group version (all must still exist).
    pub fn member_versions(&self, g: &GroupVersion) -> Result<Vec<VersionRecord>> {
        g.members
            .iter()
            .map(|m| match self.resolve(&format!("{}@{}", m.volume, m.version))? {
                Target::Version(v) => Ok(v),
                Target::Head(_) => Err(Error::not_found("no such version")),
            })
            .collect()
    }
}

impl Graph {
    /// Takes groups and group versions from their objects where the index
    /// does not have them (rebuilding a lost index); returns how many.
    pub(crate) fn import_groups(&self) -> Result<usize> {
        let backend = self.storage.chunks.backend();
        let db = self.db();
        let mut b = Batch::default();
        let mut n = 0;
        for o in backend.list(objects::GROUPS)? {
            let raw = backend.get(&o.location)?;
            let key = if let Ok(g) = serde_json::from_slice::<GroupVersion>(&raw) {
                keys::group_log(&g.group, g.seq)
            } else if let Ok(g) = serde_json::from_slice::<GroupRecord>(&raw) {
                keys::group(&g.name)
            } else {
                tracing::warn!(object = %o.location, "not a group record; left alone");
                continue;
            };
            if db.get_meta(&key)?.is_none() {
                db.put_meta(&mut b, &key, &raw);
                n += 1;
            }
        }
        db.write(b, true)?;
        Ok(n)
    }
}

/// `GROUP@NAME` or `GROUP@SEQ`.
pub fn describe(g: &GroupVersion) -> String {
    match &g.name {
        Some(n) => format!("{}@{n}", g.group),
        None => format!("{}@{}", g.group, g.seq),
    }
}
