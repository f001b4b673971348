//! `forkfs fsck --repair`: rebuilds what can be rebuilt, marks what cannot,
//! and never deletes user data to make a check pass.
//!
//! - The chunk index is rebuilt from pack footers: entries for missing or
//!   unreadable packs are dropped (or re-pointed at another pack holding the
//!   same chunk), chunks only a footer knows are indexed again.
//! - Version records that are missing or altered are restored from their
//!   object copies when those verify against the id.
//! - Object copies of volume, version and head records that are missing
//!   or differ are written back from the index (a version's only when its
//!   record verifies against its id; a remote store's heads and volumes
//!   follow their own rules and are only reported).
//! - Versions that still reference missing data are marked damaged (a
//!   `damaged/<id>` meta entry; the record itself stays untouched).
//! - Unreadable packs stay where they are for a human to look at.

use super::check::CheckReport;
use crate::cas::pack::{self, Entry, PackWriter};
use crate::cas::{Location, PackInfo};
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::id::{ChunkId, PackId, VersionId};
use crate::objects::keys as objects;
use crate::progress::Progress;
use crate::records::{VersionRecord, keys, parse_id};
use crate::store::Store;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

#[derive(Serialize, Debug, Default)]
pub struct RepairReport {
    pub packs_read: usize,
    /// Pack objects whose footer cannot be read; left in place.
    pub unreadable_packs: Vec<String>,
    pub packs_indexed: usize,
    pub pack_entries_dropped: usize,
    pub chunk_entries_added: usize,
    pub chunk_entries_repointed: usize,
    pub chunk_entries_dropped: usize,
    pub version_records_restored: Vec<String>,
    /// Object copies of records written back from the index.
    pub objects_restored: Vec<String>,
    /// Acknowledged writes whose data was gone, dropped: their blocks read
    /// as in the last version again.
    pub lost_writes_dropped: Vec<String>,
    /// Versions marked damaged (they reference data that is gone).
    pub damaged_versions: Vec<String>,
    /// fs volumes whose quota count was wrong, recounted.
    pub quota_counts_fixed: Vec<String>,
}

impl Store {
    /// Repairs the store; run [`Store::check_with`] afterwards to see what remains.
    pub fn repair(&self, progress: &dyn Progress) -> Result<RepairReport> {
        let mut report = RepairReport::default();
        self.rebuild_index(progress, &mut report)?;
        self.restore_version_records(&mut report)?;
        report.objects_restored = self.restore_copies()?;
        report.lost_writes_dropped = self.drop_lost_writes()?;
        self.mark_damaged(progress, &mut report)?;
        report.quota_counts_fixed = self.repair_usage()?;
        Ok(report)
    }

