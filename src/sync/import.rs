//! A new local store over a remote that already holds one: `forkfs init
//! --remote URL` on a second host. Everything committed lives in the object
//! store (volume, head and version records as objects, packs with their
//! footers), so the local index is rebuilt from it: records from their
//! objects, the chunk index from each pack's footer (two ranged reads per
//! pack, never a pack body). Data is then read on demand.

use super::Remote;
use super::publish::Publisher;
use crate::cas::pack::read_footer;
use crate::cas::tombstone::list_tombstones;
use crate::db::Batch;
use crate::error::{Error, ErrorKind, Result};
use crate::head::Storage;
use crate::id::{VersionId, VolumeId};
use crate::objects::keys as objects;
use crate::progress::Progress;
use crate::records::{HeadRecord, VersionRecord, VolumeRecord, keys};
use object_store::UpdateVersion;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// What an attach found in the remote.
#[derive(Serialize, Debug, Default, Clone)]
pub struct AttachReport {
    pub volumes: usize,
    pub versions: usize,
    pub packs: usize,
    pub chunks: usize,
    /// Versions this host listed that another host deleted.
    pub forgotten: usize,
    /// Names of versions set or removed on other hosts.
    pub names: usize,
}

/// Fills an empty local index from the remote's objects (`publisher`: the
/// remote side of a store on S3/GCS/Azure, which records the heads it took
/// as published; none for a `file://` remote).
pub(crate) fn attach(
    storage: &Storage,
    publisher: Option<&Publisher>,
    progress: &dyn Progress,
) -> Result<AttachReport> {
    let mut report = AttachReport::default();
    let mut b = Batch::default();
    import_objects(storage, publisher, &mut b, progress, &mut report)?;
    storage.db.write(b, true)?;
    if publisher.is_some() {
        report.names = super::names::import(storage)?;
    }
    let remote = storage.chunks.backend().describe();
    tracing::info!(?report, remote, "attached to the remote store");
    Ok(report)
}

