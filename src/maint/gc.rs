//! Tracing garbage collection with pack compaction.
//!
//! 1. Begin: writers start reporting every chunk they put or deduplicate
//!    against, and the write sessions already open are waited out
//!    ([`crate::cas::ChunkStore::gc_begin`]).
//! 2. Mark: in one RocksDB snapshot, every version, every head and every
//!    fs overlay inode names roots; everything reachable from them is live.
//!    Anything referenced later was either live then or put since (and so
//!    reported), because new trees only reuse subtrees of existing ones.
//! 3. Sweep: packs indexed before the grace period with no live chunk lose
//!    their index entries (one synced batch), then their objects.
//! 4. Compact: packs with a small live fraction have their live chunks
//!    copied (verified, not recompressed) into new packs; each new pack is
//!    durable before one batch points the chunks at it and drops the old
//!    pack, whose object is deleted last.
//! 5. Orphans: pack objects no index entry names (left by a crash between
//!    steps above, or an upload cut short) and older than the grace period
//!    are deleted.
//!
//! The decisions of 3 and 4 are re-checked under the lock writers report
//! under, so a chunk revived by a dedup hit during the GC keeps its pack.
//! Every step leaves a store fsck passes if the process dies there: at
//! worst an unindexed object remains for the next GC.
//!
//! On a shared store (S3, GCS, Azure: other hosts read and deduplicate
//! through indexes of their own) no step deletes a pack object. Steps 3-5
//! leave a tombstone instead (`cas/tombstone.rs`; a compaction's names the
//! new pack, uploaded first), and every host absorbs it
//! (`store/absorb.rs`). Before marking, a GC absorbs what other GCs
//! retired, then reaps: it deletes a tombstoned pack object, then its
//! tombstone, once the tombstone is older than the grace period and every
//! host that acknowledged anything within the host timeout has
//! acknowledged it. A host silent for longer is taken for gone: what it
//! still indexed of a reaped pack is lost to it (the operator's risk,
//! `FORKFS_GC_HOST_TIMEOUT`, a day by default).

use crate::cas::index::pack_key;
use crate::cas::pack::{self, PackWriter};
use crate::cas::tombstone::{self, Tombstone};
use crate::cas::{GcScope, Location, PackInfo};
use crate::clock::now_ms;
use crate::db::{Batch, CF_CHUNKS, CF_PACKS};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::reach::{self, MapKind, Walk};
use crate::id::{ChunkId, PackId};
use crate::map::MapRoot;
use crate::map::node::Node;
use crate::objects::keys as objects;
use crate::progress::Progress;
use crate::store::Store;
use crate::store::absorb;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Report what would be reclaimed; change nothing.
    pub dry_run: bool,
    /// Packs indexed, and orphan objects written, more recently than this
    /// are left alone.
    pub grace: Duration,
    /// Packs whose live bytes are below this fraction of their size are
    /// rewritten (0 disables compaction).
    pub compact_below: f64,
    /// Ignore concurrent writers (no barrier, no dedup tracking). Wrong on
    /// purpose: only the negative control of the concurrency test sets it.
    #[doc(hidden)]
    pub unsafe_ignore_writers: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            dry_run: false,
            grace: Duration::from_secs(3600),
            compact_below: 0.5,
            unsafe_ignore_writers: false,
        }
    }
}

#[derive(Serialize, serde::Deserialize, Debug, Default, Clone)]
pub struct GcReport {
    pub dry_run: bool,
    pub versions: u64,
    pub heads: u64,
    pub live_nodes: u64,
    pub live_data_chunks: u64,
    pub packs: u64,
    pub pack_bytes: u64,
    pub packs_in_grace: u64,
    pub packs_deleted: u64,
    pub packs_compacted: u64,
    pub packs_written: u64,
    pub orphans_deleted: u64,
    /// Unindexed packs kept because they hold live chunks, or no readable
    /// footer: the index lost them (`fsck --repair` indexes them again).
    #[serde(default)]
    pub unindexed_kept: u64,
    /// Bytes of pack objects gone (deleted, compacted away, orphans) minus
    /// bytes of new packs written.
    pub bytes_reclaimed: u64,
    pub bytes_written: u64,
    pub elapsed_ms: u64,
    /// Shared stores: packs retired by a tombstone, not deleted (counted in
    /// packs_deleted, packs_compacted and orphans_deleted too).
    #[serde(default)]
    pub tombstones_written: u64,
    /// Shared stores: tombstoned pack objects deleted, every host having
    /// acknowledged them.
    #[serde(default)]
    pub tombstones_reaped: u64,
    /// Shared stores: tombstones kept, in their grace period or awaiting
    /// some host's acknowledgement.
    #[serde(default)]
    pub tombstones_waiting: u64,
    /// Shared stores: hosts whose acknowledgements count, and hosts silent
    /// for longer than the host timeout (taken for gone).
    #[serde(default)]
    pub hosts: u64,
    #[serde(default)]
    pub hosts_gone: u64,
    /// Shared stores: what this host absorbed of earlier tombstones.
    #[serde(default)]
    pub absorbed: absorb::Absorbed,
}

