//! Volumes: creating, opening, changing and deleting them. Every caller in
//! a process shares one live head per volume.

use crate::db::Batch;
use crate::error::{Error, ErrorKind, Result};
use crate::head::fs::FsReader;
use crate::head::{BlockHead, FsHead, Head, Storage};
use crate::id::{VersionId, VolumeId, VolumeName};
use crate::objects::keys as objects;
use crate::records::{
    Consistency, HeadRecord, Policy, PolicyChange, RECORD_FORMAT, VolumeKind, VolumeRecord, keys,
};
use crate::sync::Remote;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// The capacity reported for fs volumes created without a size.
pub const DEFAULT_FS_SIZE: u64 = 1 << 40;

/// The volumes of a store.
pub struct Volumes {
    storage: Arc<Storage>,
    /// The remote side of a store on S3, GCS or Azure.
    remote: Option<Arc<Remote>>,
    heads: Mutex<HashMap<VolumeId, Weak<Head>>>,
    /// Serializes changes to volume records and counters.
    meta_lock: Mutex<()>,
    /// Serializes changes to groups and their logs (`group.rs`) with the
    /// deletion of volumes, so no group this process changes gains a
    /// volume it is deleting.
    groups: Mutex<()>,
    default_block_size: u32,
}

impl Volumes {
    pub(crate) fn new(
        storage: Arc<Storage>,
        remote: Option<Arc<Remote>>,
        default_block_size: u32,
    ) -> Volumes {
        Volumes {
            storage,
            remote,
            heads: Mutex::new(HashMap::new()),
            meta_lock: Mutex::new(()),
            groups: Mutex::new(()),
            default_block_size,
        }
    }

