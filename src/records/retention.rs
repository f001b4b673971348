//! Logarithmically spaced retention: automatic versions (timer checkpoints,
//! NBD safe points) are thinned so the number kept grows with the log of
//! their age, newest densest. A pure function of the versions and `now`, so
//! it is tested with tables and simulated years, never with a clock.
//!
//! Rule: the `keep_recent` newest prunable versions stay. Older ones fall in
//! buckets by age, bucket k holding ages in [unit * 2^k, unit * 2^(k+1));
//! in each bucket the `per_bucket` oldest stay. As versions age they move
//! to older buckets and the surplus goes, so spacing doubles with age and at
//! most `keep_recent + per_bucket * (log2(max_age / unit) + 1)` remain.
//! Named, pinned, fork-base and head-base versions are never candidates.

use crate::id::VersionId;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Policy {
    pub keep_recent: usize,
    /// Age of the first bucket, in milliseconds.
    pub unit_ms: u64,
    pub per_bucket: usize,
}

impl Policy {
    /// Whether the policy can thin anything: a unit and a per-bucket count
    /// of 0 would not.
    pub fn is_valid(&self) -> bool {
        self.unit_ms > 0 && self.per_bucket > 0
    }
}

/// A change to a volume's retention, applied to its record where the
/// record is changed (so two changes of different fields both hold): each
/// field given replaces the policy's (the default's, for a volume without
/// one of its own); `default` goes back to the default policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyChange {
    pub keep_recent: Option<usize>,
    pub unit_ms: Option<u64>,
    pub per_bucket: Option<usize>,
    pub auto_prune: Option<bool>,
    pub default: bool,
}

impl PolicyChange {
    pub fn is_empty(&self) -> bool {
        *self == PolicyChange::default()
    }

    /// The policy (`None`: the default) `policy` becomes.
    pub fn apply(&self, policy: Option<&Policy>) -> Option<Policy> {
        if self.default {
            return None;
        }
        let changes =
            self.keep_recent.is_some() || self.unit_ms.is_some() || self.per_bucket.is_some();
        if !changes {
            return policy.cloned();
        }
        let mut p = policy.cloned().unwrap_or_default();
        p.keep_recent = self.keep_recent.unwrap_or(p.keep_recent);
        p.unit_ms = self.unit_ms.unwrap_or(p.unit_ms);
        p.per_bucket = self.per_bucket.unwrap_or(p.per_bucket);
        Some(p)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy { keep_recent: 16, unit_ms: 60_000, per_bucket: 1 }
    }
}

/// A prunable version (or group version, `K` its number): its id and
/// creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<K = VersionId> {
    pub id: K,
    pub created_at_ms: u64,
}

/// The candidates to delete under `policy` at time `now_ms`.
pub fn plan<K: Ord + Copy>(candidates: &[Candidate<K>], now_ms: u64, policy: &Policy) -> Vec<K> {
    let mut by_age: Vec<Candidate<K>> = candidates.to_vec();
    // Newest first; ties broken by id so the plan is deterministic.
    by_age.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then(a.id.cmp(&b.id)));
    let mut buckets: BTreeMap<u32, Vec<Candidate<K>>> = BTreeMap::new();
    for c in by_age.iter().skip(policy.keep_recent) {
        let age_units = now_ms.saturating_sub(c.created_at_ms) / policy.unit_ms.max(1);
        let bucket = 63 - age_units.max(1).leading_zeros();
        buckets.entry(bucket).or_default().push(*c);
    }
    let mut drop = Vec::new();
    for (_, mut members) in buckets {
        // Oldest first: they stay, the rest of the bucket goes.
        members.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
        drop.extend(members.iter().skip(policy.per_bucket).map(|c| c.id));
    }
    drop
}

