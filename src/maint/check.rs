//! Verification of a store (`forkfs fsck`), shared with the crash tests so
//! both hold the store to the same standard.
//!
//! 1. Packs: every indexed pack exists with its recorded length, its
//!    trailer and footer verify, and every chunk entry of the index agrees
//!    with the footer of the pack it names. `deep` also decompresses every
//!    chunk of every pack and recomputes its blake3.
//! 2. Records: every version record decodes and matches its id (records
//!    are named by their hash); every log entry names a record.
//! 3. Trees: every node reachable from a version, head or dirty inode is
//!    read and verified, every data chunk is indexed in a sound pack.
//! 4. Each bad chunk is then located in every version it affects, by block
//!    range or inode.

use crate::cas::Location;
use crate::cas::pack::{self, Entry, read_footer};
use crate::error::{Error, Result};
use crate::graph::reach::{MapKind, Walk, dirty_inode_root};
use crate::id::{ChunkId, PackId, VersionId};
use crate::map::MapRoot;
use crate::map::node::Node;
use crate::objects::keys as objects;
use crate::progress::{Progress, Quiet};
use crate::records::{VersionRecord, VolumeKind, keys, parse_id};
use crate::store::Store;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Decompress and hash every chunk of every pack.
    pub deep: bool,
}

#[derive(Serialize, serde::Deserialize, Debug, Default)]
pub struct CheckReport {
    pub deep: bool,
    pub packs: usize,
    pub pack_bytes: u64,
    /// Pack objects no index entry names (left by an interrupted upload or
    /// gc; harmless, the next gc deletes them).
    pub unindexed_packs: usize,
    pub volumes: usize,
    pub versions: usize,
    pub nodes: u64,
    pub chunks: u64,
    /// Chunks decompressed and hashed (`deep`).
    pub chunks_verified: u64,
    /// Versions that reference missing or corrupt data.
    pub damaged_versions: Vec<String>,
    /// Unsaved writes lost before any flush acknowledged them (power lost):
    /// they read as older content, by design; not a problem.
    #[serde(default)]
    pub unflushed_writes: usize,
    /// One line per problem found; empty when the store is sound.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A root to verify and what to call it in a report.
pub(crate) struct Subject {
    pub what: String,
    pub version: Option<VersionId>,
    pub map: MapKind,
    pub root: MapRoot,
    pub block_size: u32,
}

/// The outcome of walking every subject.
pub(crate) struct Damage {
    pub nodes: u64,
    pub chunks: u64,
    /// Per damaged subject: (subject index, description).
    pub damaged: Vec<(usize, String)>,
}

impl Store {
    /// A deep check of everything (what the crash tests use).
    pub fn check(&self) -> Result<CheckReport> {
        self.check_with(&CheckOptions { deep: true }, &Quiet)
    }

    pub fn check_with(&self, opts: &CheckOptions, progress: &dyn Progress) -> Result<CheckReport> {
        let mut report = CheckReport { deep: opts.deep, ..Default::default() };
        let bad = self.check_packs(opts.deep, progress, &mut report)?;
        let subjects = self.subjects(&mut report)?;
        report.problems.extend(self.check_copies()?);
        report.problems.extend(self.check_usage()?);
        let unsaved = self.unsaved_writes()?;
        report.problems.extend(unsaved.lost.into_iter().map(|l| l.what));
        report.problems.extend(unsaved.unreadable);
        report.unflushed_writes = unsaved.unflushed;
        let damage = self.damage(&subjects, bad, progress)?;
        report.nodes = damage.nodes;
        report.chunks = damage.chunks;
        for (i, why) in damage.damaged {
            report.problems.push(format!("{}: {why}", subjects[i].what));
            if subjects[i].version.is_some() {
                report.damaged_versions.push(subjects[i].what.clone());
            }
        }
        Ok(report)
    }

