//! A new local store over a remote that already holds one: `forkfs init
//! --remote URL` on a second host. Everything committed lives in the object
//! store (volume, head and version records as objects, packs with their
//! footers), so the local index is rebuilt from it: records from their
//! objects, the chunk index from each pack's footer (two ranged reads per
//! pack, never a pack body). Data is then read on demand.

use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId};
use crate::index::CF_META;
use crate::paths;
use crate::progress::Progress;
use crate::store::Store;
use crate::version::{HeadRecord, VersionRecord, VolumeRecord, keys};
use rocksdb::WriteBatch;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// What an attach found in the remote.
#[derive(Serialize, Debug, Default, Clone)]
pub struct AttachReport {
    pub volumes: usize,
    pub versions: usize,
    pub packs: usize,
    pub chunks: usize,
}

impl Store {
    /// Fills an empty local index from the remote's objects.
    pub(crate) fn attach_remote(&self, progress: &dyn Progress) -> Result<AttachReport> {
        let backend = self.chunks().backend();
        let mut report = AttachReport::default();
        let mut b = WriteBatch::default();
        self.import_remote_objects(&mut b, progress, &mut report)?;
        self.index().write(b, true)?;
        tracing::info!(?report, remote = backend.describe(), "attached to the remote store");
        Ok(report)
    }

    /// Adds to `b` the version records and packs the remote has and the
    /// local index does not (what other hosts committed).
    fn import_remote_objects(
        &self,
        b: &mut WriteBatch,
        progress: &dyn Progress,
        report: &mut AttachReport,
    ) -> Result<()> {
        let backend = self.chunks().backend();
        let meta = self.index().cf(CF_META);
        // Volumes created by other hosts since.
        let known: HashSet<VolumeId> = self.volumes()?.into_iter().map(|v| v.id).collect();
        let mut next_id: u64 = self.get_json(keys::NEXT_VOLUME_ID)?.unwrap_or(1);
        // Each volume's head, for the line of versions its log follows
        // (known volumes' are read below, only if new versions arrive).
        let mut heads: Vec<(VolumeId, HeadRecord)> = Vec::new();
        for o in backend.list(paths::VOLUMES)? {
            let rec: VolumeRecord = serde_json::from_slice(&backend.get(&o.location)?)
                .map_err(|e| Error::corrupt(format!("{}: {e}", o.location)))?;
            // Its id is taken even if its creation never finished.
            next_id = next_id.max(rec.id.0 + 1);
            if known.contains(&rec.id) {
                continue;
            }
            // The head object is the commit point of a volume's creation:
            // a record without one is a creation that was interrupted (or
            // is still under way on another host, which a later sync sees).
            let Some((raw, _)) = backend.get_versioned(&paths::head(rec.id))? else {
                tracing::debug!(volume = %rec.name, id = rec.id.0, "volume record without a head: creation not finished; skipped");
                continue;
            };
            let head: HeadRecord = serde_json::from_slice(&raw)
                .map_err(|e| Error::corrupt(format!("head of {}: {e}", rec.name)))?;
            // Never in place of a volume of the same name this host knows.
            if let Some(mine) = self.get_json::<VolumeRecord>(&keys::volume(rec.name.as_str()))? {
                tracing::warn!(volume = %rec.name, ours = mine.id.0, theirs = rec.id.0, "two volumes of one name in the bucket; this host keeps its own");
                continue;
            }
            self.put_json(b, &keys::volume(rec.name.as_str()), &rec)?;
            self.put_json(b, &keys::head(rec.id), &head)?;
            self.mark_published(b, rec.id, &head);
            heads.push((rec.id, head));
            report.volumes += 1;
        }
        self.put_json(b, keys::NEXT_VOLUME_ID, &next_id)?;
        let mut fresh = Vec::new();
        for o in backend.list(paths::VERSIONS)? {
            let named = o.location.filename().and_then(|f| f.strip_suffix(".json"));
            let Some(id) = named.and_then(VersionId::parse) else { continue };
            if self.index().get_meta(&keys::version(&id))?.is_some() {
                continue;
            }
            let v = VersionRecord::decode(&backend.get(&o.location)?)?;
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
            heads.push((*id, self.head_record(*id)?));
        }
        let mut line = HashSet::new();
        for (vol, h) in &heads {
            let Some(&floor) = lowest.get(vol) else { continue };
            let mut next = h.base;
            while let Some(id) = next.filter(|id| line.insert(*id)) {
                let v = match by_id.get(&id) {
                    Some(v) => Some((*v).clone()),
                    None => self.version(&id).ok(),
                };
                next = v.filter(|v| v.seq > floor).and_then(|v| v.parents.first().copied());
            }
        }
        let mut slots: HashMap<String, VersionId> = HashMap::new();
        for v in &fresh {
            self.put_json(b, &keys::version(&v.id), v)?;
            let slot = keys::log(VolumeId(v.volume.0), v.seq);
            let taken = match slots.get(&slot) {
                Some(id) => Some(*id),
                None => self
                    .index()
                    .get_meta(&slot)?
                    .and_then(|raw| std::str::from_utf8(&raw).ok().and_then(VersionId::parse)),
            };
            let mine = match taken {
                None => true,
                Some(other) => line.contains(&v.id) && !line.contains(&other),
            };
            if mine {
                b.put_cf(meta, &slot, v.id.to_string());
                slots.insert(slot, v.id);
            }
            report.versions += 1;
        }
        let known: std::collections::HashSet<_> =
            self.index().packs()?.into_iter().map(|(id, _)| id).collect();
        let packs: Vec<_> = backend
            .list(paths::PACKS)?
            .into_iter()
            .filter_map(|o| paths::parse_pack(&o.location).map(|id| (id, o)))
            .filter(|(id, _)| !known.contains(id))
            .collect();
        progress.stage("pack footers", packs.len() as u64);
        for (id, o) in packs {
            progress.advance(1);
            let entries = crate::check::read_footer(backend, &o.location, o.size)
                .map_err(|e| Error::corrupt(format!("pack {id}: {e}")))?;
            self.index().put_pack(b, id, o.size, &entries);
            report.packs += 1;
            report.chunks += entries.len();
        }
        Ok(())
    }