/// The most versions `plan` leaves among candidates no older than `max_age_ms`.
#[cfg(test)]
pub fn bound(policy: &Policy, max_age_ms: u64) -> usize {
    let units = (max_age_ms / policy.unit_ms.max(1)).max(1);
    policy.keep_recent + policy.per_bucket * (64 - units.leading_zeros()) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_change_replaces_only_the_fields_it_gives() {
        let mine = Policy { keep_recent: 3, unit_ms: 5_000, per_bucket: 2 };
        let keep = PolicyChange { keep_recent: Some(9), ..Default::default() };
        let unit = PolicyChange { unit_ms: Some(1_000), ..Default::default() };
        // Two changes of different fields, one after the other: both hold.
        let both = unit.apply(keep.apply(Some(&mine)).as_ref()).unwrap();
        assert_eq!(both, Policy { keep_recent: 9, unit_ms: 1_000, per_bucket: 2 });
        // Onto the default, for a volume without a policy of its own.
        let d = Policy::default();
        assert_eq!(keep.apply(None).unwrap(), Policy { keep_recent: 9, ..d });
        // Auto-pruning alone leaves the policy, default or not.
        let auto = PolicyChange { auto_prune: Some(true), ..Default::default() };
        assert_eq!(auto.apply(None), None);
        assert_eq!(auto.apply(Some(&mine)), Some(mine.clone()));
        assert!(!auto.is_empty() && PolicyChange::default().is_empty());
        let default = PolicyChange { default: true, ..Default::default() };
        assert_eq!(default.apply(Some(&mine)), None);
    }

    fn c(n: u8, t: u64) -> Candidate {
        Candidate { id: VersionId([n; 16]), created_at_ms: t }
    }

    #[test]
    fn table_of_cases() {
        let p = Policy { keep_recent: 2, unit_ms: 10, per_bucket: 1 };
        let now = 1000;
        struct Case {
            name: &'static str,
            versions: Vec<Candidate>,
            dropped: Vec<u8>,
        }
        let cases = [
            Case { name: "nothing", versions: vec![], dropped: vec![] },
            Case { name: "only recent", versions: vec![c(1, 990), c(2, 995)], dropped: vec![] },
            // ages 100..=130 units: all in bucket 6 (64..128) or 7: keep the oldest of each.
            Case {
                name: "one bucket keeps its oldest",
                versions: vec![c(1, 999), c(2, 998), c(3, 20), c(4, 30), c(5, 40)],
                dropped: vec![4, 5],
            },
            Case {
                name: "different buckets all stay",
                versions: vec![c(1, 999), c(2, 998), c(3, 990), c(4, 970), c(5, 930), c(6, 850)],
                dropped: vec![],
            },
            Case {
                name: "future timestamps count as age zero",
                versions: vec![c(1, 5000), c(2, 4000), c(3, 3000), c(4, 2000)],
                dropped: vec![3],
            },
        ];
        for case in cases {
            let mut got: Vec<u8> = plan(&case.versions, now, &p).iter().map(|v| v.0[0]).collect();
            got.sort();
            assert_eq!(got, case.dropped, "{}", case.name);
        }
    }

    /// Two simulated years of a checkpoint every 30 s, pruned every hour.
    #[test]
    fn years_of_checkpoints_stay_within_the_log_bound_and_spacing_grows() {
        let p = Policy::default();
        let step = 30_000u64;
        let hour = 3_600_000u64;
        let end = 2 * 365 * 24 * hour;
        let mut kept: Vec<Candidate> = Vec::new();
        let mut n: u64 = 0;
        let mut t = 0;
        while t < end {
            t += step;
            n += 1;
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&n.to_le_bytes());
            kept.push(Candidate { id: VersionId(id), created_at_ms: t });
            if t % hour == 0 {
                let drop: std::collections::HashSet<VersionId> =
                    plan(&kept, t, &p).into_iter().collect();
                kept.retain(|c| !drop.contains(&c.id));
                let oldest = kept.iter().map(|c| c.created_at_ms).min().unwrap_or(t);
                assert!(kept.len() <= bound(&p, t - oldest), "at {t}: {} kept", kept.len());
            }
        }
        assert!(kept.len() < 60, "{} versions kept after two years", kept.len());
        // The first version survives: thinning keeps the oldest of each bucket.
        assert_eq!(kept.iter().map(|c| c.created_at_ms).min(), Some(step));
        // Gaps between kept versions grow with age (allowing one bucket of slack).
        let mut times: Vec<u64> = kept.iter().map(|c| c.created_at_ms).collect();
        times.sort_unstable();
        times.reverse();
        let gaps: Vec<u64> = times.windows(2).map(|w| w[0] - w[1]).collect();
        for w in gaps.windows(3).skip(p.keep_recent) {
            assert!(w[2] * 4 >= w[0], "spacing shrank with age: {gaps:?}");
        }
    }
}