/// Adds to `b` the volume and version records and packs the remote has and
/// the local index does not (what other hosts committed).
fn import_objects(
    storage: &Storage,
    publisher: Option<&Publisher>,
    b: &mut Batch,
    progress: &dyn Progress,
    report: &mut AttachReport,
) -> Result<()> {
    let backend = storage.chunks.backend();
    let db = &storage.db;
    let records = &storage.records;
    // Volumes created by other hosts since.
    let known: HashSet<VolumeId> = records.volumes()?.into_iter().map(|v| v.id).collect();
    let mut next_id: u64 = db.get_json(keys::NEXT_VOLUME_ID)?.unwrap_or(1);
    // Each volume's head, for the line of versions its log follows
    // (known volumes' are read below, only if new versions arrive).
    let mut heads: Vec<(VolumeId, HeadRecord)> = Vec::new();
    // Volumes deleted on any host are not taken (shared stores).
    let gone = match publisher {
        Some(_) => super::view::deleted_volumes(backend)?,
        None => HashSet::new(),
    };
    // A deleted volume's id is never given again: its deletion record
    // would make other hosts forget the new volume.
    if let Some(last) = gone.iter().map(|v| v.0).max() {
        next_id = next_id.max(last + 1);
    }
    for o in backend.list(objects::VOLUMES)? {
        // Known by its key: not read again (one GET per volume per import
        // would grow with the store).
        if let Some(id) = objects::parse_volume(&o.location) {
            next_id = next_id.max(id.0 + 1);
            if known.contains(&id) || gone.contains(&id) {
                continue;
            }
        }
        let raw = match backend.get(&o.location) {
            Ok(raw) => raw,
            // Deleted by another host since the listing.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let rec: VolumeRecord = serde_json::from_slice(&raw)
            .map_err(|e| Error::corrupt(format!("{}: {e}", o.location)))?;
        // Its id is taken even if its creation never finished.
        next_id = next_id.max(rec.id.0 + 1);
        if known.contains(&rec.id) || gone.contains(&rec.id) {
            continue;
        }
        // The head object is the commit point of a volume's creation:
        // a record without one is a creation that was interrupted (or
        // is still under way on another host, which a later sync sees).
        let Some((raw, _)) = backend.get_versioned(&objects::head(rec.id))? else {
            tracing::debug!(volume = %rec.name, id = rec.id.0, "volume record without a head: creation not finished; skipped");
            continue;
        };
        let head: HeadRecord = serde_json::from_slice(&raw)
            .map_err(|e| Error::corrupt(format!("head of {}: {e}", rec.name)))?;
        // Never in place of a volume of the same name this host knows.
        if let Some(mine) = records.volume_named(rec.name.as_str())? {
            tracing::warn!(volume = %rec.name, ours = mine.id.0, theirs = rec.id.0, "two volumes of one name in the bucket; this host keeps its own");
            continue;
        }
        db.put_json(b, &keys::volume(rec.name.as_str()), &rec)?;
        db.put_json(b, &keys::head(rec.id), &head)?;
        if let Some(p) = publisher {
            p.set_published(b, rec.id, &head);
        }
        heads.push((rec.id, head));
        report.volumes += 1;
    }
    db.put_json(b, keys::NEXT_VOLUME_ID, &next_id)?;
    // Versions deleted on any host (shared stores): listed before the
    // versions, so a record object a deletion has yet to remove is not
    // taken for a new version.
    let deleted = match publisher {
        Some(_) => super::view::deleted_versions(backend)?,
        None => HashSet::new(),
    };
    let mut fresh = Vec::new();
    for o in backend.list(objects::VERSIONS)? {
        let named = o.location.filename().and_then(|f| f.strip_suffix(".json"));
        let Some(id) = named.and_then(VersionId::parse) else { continue };
        if deleted.contains(&id) || db.get_meta(&keys::version(&id))?.is_some() {
            continue;
        }
        let raw = match backend.get(&o.location) {
            Ok(raw) => raw,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let v = VersionRecord::decode(&raw)?;
        if v.id != id || v.clone().seal()?.id != v.id {
            return Err(Error::corrupt(format!("{} does not match its id", o.location)));
        }
        fresh.push(v);
    }
    // A host cut off from the bucket may have committed versions of its
    // own at sequence numbers the volume's history took meanwhile: all
    // records are kept, and a log slot goes to the version on the line
    // of the head (its base, that one's parent, ...) over any other.
    // The walk stops below the lowest new sequence number of the
    // volume: older slots cannot be contested (and histories are long).
    let by_id: HashMap<VersionId, &VersionRecord> = fresh.iter().map(|v| (v.id, v)).collect();
    let mut lowest: HashMap<VolumeId, u64> = HashMap::new();
    for v in &fresh {
        let l = lowest.entry(v.volume).or_insert(v.seq);
        *l = (*l).min(v.seq);
    }
    for id in known.iter().filter(|id| lowest.contains_key(id)) {
        heads.push((*id, records.head(*id)?));
    }
    let mut line = HashSet::new();
    for (vol, h) in &heads {
        let Some(&floor) = lowest.get(vol) else { continue };
        let mut next = h.base;
        while let Some(id) = next.filter(|id| line.insert(*id)) {
            let v = match by_id.get(&id) {
                Some(v) => Some((*v).clone()),
                None => records.version(&id).ok(),
            };
            next = v.filter(|v| v.seq > floor).and_then(|v| v.parents.first().copied());
        }
    }
    let mut slots: HashMap<String, VersionId> = HashMap::new();
    for v in &fresh {
        db.put_json(b, &keys::version(&v.id), v)?;
        let slot = keys::log(VolumeId(v.volume.0), v.seq);
        let taken = match slots.get(&slot) {
            Some(id) => Some(*id),
            None => db
                .get_meta(&slot)?
                .and_then(|raw| std::str::from_utf8(&raw).ok().and_then(VersionId::parse)),
        };
        let mine = match taken {
            None => true,
            Some(other) => line.contains(&v.id) && !line.contains(&other),
        };
        if mine {
            db.put_meta(b, &slot, v.id.to_string());
            slots.insert(slot, v.id);
        }
        report.versions += 1;
    }
    report.forgotten = super::view::forget_deleted(db, records, b, &deleted)?;
    let index = storage.chunks.index();
    let mut known: HashSet<_> = index.packs()?.into_iter().map(|(id, _)| id).collect();
    // Packs a GC retired are never indexed again (see `cas/tombstone.rs`).
    // Listed before the packs: a tombstone absent now was either reaped
    // with its pack already gone, or is written later, when this host's
    // acknowledgement is awaited.
    if publisher.is_some() {
        for t in list_tombstones(backend)? {
            known.extend(t.pack_id().ok());
        }
    }
    let packs: Vec<_> = backend
        .list(objects::PACKS)?
        .into_iter()
        .filter_map(|o| objects::parse_pack(&o.location).map(|id| (id, o)))
        .filter(|(id, _)| !known.contains(id))
        .collect();
    progress.stage("pack footers", packs.len() as u64);
    for (id, o) in packs {
        progress.advance(1);
        let entries = match read_footer(backend, &o.location, o.size) {
            Ok(entries) => entries,
            // Deleted since the listing (a GC reaped it): nothing to index.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::corrupt(format!("pack {id}: {e}"))),
        };
        index.put_pack(b, id, o.size, &entries);
        report.packs += 1;
        report.chunks += entries.len();
    }
    Ok(())
}

/// Fails while this host is not registered with the bucket's GC (see
/// [`Remote::registration`]).
pub(super) fn registered(flag: &std::sync::atomic::AtomicBool) -> Result<()> {
    if flag.load(std::sync::atomic::Ordering::SeqCst) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        "this host is not registered with the bucket's gc yet (the bucket was out of reach when \
         the store opened): other hosts' changes are imported once it is",
    ))
}

