//! One graph for every host of a bucket: how a host learns what the others
//! changed, cheaply, and forgets what they deleted.
//!
//! - Every change a host makes visible to the others (a head published, a
//!   volume created, a version or volume deleted, a name set or removed)
//!   is followed by a rewrite of the generation object
//!   (`graph/generation`, [`bump`]).
//! - Before a name is resolved or volumes are listed, a host compares that
//!   object's ETag with the one it saw last ([`Remote::moved`]): one HEAD
//!   request when nothing changed. When it changed ([`Remote::catch_up`]),
//!   the host imports what is new (volumes, versions, packs, names),
//!   forgets what was deleted, and takes the heads other hosts advanced.
//!   At every tick of the remote side, a long-running process imports the
//!   records the same way ([`Remote::importer`]), heads excepted.
//! - A deleted version leaves a deletion record (`deleted/versions/<id>`),
//!   put before its record object goes. A host that imports it forgets the
//!   version ([`forget_deleted`]) and, from then on, answers a reference
//!   to it with "deleted on another host". Since every host absorbs GC's
//!   tombstones only after such a refresh, a host never copies (or keeps
//!   reading) the data of a version deleted elsewhere, and GC, which
//!   waits for every live host's acknowledgement, never deletes a pack a
//!   host still lists a version in.
//! - A deleted volume leaves `deleted/volumes/<id>` the same way, and its
//!   id is never given again.
//!
//! The generation is read before the import and remembered only after it
//! succeeded: a change that lands during an import is seen by the next one.

use super::Remote;
use crate::db::{Batch, Db};
use crate::error::{ErrorKind, Result};
use crate::id::{VersionId, VolumeId};
use crate::objects::{Backend, keys as objects};
use crate::records::{Records, keys};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Checks closer together than this reuse the last answer (one command
/// resolves several names).
const MIN_INTERVAL: Duration = Duration::from_millis(250);
/// How long a check waits for the bucket; after a failed one, checks
/// stop for [`RETRY_AFTER`]: a host cut off works on its view as it was,
/// at local speed.
const CHECK_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// What this host last saw of the graph (kept in the index: every command
/// is a process of its own, and must not import everything again).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct View {
    /// The generation object's ETag then ("" when there was none).
    pub generation: String,
    /// When the bucket last answered, in ms since the epoch.
    pub checked_ms: u64,
}

/// The in-process side of [`View`].
#[derive(Default)]
pub(super) struct Seen {
    /// When this process last compared its view with the bucket's.
    at: Option<Instant>,
    /// When a check last failed.
    failed: Option<Instant>,
    /// The generation this process last imported at (the records; the
    /// heads are taken by [`Remote::catch_up`] only).
    imported: Option<String>,
}

/// Tells every other host that the graph changed. Best effort: a host
/// whose bump fails has changed the graph anyway, and says so in the log;
/// the next change bumps again.
pub(crate) fn bump(backend: &Backend) {
    let body = format!("{}\n", crate::clock::now_ms());
    if let Err(e) = backend.put(&objects::generation(), body.into()) {
        tracing::warn!(error = %e, "the graph's generation was not bumped; other hosts see this change with the next one");
    }
}

