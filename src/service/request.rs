//! The control requests: what a command asks of the process that holds a
//! store, and how that process answers them.

use super::socket::Extensions;
use crate::error::{Error, Result};
use crate::graph::{SnapshotOptions, Target};
use crate::maint::{CheckOptions, GcOptions};
use crate::progress::Progress;
use crate::records::{Consistency, Policy, PolicyChange, VolumeKind};
use crate::store::Store;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Gc {
        dry_run: bool,
        grace_ms: u64,
        compact_below: f64,
    },
    Check {
        deep: bool,
    },
    Prune {
        volume: String,
        keep_recent: Option<usize>,
        unit_ms: Option<u64>,
        dry_run: bool,
    },
    Snapshot {
        volume: String,
        name: Option<String>,
        label: Option<String>,
    },
    /// Fork `source` (VOL for its current state, or VOL@VERSION) as `new`.
    Fork {
        source: String,
        new: String,
    },
    /// Set the head of `volume` to `version` (VOL@VERSION or a version of `volume`).
    Restore {
        volume: String,
        version: String,
    },
    /// Show (`None`) or set a block volume's consistency mode.
    Consistency {
        volume: String,
        mode: Option<Consistency>,
    },
    /// The version graph of `volume`: versions (with names and damage
    /// marks), rollbacks and the head's base.
    Log {
        volume: String,
    },
    /// What changed from `from` to `to` (VOL for a head, VOL@VERSION;
    /// `to` defaults to the head of `from`'s volume).
    Diff {
        from: String,
        to: Option<String>,
    },
    /// Every volume of the store.
    Volumes,
    /// Volumes, sizes, stored bytes, cache and uploads ([`Store::stats`]).
    Status,
    /// Records a version of each volume (or of `volume`) that has changes
    /// not yet in one, and syncs the store (see [`Store::sync`]).
    Sync {
        volume: Option<String>,
    },
    CreateVolume {
        name: String,
        kind: VolumeKind,
        size: Option<u64>,
        block_size: Option<u32>,
        /// An fs volume's quota in bytes.
        #[serde(default)]
        quota: Option<u64>,
    },
    /// Shows an fs volume's quota and use; sets the quota to `set`
    /// bytes, or removes it (`remove`).
    Quota {
        volume: String,
        #[serde(default)]
        set: Option<u64>,
        #[serde(default)]
        remove: bool,
    },
    /// Writes a history bundle of `range` (`VOL`, `VOL@B`, `VOL@A..B`) to
    /// the file `path` (absolute: the holder's working directory is not
    /// the caller's).
    BundleCreate {
        range: String,
        path: std::path::PathBuf,
    },
    /// Adds the versions of the bundle in the file `path` to the volume
    /// named as in the bundle, or `into`.
    BundleImport {
        path: std::path::PathBuf,
        into: Option<String>,
    },
    /// Names version `version` (VOL@VERSION) `name`.
    Tag {
        version: String,
        name: String,
    },
    Untag {
        volume: String,
        name: String,
    },
    /// Deletes version `version` (VOL@VERSION).
    DeleteVersion {
        version: String,
    },
    /// Deletes a volume no process serves.
    DeleteVolume {
        name: String,
    },
    /// Changes a volume's retention and auto-pruning (the fields given).
    Retention {
        volume: String,
        change: PolicyChange,
    },
    /// Volume groups (see [`GroupRequest`]).
    Group {
        request: GroupRequest,
    },
    /// A front-end's own request, served by the handler the holding
    /// process registered ([`super::Extensions::insert`]).
    Extension {
        name: String,
        args: serde_json::Value,
    },
}

/// An fs volume's quota and the bytes its files take ([`Request::Quota`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct QuotaReport {
    pub volume: String,
    pub quota: Option<u64>,
    pub used: u64,
}

/// What can be asked about volume groups. Versions of a group are named
/// `NAME`, a number, or `~N` (N back from the newest).
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "group-op", rename_all = "kebab-case")]
pub enum GroupRequest {
    Create {
        group: String,
        members: Vec<String>,
    },
    Change {
        group: String,
        add: Vec<String>,
        remove: Vec<String>,
    },
    Delete {
        group: String,
    },
    List,
    /// The group and its group versions, oldest first.
    Log {
        group: String,
    },
    Snapshot {
        group: String,
        name: Option<String>,
        label: Option<String>,
    },
    Restore {
        group: String,
        version: String,
    },
    /// Forks `version` (default: a new group snapshot) as group `new`.
    Fork {
        group: String,
        version: Option<String>,
        new: String,
    },
    /// Per member: what changed from `from` to `to` (default: the heads).
    Diff {
        group: String,
        from: String,
        to: Option<String>,
    },
    /// Thins the group's unnamed group versions, each with its members
    /// (the default retention policy, with these overrides).
    Prune {
        group: String,
        keep_recent: Option<usize>,
        unit_ms: Option<u64>,
        per_bucket: Option<usize>,
        dry_run: bool,
    },
}