    /// Held while groups change (`group.rs`) and while a volume is deleted.
    pub(crate) fn groups_lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.groups.lock()
    }

    /// The remote side of a shared store.
    pub(crate) fn remote(&self) -> Option<&Arc<Remote>> {
        self.remote.as_ref()
    }

    /// Whether other hosts may share the store (it has a remote): names of
    /// versions are then the bucket's (`sync/names.rs`).
    pub(crate) fn is_shared(&self) -> bool {
        self.remote.is_some()
    }

    /// On a shared store: brings this host's view of the graph up to the
    /// bucket's, if another host changed it (`sync/view.rs`); the heads of
    /// volumes this process has open stay. A bucket that does not answer
    /// leaves the view as it was (`forkfs status` says how old it is).
    pub(crate) fn refresh(&self) {
        let Some(r) = &self.remote else { return };
        let caught_up = r.moved().and_then(|moved| {
            let Some(now) = moved else { return Ok(()) };
            // Held so no volume opens (and takes its head) meanwhile.
            let heads = self.heads.lock();
            let open = |id: VolumeId| heads.get(&id).and_then(Weak::upgrade).is_some();
            r.catch_up(now, &open)
        });
        if let Err(e) = caught_up {
            tracing::warn!(error = %e, "other hosts' changes not imported; this host's view of the graph stays as it was");
        }
    }

    /// The shared graph's state as this host last saw it (shared stores).
    pub fn view(&self) -> Result<Option<crate::sync::view::View>> {
        match &self.remote {
            Some(_) => Ok(Some(crate::sync::view::view(&self.storage.db)?)),
            None => Ok(None),
        }
    }

    /// The volume named `name` (on a remote store, as the bucket holds it
    /// now: also one another host created since this host last looked).
    pub fn get(&self, name: &str) -> Result<VolumeRecord> {
        self.refresh();
        if let Some(v) = self.storage.records.volume_named(name)? {
            return Ok(v);
        }
        if let Some(r) = &self.remote
            && r.import()? > 0
            && let Some(v) = self.storage.records.volume_named(name)?
        {
            return Ok(v);
        }
        Err(Error::not_found(format!("no volume named {name:?}")))
    }

    /// Every volume, by name (on a remote store, as the bucket holds them).
    pub fn list(&self) -> Result<Vec<VolumeRecord>> {
        self.refresh();
        self.storage.records.volumes()
    }

    /// The version a volume's head is based on (no lease needed).
    pub fn head_base(&self, vol: &VolumeRecord) -> Result<Option<VersionId>> {
        Ok(self.storage.records.head(vol.id)?.base)
    }

    /// Creates an empty volume. `size` is required for block volumes.
    pub fn create(
        &self,
        name: &str,
        kind: VolumeKind,
        size: Option<u64>,
        block_size: Option<u32>,
    ) -> Result<VolumeRecord> {
        let name = VolumeName::new(name)?;
        let block_size = block_size.unwrap_or(self.default_block_size);
        if !block_size.is_power_of_two() || !(4096..=(1 << 24)).contains(&block_size) {
            return Err(Error::invalid("block size must be a power of two from 4 KiB to 16 MiB"));
        }
        let size = match (kind, size) {
            (VolumeKind::Block, None) => {
                return Err(Error::invalid("a block volume needs a size (e.g. --size 64G)"));
            }
            (VolumeKind::Block, Some(s)) if s == 0 || s % block_size as u64 != 0 => {
                return Err(Error::invalid(format!(
                    "size {s} is not a positive multiple of the block size {block_size}"
                )));
            }
            (_, Some(s)) => s,
            (VolumeKind::Fs, None) => DEFAULT_FS_SIZE,
        };
        let chunks = &self.storage.chunks;
        let _session = chunks.write_session();
        let root = match kind {
            VolumeKind::Fs => crate::head::fs::initial_root(chunks.as_ref())?,
            VolumeKind::Block => None,
        };
        let head = HeadRecord { base: None, root, next_seq: 0 };
        self.insert(name, kind, size, block_size, None, head)
    }

    /// Writes a new volume record and head in one batch.
    pub(crate) fn insert(
        &self,
        name: VolumeName,
        kind: VolumeKind,
        size: u64,
        block_size: u32,
        forked_from: Option<VersionId>,
        head: HeadRecord,
    ) -> Result<VolumeRecord> {
        if let Some(r) = &self.remote {
            r.import()?; // names and ids other hosts took
        }
        let chunks = &self.storage.chunks;
        let db = &self.storage.db;
        let _session = chunks.write_session();
        let _g = self.meta_lock.lock();
        if self.storage.records.volume_named(name.as_str())?.is_some() {
            return Err(Error::conflict(format!("a volume named {name} already exists")));
        }
        let next: u64 = db.get_json(keys::NEXT_VOLUME_ID)?.unwrap_or(1);
        let rec = VolumeRecord {
            format: RECORD_FORMAT,
            id: VolumeId(next),
            name,
            kind,
            size,
            block_size,
            created_at_ms: crate::clock::now_ms(),
            forked_from,
            retention: None,
            auto_prune: true,
            consistency: Default::default(),
            quota: None,
        };
        // Nodes of a new root must be durable before anything names them.
        chunks.flush()?;
        let backend = chunks.backend();
        let mut b = Batch::default();
        match &self.remote {
            // Side by side: each is a file and a directory synced. A crash
            // before the commit below can leave either alone: the index
            // does not know the volume and the next creation takes the
            // same id and replaces them; and an index rebuilt from the
            // objects skips both (a volume record without a head is a
            // creation not finished, its id not given again; a head
            // without a record names no volume).
            None => {
                let records = &self.storage.records;
                std::thread::scope(|s| {
                    let volume = s.spawn(|| records.put_object(&objects::volume(rec.id), &rec));
                    let head = records.put_object(&objects::head(rec.id), &head);
                    let volume = volume.join().unwrap_or_else(|_| {
                        Err(Error::new(ErrorKind::Unavailable, "writing a volume record panicked"))
                    });
                    volume.and(head)
                })?;
            }
            Some(r) => {
                // Hosts number volumes from what they have seen: never take
                // an id another host took meanwhile.
                let obj = crate::records::encode(&rec)?;
                backend.put_or_same(&objects::volume(rec.id), obj, None).map_err(|e| {
                    if e.kind() == ErrorKind::Conflict {
                        Error::conflict(
                            "another host created a volume at the same moment; try again",
                        )
                    } else {
                        e
                    }
                })?;
                // The head object is the creation's commit point (see
                // sync/import.rs), put at once: until it is, other hosts do
                // not see the volume, and could take its name.
                r.create_head(&mut b, rec.id, &head)?;
            }
        }
        db.put_json(&mut b, keys::NEXT_VOLUME_ID, &(next + 1))?;
        db.put_json(&mut b, &keys::volume(rec.name.as_str()), &rec)?;
        db.put_json(&mut b, &keys::head(rec.id), &head)?;
        db.write(b, true)?;
        Ok(rec)
    }

    /// Opens a block volume for reading and writing.
    pub fn open_block(&self, name: &str) -> Result<BlockHead> {
        BlockHead::new(self.open(name)?)
    }

    /// Opens an fs volume for reading and writing.
    pub fn open_fs(&self, name: &str) -> Result<FsHead> {
        FsHead::new(self.open(name)?)
    }

    /// Opens a volume's head. All callers in this process share one head
    /// per volume.
    pub(crate) fn open(&self, name: &str) -> Result<Arc<Head>> {
        let rec = self.get(name)?;
        let mut heads = self.heads.lock();
        if let Some(h) = heads.get(&rec.id).and_then(Weak::upgrade) {
            return Ok(h);
        }
        let (state, fence) = match &self.remote {
            None => (self.storage.records.head(rec.id)?, None),
            // Another host may hold it; once ours, start from the remote
            // head. The publisher keeps the lease until the head is out.
            Some(r) => {
                let (right, head) = r.right(&rec)?;
                (head, Some(right))
            }
        };
        let head = Arc::new(Head::new(self.storage.clone(), rec.clone(), state, fence)?);
        heads.insert(rec.id, Arc::downgrade(&head));
        Ok(head)
    }

    pub(crate) fn opened_id(&self, id: VolumeId) -> Option<Arc<Head>> {
        self.heads.lock().get(&id).and_then(Weak::upgrade)
    }

    /// Writes the head object other hosts (and a rebuild) read, before
    /// the local commit of `rec`: stores that upload in the background
    /// publish it after the commit instead (see [`Volumes::committed`]).
    pub(crate) fn put_head_object(&self, vol: VolumeId, rec: &HeadRecord) -> Result<()> {
        match &self.remote {
            Some(_) => Ok(()),
            None => self.storage.records.put_object(&objects::head(vol), rec),
        }
    }

    /// A head changed in the local index: publish it (remote stores).
    pub(crate) fn committed(&self) {
        if let Some(r) = &self.remote {
            r.committed();
        }
    }

    /// Changes a volume record (object copy first, then the index).
    pub(crate) fn update(
        &self,
        name: &str,
        f: impl FnOnce(&mut VolumeRecord) -> Result<()>,
    ) -> Result<VolumeRecord> {
        let _g = self.meta_lock.lock();
        let mut rec = self.get(name)?;
        f(&mut rec)?;
        self.storage.records.put_object(&objects::volume(rec.id), &rec)?;
        let mut b = Batch::default();
        self.storage.db.put_json(&mut b, &keys::volume(name), &rec)?;
        self.storage.db.write(b, true)?;
        Ok(rec)
    }

    /// Deletes a volume with its head, overlay, tags and versions. Space is
    /// reclaimed by the next GC.
    pub fn delete(&self, name: &str) -> Result<()> {
        let rec = self.get(name)?;
        if self.opened_id(rec.id).is_some() {
            return Err(Error::conflict(format!(
                "volume {name} is in use in the process holding the store (mounted or served): \
                 unmount it or stop serving it first"
            )));
        }
        // Taken before the check: a group made or changed after it could
        // name the volume deleted under it.
        let groups = self.groups.lock();
        self.check_no_group(name)?;
        let head = self.open(name)?;
        let _one = head.checkpoint.lock();
        let _gate = head.gate.write();
        // No publishing pass may put the head object back after this.
        let _pass = self.remote.as_ref().map(|r| r.pass_lock());
        let _g = self.meta_lock.lock();
        let versions = self.storage.records.log(&rec)?;
        let mut b = Batch::default();
        self.storage.forget_volume(&mut b, &rec, &versions)?;
        self.storage.db.write(b, true)?;
        // Gone from the index: a group change now finds no such volume.
        drop(groups);
        let backend = self.storage.chunks.backend();
        // On a shared store, the deletion record first: every other host
        // then forgets the volume (`sync/view.rs`).
        if self.remote.is_some() {
            backend.put(&objects::deleted_volume(rec.id), name.to_string().into())?;
        }
        // The volume record's object first: a deletion cut short leaves
        // records of no volume, never a volume whose versions look lost.
        backend.delete(&objects::volume(rec.id))?;
        for v in &versions {
            backend.delete(&objects::version(&v.id))?;
        }
        for o in backend.list(&format!("{}/{:016x}/", objects::TAGS, rec.id.0))? {
            backend.delete(&o.location)?;
        }
        backend.delete(&objects::head(rec.id))?;
        if let Some(r) = &self.remote {
            r.deleted(rec.id);
            r.bump();
        }
        head.mark_deleted();
        self.storage.log.drop_below(rec.id, u64::MAX)
    }

    /// Refuses to delete a volume a group has, or whose versions a group
    /// version names (they would be deleted with it).
    fn check_no_group(&self, name: &str) -> Result<()> {
        let db = &self.storage.db;
        for (_, v) in db.scan_meta(keys::GROUP_PREFIX)? {
            let g: crate::records::GroupRecord = serde_json::from_slice(&v)?;
            if g.members.iter().any(|m| m.as_str() == name) {
                return Err(Error::conflict(format!(
                    "volume {name} is a member of group {}: `forkfs group remove {} {name}` first",
                    g.name, g.name
                )));
            }
        }
        for (_, v) in db.scan_meta(keys::GROUP_LOG_PREFIX)? {
            let g: crate::records::GroupVersion = serde_json::from_slice(&v)?;
            if g.members.iter().any(|m| m.volume.as_str() == name) {
                return Err(Error::conflict(format!(
                    "versions of {name} are in group {}'s versions: `forkfs group delete {}` first",
                    g.group, g.group
                )));
            }
        }
        Ok(())
    }

    /// Sets a block volume's consistency mode. A head open in this process
    /// switches at once (to flush: what is pending is sealed first).
    pub fn set_consistency(&self, volume: &str, mode: Consistency) -> Result<VolumeRecord> {
        let rec = self.update(volume, |rec| {
            if rec.kind != VolumeKind::Block {
                return Err(Error::invalid(format!(
                    "{volume} is not a block volume; consistency modes apply to disks"
                )));
            }
            rec.consistency = mode;
            Ok(())
        })?;
        if let Some(head) = self.opened_id(rec.id).and_then(|h| h.as_block()) {
            head.set_deferred(mode == Consistency::Btrfs)?;
        }
        tracing::info!(volume, %mode, "consistency mode set");
        Ok(rec)
    }

    /// Sets (or with `None` removes) an fs volume's quota: the most bytes
    /// its files may take, as [`crate::head::fs::inode::charged`] counts
    /// them. Changes past it fail with ENOSPC from then on, in this
    /// process and in any that opens the volume later; a quota below what
    /// the files already take refuses growth and lets them shrink. A
    /// volume made before the count was kept is counted at its first
    /// change under the quota. Returns the record and the bytes used.
    pub fn set_quota(&self, volume: &str, quota: Option<u64>) -> Result<(VolumeRecord, u64)> {
        check_quota(self.get(volume)?.kind, quota)?;
        self.update(volume, |rec| {
            rec.quota = quota;
            // Under the record's lock: two at once leave the open head
            // enforcing what the record says.
            if let Some(h) = self.opened_id(rec.id) {
                h.set_quota(quota);
            }
            Ok(())
        })?;
        tracing::info!(volume, ?quota, "quota set");
        self.usage(volume)
    }

    /// An fs volume's record (with its quota, if any) and the bytes its
    /// files take: from the head this process has open, else from the
    /// committed head (a volume is not opened for it: on a shared store
    /// that would take its lease).
    pub fn usage(&self, volume: &str) -> Result<(VolumeRecord, u64)> {
        let rec = self.get(volume)?;
        check_quota(rec.kind, None)?;
        let used = match self.opened_id(rec.id) {
            Some(h) => FsHead::new(h)?.used()?,
            None => {
                let head = self.storage.records.head(rec.id)?;
                FsReader::frozen(&self.storage.chunks, head.root, rec.block_size).used()?
            }
        };
        Ok((rec, used))
    }

    /// Changes a volume's retention policy and auto-pruning, each field
    /// given (see [`PolicyChange`]), under the record's lock.
    pub fn change_retention(&self, volume: &str, change: &PolicyChange) -> Result<VolumeRecord> {
        self.update(volume, |rec| {
            let policy = change.apply(rec.retention.as_ref());
            check_policy(policy.as_ref())?;
            rec.retention = policy;
            rec.auto_prune = change.auto_prune.unwrap_or(rec.auto_prune);
            Ok(())
        })
    }

    /// Sets a volume's retention policy (`None`: the default) and whether
    /// automatic checkpoints prune.
    pub fn set_retention(
        &self,
        volume: &str,
        policy: Option<Policy>,
        auto_prune: bool,
    ) -> Result<VolumeRecord> {
        check_policy(policy.as_ref())?;
        self.update(volume, |rec| {
            rec.retention = policy;
            rec.auto_prune = auto_prune;
            Ok(())
        })
    }
}

fn check_policy(policy: Option<&Policy>) -> Result<()> {
    if policy.is_some_and(|p| !p.is_valid()) {
        return Err(Error::invalid("retention unit and per-bucket count must be positive"));
    }
    Ok(())
}

/// Refuses a quota where there can be none: on a block volume (its size
/// is its limit), or of zero bytes.
pub(crate) fn check_quota(kind: VolumeKind, quota: Option<u64>) -> Result<()> {
    if kind == VolumeKind::Block {
        return Err(Error::invalid(
            "a quota is for fs volumes: a block volume's size is its limit",
        ));
    }
    if quota == Some(0) {
        return Err(Error::invalid("a quota must be more than zero bytes (none: --none)"));
    }
    Ok(())
}
