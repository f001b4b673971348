//! Adopting versions made in another store (a history bundle's): they are
//! sealed again as versions of a volume here, after the ones it has, in
//! one synced batch; the head moves to the newest of them only when it
//! stood, unchanged, at the version they build on.
//!
//! A version is the same across stores when its content (root) and its
//! creation time are: version ids name a volume of one store, so they
//! cannot carry over.

use super::Graph;
use super::refs::check_tag;
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::id::VersionId;
use crate::map::MapRoot;
use crate::records::{HeadRecord, VersionRecord, VolumeRecord, keys};
use std::collections::HashMap;

/// A version as another store knew it: enough to find its copy here.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Foreign {
    /// Its id in the store it came from.
    pub id: VersionId,
    pub root: MapRoot,
    pub created_at_ms: u64,
    /// Its names there.
    #[serde(default)]
    pub names: Vec<String>,
}

impl Foreign {
    pub fn of(v: &VersionRecord, names: Vec<String>) -> Foreign {
        Foreign { id: v.id, root: v.root, created_at_ms: v.created_at_ms, names }
    }

    /// The error of a store whose volume `here` lacks it (`there`: the
    /// volume's name in the bundle).
    pub fn missing(&self, here: &str, there: &str) -> Error {
        Error::not_found(format!(
            "{here} does not have {}, which this bundle builds on: import the bundle that \
             carries it first",
            self.describe(there)
        ))
    }

    /// How a user would name it: `ws@1a2b3c4d (named before-fix)`.
    pub fn describe(&self, volume: &str) -> String {
        match self.names.first() {
            Some(n) => format!("{volume}@{} (named {n})", self.id.short()),
            None => format!("{volume}@{}", self.id.short()),
        }
    }
}

/// What [`Graph::adopt`] did.
#[derive(Debug, Default)]
pub struct Adopted {
    /// The versions added, oldest first, as this store names them.
    pub added: Vec<VersionRecord>,
    /// Versions the volume already had.
    pub known: usize,
    /// Whether the head now stands at the newest version adopted.
    pub head_moved: bool,
    /// Names given here, and names left out (taken by another version).
    pub named: Vec<String>,
    pub names_taken: Vec<String>,
}

impl Graph {
    /// The version of `volume` that is `f` (same content, same creation).
    pub fn same_version(
        &self,
        volume: &VolumeRecord,
        f: &Foreign,
    ) -> Result<Option<VersionRecord>> {
        Ok(find_same(&self.log(volume)?, f.root, f.created_at_ms).cloned())
    }

    /// Adds `versions` (another store's, oldest first, building on `base`,
    /// which this volume must have; `None`: a whole history) to `volume`,
    /// with their `names`. Every chunk they name must already be here.
    ///
    /// A head that moves is a restore to whoever serves the volume in this
    /// process (a mount drops what the kernel cached of what changed).
    pub(crate) fn adopt(
        &self,
        volume: &str,
        base: Option<&Foreign>,
        versions: &[VersionRecord],
        names: &[(String, VersionId)],
    ) -> Result<Adopted> {
        let (out, moved) = self.adopt_locked(volume, base, versions, names)?;
        if let (Some(before), Some(to)) = (moved, out.added.last()) {
            let hooks: Vec<_> = self.restore_hooks.lock().iter().map(|(_, h)| h.clone()).collect();
            let done = super::Restored { volume, before: &before, to };
            for h in hooks {
                h(&done);
            }
        }
        Ok(out)
    }