/// Runs a request against an open store; `extensions` serve the front-end
/// requests this process registered.
pub fn execute(
    store: &Store,
    extensions: &Extensions,
    req: &Request,
    progress: &dyn Progress,
) -> Result<serde_json::Value> {
    let (volumes, graph) = (store.volumes(), store.graph());
    Ok(match req {
        Request::Gc { dry_run, grace_ms, compact_below } => {
            let opts = GcOptions {
                dry_run: *dry_run,
                grace: Duration::from_millis(*grace_ms),
                compact_below: *compact_below,
                ..Default::default()
            };
            serde_json::to_value(store.gc(&opts, progress)?)?
        }
        Request::Check { deep } => {
            let opts = CheckOptions { deep: *deep };
            serde_json::to_value(store.check_with(&opts, progress)?)?
        }
        Request::Prune { volume, keep_recent, unit_ms, dry_run } => {
            let p = volumes.get(volume)?.retention.unwrap_or_default();
            let policy = Policy {
                keep_recent: keep_recent.unwrap_or(p.keep_recent),
                unit_ms: unit_ms.unwrap_or(p.unit_ms).max(1),
                ..p
            };
            let now = crate::clock::now_ms();
            let pruned = graph.prune(volume, &policy, now, *dry_run)?;
            serde_json::to_value(pruned.iter().map(|v| v.id.to_string()).collect::<Vec<_>>())?
        }
        Request::Snapshot { volume, name, label } => {
            let opts =
                SnapshotOptions { name: name.clone(), label: label.clone(), ..Default::default() };
            serde_json::to_value(graph.snapshot(volume, &opts)?)?
        }
        Request::Fork { source, new } => {
            let from = graph.resolve_version(source)?;
            let rec = graph.fork(&from, new)?;
            serde_json::json!({ "from": from, "volume": rec })
        }
        Request::Restore { volume, version } => {
            let spec =
                if version.contains('@') { version.clone() } else { format!("{volume}@{version}") };
            let Target::Version(to) = graph.resolve(&spec)? else {
                return Err(Error::invalid("restore needs a version"));
            };
            let pre = graph.restore(volume, &to)?;
            serde_json::json!({ "restored": to, "previous_head": pre })
        }
        Request::Consistency { volume, mode: Some(m) } => {
            serde_json::to_value(volumes.set_consistency(volume, *m)?)?
        }
        Request::Consistency { volume, mode: None } => serde_json::to_value(volumes.get(volume)?)?,
        Request::Log { volume } => log(store, volume)?,
        Request::Volumes => serde_json::to_value(volumes.list()?)?,
        Request::Status => serde_json::to_value(store.stats()?)?,
        Request::Sync { volume } => serde_json::to_value(store.sync(volume.as_deref())?)?,
        Request::CreateVolume { name, kind, size, block_size, quota } => {
            if quota.is_some() {
                crate::graph::check_quota(*kind, *quota)?;
            }
            let rec = volumes.create(name, *kind, *size, *block_size)?;
            match quota {
                Some(q) => serde_json::to_value(volumes.set_quota(name, Some(*q))?.0)?,
                None => serde_json::to_value(rec)?,
            }
        }
        Request::Quota { volume, set, remove } => {
            let (rec, used) = match (set, remove) {
                (Some(_), true) => {
                    return Err(Error::invalid("set a quota or remove it, not both"));
                }
                (Some(q), false) => volumes.set_quota(volume, Some(*q))?,
                (None, true) => volumes.set_quota(volume, None)?,
                (None, false) => volumes.usage(volume)?,
            };
            serde_json::to_value(QuotaReport {
                volume: rec.name.to_string(),
                quota: rec.quota,
                used,
            })?
        }
        Request::BundleCreate { range, path } => {
            serde_json::to_value(store.bundle_create_file(range, path, progress)?)?
        }
        Request::BundleImport { path, into } => {
            serde_json::to_value(store.bundle_import_file(path, into.as_deref(), progress)?)?
        }
        Request::Group { request } => group(store, request)?,
        Request::Tag { version, name } => {
            let v = graph.resolve_version(version)?;
            graph.tag(&v, name)?;
            serde_json::to_value(v)?
        }
        Request::Untag { volume, name } => {
            graph.untag(&volumes.get(volume)?, name)?;
            serde_json::Value::Null
        }
        Request::DeleteVersion { version } => {
            let Target::Version(v) = graph.resolve(version)? else {
                return Err(Error::invalid("name a version: VOL@VERSION"));
            };
            graph.delete_version(&v)?;
            serde_json::to_value(v)?
        }
        Request::DeleteVolume { name } => {
            volumes.delete(name)?;
            serde_json::Value::Null
        }
        Request::Retention { volume, change } => {
            serde_json::to_value(volumes.change_retention(volume, change)?)?
        }
        Request::Extension { name, args } => match extensions.get(name) {
            Some(handler) => handler(args)?,
            None => {
                return Err(Error::conflict(format!(
                    "the process holding the store at {} does not serve {name} requests",
                    store.dir().display()
                )));
            }
        },
        Request::Diff { from, to } => {
            let a = graph.resolve(from)?;
            let b = match to {
                Some(t) => graph.resolve(t)?,
                None => Target::Head(volumes.get(a.volume_name().as_str())?),
            };
            serde_json::to_value(graph.diff(&a, &b)?)?
        }
    })
}

