//! Snapshot: a head becomes a new immutable version.
//!
//! Commit protocol (see docs/FORMAT.md): fold the overlay into a new root,
//! seal the open pack (object put + fsync, then index), write the version
//! object, then one synced RocksDB batch that records the version, moves
//! the head and clears the overlay. A crash before that batch leaves the
//! old head and the overlay as they were; after it, the version is
//! complete because everything it names was durable first.

use super::refs::check_tag;
use super::{Graph, SnapshotOptions};
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::head::{Folded, Head};
use crate::id::VersionId;
use crate::objects::keys as objects;
use crate::records::{HeadRecord, Origin, RECORD_FORMAT, VersionRecord, VolumeKind, keys};

impl Graph {
    /// Records the head of `volume` as a new immutable version.
    ///
    /// Block volumes are folded while writers go on: the gate is held
    /// exclusively only to rotate the data log at the start and to commit at
    /// the end, so a client sees milliseconds of pause, not the fold.
    pub fn snapshot(&self, volume: &str, opts: &SnapshotOptions) -> Result<VersionRecord> {
        let head = self.volumes.open(volume)?;
        let _one = head.checkpoint.lock();
        if head.kind() == VolumeKind::Block {
            return self.checkpoint(&head, opts, false);
        }
        let _gate = head.gate.write();
        self.checkpoint(&head, opts, true)
    }

    /// Commits a version of `head`, whose checkpoint lock the caller holds.
    /// `exclusive`: the caller holds the gate for the whole checkpoint
    /// (fs volumes, restore); otherwise it is taken for the two short
    /// phases only.
    pub(super) fn checkpoint(
        &self,
        head: &Head,
        opts: &SnapshotOptions,
        exclusive: bool,
    ) -> Result<VersionRecord> {
        let rec = head.record().clone();
        if let Some(n) = &opts.name {
            check_tag(n)?;
            if self.db().get_meta(&keys::tag(rec.id, n))?.is_some() {
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
            if head.is_clean_but_accesses()?
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
                let next = self.storage.log.rotate(rec.id)?;
                let pending = head.block().and_then(|b| b.pending_min_segment());
                // Never below the floor before: segments under it are gone.
                Some(pending.map_or(next, |m| m.min(next)).max(head.log_floor()))
            };
            (state, clean, floor)
        };
        // Phase 2: fold and make everything the version names durable.
        let _session = self.storage.chunks.write_session();
        let folded = match clean {
            true => Folded {
                root: state.root,
                entries: Vec::new(),
                count: 0,
                generation: head.block().and_then(|b| b.sealed_generation()),
            },
            false => head.fold()?,
        };
        let Folded { root, entries: folded, count, generation } = folded;
        self.storage.chunks.flush()?;
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
            created_at_ms: crate::clock::now_ms(),
            label: opts.label.clone(),
            origin: opts.origin.unwrap_or(Origin::Manual),
            pinned: opts.name.is_some(),
            generation,
        }
        .seal()?;
        self.storage.records.put_object(&objects::version(&version.id), &version)?;
        // The name, taken in the bucket first (conditionally, on a shared
        // store: another host may have taken it).
        let claimed = match &opts.name {
            Some(n) if self.volumes.is_shared() => {
                Some(crate::sync::names::claim(&self.storage, rec.id, n, &version.id)?)
            }
            Some(n) => {
                self.put_tag_object(rec.id, n, &version.id)?;
                None
            }
            None => None,
        };
        // Phase 3: commit in one synced batch. The head object other hosts
        // read names the durable version before (local objects) or after
        // the commit, once the version's objects are uploaded (remote).
        let new_head = HeadRecord { base: Some(version.id), root, next_seq: state.next_seq + 1 };
        self.volumes.put_head_object(rec.id, &new_head)?;
        {
            let _g = (!exclusive).then(|| head.gate.write());
            head.check_live()?;
            let db = self.db();
            let mut b = Batch::default();
            db.put_json(&mut b, &keys::version(&version.id), &version)?;
            db.put_meta(&mut b, &keys::log(rec.id, version.seq), version.id.to_string());
            if let Some(n) = &opts.name {
                db.put_meta(&mut b, &keys::tag(rec.id, n), version.id.to_string());
                if let Some(etag) = &claimed {
                    db.put_meta(&mut b, &keys::tag_seen(rec.id, n), etag);
                }
            }
            self.db().put_json(&mut b, &keys::head(rec.id), &new_head)?;
            if exclusive {
                head.overlay().clear_stopped(&mut b)?;
            } else {
                // Entries rewritten during the fold are newer than the version: they stay.
                head.overlay().delete_unchanged(&mut b, &folded)?;
            }
            if let Some(f) = floor {
                self.db().put_json(&mut b, &keys::log_floor(rec.id), &f)?;
                // The marks of the segments that go with the floor.
                let prefix = keys::durable_prefix(rec.id);
                for (k, _) in self.db().scan_meta(&prefix)? {
                    let seq = u64::from_str_radix(&k[prefix.len()..], 16).unwrap_or(u64::MAX);
                    if seq < f {
                        self.db().delete_meta(&mut b, &k);
                    }
                }
            }
            head.publish(|| {
                self.db().write(b, true)?;
                head.set_state(new_head.clone());
                if let Some(f) = floor {
                    head.set_log_floor(f);
                }
                head.reload_zeroed()
            })?;
        }
        self.volumes.committed();
        if !clean {
            head.overlay().cleared(Some(count));
            head.accessed_only.store(false, std::sync::atomic::Ordering::Release);
        }
        if let Some(f) = floor {
            self.storage.log.drop_below(rec.id, f)?;
        }
        tracing::info!(volume = %rec.name, version = %version.id.short(), origin = %version.origin, "snapshot");
        if matches!(version.origin, Origin::Auto | Origin::SafePoint) {
            self.auto_prune(rec.name.as_str());
        }
        Ok(version)
    }
}