    /// [`Graph::adopt`] under the head's locks; also the version the head
    /// moved from, if it moved from one.
    fn adopt_locked(
        &self,
        volume: &str,
        base: Option<&Foreign>,
        versions: &[VersionRecord],
        names: &[(String, VersionId)],
    ) -> Result<(Adopted, Option<VersionRecord>)> {
        let head = self.volumes.open(volume)?;
        let rec = head.record().clone();
        let _one = head.checkpoint.lock();
        let _gate = head.gate.write();
        head.check_live()?;
        let log = self.log(&rec)?;
        let here = |root: MapRoot, at: u64| find_same(&log, root, at).map(|v| v.id);
        // Bundle id -> id here, and the newest version both sides share.
        let mut ids: HashMap<VersionId, VersionId> = HashMap::new();
        let mut common = None;
        match base {
            Some(b) => {
                let id = here(b.root, b.created_at_ms).ok_or_else(|| b.missing(volume, volume))?;
                ids.insert(b.id, id);
                common = Some(id);
            }
            None if !log.is_empty()
                && versions.first().is_none_or(|v| here(v.root, v.created_at_ms).is_none()) =>
            {
                return Err(Error::conflict(format!(
                    "volume {volume} already exists and shares no history with this bundle; \
                     import it under another name (--as)"
                )));
            }
            None => {}
        }
        let state = head.state();
        let mut out = Adopted::default();
        let mut next_seq = state.next_seq;
        for v in versions {
            if let Some(id) = here(v.root, v.created_at_ms) {
                ids.insert(v.id, id);
                out.known += 1;
                if out.added.is_empty() {
                    common = Some(id);
                }
                continue;
            }
            let sealed = VersionRecord {
                id: VersionId([0; 16]),
                volume: rec.id,
                volume_name: rec.name.clone(),
                seq: next_seq,
                parents: v.parents.iter().filter_map(|p| ids.get(p)).copied().collect(),
                ..v.clone()
            }
            .seal()?;
            next_seq += 1;
            ids.insert(v.id, sealed.id);
            out.added.push(sealed);
        }
        let mut tags = Vec::new();
        for (name, id) in names {
            let Some(mine) = ids.get(id) else { continue };
            check_tag(name)?;
            match self.storage.records.tagged(rec.id, name)? {
                Some(t) if t == *mine => {}
                Some(_) => out.names_taken.push(name.clone()),
                None => tags.push((name, *mine)),
            }
        }
        if out.added.is_empty() && tags.is_empty() {
            return Ok((out, None));
        }
        // Everything the versions name is durable (the caller flushed);
        // their objects first, then the commit, as a snapshot does.
        for v in &out.added {
            self.storage.records.put_object(&crate::objects::keys::version(&v.id), v)?;
        }
        let mut claimed = Vec::new();
        for (name, id) in &tags {
            if self.volumes.is_shared() {
                match crate::sync::names::claim(&self.storage, rec.id, name, id) {
                    Ok(etag) => claimed.push((name.to_string(), *id, Some(etag))),
                    Err(e) if e.kind() == crate::error::ErrorKind::Conflict => {
                        out.names_taken.push(name.to_string())
                    }
                    Err(e) => return Err(e),
                }
            } else {
                self.put_tag_object(rec.id, name, id)?;
                claimed.push((name.to_string(), *id, None));
            }
        }
        let tip = out.added.last().filter(|_| state.base == common);
        // Access times alone do not hold the head back: the tree they
        // were recorded in is being replaced (its inode counter carries
        // over, as in a restore).
        let new_head = match tip {
            // Unsealed writes of a deferred (btrfs-mode) head belong to the
            // tree in place: such a head stays, as one with changes does.
            Some(tip)
                if head.is_clean_but_accesses()?
                    && !head.block().is_some_and(|b| b.has_pending()) =>
            {
                out.head_moved = true;
                HeadRecord { base: Some(tip.id), root: tip.root, next_seq }
            }
            _ => HeadRecord { next_seq, ..state.clone() },
        };
        self.volumes.put_head_object(rec.id, &new_head)?;
        let db = self.db();
        let mut b = Batch::default();
        for v in &out.added {
            db.put_json(&mut b, &keys::version(&v.id), v)?;
            db.put_meta(&mut b, &keys::log(rec.id, v.seq), v.id.to_string());
        }
        for (name, id, etag) in &claimed {
            db.put_meta(&mut b, &keys::tag(rec.id, name), id.to_string());
            if let Some(etag) = etag {
                db.put_meta(&mut b, &keys::tag_seen(rec.id, name), etag);
            }
            out.named.push(name.clone());
        }
        db.put_json(&mut b, &keys::head(rec.id), &new_head)?;
        // The head moves to the tip as a restore moves it.
        let root = new_head.root;
        let counter_only = if out.head_moved {
            Some(super::restore::stage_new_tree(&head, root, &mut b)?)
        } else {
            None
        };
        head.publish(|| {
            db.write(b, true)?;
            head.set_state(new_head);
            match counter_only {
                Some(counter_only) => super::restore::enter_new_tree(&head, counter_only),
                None => Ok(()),
            }
        })?;
        self.volumes.committed();
        tracing::info!(
            volume,
            added = out.added.len(),
            known = out.known,
            head_moved = out.head_moved,
            "adopted versions"
        );
        let before = match state.base {
            Some(b) if out.head_moved => Some(self.version(&b)?),
            _ => None,
        };
        Ok((out, before))
    }
}

/// The version of `log` with this content and creation time.
fn find_same(log: &[VersionRecord], root: MapRoot, at: u64) -> Option<&VersionRecord> {
    log.iter().find(|v| v.root == root && v.created_at_ms == at)
}