fn log(store: &Store, volume: &str) -> Result<serde_json::Value> {
    let graph = store.graph();
    let vol = store.volumes().get(volume)?;
    let mut names: std::collections::HashMap<_, Vec<String>> = Default::default();
    for (n, id) in graph.tags(&vol)? {
        names.entry(id).or_default().push(n);
    }
    let mut versions = Vec::new();
    for v in graph.log(&vol)? {
        let mut j = serde_json::to_value(&v)?;
        j["names"] = serde_json::json!(names.remove(&v.id).unwrap_or_default());
        // Marks left by `fsck --repair` on versions that reference lost data.
        j["damaged"] = serde_json::json!(graph.damaged(&v.id)?);
        versions.push(j);
    }
    Ok(serde_json::json!({
        "head_base": store.volumes().head_base(&vol)?,
        "versions": versions,
        "rollbacks": graph.rollbacks(&vol)?,
    }))
}

fn group(store: &Store, req: &GroupRequest) -> Result<serde_json::Value> {
    let graph = store.graph();
    Ok(match req {
        GroupRequest::Create { group, members } => {
            serde_json::to_value(graph.group_create(group, members)?)?
        }
        GroupRequest::Change { group, add, remove } => {
            serde_json::to_value(graph.group_change(group, add, remove)?)?
        }
        GroupRequest::Delete { group } => serde_json::to_value(graph.group_delete(group)?)?,
        GroupRequest::List => serde_json::to_value(graph.groups()?)?,
        GroupRequest::Log { group } => {
            serde_json::json!({ "group": graph.group(group)?, "versions": graph.group_log(group)? })
        }
        GroupRequest::Snapshot { group, name, label } => {
            let opts =
                SnapshotOptions { name: name.clone(), label: label.clone(), ..Default::default() };
            serde_json::to_value(graph.group_snapshot(group, &opts)?)?
        }
        GroupRequest::Restore { group, version } => {
            let to = graph.group_version(group, version)?;
            let before = graph.group_restore(group, &to)?;
            serde_json::json!({ "restored": to, "previous": before })
        }
        GroupRequest::Fork { group, version, new } => {
            let from = match version {
                Some(r) => graph.group_version(group, r)?,
                None => graph.group_snapshot(group, &SnapshotOptions::default())?,
            };
            serde_json::json!({ "from": from, "group": graph.group_fork(&from, new)? })
        }
        GroupRequest::Prune { group, keep_recent, unit_ms, per_bucket, dry_run } => {
            let d = Policy::default();
            let policy = Policy {
                keep_recent: keep_recent.unwrap_or(d.keep_recent),
                unit_ms: unit_ms.unwrap_or(d.unit_ms).max(1),
                per_bucket: per_bucket.unwrap_or(d.per_bucket),
            };
            let now = crate::clock::now_ms();
            serde_json::to_value(graph.prune_group(group, &policy, now, *dry_run)?)?
        }
        GroupRequest::Diff { group, from, to } => {
            let a = graph.group_version(group, from)?;
            let b = to.as_ref().map(|t| graph.group_version(group, t)).transpose()?;
            let mut out = Vec::new();
            for m in &a.members {
                let old = graph.resolve(&format!("{}@{}", m.volume, m.version))?;
                let new = match &b {
                    Some(b) => match b.members.iter().find(|n| n.volume == m.volume) {
                        Some(n) => graph.resolve(&format!("{}@{}", n.volume, n.version))?,
                        None => continue,
                    },
                    None => graph.resolve(m.volume.as_str())?,
                };
                out.push(
                    serde_json::json!({ "volume": m.volume, "diff": graph.diff(&old, &new)? }),
                );
            }
            serde_json::Value::Array(out)
        }
    })
}
