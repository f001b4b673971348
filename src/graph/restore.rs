//! Restore (the head goes back to a version, undoably) and fork (a new
//! volume starting at a version), both O(1) in the volume's size.

use super::{Graph, Restored, SnapshotOptions};
use crate::db::Batch;
use crate::error::{Error, ErrorKind, Result};
use crate::head::Head;
use crate::head::fs::inode::META_KEY;
use crate::head::overlay::{Dirty, Space};
use crate::id::VolumeName;
use crate::records::{HeadRecord, Origin, VersionRecord, VolumeKind, VolumeRecord, keys};

impl Graph {
    /// Creates volume `new_name` whose head starts at `from`. O(1): the new
    /// head shares the version's root; nothing is copied.
    pub fn fork(&self, from: &VersionRecord, new_name: &str) -> Result<VolumeRecord> {
        let name = VolumeName::new(new_name)?;
        let head = HeadRecord { base: Some(from.id), root: from.root, next_seq: 0 };
        let mut rec = self.volumes.insert(
            name,
            from.kind,
            from.size,
            from.block_size,
            Some(from.id),
            head,
        )?;
        // A fork of a btrfs-mode disk is served the same way.
        // (The source volume may be gone; a failure to read it is an error.)
        let src = match self.volumes.get(from.volume_name.as_str()) {
            Ok(v) => Some(v),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Some(src) = src
            && src.consistency != rec.consistency
        {
            rec = self.volumes.update(rec.name.as_str(), |r| {
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
        let head = self.volumes.open(volume)?;
        check_fits(&head, to)?;
        let pre = {
            let _one = head.checkpoint.lock();
            let _gate = head.gate.write();
            self.restore_held(&head, to)?
        };
        self.restored(volume, &pre, to);
        Ok(pre)
    }

    /// Tells the restore hooks (after the head's locks are let go).
    pub(super) fn restored(&self, volume: &str, before: &VersionRecord, to: &VersionRecord) {
        let hooks: Vec<_> = self.restore_hooks.lock().iter().map(|(_, h)| h.clone()).collect();
        let done = Restored { volume, before, to };
        for h in hooks {
            h(&done);
        }
    }

    /// Restores `head`, whose checkpoint lock and gate the caller holds
    /// (and which [`check_fits`] passed).
    pub(super) fn restore_held(
        &self,
        head: &std::sync::Arc<Head>,
        to: &VersionRecord,
    ) -> Result<VersionRecord> {
        let rec = head.record().clone();
        head.check_live()?;
        let pre = self.checkpoint(
            head,
            &SnapshotOptions {
                label: Some(format!("before restore to {}", to.id.short())),
                origin: Some(Origin::Restore),
                ..Default::default()
            },
            true,
        )?;
        let new_head = HeadRecord { base: Some(to.id), root: to.root, next_seq: pre.seq + 1 };
        // Staged first: what can fail here fails before anything changes.
        let mut b = Batch::default();
        let counter_only = stage_new_tree(head, to.root, &mut b)?;
        // Unsealed writes of a deferred head belong to the tree being replaced.
        let dropped = match head.as_block() {
            Some(b) => b.discard_pending()?,
            None => Default::default(),
        };
        if dropped.bytes > 0 {
            tracing::info!(volume = %rec.name, bytes = dropped.bytes, "restore dropped unsealed writes");
        }
        self.volumes.put_head_object(rec.id, &new_head)?;
        self.db().put_json(&mut b, &keys::head(rec.id), &new_head)?;
        head.publish(|| {
            self.db().write(b, true)?;
            self.volumes.committed();
            head.set_state(new_head);
            enter_new_tree(head, counter_only)
        })?;
        tracing::info!(volume = %rec.name, to = %to.id.short(), "restore");
        Ok(pre)
    }
}

/// Stages in `b` the overlay of a head whose tree becomes `root` (a
/// restore; a bundle's tip adopted): every staged change dropped but, for
/// an fs volume, its inode counter, since inode numbers never go back (one
/// the kernel or an open file still knows must not name another file).
/// That counter is bookkeeping, not a change: whether it is all that is
/// left staged (the head then takes no automatic version for it).
pub(super) fn stage_new_tree(
    head: &Head,
    root: crate::map::MapRoot,
    b: &mut Batch,
) -> Result<bool> {
    let counter = match head.record().kind {
        VolumeKind::Fs => Some(crate::head::fs::restored_meta(head, root)?),
        VolumeKind::Block => None,
    };
    head.overlay().clear_stopped(b)?;
    let counter_only = counter.is_some();
    if let Some(m) = counter {
        head.overlay().put(b, Space::Root, 0, META_KEY, &Dirty::Value(m));
    }
    Ok(counter_only)
}

/// Once the batch of [`stage_new_tree`] is written and the head's record
/// set: the head reads its new tree.
pub(super) fn enter_new_tree(head: &Head, counter_only: bool) -> Result<()> {
    head.overlay().cleared(None);
    head.accessed_only.store(counter_only, std::sync::atomic::Ordering::Release);
    head.reload_zeroed()
}

/// Whether version `to` can be the state of `head`'s volume.
pub(super) fn check_fits(head: &Head, to: &VersionRecord) -> Result<()> {
    let rec = head.record();
    if to.kind != rec.kind || to.block_size != rec.block_size || to.size != rec.size {
        return Err(Error::invalid(format!(
            "version {} ({} {} bytes) does not fit volume {}",
            to.id.short(),
            to.kind,
            to.size,
            rec.name
        )));
    }
    Ok(())
}
