//! Retention: automatic versions thinned by the volume's policy (the plan
//! itself is a pure function, `records/retention.rs`).

use super::Graph;
use crate::error::Result;
use crate::id::VersionId;
use crate::records::retention::{Candidate, plan};
use crate::records::{Origin, Policy, VersionRecord};
use std::collections::HashSet;

impl Graph {
    /// Applies the volume's retention after an automatic checkpoint, if it
    /// has auto-pruning on. Failures are logged: the checkpoint stands.
    pub(super) fn auto_prune(&self, volume: &str) {
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
        let mut protected: HashSet<VersionId> =
            self.tags(&vol)?.into_iter().map(|(_, id)| id).collect();
        protected.extend(self.volumes.head_base(&vol)?);
        protected.extend(self.volumes.list()?.into_iter().filter_map(|v| v.forked_from));
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
}