/// A root to mark from, and how to read its nodes.
type Root = (MapKind, MapRoot);
/// One indexed pack and the chunk entries pointing into it.
struct PackUse {
    id: PackId,
    info: PackInfo,
    chunks: Vec<(ChunkId, Location)>,
}

enum Fate {
    Keep,
    Delete,
    Compact,
}

impl Store {
    /// Collects garbage; see the module documentation. Safe to run while
    /// volumes are written; one GC at a time per store.
    pub fn gc(&self, opts: &GcOptions, progress: &dyn Progress) -> Result<GcReport> {
        let _one = self
            .gc_lock()
            .try_lock()
            .ok_or_else(|| Error::conflict("a gc is already running on this store"))?;
        // Waits out an absorption of tombstones (they share writer tracking).
        let _tracking = self.chunks().gc_lock().lock();
        let started = Instant::now();
        // Before the import: a pack that arrives after it is in its grace period.
        let start_ms = now_ms();
        let grace_ms = u64::try_from(opts.grace.as_millis()).unwrap_or(u64::MAX);
        let mut report = GcReport { dry_run: opts.dry_run, ..Default::default() };
        // Other hosts' volumes, versions and heads count as live too.
        if let Some(r) = self.remote() {
            r.import()?;
            r.refresh_heads(&|id| self.volumes().opened_id(id).is_some())?;
        }
        let shared = self.remote().is_some() && !self.gc_unsafe_immediate_delete();
        if shared && !opts.dry_run {
            let stall = self.remote().map(|r| r.stall()).unwrap_or_default();
            report.absorbed = absorb::absorb_locked(self.storage(), self.host_id(), stall)?;
            self.gc_reap(grace_ms, &mut report)?;
        }
        // An index behind the object store would make live data look dead.
        let mut missing = self.records_missing_from_index()?;
        // On a shared store they may be another host's commit that landed
        // after the import: import again, once, before refusing.
        if let (Some(r), false) = (self.remote(), missing.is_empty()) {
            r.import()?;
            r.refresh_heads(&|id| self.volumes().opened_id(id).is_some())?;
            missing = self.records_missing_from_index()?;
        }
        if let Some(first) = missing.first() {
            return Err(Error::corrupt(format!(
                "gc refused: the index lacks {} records the object store holds (e.g. {first}); \
                 run `forkfs fsck --repair`",
                missing.len()
            )));
        }
        let chunks = self.chunks().clone();
        let scope =
            if opts.unsafe_ignore_writers { chunks.gc_untracked() } else { chunks.gc_begin() };

        // Mark.
        let (roots, packs) = self.gc_snapshot(&mut report)?;
        let load = |id: &ChunkId| Node::decode(&chunks.get(id)?);
        let mut walk = Walk::new(&load);
        progress.stage("mark", roots.len() as u64);
        for (map, root) in roots {
            walk.root(map, root, &mut |_| Ok(()));
            progress.advance(1);
        }
        if let Some((id, why)) = walk.bad.iter().next() {
            // An I/O error may pass: "unavailable", not "damaged".
            let kind =
                if walk.unreadable > 0 { ErrorKind::Unavailable } else { ErrorKind::Corrupt };
            return Err(Error::new(
                kind,
                format!(
                    "gc stopped before changing anything: {} referenced chunks are unreadable \
                     (e.g. {id}: {why}); run `forkfs fsck` (gc never runs on a damaged store)",
                    walk.bad.len()
                ),
            ));
        }
        report.live_nodes = walk.nodes;
        report.live_data_chunks = walk.data;
        let live = walk.reached;

        // Decide.
        let mut doomed = Vec::new();
        let mut compact = Vec::new();
        for p in packs {
            report.packs += 1;
            report.pack_bytes += p.info.len;
            if p.info.created_ms.saturating_add(grace_ms) > start_ms {
                report.packs_in_grace += 1;
                continue;
            }
            match fate(&p, &live, opts.compact_below) {
                Fate::Keep => {}
                Fate::Delete => doomed.push(p),
                Fate::Compact => compact.push(p),
            }
        }
        if opts.dry_run {
            report.packs_deleted = doomed.len() as u64;
            report.packs_compacted = compact.len() as u64;
            report.bytes_reclaimed = doomed.iter().map(|p| p.info.len).sum::<u64>()
                + compact
                    .iter()
                    .map(|p| p.info.len - live_bytes(p, &live).min(p.info.len))
                    .sum::<u64>();
            report.orphans_deleted =
                self.gc_orphans(start_ms, grace_ms, &live, true, shared, &mut report)?;
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            return Ok(report);
        }

        // Sweep.
        progress.stage("sweep", doomed.len() as u64);
        for group in doomed.chunks(256) {
            let gone = scope.with_reached(|reached| self.drop_packs(group, reached))?;
            for p in group.iter().filter(|p| gone.contains(&p.id)) {
                self.retire(shared, &p.id, None, &mut report)?;
                report.packs_deleted += 1;
                report.bytes_reclaimed += p.info.len;
            }
            progress.advance(group.len() as u64);
        }

        // Compact.
        progress.stage("compact", compact.len() as u64);
        let target = chunks.config().pack_target;
        let mut writer = PackWriter::new();
        let mut sources: Vec<&PackUse> = Vec::new();
        for p in &compact {
            if let Err(e) = copy_live(self, p, &live, &mut writer) {
                tracing::warn!(pack = %p.id, error = %e, "not compacting a pack that fails to read");
            } else {
                sources.push(p);
            }
            if writer.len_bytes() >= target {
                let w = std::mem::take(&mut writer);
                let sources = std::mem::take(&mut sources);
                self.commit_compaction(&scope, w, &sources, shared, &mut report)?;
            }
            progress.advance(1);
        }
        if !sources.is_empty() {
            self.commit_compaction(&scope, writer, &sources, shared, &mut report)?;
        }

        progress.stage("orphans", 0);
        report.orphans_deleted =
            self.gc_orphans(start_ms, grace_ms, &live, false, shared, &mut report)?;
        report.elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            deleted = report.packs_deleted,
            compacted = report.packs_compacted,
            reclaimed = report.bytes_reclaimed,
            "gc"
        );
        Ok(report)
    }

    /// Reads, in one RocksDB snapshot, every root to mark from and every
    /// indexed pack with the chunk entries that point into it.
    fn gc_snapshot(&self, report: &mut GcReport) -> Result<(Vec<Root>, Vec<PackUse>)> {
        let db = self.db();
        let snap = db.raw().snapshot();
        let scan = |cf: &str, prefix: &[u8], f: &mut reach::Visit<'_>| {
            reach::scan(db, &snap, cf, prefix, f)
        };
        let found = reach::roots_with_readers(self.storage(), &snap)
            .map_err(|e| e.context("gc stopped"))?;
        report.versions = found.versions;
        report.heads = found.heads;
        let mut packs: HashMap<PackId, PackUse> = HashMap::new();
        scan(CF_PACKS, b"", &mut |k, v| {
            let id = pack_key(k)?;
            packs.insert(id, PackUse { id, info: PackInfo::decode(v)?, chunks: Vec::new() });
            Ok(())
        })?;
        scan(CF_CHUNKS, b"", &mut |k, v| {
            let loc = Location::decode(v)?;
            // An entry naming an unknown pack is fsck's business, not gc's.
            if let Some(p) = packs.get_mut(&loc.pack) {
                p.chunks.push((ChunkId::from_slice(k)?, loc));
            }
            Ok(())
        })?;
        let mut packs: Vec<PackUse> = packs.into_values().collect();
        packs.sort_by_key(|p| p.info.created_ms);
        Ok((found.roots, packs))
    }

    /// Removes the index entries of packs none of whose chunks is live or
    /// was reached by a writer; returns those packs, whose objects may go.
    fn drop_packs(&self, group: &[PackUse], reached: &HashSet<ChunkId>) -> Result<Vec<PackId>> {
        let index = self.chunks().index();
        let mut b = Batch::default();
        let mut gone = Vec::new();
        for p in group {
            if p.chunks.iter().any(|(c, _)| reached.contains(c)) {
                continue;
            }
            for (c, _) in &p.chunks {
                index.delete_chunk(&mut b, c);
            }
            index.delete_pack(&mut b, &p.id);
            gone.push(p.id);
        }
        self.db().write(b, true)?;
        Ok(gone)
    }

    /// Makes a compacted pack durable, then in one batch indexes it and
    /// drops its sources, then deletes the sources' objects.
    fn commit_compaction(
        &self,
        scope: &GcScope<'_>,
        writer: PackWriter,
        sources: &[&PackUse],
        shared: bool,
        report: &mut GcReport,
    ) -> Result<()> {
        let (new_id, bytes, entries) = writer.seal();
        let len = bytes.len() as u64;
        self.chunks().backend().put(&objects::pack(&new_id), bytes)?;
        report.packs_written += 1;
        report.bytes_written += len;
        let copied: HashSet<ChunkId> = entries.iter().map(|e| e.id).collect();
        let index = self.chunks().index();
        let gone = scope.with_reached(|reached| -> Result<Vec<&PackUse>> {
            let mut b = Batch::default();
            index.put_pack(&mut b, new_id, len, &entries);
            let mut gone = Vec::new();
            for p in sources.iter().filter(|p| p.id != new_id) {
                // A chunk left behind as dead that a writer has since reached
                // keeps its pack (and entry) until a later gc.
                let revived =
                    p.chunks.iter().any(|(c, _)| !copied.contains(c) && reached.contains(c));
                if revived {
                    continue;
                }
                for (c, _) in p.chunks.iter().filter(|(c, _)| !copied.contains(c)) {
                    index.delete_chunk(&mut b, c);
                }
                index.delete_pack(&mut b, &p.id);
                gone.push(*p);
            }
            self.db().write(b, true)?;
            Ok(gone)
        })?;
        // Other hosts read the sources until the new pack is in the object store.
        if let Some(r) = self.remote() {
            r.uploaded_so_far()?;
        }
        for p in gone {
            self.retire(shared, &p.id, Some(new_id), report)?;
            report.packs_compacted += 1;
            report.bytes_reclaimed += p.info.len;
        }
        report.bytes_reclaimed = report.bytes_reclaimed.saturating_sub(len);
        Ok(())
    }

    /// Deletes (or counts) pack objects that no index entry names.
    /// An unindexed pack whose footer names a live chunk (an index that
    /// lost it), or whose footer cannot be read, is kept and counted.
    fn gc_orphans(
        &self,
        start_ms: u64,
        grace_ms: u64,
        live: &HashSet<ChunkId>,
        dry_run: bool,
        shared: bool,
        report: &mut GcReport,
    ) -> Result<u64> {
        let backend = self.chunks().backend();
        let mut n = 0;
        // Already retired: the reaping decides when they go.
        let retired: HashSet<PackId> = if shared {
            tombstone::list_tombstones(backend)?.iter().filter_map(|t| t.pack_id().ok()).collect()
        } else {
            HashSet::new()
        };
        for meta in backend.list(objects::PACKS)? {
            let Some(id) = objects::parse_pack(&meta.location) else { continue };
            let written_ms = meta.last_modified.timestamp_millis().max(0) as u64;
            if written_ms.saturating_add(grace_ms) > start_ms {
                continue;
            }
            // In flight first: once indexed, an upload leaves the in-flight list.
            if retired.contains(&id)
                || self.chunks().is_in_flight(&id)
                || self.chunks().index().pack_info(&id)?.is_some()
            {
                continue;
            }
            // The only copy of a live chunk: the index lost this pack.
            let index = self.chunks().index();
            let only_copy = |e: &pack::Entry| -> Result<bool> {
                Ok(live.contains(&e.id) && !index.has_chunk(&e.id)?)
            };
            let holds_live =
                pack::read_footer(backend, &meta.location, meta.size).and_then(|entries| {
                    entries.iter().try_fold(false, |any, e| Ok(any || only_copy(e)?))
                });
            if !matches!(holds_live, Ok(false)) {
                let why = match holds_live {
                    Ok(_) => "holds the only copy of live chunks".to_string(),
                    Err(e) => format!("has no readable footer ({e})"),
                };
                tracing::error!(pack = %id, "an unindexed pack {why}: kept; run `forkfs fsck --repair`");
                report.unindexed_kept += 1;
                continue;
            }
            if !dry_run {
                self.retire(shared, &id, None, report)?;
                report.bytes_reclaimed += meta.size;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Removes a pack object this host no longer indexes: at once on a
    /// store of its own; on a shared one, a tombstone (`replacement`: where
    /// a compaction copied its live chunks) and the reaping later.
    fn retire(
        &self,
        shared: bool,
        pack: &PackId,
        replacement: Option<PackId>,
        report: &mut GcReport,
    ) -> Result<()> {
        let backend = self.chunks().backend();
        if shared {
            tombstone::put_tombstone(backend, &Tombstone::new(*pack, self.host_id(), replacement))?;
            report.tombstones_written += 1;
            Ok(())
        } else {
            backend.delete(&objects::pack(pack))
        }
    }

    /// Deletes the tombstoned packs every host that counts has absorbed
    /// (and that are past the grace period), then their tombstones.
    fn gc_reap(&self, grace_ms: u64, report: &mut GcReport) -> Result<()> {
        let backend = self.chunks().backend();
        let tombs = tombstone::list_tombstones(backend)?;
        if tombs.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let timeout = u64::try_from(self.gc_host_timeout().as_millis()).unwrap_or(u64::MAX);
        let (hosts, gone): (Vec<_>, Vec<_>) = tombstone::list_acks(backend)?
            .into_iter()
            .partition(|a| a.at_ms.saturating_add(timeout) >= now);
        for a in &gone {
            tracing::warn!(host = %a.host, hostname = %a.hostname, silent_ms = now.saturating_sub(a.at_ms), "a host silent for longer than the gc host timeout is taken for gone");
        }
        report.hosts = hosts.len() as u64;
        report.hosts_gone = gone.len() as u64;
        for t in &tombs {
            let pack = t.pack_id()?;
            let ready = t.at_ms.saturating_add(grace_ms) <= now
                && hosts.iter().all(|a| absorb::acked(a, t))
                && self.chunks().index().pack_info(&pack)?.is_none();
            if !ready {
                report.tombstones_waiting += 1;
                continue;
            }
            // The pack first: a tombstone never outlives a pack another
            // host could still index.
            backend.delete(&objects::pack(&pack))?;
            backend.delete(&objects::gc_tombstone(&pack))?;
            report.tombstones_reaped += 1;
        }
        Ok(())
    }
}

/// Stored bytes of the live chunks of `p`.
fn live_bytes(p: &PackUse, live: &HashSet<ChunkId>) -> u64 {
    p.chunks.iter().filter(|(c, _)| live.contains(c)).map(|(_, l)| l.stored_len as u64).sum()
}

fn fate(p: &PackUse, live: &HashSet<ChunkId>, compact_below: f64) -> Fate {
    let live = live_bytes(p, live);
    // The fraction is of the body: header, footer and trailer are overhead a
    // rewritten pack has too (else a small, fully live pack is rewritten forever).
    let overhead = (pack::HEADER_LEN + pack::TRAILER_LEN) as u64
        + p.info.count as u64 * pack::ENTRY_LEN as u64;
    let body = p.info.len.saturating_sub(overhead);
    if live == 0 {
        Fate::Delete
    } else if (live as f64) < compact_below * body as f64 {
        Fate::Compact
    } else {
        Fate::Keep
    }
}

/// Copies the live chunks of `p` into `writer`, each verified first.
fn copy_live(
    store: &Store,
    p: &PackUse,
    live: &HashSet<ChunkId>,
    writer: &mut PackWriter,
) -> Result<()> {
    let bytes = store.chunks().backend().get(&objects::pack(&p.id))?;
    let mut staged = Vec::new();
    for (c, loc) in p.chunks.iter().filter(|(c, _)| live.contains(c)) {
        let start = usize::try_from(loc.offset).map_err(|_| Error::corrupt("offset"))?;
        let end = start + loc.stored_len as usize;
        let stored = bytes.get(start..end).ok_or_else(|| {
            Error::corrupt(format!("chunk {c} lies beyond the end of pack {}", p.id))
        })?;
        pack::decompress(&loc.entry(*c), stored)?;
        staged.push((*c, loc, stored));
    }
    for (c, loc, stored) in staged {
        if !writer.contains(&c) {
            writer.add(c, loc.plain_len, loc.codec, stored);
        }
    }
    Ok(())
}
