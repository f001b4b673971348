//! Version-graph operations: snapshot, fork, restore, tags, deletion, log
//! and version references.
//!
//! Commit protocol of a snapshot (see docs/FORMAT.md): fold the overlay into
//! a new root, seal the open pack (object put + fsync, then index), write
//! the version object, then one synced RocksDB batch that records the
//! version, moves the head and clears the overlay. A crash before that batch
//! leaves the old head and the overlay as they were; after it, the version
//! is complete because everything it names was durable first.

use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeName};
use crate::index::CF_META;
use crate::overlay::{Dirty, Space};
use crate::paths;
use crate::store::Store;
use crate::version::{
    HeadRecord, Origin, RECORD_FORMAT, VersionRecord, VolumeKind, VolumeRecord, keys, now_ms,
};
use crate::volume::Head;
use crate::volume::inode::META_KEY;
use bytes::Bytes;
use rocksdb::WriteBatch;

/// What to snapshot.
#[derive(Clone, Debug, Default)]
pub struct SnapshotOptions {
    /// A name (tag) for the new version; named versions are never pruned.
    pub name: Option<String>,
    pub label: Option<String>,
    pub origin: Option<Origin>,
    /// Skip creating a version when nothing changed since the last one.
    pub skip_if_clean: bool,
}

/// A resolved reference: the live head of a volume, or one of its versions.
#[derive(Clone, Debug)]
pub enum Target {
    Head(VolumeRecord),
    Version(VersionRecord),
}

impl Target {
    pub fn volume_name(&self) -> &VolumeName {
        match self {
            Target::Head(v) => &v.name,
            Target::Version(v) => &v.volume_name,
        }
    }
}

impl Store {
    /// Records the head of `volume` as a new immutable version.
    ///
    /// Block volumes are folded while writers go on: the gate is held
    /// exclusively only to rotate the data log at the start and to commit at
    /// the end, so a client sees milliseconds of pause, not the fold.
    pub fn snapshot(&self, volume: &str, opts: &SnapshotOptions) -> Result<VersionRecord> {
        let head = self.open_volume(volume)?;
        let _one = head.checkpoint.lock();
        if head.kind() == VolumeKind::Block {
            return self.checkpoint(&head, opts, false);
        }
        let _gate = head.gate.write();
        self.checkpoint(&head, opts, true)
    }

    /// A snapshot by a caller that holds the head's checkpoint lock and its
    /// gate exclusively (restore).
    pub(crate) fn snapshot_locked(
        &self,
        head: &Head,
        opts: &SnapshotOptions,
    ) -> Result<VersionRecord> {
        self.checkpoint(head, opts, true)
    }

