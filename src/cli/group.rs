//! `forkfs group ...`, and the `--group` forms of snapshot, restore, fork,
//! log and diff: volumes checkpointed, restored and forked together.

use super::Global;
use super::output::{age, print_json};
use forkfs::service::{GroupRequest, Request};
use forkfs::{GroupRecord, GroupVersion, describe_group_version as describe};

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Create a group of volumes
    Create {
        group: String,
        #[arg(required = true)]
        volumes: Vec<String>,
    },
    /// Add volumes to a group
    Add {
        group: String,
        #[arg(required = true)]
        volumes: Vec<String>,
    },
    /// Remove volumes from a group (their versions stay)
    Remove {
        group: String,
        #[arg(required = true)]
        volumes: Vec<String>,
    },
    /// Delete a group and its group versions (the members' versions stay)
    Delete { group: String },
    /// List groups
    List,
    /// Thin the group's unnamed group versions by age (log spacing), each
    /// with its members' versions; named ones and restore undo points stay
    Prune {
        group: String,
        /// Always keep this many newest (default 16)
        #[arg(long)]
        keep_recent: Option<usize>,
        /// Age of the first bucket, doubling from there (default 60s), e.g. 10m
        #[arg(long, value_parser = humantime::parse_duration)]
        unit: Option<std::time::Duration>,
        /// Group versions kept per bucket (default 1)
        #[arg(long)]
        per_bucket: Option<usize>,
        /// Show what would go; change nothing
        #[arg(long)]
        dry_run: bool,
    },
}

fn call<T: serde::de::DeserializeOwned>(g: &Global, request: GroupRequest) -> anyhow::Result<T> {
    g.call(&Request::Group { request })
}

pub fn run(g: &Global, c: Cmd) -> anyhow::Result<()> {
    let (rec, what): (Option<GroupRecord>, &str) = match c {
        Cmd::Create { group, volumes } => {
            (Some(call(g, GroupRequest::Create { group, members: volumes })?), "created")
        }
        Cmd::Add { group, volumes } => (
            Some(call(g, GroupRequest::Change { group, add: volumes, remove: vec![] })?),
            "changed",
        ),
        Cmd::Remove { group, volumes } => (
            Some(call(g, GroupRequest::Change { group, add: vec![], remove: volumes })?),
            "changed",
        ),
        Cmd::Delete { group } => {
            call::<serde_json::Value>(g, GroupRequest::Delete { group: group.clone() })?;
            if !g.json {
                println!("deleted group {group}");
            }
            return Ok(());
        }
        Cmd::Prune { group, keep_recent, unit, per_bucket, dry_run } => {
            let unit_ms = unit.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let req = GroupRequest::Prune {
                group: group.clone(),
                keep_recent,
                unit_ms,
                per_bucket,
                dry_run,
            };
            let pruned: Vec<GroupVersion> = call(g, req)?;
            if g.json {
                return print_json(&pruned);
            }
            let verb = if dry_run { "would prune" } else { "pruned" };
            println!("{verb} {} group versions of {group}", pruned.len());
            for v in &pruned {
                println!("  {}", show(v));
            }
            return Ok(());
        }
        Cmd::List => {
            let all: Vec<GroupRecord> = call(g, GroupRequest::List)?;
            if g.json {
                return print_json(&all);
            }
            for r in all {
                println!("{:<24} {}", r.name, members(&r));
            }
            return Ok(());
        }
    };
    let rec = rec.expect("a group");
    if g.json {
        return print_json(&rec);
    }
    println!("{what} group {}: {}", rec.name, members(&rec));
    Ok(())
}

fn members(r: &GroupRecord) -> String {
    r.members.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" ")
}

fn show(g: &GroupVersion) -> String {
    let m: Vec<String> =
        g.members.iter().map(|m| format!("{}@{}", m.volume, m.version.short())).collect();
    format!("{} = {}", describe(g), m.join(" "))
}

/// `forkfs snapshot --group NAME`.
pub fn snapshot(
    g: &Global,
    group: String,
    name: Option<String>,
    label: Option<String>,
) -> anyhow::Result<()> {
    let v: GroupVersion = call(g, GroupRequest::Snapshot { group, name, label })?;
    if g.json {
        return print_json(&v);
    }
    println!("{}", show(&v));
    Ok(())
}

/// `forkfs restore --group NAME VERSION`.
pub fn restore(g: &Global, group: String, version: String) -> anyhow::Result<()> {
    let j: serde_json::Value = call(g, GroupRequest::Restore { group, version })?;
    if g.json {
        return print_json(&j);
    }
    let to: GroupVersion = serde_json::from_value(j["restored"].clone())?;
    let pre: GroupVersion = serde_json::from_value(j["previous"].clone())?;
    println!(
        "restored {}; the previous state is {} (restore that to undo)",
        show(&to),
        describe(&pre)
    );
    Ok(())
}

/// `forkfs fork --group NAME[@VERSION] NEW`.
pub fn fork(g: &Global, spec: String, new: String) -> anyhow::Result<()> {
    let (group, version) = match spec.split_once('@') {
        Some((n, v)) => (n.to_string(), Some(v.to_string())),
        None => (spec, None),
    };
    let j: serde_json::Value = call(g, GroupRequest::Fork { group, version, new })?;
    if g.json {
        return print_json(&j);
    }
    let from: GroupVersion = serde_json::from_value(j["from"].clone())?;
    let rec: GroupRecord = serde_json::from_value(j["group"].clone())?;
    println!("forked {} as group {}: {}", describe(&from), rec.name, members(&rec));
    Ok(())
}

/// `forkfs log --group NAME`: group versions, newest first.
pub fn log(g: &Global, group: String, limit: Option<usize>) -> anyhow::Result<()> {
    let j: serde_json::Value = call(g, GroupRequest::Log { group })?;
    let mut versions: Vec<GroupVersion> = serde_json::from_value(j["versions"].clone())?;
    versions.reverse();
    if let Some(n) = limit {
        versions.truncate(n);
    }
    if g.json {
        return print_json(&versions);
    }
    for v in &versions {
        let label = v.label.as_deref().map(|l| format!("  {l}")).unwrap_or_default();
        println!("{:>8}  {}{label}", age(v.created_at_ms), show(v));
    }
    Ok(())
}

/// `forkfs diff --group NAME A [B]`: each member's diff.
pub fn diff(
    g: &Global,
    group: String,
    from: String,
    to: Option<String>,
    stat: bool,
) -> anyhow::Result<()> {
    let j: serde_json::Value = call(g, GroupRequest::Diff { group, from, to })?;
    if g.json {
        return print_json(&j);
    }
    for m in j.as_array().into_iter().flatten() {
        let d: forkfs::Diff = serde_json::from_value(m["diff"].clone())?;
        println!("== {}", m["volume"].as_str().unwrap_or("?"));
        super::log::print_diff(d, stat);
    }
    Ok(())
}
