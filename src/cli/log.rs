//! `forkfs log` and `forkfs diff`.

use super::Global;
use super::output::{age, bytes, print_json};
use forkfs::service::Request;
use forkfs::{Diff, PathChange};

#[derive(clap::Args)]
pub struct LogArgs {
    /// The volume (or, with --group, nothing)
    #[arg(required_unless_present = "group")]
    volume: Option<String>,
    /// The group versions of this volume group instead
    #[arg(long, conflicts_with = "volume")]
    group: Option<String>,
    /// Show at most this many versions
    #[arg(short = 'n', long)]
    limit: Option<usize>,
}

/// Versions and rollbacks, newest first. Works while a server holds the
/// store (through its control socket).
pub fn log(g: &Global, a: LogArgs) -> anyhow::Result<()> {
    let volume = match (a.volume, a.group) {
        (_, Some(group)) => return super::group::log(g, group, a.limit),
        (Some(v), None) => v,
        (None, None) => anyhow::bail!("name a volume, or a group with --group"),
    };
    let req = Request::Log { volume };
    let j: serde_json::Value = g.call(&req)?;
    let field = |k: &str| j[k].as_array().cloned().unwrap_or_default();
    // One event list: versions and rollbacks, by time.
    let mut events: Vec<serde_json::Value> = field("versions")
        .into_iter()
        .map(|mut v| {
            v["event"] = "version".into();
            v
        })
        .chain(field("rollbacks").into_iter().map(|mut r| {
            r["event"] = "rollback".into();
            r["created_at_ms"] = r["at_ms"].clone();
            r
        }))
        .collect();
    events.sort_by_key(|e| std::cmp::Reverse(e["created_at_ms"].as_u64().unwrap_or(0)));
    if let Some(n) = a.limit {
        events.truncate(n);
    }
    if g.json {
        return print_json(&events);
    }
    let head = j["head_base"].as_str().unwrap_or_default();
    let mut i = 0;
    for e in &events {
        let at = e["created_at_ms"].as_u64().unwrap_or(0);
        if e["event"] == "rollback" {
            let lost = match e["discarded_bytes"].as_u64() {
                Some(b) => bytes(b),
                None => "unknown amount".into(),
            };
            println!(
                "ROLLBACK      {:>18}  discarded {lost} written after the last safe point{}: {}",
                age(at),
                e["sealed_generation"]
                    .as_u64()
                    .map(|g| format!(" (generation {g})"))
                    .unwrap_or_default(),
                e["reason"].as_str().unwrap_or("?")
            );
            continue;
        }
        let id = e["id"].as_str().unwrap_or_default();
        let mut marks = Vec::new();
        if id == head {
            marks.push("HEAD".to_string());
        }
        for n in e["names"].as_array().into_iter().flatten() {
            marks.push(n.as_str().unwrap_or_default().to_string());
        }
        if !e["damaged"].is_null() {
            marks.push("DAMAGED: see forkfs fsck".to_string());
        }
        if let Some(g) = e["generation"].as_u64() {
            marks.push(format!("generation {g}"));
        }
        let marks =
            if marks.is_empty() { String::new() } else { format!(" ({})", marks.join(", ")) };
        println!(
            "{} ~{:<3} {:<10} {:>8}{}{}",
            &id[..id.len().min(12)],
            i,
            e["origin"].as_str().unwrap_or("?"),
            age(at),
            marks,
            e["label"].as_str().map(|l| format!("  {l}")).unwrap_or_default()
        );
        i += 1;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct DiffArgs {
    /// VOL@VERSION (or VOL for the live head)
    from: String,
    /// VOL@VERSION or VOL [default: the head of FROM's volume]
    to: Option<String>,
    /// Summary counts and bytes instead of a list
    #[arg(long)]
    stat: bool,
    /// FROM and TO name versions of this volume group: each member's diff
    #[arg(long)]
    group: Option<String>,
}

pub fn diff(g: &Global, a: DiffArgs) -> anyhow::Result<()> {
    if let Some(group) = a.group {
        return super::group::diff(g, group, a.from, a.to, a.stat);
    }
    let req = Request::Diff { from: a.from.clone(), to: a.to.clone() };
    let d: Diff = g.call(&req)?;
    if g.json {
        return print_json(&d);
    }
    print_diff(d, a.stat);
    Ok(())
}

/// A diff for people; `stat`: counts and bytes instead of a list.
pub fn print_diff(d: Diff, stat: bool) {
    match d {
        Diff::Block { ranges, .. } => {
            let changed: u64 = ranges.iter().map(|r| r.len).sum();
            if stat {
                println!("{} ranges, {} changed", ranges.len(), bytes(changed));
                return;
            }
            for r in ranges {
                let what = if r.zeroed { "zeroed" } else { "changed" };
                println!("{what} {:#x}+{:#x} ({})", r.offset, r.len, bytes(r.len));
            }
        }
        Diff::Fs { paths } => {
            if stat {
                let count = |c: PathChange| paths.iter().filter(|p| p.change == c).count();
                let grown: i64 = paths
                    .iter()
                    .map(|p| p.new_size.unwrap_or(0) as i64 - p.old_size.unwrap_or(0) as i64)
                    .sum();
                println!(
                    "{} added, {} deleted, {} modified, {} renamed, {:+} bytes",
                    count(PathChange::Added),
                    count(PathChange::Deleted),
                    count(PathChange::Modified),
                    count(PathChange::Renamed),
                    grown
                );
                return;
            }
            for p in paths {
                let code = match p.change {
                    PathChange::Added => "A ",
                    PathChange::Deleted => "D ",
                    PathChange::Modified => "M ",
                    PathChange::Renamed => "R ",
                };
                match p.from {
                    Some(f) => println!("{code} {f} -> {}", p.path),
                    None => println!("{code} {}", p.path),
                }
            }
        }
    }
}