/// [`Remote::import`], for a task that holds no `Remote`.
pub(super) fn import(storage: &Storage, publisher: &Publisher) -> Result<usize> {
    let mut b = Batch::default();
    let mut report = AttachReport::default();
    import_objects(storage, Some(publisher), &mut b, &crate::progress::Quiet, &mut report)?;
    storage.db.write(b, true)?;
    // After the versions they name are in.
    report.names = super::names::import(storage)?;
    Ok(report.volumes + report.versions + report.packs + report.forgotten + report.names)
}

impl Remote {
    /// Imports what other hosts committed (volumes, versions, packs);
    /// returns how many records and packs were new.
    pub(crate) fn import(&self) -> Result<usize> {
        registered(&self.registered)?;
        import(&self.storage, &self.publisher)
    }

    /// Takes the remote's head of every volume that another host advanced,
    /// except those `open` says this process is writing, so that GC marks
    /// from it. A local head this host has yet to publish stays.
    ///
    /// One listing of the head objects first: a volume whose head object
    /// has the ETag this host saw when it last compared (`headseen/` in
    /// its index) is as it was then, and is not read again.
    pub(crate) fn refresh_heads(&self, open: &dyn Fn(VolumeId) -> bool) -> Result<()> {
        let listed: HashMap<VolumeId, String> = self
            .backend()
            .list(objects::HEADS)?
            .into_iter()
            .filter_map(|o| Some((objects::parse_head(&o.location)?, o.e_tag?)))
            .collect();
        let mut b = Batch::default();
        for vol in self.storage.records.volumes()? {
            if open(vol.id) {
                continue;
            }
            let seen = self.db().get_meta(&keys::head_seen(vol.id))?;
            let etag = listed.get(&vol.id);
            if etag.is_some_and(|e| seen.as_deref() == Some(e.as_bytes())) {
                continue;
            }
            let local = self.storage.records.head(vol.id)?;
            let Some(r) = self.reconcile(&mut b, &vol, &local)? else { continue };
            if let Some(e) = &r.version.e_tag {
                self.db().put_meta(&mut b, &keys::head_seen(vol.id), e);
            }
            if r.taken {
                self.publisher.saw(vol.id, Some(r.version));
            }
        }
        self.db().write(b, true)
    }

