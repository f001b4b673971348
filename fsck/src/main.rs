//! `forkfs-fsck`: store verification and repair, garbage collection, and
//! retention pruning (also `forkfs fsck`, `forkfs gc`, `forkfs prune`).

mod progress;

use clap::{Parser, Subcommand};
use forkfs::service::Request;
use forkfs::{CheckOptions, CheckReport, GcOptions, GcReport, Settings, Store};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "forkfs-fsck",
    version,
    about = "Check a forkfs store; reclaim space; prune history"
)]
struct Cli {
    /// Store directory [default: $XDG_DATA_HOME/forkfs]
    #[arg(long, env = "FORKFS_STORE", global = true)]
    store: Option<PathBuf>,
    /// Machine-readable JSON output
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Verify every version and head (the default)
    Check {
        /// Verify every chunk's content (decompress and hash everything)
        #[arg(long)]
        deep: bool,
        /// Rebuild the index from pack footers, salvage damaged packs,
        /// restore version records from their object copies, mark versions
        /// that reference lost data damaged
        #[arg(long)]
        repair: bool,
    },
    /// Reclaim the space of data no version, head or unsaved change references
    Gc {
        /// Show what would be reclaimed, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Leave packs written more recently than this (e.g. 0s, 10m, 1h) [default: 1h]
        #[arg(long, value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        /// Rewrite packs whose live bytes are below this fraction (0 disables) [default: 0.5]
        #[arg(long)]
        compact_below: Option<f64>,
    },
    /// Thin a volume's automatic versions by logarithmically spaced retention
    Prune {
        volume: String,
        /// Show what would go, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Always keep this many newest automatic versions [default: the volume's policy]
        #[arg(long)]
        keep_recent: Option<usize>,
        /// Age of the first retention bucket, in seconds (buckets double from there)
        #[arg(long)]
        unit_secs: Option<u64>,
    },
}

fn main() {
    forkfs::restrict_umask();
    let cli = Cli::parse();
    let dir = cli.store.clone().unwrap_or_else(forkfs::default_store_dir);
    let command = cli.command.unwrap_or(Command::Check { deep: false, repair: false });
    let code = match command {
        Command::Check { deep, repair } => check(&dir, deep, repair, cli.json),
        Command::Gc { dry_run, grace, compact_below } => {
            let d = GcOptions::default();
            let opts = GcOptions {
                dry_run,
                grace: grace.unwrap_or(d.grace),
                compact_below: compact_below.unwrap_or(d.compact_below),
                ..d
            };
            gc(&dir, &opts, cli.json)
        }
        Command::Prune { volume, dry_run, keep_recent, unit_secs } => {
            prune(&dir, &volume, keep_recent, unit_secs, dry_run, cli.json)
        }
    };
    std::process::exit(code)
}

/// Prints a one-line error and returns the exit code for it.
fn fail(e: &forkfs::Error) -> i32 {
    eprintln!("forkfs-fsck: {}", forkfs::one_line(e));
    forkfs::exit_code(e)
}

/// Runs a request on the store here, or, when another process (a server or
/// mount) holds it, inside that process through its control socket.
fn run<T: serde::de::DeserializeOwned>(
    dir: &Path,
    req: &Request,
    bar: &progress::Bar,
) -> Result<T, forkfs::Error> {
    let value = forkfs::service::run(dir, &Settings::from_env(), req, bar)?;
    bar.finish();
    serde_json::from_value(value).map_err(|e| forkfs::Error::corrupt(format!("bad reply: {e}")))
}