    /// `exclusive`: the caller holds the gate for the whole checkpoint;
    /// otherwise it is taken for the two short phases only.
    fn checkpoint(
        &self,
        head: &Head,
        opts: &SnapshotOptions,
        exclusive: bool,
    ) -> Result<VersionRecord> {
        let rec = head.record().clone();
        if let Some(n) = &opts.name {
            check_tag(n)?;
            if self.index().get_meta(&keys::tag(rec.id, n))?.is_some() {
                return Err(Error::conflict(format!(
                    "volume {} already has a version named {n}",
                    rec.name
                )));
            }
        }
        // Phase 1: decide, and send new writes to a fresh log segment.
        let (state, clean, floor) = {
            let _g = (!exclusive).then(|| head.gate.write());
            head.check_live()?;
            let state = head.state();
            let clean = head.is_clean()?;
            if clean
                && opts.skip_if_clean
                && opts.name.is_none()
                && let Some(base) = state.base
                && let Ok(v) = self.version(&base)
            {
                return Ok(v);
            }
            let floor = if clean {
                None
            } else {
                // Unsealed writes (deferred heads) may still need older segments.
                let next = self.datalog().rotate(rec.id)?;
                Some(head.pending_min_segment().map_or(next, |m| m.min(next)))
            };
            (state, clean, floor)
        };
        // Phase 2: fold and make everything the version names durable.
        let _session = self.chunks().write_session();
        let (root, folded, generation) =
            if clean { (state.root, Vec::new(), head.sealed_generation()) } else { head.fold()? };
        self.chunks().flush()?;
        let version = VersionRecord {
            format: RECORD_FORMAT,
            id: VersionId([0; 16]),
            volume: rec.id,
            volume_name: rec.name.clone(),
            seq: state.next_seq,
            parents: state.base.into_iter().collect(),
            root,
            kind: rec.kind,
            size: rec.size,
            block_size: rec.block_size,
            created_at_ms: now_ms(),
            label: opts.label.clone(),
            origin: opts.origin.unwrap_or(Origin::Manual),
            pinned: opts.name.is_some(),
            generation,
        }
        .seal()?;
        let json = serde_json::to_vec_pretty(&version)?;
        self.chunks().backend().put(&paths::version(&version.id), Bytes::from(json))?;
        // Phase 3: commit in one synced batch. The head object other hosts
        // read names the durable version before (local objects) or after
        // the commit, once the version's objects are uploaded (remote).
        let new_head = HeadRecord { base: Some(version.id), root, next_seq: state.next_seq + 1 };
        self.publish_head(head, &new_head)?;
        {
            let _g = (!exclusive).then(|| head.gate.write());
            head.check_live()?;
            let mut b = WriteBatch::default();
            self.put_json(&mut b, &keys::version(&version.id), &version)?;
            b.put_cf(
                self.index().cf(CF_META),
                keys::log(rec.id, version.seq),
                version.id.to_string(),
            );
            if let Some(n) = &opts.name {
                b.put_cf(self.index().cf(CF_META), keys::tag(rec.id, n), version.id.to_string());
            }
            self.put_json(&mut b, &keys::head(rec.id), &new_head)?;
            if exclusive {
                head.overlay().clear(&mut b);
            } else {
                // Entries rewritten during the fold are newer than the version: they stay.
                head.overlay().delete_unchanged(&mut b, &folded)?;
            }
            if let Some(f) = floor {
                self.put_json(&mut b, &keys::log_floor(rec.id), &f)?;
            }
            self.index().write(b, true)?;
            head.set_state(new_head.clone());
            head.reload_zeroed()?;
        }
        self.head_committed();
        if !clean {
            self.index().overlay_cleared();
        }
        if let Some(f) = floor {
            self.datalog().drop_below(rec.id, f)?;
        }
        tracing::info!(volume = %rec.name, version = %version.id.short(), origin = %version.origin, "snapshot");
        if matches!(version.origin, Origin::Auto | Origin::SafePoint) {
            self.auto_prune(rec.name.as_str());
        }
        Ok(version)
    }

    pub fn version(&self, id: &VersionId) -> Result<VersionRecord> {
        self.get_json(&keys::version(id))?
            .ok_or_else(|| Error::not_found(format!("no version {}", id.short())))
    }

    /// The versions of a volume, oldest first.
    pub fn log(&self, volume: &VolumeRecord) -> Result<Vec<VersionRecord>> {
        let mut out = Vec::new();
        for (_, id) in self.index().scan_meta(&keys::log_prefix(volume.id))? {
            let id = std::str::from_utf8(&id).ok().and_then(VersionId::parse);
            let id = id.ok_or_else(|| Error::corrupt("log entry is not a version id"))?;
            out.push(self.version(&id)?);
        }
        Ok(out)
    }

    /// Tags of a volume: name -> version.
    pub fn tags(&self, volume: &VolumeRecord) -> Result<Vec<(String, VersionId)>> {
        let prefix = keys::tag_prefix(volume.id);
        let mut out = Vec::new();
        for (k, v) in self.index().scan_meta(&prefix)? {
            let id = std::str::from_utf8(&v).ok().and_then(VersionId::parse);
            let id = id.ok_or_else(|| Error::corrupt("tag does not name a version id"))?;
            out.push((k[prefix.len()..].to_string(), id));
        }
        Ok(out)
    }

