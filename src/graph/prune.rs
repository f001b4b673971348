//! Retention: automatic versions thinned by the volume's policy, and group
//! versions thinned as units (the plan itself is a pure function,
//! `records/retention.rs`).

use super::{Graph, Target};
use crate::db::Batch;
use crate::error::Result;
use crate::id::VersionId;
use crate::objects::keys as objects;
use crate::records::retention::{Candidate, plan};
use crate::records::{GroupVersion, Origin, Policy, VersionRecord, VolumeRecord, keys};
use std::collections::{HashMap, HashSet};

thread_local! {
    /// Inside [`Graph::pruning_after`] on this thread: the volumes whose
    /// automatic pruning waits until the work is answered.
    static HELD: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Automatic prunings held back by [`Graph::pruning_after`], to run once
/// the work's answer is out.
#[must_use = "held prunings run only when asked to"]
pub struct HeldPrunes(Vec<String>);

impl HeldPrunes {
    /// Each under the volume's checkpoint lock, as a prune inside a
    /// checkpoint runs: never beside another checkpoint of the volume.
    pub fn run(self, graph: &Graph) {
        for volume in self.0 {
            let head = graph.volumes.get(&volume).ok().and_then(|v| graph.volumes.opened_id(v.id));
            let _one = head.as_ref().map(|h| h.checkpoint.lock());
            graph.auto_prune_now(&volume);
        }
    }

    /// The volumes whose pruning was held.
    pub fn volumes(&self) -> &[String] {
        &self.0
    }
}

impl Graph {
    /// Runs `work` (a request) with the automatic pruning its versions
    /// call for held back: a prune reads the volume's whole log, so it
    /// grows with the history, and the caller runs it once it has
    /// answered ([`HeldPrunes::run`]). Nested calls hold for the outermost.
    pub fn pruning_after<T>(&self, work: impl FnOnce() -> T) -> (T, HeldPrunes) {
        /// Ends the hold, even if the work panics.
        struct Outermost;
        impl Drop for Outermost {
            fn drop(&mut self) {
                HELD.with(|h| h.borrow_mut().take());
            }
        }
        let outermost = HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.is_some() {
                return None;
            }
            *h = Some(Vec::new());
            Some(Outermost)
        });
        let out = work();
        let held = match outermost {
            Some(end) => {
                let held = HELD.with(|h| h.borrow_mut().take());
                drop(end);
                held.unwrap_or_default()
            }
            None => Vec::new(),
        };
        (out, HeldPrunes(held))
    }

    /// Applies the volume's retention after an automatic checkpoint, if it
    /// has auto-pruning on (later, inside [`Graph::pruning_after`]).
    pub(super) fn auto_prune(&self, volume: &str) {
        let held = HELD.with(|h| match h.borrow_mut().as_mut() {
            Some(v) => {
                if !v.iter().any(|x| x == volume) {
                    v.push(volume.to_string());
                }
                true
            }
            None => false,
        });
        if !held {
            self.auto_prune_now(volume);
        }
    }

    /// Failures are logged: the checkpoint stands.
    fn auto_prune_now(&self, volume: &str) {
        let res = self.volumes.get(volume).and_then(|v| {
            if !v.auto_prune {
                return Ok(0);
            }
            let policy = v.retention.unwrap_or_default();
            Ok(self.prune(volume, &policy, crate::clock::now_ms(), false)?.len())
        });
        if let Err(e) = res {
            tracing::warn!(volume, error = %e, "automatic pruning failed");
        }
    }

    /// Thins the automatic versions of `volume` by logarithmically spaced
    /// retention and returns the versions removed (or that would be, with
    /// `dry_run`). Named, pinned, head-base and fork-base versions stay.
    /// Only records go; GC reclaims the data.
    pub fn prune(
        &self,
        volume: &str,
        policy: &Policy,
        now_ms: u64,
        dry_run: bool,
    ) -> Result<Vec<VersionRecord>> {
        let vol = self.volumes.get(volume)?;
        let versions = self.log(&vol)?;
        // Group members are manual or restore versions: never candidates.
        let protected = self.kept_apart(&vol)?;
        let candidates: Vec<Candidate> = versions
            .iter()
            .filter(|v| matches!(v.origin, Origin::Auto | Origin::SafePoint))
            .filter(|v| !v.pinned && !protected.contains(&v.id))
            .map(|v| Candidate { id: v.id, created_at_ms: v.created_at_ms })
            .collect();
        let doomed: HashSet<VersionId> = plan(&candidates, now_ms, policy).into_iter().collect();
        let pruned: Vec<VersionRecord> =
            versions.into_iter().filter(|v| doomed.contains(&v.id)).collect();
        if !dry_run {
            for v in &pruned {
                self.delete_version(v)?;
            }
            tracing::info!(volume, pruned = pruned.len(), "prune");
        }
        Ok(pruned)
    }

    /// Versions of `vol` that retention never removes on its own: named
    /// ones, the head's base and versions a volume was forked from.
    fn kept_apart(&self, vol: &VolumeRecord) -> Result<HashSet<VersionId>> {
        let mut kept: HashSet<VersionId> = self.tags(vol)?.into_iter().map(|(_, id)| id).collect();
        kept.extend(self.volumes.head_base(vol)?);
        kept.extend(self.volumes.list()?.into_iter().filter_map(|v| v.forked_from));
        Ok(kept)
    }

    /// The member versions named by group versions, of every group, except
    /// the group versions `except` of `group`.
    fn group_members_but(&self, group: &str, except: &HashSet<u64>) -> Result<HashSet<VersionId>> {
        let mut out = HashSet::new();
        for (_, raw) in self.db().scan_meta(keys::GROUP_LOG_PREFIX)? {
            let g: GroupVersion = serde_json::from_slice(&raw)?;
            if g.group == group && except.contains(&g.seq) {
                continue;
            }
            out.extend(g.members.iter().map(|m| m.version));
        }
        Ok(out)
    }

    /// Thins the group versions of `group` by logarithmically spaced
    /// retention under `policy`, each as one unit: a group version that
    /// goes leaves the group's log, and its member versions go with it
    /// unless something else keeps them (a name, a pin, a head or a fork
    /// based on them, another group version). Candidates are the group
    /// versions snapshots took that have no name, except the newest; named
    /// ones and those a group restore left (its undo points) stay. Returns the group
    /// versions removed (or that would be, with `dry_run`). Only records
    /// go; GC reclaims the data.
    ///
    /// The group versions go first (object, then index), then the member
    /// versions: a crash in between leaves members no group version
    /// names, ordinary manual versions, and never a group version whose
    /// members are gone.
    pub fn prune_group(
        &self,
        group: &str,
        policy: &Policy,
        now_ms: u64,
        dry_run: bool,
    ) -> Result<Vec<GroupVersion>> {
        let _held = self.volumes.groups_lock();
        let log = self.group_log(group)?;
        // The newest stays: group versions are numbered from the last one,
        // so pruning it would give its number to the next.
        let newest = log.last().map(|g| g.seq);
        let candidates: Vec<Candidate<u64>> = log
            .iter()
            .filter(|g| Some(g.seq) != newest)
            .filter(|g| g.name.is_none() && matches!(g.origin, Origin::Manual | Origin::Auto))
            .map(|g| Candidate { id: g.seq, created_at_ms: g.created_at_ms })
            .collect();
        let doomed: HashSet<u64> = plan(&candidates, now_ms, policy).into_iter().collect();
        let pruned: Vec<GroupVersion> =
            log.into_iter().filter(|g| doomed.contains(&g.seq)).collect();
        if dry_run || pruned.is_empty() {
            return Ok(pruned);
        }
        let still_named = self.group_members_but(group, &doomed)?;
        let backend = self.storage.chunks.backend();
        for g in &pruned {
            backend.delete(&objects::group_version(group, g.seq))?;
        }
        let mut b = Batch::default();
        for g in &pruned {
            self.db().delete_meta(&mut b, &keys::group_log(group, g.seq));
        }
        self.db().write(b, true)?;
        let mut kept: HashMap<String, HashSet<VersionId>> = HashMap::new();
        for m in pruned.iter().flat_map(|g| &g.members) {
            if still_named.contains(&m.version) {
                continue;
            }
            // A member already gone (its volume deleted) needs nothing.
            let Ok(Target::Version(v)) = self.resolve(&format!("{}@{}", m.volume, m.version))
            else {
                continue;
            };
            let vol = m.volume.to_string();
            if !kept.contains_key(&vol) {
                let apart = self.kept_apart(&self.volumes.get(&vol)?)?;
                kept.insert(vol.clone(), apart);
            }
            if v.pinned || kept[&vol].contains(&v.id) {
                continue;
            }
            self.delete_version(&v)?;
        }
        tracing::info!(group, pruned = pruned.len(), "group prune");
        Ok(pruned)
    }
}