fn check(dir: &Path, deep: bool, repair: bool, json: bool) -> i32 {
    let bar = progress::Bar::new();
    let req = Request::Check { deep };
    // A lost index: nothing to check until `--repair` rebuilds it.
    let (first, lost) = match run::<CheckReport>(dir, &req, &bar) {
        Ok(r) => (r, false),
        Err(e) if e.is_index_lost() && repair => {
            let problems = vec![forkfs::one_line(&e)];
            (CheckReport { problems, ..Default::default() }, true)
        }
        Err(e) => return fail(&e),
    };
    let (repaired, report) = if repair && !first.ok() {
        // Repair rewrites the index: only with the store to itself.
        let opened = if lost {
            Store::rebuild(dir, &Settings::from_env(), &bar)
        } else {
            Store::open_with(dir, &Settings::from_env())
        };
        let store = match opened {
            Ok(s) => s,
            Err(e) => return fail(&e),
        };
        let rep = match store.repair(&bar) {
            Ok(r) => r,
            Err(e) => return fail(&e),
        };
        match store.check_with(&CheckOptions { deep }, &bar) {
            Ok(after) => (Some((first, rep)), after),
            Err(e) => return fail(&e),
        }
    } else {
        (None, first)
    };
    bar.finish();
    if json {
        let v = match &repaired {
            Some((before, rep)) => serde_json::json!({
                "ok": report.ok(), "before_repair": before, "repair": rep, "after_repair": report,
            }),
            None => {
                let mut v = serde_json::to_value(&report).unwrap_or_default();
                v["ok"] = report.ok().into();
                v
            }
        };
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        if let Some((before, rep)) = &repaired {
            for p in &before.problems {
                println!("found: {p}");
            }
            println!("repair: {}", serde_json::to_string(rep).unwrap_or_default());
        }
        for p in &report.problems {
            println!("problem: {p}");
        }
        println!(
            "checked {} packs ({} bytes), {} volumes, {} versions, {} nodes, {} data chunks{}: {}",
            report.packs,
            report.pack_bytes,
            report.volumes,
            report.versions,
            report.nodes,
            report.chunks,
            if deep {
                format!(", {} chunks hashed", report.chunks_verified)
            } else {
                String::new()
            },
            if report.ok() { "ok" } else { "PROBLEMS FOUND" }
        );
        if report.unindexed_packs > 0 {
            println!("{} unindexed pack objects (gc removes them)", report.unindexed_packs);
        }
    }
    if report.ok() { 0 } else { 1 }
}

fn gc(dir: &Path, opts: &GcOptions, json: bool) -> i32 {
    if !(0.0..=1.0).contains(&opts.compact_below) {
        eprintln!("forkfs-fsck: --compact-below must be between 0 and 1");
        return 64;
    }
    let req = Request::Gc {
        dry_run: opts.dry_run,
        grace_ms: u64::try_from(opts.grace.as_millis()).unwrap_or(u64::MAX),
        compact_below: opts.compact_below,
    };
    let report: GcReport = match run(dir, &req, &progress::Bar::new()) {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    } else {
        let verb = if report.dry_run { "would reclaim" } else { "reclaimed" };
        println!(
            "{verb} {} bytes: {} packs deleted, {} compacted into {}, {} orphans; \
             {} packs in the grace period; marked {} nodes, {} data chunks from {} versions and {} heads in {} ms",
            report.bytes_reclaimed,
            report.packs_deleted,
            report.packs_compacted,
            report.packs_written,
            report.orphans_deleted,
            report.packs_in_grace,
            report.live_nodes,
            report.live_data_chunks,
            report.versions,
            report.heads,
            report.elapsed_ms
        );
    }
    0
}

fn prune(
    dir: &Path,
    volume: &str,
    keep_recent: Option<usize>,
    unit_secs: Option<u64>,
    dry_run: bool,
    json: bool,
) -> i32 {
    let req = Request::Prune {
        volume: volume.to_string(),
        keep_recent,
        unit_ms: unit_secs.map(|s| s.saturating_mul(1000)),
        dry_run,
    };
    let pruned: Vec<String> = match run(dir, &req, &progress::Bar::new()) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({ "volume": volume, "dry_run": dry_run, "pruned": pruned })
        );
    } else {
        let (verb, summary) =
            if dry_run { ("would prune", "would be pruned") } else { ("pruned", "pruned") };
        for id in &pruned {
            println!("{verb} {volume}@{}", &id[..12.min(id.len())]);
        }
        println!("{} versions {summary}", pruned.len());
    }
    0
}