    /// Resolves `VOL` (the live head) or `VOL@REF`, where REF is a tag, a
    /// version id or unique prefix of one (4+ hex digits), or `~N` (the N-th
    /// version back from the newest; `~0` is the newest).
    pub fn resolve(&self, spec: &str) -> Result<Target> {
        let Some((vol, r)) = spec.split_once('@') else {
            return Ok(Target::Head(self.volume(spec)?));
        };
        let volume = self.volume(vol)?;
        if let Some(v) = self.index().get_meta(&keys::tag(volume.id, r))? {
            let id = std::str::from_utf8(&v).ok().and_then(VersionId::parse);
            return Ok(Target::Version(
                self.version(&id.ok_or_else(|| Error::corrupt("bad tag"))?)?,
            ));
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

    /// Creates volume `new_name` whose head starts at `from`. O(1): the new
    /// head shares the version's root; nothing is copied.
    pub fn fork(&self, from: &VersionRecord, new_name: &str) -> Result<VolumeRecord> {
        let name = VolumeName::new(new_name)?;
        let head = HeadRecord { base: Some(from.id), root: from.root, next_seq: 0 };
        let mut rec =
            self.insert_volume(name, from.kind, from.size, from.block_size, Some(from.id), head)?;
        // A fork of a btrfs-mode disk is served the same way.
        if let Ok(src) = self.volume(from.volume_name.as_str())
            && src.consistency != rec.consistency
        {
            rec = self.update_volume(rec.name.as_str(), |r| {
                r.consistency = src.consistency;
                Ok(())
            })?;
        }
        tracing::info!(from = %from.id.short(), volume = %rec.name, "fork");
        Ok(rec)
    }

    /// Sets the head of `volume` to `to`. The old head is recorded as a
    /// version first, so a restore can itself be undone; returns that version.
    pub fn restore(&self, volume: &str, to: &VersionRecord) -> Result<VersionRecord> {
        let pre = self.restore_locked(volume, to)?;
        let hooks: Vec<_> =
            self.inner.restore_hooks.lock().iter().map(|(_, h)| h.clone()).collect();
        let done = crate::store::Restored { volume, before: &pre, to };
        for h in hooks {
            h(&done);
        }
        Ok(pre)
    }

    fn restore_locked(&self, volume: &str, to: &VersionRecord) -> Result<VersionRecord> {
        let head = self.open_volume(volume)?;
        let rec = head.record().clone();
        if to.kind != rec.kind || to.block_size != rec.block_size || to.size != rec.size {
            return Err(Error::invalid(format!(
                "version {} ({} {} bytes) does not fit volume {}",
                to.id.short(),
                to.kind,
                to.size,
                rec.name
            )));
        }
        let _one = head.checkpoint.lock();
        let _gate = head.gate.write();
        head.check_live()?;
        let pre = self.snapshot_locked(
            &head,
            &SnapshotOptions {
                label: Some(format!("before restore to {}", to.id.short())),
                origin: Some(Origin::Restore),
                ..Default::default()
            },
        )?;
        let new_head = HeadRecord { base: Some(to.id), root: to.root, next_seq: pre.seq + 1 };
        // Inode numbers never go back: one the kernel or an open file still
        // knows must not name a different file after the restore.
        let fs_meta = match rec.kind {
            VolumeKind::Fs => Some(crate::volume::fs::restored_meta(&head, to.root)?),
            VolumeKind::Block => None,
        };
        // Unsealed writes of a deferred head belong to the tree being replaced.
        let dropped = head.discard_pending()?;
        if dropped.bytes > 0 {
            tracing::info!(volume = %rec.name, bytes = dropped.bytes, "restore dropped unsealed writes");
        }
        self.publish_head(&head, &new_head)?;
        let mut b = WriteBatch::default();
        self.put_json(&mut b, &keys::head(rec.id), &new_head)?;
        head.overlay().clear(&mut b);
        if let Some(m) = fs_meta {
            head.overlay().put(&mut b, Space::Root, 0, META_KEY, &Dirty::Value(m));
        }
        self.index().write(b, true)?;
        self.head_committed();
        self.index().overlay_cleared();
        head.set_state(new_head);
        head.reload_zeroed()?;
        tracing::info!(volume = %rec.name, to = %to.id.short(), "restore");
        Ok(pre)
    }

    pub fn tag(&self, version: &VersionRecord, name: &str) -> Result<()> {
        check_tag(name)?;
        let key = keys::tag(version.volume, name);
        if self.index().get_meta(&key)?.is_some() {
            return Err(Error::conflict(format!(
                "{} already has a version named {name}",
                version.volume_name
            )));
        }
        let mut b = WriteBatch::default();
        b.put_cf(self.index().cf(CF_META), key, version.id.to_string());
        self.index().write(b, true)
    }

    pub fn untag(&self, volume: &VolumeRecord, name: &str) -> Result<()> {
        let key = keys::tag(volume.id, name);
        if self.index().get_meta(&key)?.is_none() {
            return Err(Error::not_found(format!("{} has no version named {name}", volume.name)));
        }
        let mut b = WriteBatch::default();
        b.delete_cf(self.index().cf(CF_META), key);
        self.index().write(b, true)
    }

    /// Deletes a version record (and its tags). Data it alone referenced is
    /// reclaimed by the next GC; a head based on it keeps its root.
    pub fn delete_version(&self, version: &VersionRecord) -> Result<()> {
        let volume = self.volume(version.volume_name.as_str())?;
        let mut b = WriteBatch::default();
        let meta = self.index().cf(CF_META);
        b.delete_cf(meta, keys::version(&version.id));
        b.delete_cf(meta, keys::damaged(&version.id));
        b.delete_cf(meta, keys::log(volume.id, version.seq));
        for (name, id) in self.tags(&volume)? {
            if id == version.id {
                b.delete_cf(meta, keys::tag(volume.id, &name));
            }
        }
        self.index().write(b, true)?;
        self.chunks().backend().delete(&paths::version(&version.id))
    }
}

fn check_tag(name: &str) -> Result<()> {
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

impl Store {
    /// Applies the volume's retention after an automatic checkpoint, if it
    /// has auto-pruning on. Failures are logged: the checkpoint stands.
    fn auto_prune(&self, volume: &str) {
        let res = self.volume(volume).and_then(|v| {
            if !v.auto_prune {
                return Ok(0);
            }
            let policy = v.retention.unwrap_or_default();
            Ok(self.prune(volume, &policy, now_ms(), false)?.len())
        });
        if let Err(e) = res {
            tracing::warn!(volume, error = %e, "automatic pruning failed");
        }
    }

    /// Sets a volume's retention policy (`None`: the default) and whether
    /// automatic checkpoints prune.
    pub fn set_retention(
        &self,
        volume: &str,
        policy: Option<crate::retention::Policy>,
        auto_prune: bool,
    ) -> Result<VolumeRecord> {
        if let Some(p) = &policy {
            if p.unit_ms == 0 || p.per_bucket == 0 {
                return Err(Error::invalid("retention unit and per-bucket count must be positive"));
            }
        }
        self.update_volume(volume, |rec| {
            rec.retention = policy;
            rec.auto_prune = auto_prune;
            Ok(())
        })
    }

    /// Thins the automatic versions of `volume` by logarithmically spaced
    /// retention and returns the versions removed (or that would be, with
    /// `dry_run`). Named, pinned, head-base and fork-base versions stay.
    /// Only records go; GC reclaims the data.
    pub fn prune(
        &self,
        volume: &str,
        policy: &crate::retention::Policy,
        now_ms: u64,
        dry_run: bool,
    ) -> Result<Vec<VersionRecord>> {
        let vol = self.volume(volume)?;
        let versions = self.log(&vol)?;
        let mut protected: std::collections::HashSet<VersionId> =
            self.tags(&vol)?.into_iter().map(|(_, id)| id).collect();
        protected.extend(self.head_record(vol.id)?.base);
        protected.extend(self.volumes()?.into_iter().filter_map(|v| v.forked_from));
        let candidates: Vec<crate::retention::Candidate> = versions
            .iter()
            .filter(|v| matches!(v.origin, Origin::Auto | Origin::SafePoint))
            .filter(|v| !v.pinned && !protected.contains(&v.id))
            .map(|v| crate::retention::Candidate { id: v.id, created_at_ms: v.created_at_ms })
            .collect();
        let doomed: std::collections::HashSet<VersionId> =
            crate::retention::plan(&candidates, now_ms, policy).into_iter().collect();
        let pruned: Vec<VersionRecord> =
            versions.into_iter().filter(|v| doomed.contains(&v.id)).collect();
        if !dry_run {
            for v in &pruned {
                self.delete_version(v)?;
            }
            tracing::info!(volume, pruned = pruned.len(), "prune");
        }
        Ok(pruned)
    }
}