    /// Imports what other hosts committed (volumes, versions, packs);
    /// returns how many records and packs were new.
    pub(crate) fn sync_from_remote(&self) -> Result<usize> {
        let mut b = WriteBatch::default();
        let mut report = AttachReport::default();
        self.import_remote_objects(&mut b, &crate::progress::Quiet, &mut report)?;
        self.index().write(b, true)?;
        Ok(report.volumes + report.versions + report.packs)
    }

    /// Takes the remote's head of every volume this process is not
    /// writing that another host advanced, so that GC marks from it. A
    /// local head this host has yet to publish stays.
    pub(crate) fn refresh_remote_heads(&self) -> Result<()> {
        let backend = self.chunks().backend();
        let mut b = WriteBatch::default();
        for vol in self.volumes()? {
            if self.open_head(vol.name.as_str()).is_some() {
                continue;
            }
            // What this host published, read before the object: a publish
            // finishing in between then reads as ours, never as another's.
            let published = self.publisher().map(|p| p.published(vol.id)).transpose()?.flatten();
            if let Some((raw, v)) = backend.get_versioned(&paths::head(vol.id))? {
                let remote: HeadRecord = serde_json::from_slice(&raw)
                    .map_err(|e| Error::corrupt(format!("head of {}: {e}", vol.name)))?;
                let local = self.head_record(vol.id)?;
                let ahead = published.as_ref() == Some(&remote);
                if remote == local {
                    if published.as_ref() != Some(&remote) {
                        self.mark_published(&mut b, vol.id, &remote);
                    }
                } else if !ahead {
                    // As when the volume is opened: the other host's head,
                    // its line in the log, nothing of the old head's overlay.
                    let overlay = crate::overlay::Overlay::new(self.index(), vol.id);
                    if !overlay.is_empty()? {
                        tracing::warn!(volume = %vol.name, "another host advanced this volume; uncommitted local changes to the old head are dropped");
                    }
                    overlay.clear(&mut b);
                    self.put_json(&mut b, &keys::head(vol.id), &remote)?;
                    self.mark_published(&mut b, vol.id, &remote);
                    self.adopt_line(&mut b, vol.id, &remote)?;
                    if let Some(p) = self.publisher() {
                        p.saw(vol.id, Some(v));
                    }
                }
            }
        }
        self.index().write(b, true)
    }