/// The generation object's ETag ("" when there is none).
fn generation(backend: &Backend) -> Result<String> {
    match backend.head_within(&objects::generation(), CHECK_DEADLINE) {
        Ok(meta) => Ok(meta.e_tag.unwrap_or_else(|| meta.last_modified.to_rfc3339())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// The view this host's index holds.
pub(crate) fn view(db: &Db) -> Result<View> {
    Ok(db.get_json(keys::VIEW)?.unwrap_or_default())
}

impl Remote {
    /// The bucket's generation of the graph, if it moved since this host's
    /// view (see the module documentation); `None` when there is nothing
    /// to import, or when the last check was a moment ago (or failed less
    /// than [`RETRY_AFTER`] ago). Then [`Remote::catch_up`].
    pub(crate) fn moved(&self) -> Result<Option<String>> {
        let mut seen = self.seen.lock();
        let recent = seen.at.is_some_and(|t| t.elapsed() < MIN_INTERVAL);
        if recent || seen.failed.is_some_and(|t| t.elapsed() < RETRY_AFTER) {
            return Ok(None);
        }
        let now = generation(self.backend()).inspect_err(|_| seen.failed = Some(Instant::now()))?;
        seen.failed = None;
        let view = view(self.db())?;
        if now.is_empty() || now != view.generation {
            return Ok(Some(now));
        }
        self.record(&mut seen, now)?;
        Ok(None)
    }

    /// Brings this host's view up to generation `now` (from
    /// [`Remote::moved`]): imports what is new, forgets what was deleted,
    /// takes the heads other hosts advanced except where `open` (the
    /// volumes this process writes).
    pub(crate) fn catch_up(&self, now: String, open: &dyn Fn(VolumeId) -> bool) -> Result<()> {
        let mut seen = self.seen.lock();
        if now.is_empty() || seen.imported.as_ref() != Some(&now) {
            self.import()?;
        }
        self.forget_volumes(open)?;
        self.refresh_heads(open)?;
        self.record(&mut seen, now)
    }

    /// Forgets the volumes other hosts deleted (their deletion records),
    /// except those `open` says this process writes (a deletion elsewhere
    /// took their lease: their writes fail, and a later look forgets them).
    fn forget_volumes(&self, open: &dyn Fn(VolumeId) -> bool) -> Result<()> {
        let deleted = deleted_volumes(self.backend())?;
        let storage = &self.storage;
        for rec in storage.records.volumes()? {
            if !deleted.contains(&rec.id) || open(rec.id) {
                continue;
            }
            let versions = storage.records.log(&rec)?;
            let mut b = Batch::default();
            storage.forget_volume(&mut b, &rec, &versions)?;
            for v in &versions {
                self.db().put_meta(&mut b, &keys::deleted(&v.id), rec.name.to_string());
            }
            self.db().write(b, true)?;
            self.publisher.saw(rec.id, None);
            storage.log.drop_below(rec.id, u64::MAX)?;
            tracing::info!(volume = %rec.name, "deleted on another host; forgotten");
        }
        Ok(())
    }

    /// Remembers that this host's view is at generation `now`.
    fn record(&self, seen: &mut Seen, now: String) -> Result<()> {
        let view = View { generation: now.clone(), checked_ms: crate::clock::now_ms() };
        let mut b = Batch::default();
        self.db().put_json(&mut b, keys::VIEW, &view)?;
        self.db().write(b, false)?;
        seen.at = Some(Instant::now());
        seen.imported = Some(now);
        Ok(())
    }

    /// Tells the other hosts that this host changed the graph.
    pub(crate) fn bump(&self) {
        bump(self.backend());
    }

    /// A task for the remote side's ticker, which holds no `Remote`:
    /// imports the records other hosts changed (deletions included), if
    /// the generation moved. Heads are left to [`Remote::catch_up`], which
    /// knows which volumes this process writes.
    pub(crate) fn importer(&self) -> impl Fn() -> Result<()> + Send + 'static {
        let (storage, publisher, seen) =
            (self.storage.clone(), self.publisher.clone(), self.seen.clone());
        let registered = self.registered.clone();
        move || {
            super::import::registered(&registered)?;
            let mut seen = seen.lock();
            let now = generation(storage.chunks.backend())?;
            if now.is_empty()
                || (seen.imported.as_ref() != Some(&now) && view(&storage.db)?.generation != now)
            {
                super::import::import(&storage, &publisher)?;
                seen.imported = Some(now);
            }
            Ok(())
        }
    }
}

/// The volumes deleted on any host (their deletion records).
pub(super) fn deleted_volumes(backend: &Backend) -> Result<HashSet<VolumeId>> {
    let mut out = HashSet::new();
    for o in backend.list(objects::DELETED_VOLUMES)? {
        out.extend(objects::parse_deleted_volume(&o.location));
    }
    Ok(out)
}

/// The versions deleted on any host (their deletion records).
pub(super) fn deleted_versions(backend: &Backend) -> Result<HashSet<VersionId>> {
    let mut out = HashSet::new();
    for o in backend.list(objects::DELETED_VERSIONS)? {
        out.extend(objects::parse_deleted_version(&o.location));
    }
    Ok(out)
}

/// Adds to `b` that this host forgets the versions of `deleted` it still
/// lists (their records, log slots and names); a reference to one is then
/// answered "deleted on another host". A head based on one keeps its root,
/// as after a deletion on this host. Returns how many it forgot.
pub(super) fn forget_deleted(
    db: &Db,
    records: &Records,
    b: &mut Batch,
    deleted: &HashSet<VersionId>,
) -> Result<usize> {
    let mut n = 0;
    for id in deleted {
        let Ok(v) = records.version(id) else { continue };
        db.delete_meta(b, &keys::version(id));
        db.delete_meta(b, &keys::damaged(id));
        let slot = keys::log(v.volume, v.seq);
        if db.get_meta(&slot)?.is_some_and(|raw| raw == id.to_string().as_bytes()) {
            db.delete_meta(b, &slot);
        }
        for (k, raw) in db.scan_meta(&keys::tag_prefix(v.volume))? {
            if raw == id.to_string().as_bytes() {
                db.delete_meta(b, &k);
            }
        }
        db.put_meta(b, &keys::deleted(id), v.volume_name.to_string());
        tracing::info!(version = %id.short(), volume = %v.volume_name, "deleted on another host; forgotten");
        n += 1;
    }
    Ok(n)
}