    /// Checks packs against the index; returns the chunks found bad.
    fn check_packs(
        &self,
        deep: bool,
        progress: &dyn Progress,
        report: &mut CheckReport,
    ) -> Result<HashMap<ChunkId, String>> {
        let mut by_pack: HashMap<PackId, Vec<(ChunkId, Location)>> = HashMap::new();
        let mut bad = HashMap::new();
        self.chunks().index().for_each_chunk(&mut |id, loc| {
            match loc {
                Ok(loc) => by_pack.entry(loc.pack).or_default().push((id, loc)),
                Err(e) => {
                    report.problems.push(format!("index entry of chunk {id}: {e}"));
                    bad.insert(id, e.to_string());
                }
            }
            Ok(())
        })?;
        let packs = self.chunks().index().packs()?;
        progress.stage("packs", packs.len() as u64);
        let known: HashSet<PackId> = packs.iter().map(|(id, _)| *id).collect();
        for (pack, entries) in &by_pack {
            if !known.contains(pack) {
                report.problems.push(format!(
                    "index names pack {pack} for {} chunks, but has no record of that pack",
                    entries.len()
                ));
                for (c, _) in entries {
                    bad.insert(*c, format!("its pack {pack} is not indexed"));
                }
            }
        }
        for (id, info) in packs {
            report.packs += 1;
            report.pack_bytes += info.len;
            let indexed = by_pack.remove(&id).unwrap_or_default();
            let res = self.check_pack(id, info.len, info.count, deep, &indexed, &mut bad, report);
            if let Err(e) = res {
                report.problems.push(format!("pack {id}: {e}"));
                for (c, _) in indexed {
                    bad.insert(c, format!("pack {id}: {e}"));
                }
            }
            progress.advance(1);
        }
        for meta in self.chunks().backend().list(objects::PACKS)? {
            if let Some(id) = objects::parse_pack(&meta.location) {
                if !known.contains(&id) {
                    report.unindexed_packs += 1;
                }
            }
        }
        Ok(bad)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_pack(
        &self,
        id: PackId,
        len: u64,
        count: u32,
        deep: bool,
        indexed: &[(ChunkId, Location)],
        bad: &mut HashMap<ChunkId, String>,
        report: &mut CheckReport,
    ) -> Result<()> {
        let key = objects::pack(&id);
        let backend = self.chunks().backend();
        let size = backend.head(&key)?.size;
        if size != len {
            return Err(Error::corrupt(format!("is {size} bytes, the index says {len}")));
        }
        let entries = read_footer(backend, &key, len)?;
        if entries.len() != count as usize {
            return Err(Error::corrupt(format!(
                "lists {} chunks, the index says {count}",
                entries.len()
            )));
        }
        let footer: HashMap<ChunkId, &Entry> = entries.iter().map(|e| (e.id, e)).collect();
        for (c, loc) in indexed {
            if footer.get(c).is_none_or(|e| Location::of(id, e) != *loc) {
                report.problems.push(format!(
                    "index entry of chunk {c} disagrees with the footer of pack {id}"
                ));
                bad.insert(*c, format!("its index entry disagrees with pack {id}"));
            }
        }
        if deep {
            let body = backend.get(&key)?;
            for e in &entries {
                let range = usize::try_from(e.offset)
                    .ok()
                    .and_then(|s| Some(s..s.checked_add(e.stored_len as usize)?));
                let res = range
                    .and_then(|r| body.get(r))
                    .ok_or_else(|| Error::corrupt("lies beyond the end of the pack"))
                    .and_then(|s| pack::decompress(e, s).map(|_| ()));
                report.chunks_verified += 1;
                if let Err(err) = res {
                    report.problems.push(format!("pack {id}: chunk {}: {err}", e.id));
                    if indexed.iter().any(|(c, _)| *c == e.id) {
                        bad.insert(e.id, format!("corrupt in pack {id}"));
                        self.chunks().evict(&e.id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Every root to verify: each version (records checked on the way),
    /// each head, each dirty inode's content maps.
    pub(crate) fn subjects(&self, report: &mut CheckReport) -> Result<Vec<Subject>> {
        let mut out = Vec::new();
        let mut listed = HashSet::new();
        for vol in self.volumes().list()? {
            report.volumes += 1;
            for (k, id) in self.db().scan_meta(&keys::log_prefix(vol.id))? {
                let Ok(id) = parse_id(&id, "log entry") else {
                    report
                        .problems
                        .push(format!("volume {}: log entry {k} is malformed", vol.name));
                    continue;
                };
                listed.insert(id);
                report.versions += 1;
                let what = format!("{}@{}", vol.name, id.short());
                match self.version_record_checked(&id) {
                    Ok(v) => out.push(Subject {
                        what,
                        version: Some(id),
                        map: MapKind::top(v.kind),
                        root: v.root,
                        block_size: v.block_size,
                    }),
                    Err(e) => report.problems.push(format!("{what}: version record {e}")),
                }
            }
            let head_what = format!("{} head", vol.name);
            match self.storage().records.head(vol.id) {
                Ok(h) => out.push(Subject {
                    what: head_what.clone(),
                    version: None,
                    map: MapKind::top(vol.kind),
                    root: h.root,
                    block_size: vol.block_size,
                }),
                Err(e) => report.problems.push(format!("{head_what}: {e}")),
            }
            if vol.kind == VolumeKind::Fs {
                self.storage().overlay(vol.id).for_each(&mut |e| {
                    if let Some((map, root)) = dirty_inode_root(e.space, e.key, &e.dirty)? {
                        out.push(Subject {
                            what: format!("{head_what} (unsaved changes)"),
                            version: None,
                            map,
                            root,
                            block_size: vol.block_size,
                        });
                    }
                    Ok(())
                })?;
            }
        }
        // Records no log lists are unreachable but must still be sound.
        for (k, raw) in self.db().scan_meta(keys::VERSION_PREFIX)? {
            let id = VersionId::parse(&k[keys::VERSION_PREFIX.len()..]);
            if id.is_some_and(|id| listed.contains(&id)) {
                continue;
            }
            if let Err(e) = check_record(&k[keys::VERSION_PREFIX.len()..], &raw) {
                report.problems.push(format!("version record {k}: {e}"));
            }
        }
        Ok(out)
    }

    /// A version record, verified against the id it is stored under.
    pub(crate) fn version_record_checked(&self, id: &VersionId) -> Result<VersionRecord> {
        let raw = self
            .db()
            .get_meta(&keys::version(id))?
            .ok_or_else(|| Error::not_found("is missing"))?;
        check_record(&id.to_string(), &raw)
    }

    /// Walks every subject once per shared node and locates what is bad.
    pub(crate) fn damage(
        &self,
        subjects: &[Subject],
        bad: HashMap<ChunkId, String>,
        progress: &dyn Progress,
    ) -> Result<Damage> {
        let chunks = self.chunks().clone();
        let index = chunks.index();
        let load = |id: &ChunkId| Node::decode(&chunks.get(id)?);
        let mut walk = Walk::new(&load);
        walk.bad = bad;
        let pre_bad: HashSet<ChunkId> = walk.bad.keys().copied().collect();
        progress.stage("trees", subjects.len() as u64);
        for s in subjects {
            walk.root(s.map, s.root, &mut |id| {
                if pre_bad.contains(id) {
                    return Ok(());
                }
                match index.get_chunk(id)? {
                    Some(_) => Ok(()),
                    None => Err(Error::not_found("is not in the index")),
                }
            });
            progress.advance(1);
        }
        let mut damaged = Vec::new();
        if !walk.bad.is_empty() {
            let mut clean = HashMap::new();
            for (i, s) in subjects.iter().enumerate() {
                let found = walk.damage(s.map, s.root, &mut clean);
                if found.is_empty() {
                    continue;
                }
                let shown: Vec<String> = found
                    .iter()
                    .take(3)
                    .map(|(c, p, why)| format!("{} (chunk {}: {why})", p.describe(s.block_size), c))
                    .collect();
                let more = if found.len() > 3 {
                    format!("; {} more", found.len() - 3)
                } else {
                    String::new()
                };
                damaged.push((
                    i,
                    format!("{} unreadable chunks: {}{more}", found.len(), shown.join("; ")),
                ));
            }
        }
        Ok(Damage { nodes: walk.nodes, chunks: walk.data, damaged })
    }
}

/// Decodes a stored version record and checks it is the one named `id`.
fn check_record(id: &str, raw: &[u8]) -> Result<VersionRecord> {
    let v = VersionRecord::decode(raw)?;
    let sealed = v.clone().seal()?;
    if sealed.id != v.id || v.id.to_string() != id {
        return Err(Error::corrupt("does not match its id (altered or damaged)"));
    }
    Ok(v)
}