    /// Points the log slots of `head`'s line (its base, that one's
    /// parent, ...) at those versions: a head taken from another host
    /// replaces this host's versions that never reached the bucket (their
    /// records stay, by id).
    fn adopt_line(&self, b: &mut WriteBatch, vol: VolumeId, head: &HeadRecord) -> Result<()> {
        let meta = self.index().cf(CF_META);
        let mut next = head.base;
        let mut seen = HashSet::new();
        while let Some(id) = next.filter(|id| seen.insert(*id)) {
            let Ok(v) = self.version(&id) else { break };
            if v.volume == vol {
                b.put_cf(meta, keys::log(vol, v.seq), v.id.to_string());
            }
            next = v.parents.first().copied();
        }
        Ok(())
    }

    fn mark_published(&self, b: &mut WriteBatch, vol: VolumeId, head: &HeadRecord) {
        if let Some(p) = self.publisher() {
            p.set_published(b, vol, head);
        }
    }

    /// Brings one volume up to what the remote holds before this host
    /// writes it (after taking its lease): new packs and versions, and the
    /// remote head if another host advanced it (local changes to an
    /// outdated head are dropped, with a warning). A local head that is
    /// ahead of the remote's (versions not yet published) stays. Returns
    /// the head to start from.
    pub(crate) fn refresh_from_remote(&self, vol: &VolumeRecord) -> Result<HeadRecord> {
        let backend = self.chunks().backend();
        self.sync_from_remote()?; // records a taken head's line needs
        let mut b = WriteBatch::default();
        let local = self.head_record(vol.id)?;
        // Read before the object (see `refresh_remote_heads`).
        let published = self.publisher().map(|p| p.published(vol.id)).transpose()?.flatten();
        let (remote, version) = match backend.get_versioned(&paths::head(vol.id))? {
            Some((raw, v)) => {
                let remote: HeadRecord = serde_json::from_slice(&raw)
                    .map_err(|e| Error::corrupt(format!("head of {}: {e}", vol.name)))?;
                (Some(remote), Some(v))
            }
            // Not published yet (its creation is still queued here).
            None => (None, None),
        };
        let mut head = local.clone();
        if let Some(remote) = remote {
            // The remote still holds what this host published: the local
            // head is its successor, not yet out.
            let ahead = published.as_ref() == Some(&remote);
            if remote == local {
                self.mark_published(&mut b, vol.id, &remote);
            } else if !ahead {
                let overlay = crate::overlay::Overlay::new(self.index(), vol.id);
                if !overlay.is_empty()? {
                    tracing::warn!(volume = %vol.name, "another host advanced this volume; uncommitted local changes to the old head are dropped");
                }
                if published.as_ref().is_some_and(|p| *p != local) {
                    tracing::warn!(volume = %vol.name, "this host's versions since its last publish stay local, not in the volume's remote history");
                }
                overlay.clear(&mut b);
                self.put_json(&mut b, &keys::head(vol.id), &remote)?;
                self.mark_published(&mut b, vol.id, &remote);
                self.adopt_line(&mut b, vol.id, &remote)?;
                tracing::info!(volume = %vol.name, base = ?remote.base, "head taken from the remote store");
                head = remote;
            }
        }
        self.index().write(b, true)?;
        if let Some(p) = self.publisher() {
            p.saw(vol.id, version);
            p.kick();
        }
        Ok(head)
    }
}
