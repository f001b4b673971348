//! `forkfs log` and `forkfs diff`.

use super::Global;
use super::output::{age, bytes, print_json};
use forkfs::{Diff, PathChange, Target};
use std::collections::HashMap;

#[derive(clap::Args)]
pub struct LogArgs {
    volume: String,
    /// Show at most this many versions
    #[arg(short = 'n', long)]
    limit: Option<usize>,
}

pub fn log(g: &Global, a: LogArgs) -> anyhow::Result<()> {
    let store = g.open()?;
    let vol = store.volume(&a.volume)?;
    let mut versions = store.log(&vol)?;
    versions.reverse();
    if let Some(n) = a.limit {
        versions.truncate(n);
    }
    let mut names: HashMap<_, Vec<String>> = HashMap::new();
    for (n, id) in store.tags(&vol)? {
        names.entry(id).or_default().push(n);
    }
    // Marks left by `fsck --repair` on versions that reference lost data.
    let damaged: HashMap<_, String> = versions
        .iter()
        .filter_map(|v| store.damaged(&v.id).transpose().map(|d| d.map(|d| (v.id, d))))
        .collect::<forkfs::Result<_>>()?;
    if g.json {
        let out: Vec<_> = versions
            .iter()
            .map(|v| {
                let mut j = serde_json::to_value(v).unwrap_or_default();
                j["names"] = serde_json::json!(names.get(&v.id).cloned().unwrap_or_default());
                j["damaged"] = serde_json::json!(damaged.get(&v.id));
                j
            })
            .collect();
        return print_json(&out);
    }
    let head = store.open_volume(&a.volume)?.state();
    for (i, v) in versions.iter().enumerate() {
        let mut marks = Vec::new();
        if head.base == Some(v.id) {
            marks.push("HEAD".to_string());
        }
        marks.extend(names.get(&v.id).cloned().unwrap_or_default());
        if damaged.contains_key(&v.id) {
            marks.push("DAMAGED: see forkfs fsck".to_string());
        }
        let marks =
            if marks.is_empty() { String::new() } else { format!(" ({})", marks.join(", ")) };
        println!(
            "{} ~{:<3} {:<10} {:>8}{}{}",
            v.id.short(),
            i,
            v.origin.to_string(),
            age(v.created_at_ms),
            marks,
            v.label.as_deref().map(|l| format!("  {l}")).unwrap_or_default()
        );
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
}

pub fn diff(g: &Global, a: DiffArgs) -> anyhow::Result<()> {
    let store = g.open()?;
    let from = store.resolve(&a.from)?;
    let to = match &a.to {
        Some(t) => store.resolve(t)?,
        None => Target::Head(store.volume(from.volume_name().as_str())?),
    };
    let d = store.diff(&from, &to)?;
    if g.json {
        return print_json(&d);
    }
    match d {
        Diff::Block { ranges, .. } => {
            let changed: u64 = ranges.iter().map(|r| r.len).sum();
            if a.stat {
                println!("{} ranges, {} changed", ranges.len(), bytes(changed));
                return Ok(());
            }
            for r in ranges {
                let what = if r.zeroed { "zeroed" } else { "changed" };
                println!("{what} {:#x}+{:#x} ({})", r.offset, r.len, bytes(r.len));
            }
        }
        Diff::Fs { paths } => {
            if a.stat {
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
                return Ok(());
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
    Ok(())
}