    /// Brings one volume up to what the remote holds before this host
    /// writes it (after taking its lease): new packs and versions, and the
    /// remote head if another host advanced it (local changes to an
    /// outdated head are dropped, with a warning). A local head that is
    /// ahead of the remote's (versions not yet published) stays. Returns
    /// the head to start from.
    pub(crate) fn refresh_volume(&self, vol: &VolumeRecord) -> Result<HeadRecord> {
        self.import()?; // records a taken head's line needs
        let mut b = Batch::default();
        let local = self.storage.records.head(vol.id)?;
        let r = self.reconcile(&mut b, vol, &local)?;
        self.db().write(b, true)?;
        // Not published yet (its creation is still queued here): no version.
        self.publisher.saw(vol.id, r.as_ref().map(|r| r.version.clone()));
        self.publisher.kick();
        Ok(r.map_or(local, |r| r.head))
    }

    /// Compares this host's head of `vol` with the head object, and adds
    /// to `b` what follows: the object's head when another host advanced
    /// the volume (its line in the log, nothing of the old head's overlay),
    /// else the mark that the object holds this host's head. `None` when
    /// there is no head object yet.
    fn reconcile(
        &self,
        b: &mut Batch,
        vol: &VolumeRecord,
        local: &HeadRecord,
    ) -> Result<Option<Reconciled>> {
        // What this host published, read before the object: a publish
        // finishing in between then reads as ours, never as another's.
        let published = self.publisher.published(vol.id)?;
        let Some((raw, version)) = self.backend().get_versioned(&objects::head(vol.id))? else {
            return Ok(None);
        };
        let remote: HeadRecord = serde_json::from_slice(&raw)
            .map_err(|e| Error::corrupt(format!("head of {}: {e}", vol.name)))?;
        let ours = published.as_ref() == Some(&remote);
        if remote == *local || ours {
            // The object holds this host's head, or what this host
            // published before the local head (its successor, not yet out).
            if !ours {
                self.publisher.set_published(b, vol.id, &remote);
            }
            return Ok(Some(Reconciled { head: local.clone(), taken: false, version }));
        }
        let overlay = self.storage.overlay(vol.id);
        if !overlay.is_empty()? {
            tracing::warn!(volume = %vol.name, "another host advanced this volume; uncommitted local changes to the old head are dropped");
        }
        if published.as_ref().is_some_and(|p| p != local) {
            tracing::warn!(volume = %vol.name, "this host's versions since its last publish stay local, not in the volume's remote history");
        }
        overlay.clear(b);
        self.db().put_json(b, &keys::head(vol.id), &remote)?;
        self.publisher.set_published(b, vol.id, &remote);
        self.adopt_line(b, vol.id, &remote)?;
        tracing::info!(volume = %vol.name, base = ?remote.base, "head taken from the remote store");
        Ok(Some(Reconciled { head: remote, taken: true, version }))
    }

    /// Points the log slots of `head`'s line (its base, that one's
    /// parent, ...) at those versions: a head taken from another host
    /// replaces this host's versions that never reached the bucket (their
    /// records stay, by id).
    fn adopt_line(&self, b: &mut Batch, vol: VolumeId, head: &HeadRecord) -> Result<()> {
        let mut next = head.base;
        let mut seen = HashSet::new();
        while let Some(id) = next.filter(|id| seen.insert(*id)) {
            let Ok(v) = self.storage.records.version(&id) else { break };
            if v.volume == vol {
                self.db().put_meta(b, &keys::log(vol, v.seq), v.id.to_string());
            }
            next = v.parents.first().copied();
        }
        Ok(())
    }
}

/// A head compared with the head object (see [`Remote::reconcile`]).
struct Reconciled {
    /// The head to use.
    head: HeadRecord,
    /// Taken from the object (another host advanced the volume).
    taken: bool,
    /// The object's version, for the next conditional update.
    version: UpdateVersion,
}