    fn rebuild_index(&self, progress: &dyn Progress, report: &mut RepairReport) -> Result<()> {
        let backend = self.chunks().backend();
        let index = self.chunks().index();
        let listed = backend.list(objects::PACKS)?;
        // What the index says lives in each pack (used to salvage packs whose footer is gone).
        let mut by_pack: HashMap<PackId, Vec<Entry>> = HashMap::new();
        index.for_each_chunk(&mut |c, loc| {
            if let Ok(l) = loc {
                by_pack.entry(l.pack).or_default().push(l.entry(c));
            }
            Ok(())
        })?;
        progress.stage("packs", listed.len() as u64);
        // Sound packs (footer and every chunk verify), and what they hold.
        let mut sound: HashMap<PackId, (u64, u32)> = HashMap::new();
        let mut copies: HashMap<ChunkId, Vec<Location>> = HashMap::new();
        let mut salvage = PackWriter::new();
        let mut damaged: Vec<PackId> = Vec::new();
        for meta in listed {
            progress.advance(1);
            let Some(id) = objects::parse_pack(&meta.location) else { continue };
            report.packs_read += 1;
            let bytes = backend.get(&meta.location)?;
            let footer = pack::parse(&bytes);
            let mut wanted: Vec<Entry> = footer.as_ref().map(|e| e.clone()).unwrap_or_default();
            let listed_ids: HashSet<ChunkId> = wanted.iter().map(|e| e.id).collect();
            let from_index = by_pack.get(&id).map(|v| v.as_slice()).unwrap_or_default();
            wanted.extend(from_index.iter().filter(|e| !listed_ids.contains(&e.id)));
            let good: Vec<&Entry> = wanted.iter().filter(|e| verify(&bytes, e)).collect();
            match footer {
                Ok(entries) if good.len() == entries.len() => {
                    for e in &entries {
                        copies.entry(e.id).or_default().push(Location::of(id, e));
                    }
                    sound.insert(id, (meta.size, entries.len() as u32));
                }
                res => {
                    let why = res
                        .err()
                        .map_or("some chunks fail their checksums".into(), |e| e.to_string());
                    report.unreadable_packs.push(format!(
                        "{id}: {why}; salvaged {} of {} chunks, moved to {}",
                        good.len(),
                        wanted.len(),
                        objects::quarantine(&id)
                    ));
                    for e in good {
                        let stored =
                            &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
                        salvage.add(e.id, e.plain_len, e.codec, stored);
                    }
                    damaged.push(id);
                }
            }
        }
        if !salvage.is_empty() {
            // The salvaged chunks are durable in a new pack before the index
            // names it and before the damaged packs move aside.
            let (id, bytes, entries) = salvage.seal();
            let len = bytes.len() as u64;
            backend.put(&objects::pack(&id), bytes)?;
            for e in &entries {
                copies.entry(e.id).or_default().insert(0, Location::of(id, e));
            }
            sound.insert(id, (len, entries.len() as u32));
        }
        let mut b = Batch::default();
        let indexed: HashMap<PackId, PackInfo> = index.packs()?.into_iter().collect();
        for (id, info) in &indexed {
            if sound.get(id) != Some(&(info.len, info.count)) {
                index.delete_pack(&mut b, id);
                report.pack_entries_dropped += 1;
            }
        }
        for (id, (len, count)) in &sound {
            if indexed.get(id).is_none_or(|i| (i.len, i.count) != (*len, *count)) {
                let info =
                    PackInfo { count: *count, len: *len, created_ms: crate::clock::now_ms() };
                index.put_pack_info(&mut b, *id, &info);
                report.packs_indexed += 1;
            }
        }
        // Existing entries: keep the sound ones, re-point or drop the rest.
        let mut seen: HashSet<ChunkId> = HashSet::new();
        index.for_each_chunk(&mut |c, loc| {
            seen.insert(c);
            let here = copies.get(&c);
            if loc.as_ref().is_ok_and(|l| here.is_some_and(|v| v.contains(l))) {
                return Ok(());
            }
            match here.and_then(|v| v.first()) {
                Some(l) => {
                    index.put_chunk(&mut b, c, l);
                    report.chunk_entries_repointed += 1;
                }
                None => {
                    index.delete_chunk(&mut b, &c);
                    report.chunk_entries_dropped += 1;
                }
            }
            Ok(())
        })?;
        for (c, locs) in &copies {
            if !seen.contains(c) {
                index.put_chunk(&mut b, *c, &locs[0]);
                report.chunk_entries_added += 1;
            }
        }
        self.db().write(b, true)?;
        for id in damaged {
            backend.rename(&objects::pack(&id), &objects::quarantine(&id))?;
        }
        Ok(())
    }

    /// Restores version records that are missing from, or altered in, the
    /// index from their object copies.
    fn restore_version_records(&self, report: &mut RepairReport) -> Result<()> {
        let mut wanted: Vec<VersionId> = Vec::new();
        for vol in self.volumes().list()? {
            for (_, id) in self.db().scan_meta(&keys::log_prefix(vol.id))? {
                wanted.extend(parse_id(&id, "log entry").ok());
            }
        }
        let mut b = Batch::default();
        for id in wanted {
            if self.version_record_checked(&id).is_ok() {
                continue;
            }
            let copy = self.chunks().backend().get(&objects::version(&id)).and_then(|raw| {
                let v = VersionRecord::decode(&raw)?;
                if v.id != id || v.clone().seal()?.id != id {
                    return Err(Error::corrupt("object copy does not match its id"));
                }
                Ok(v)
            });
            match copy {
                Ok(v) => {
                    self.db().put_json(&mut b, &keys::version(&id), &v)?;
                    report.version_records_restored.push(format!(
                        "{}@{}",
                        v.volume_name,
                        id.short()
                    ));
                }
                Err(e) => {
                    tracing::warn!(version = %id, error = %e, "version record cannot be restored")
                }
            }
        }
        self.db().write(b, true)
    }

    /// Marks every version that references unreadable data damaged, and
    /// clears the mark of versions that read fully again.
    fn mark_damaged(&self, progress: &dyn Progress, report: &mut RepairReport) -> Result<()> {
        let mut scratch = CheckReport::default();
        let subjects = self.subjects(&mut scratch)?;
        let damage = self.damage(&subjects, HashMap::new(), progress)?;
        let db = self.db();
        let mut b = Batch::default();
        for (k, _) in db.scan_meta(keys::DAMAGED_PREFIX)? {
            db.delete_meta(&mut b, &k);
        }
        for (i, why) in damage.damaged {
            if let Some(id) = subjects[i].version {
                db.put_meta(&mut b, &keys::damaged(&id), why.as_bytes());
                report.damaged_versions.push(subjects[i].what.clone());
            }
        }
        self.db().write(b, true)
    }
}

/// Whether entry `e` reads back intact from `pack`.
fn verify(pack: &[u8], e: &Entry) -> bool {
    let Ok(start) = usize::try_from(e.offset) else { return false };
    let Some(end) = start.checked_add(e.stored_len as usize) else { return false };
    pack.get(start..end).is_some_and(|s| pack::decompress(e, s).is_ok())
}
