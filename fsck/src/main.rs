//! `forkfs-fsck`: store verification (and later GC and retention pruning).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "forkfs-fsck",
    version,
    about = "Check a forkfs store; reclaim space; prune history"
)]
struct Cli {
    /// Store directory
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
    Check,
    /// Thin a volume's automatic versions by logarithmically spaced retention
    Prune {
        volume: String,
        /// Show what would go, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Always keep this many newest automatic versions
        #[arg(long, default_value_t = 16)]
        keep_recent: usize,
        /// Age of the first retention bucket, in seconds (buckets double from there)
        #[arg(long, default_value_t = 60)]
        unit_secs: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    let Some(dir) = cli.store.clone().or_else(default_store) else {
        eprintln!("forkfs-fsck: no store given (use --store or FORKFS_STORE)");
        std::process::exit(64);
    };
    match cli.command.unwrap_or(Command::Check) {
        Command::Check => std::process::exit(check(&dir, cli.json)),
        Command::Prune { volume, dry_run, keep_recent, unit_secs } => {
            let policy = forkfs::retention::Policy {
                keep_recent,
                unit_ms: unit_secs.max(1) * 1000,
                ..Default::default()
            };
            std::process::exit(prune(&dir, &volume, &policy, dry_run, cli.json))
        }
    }
}

fn default_store() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("forkfs"))
}

fn prune(
    dir: &std::path::Path,
    volume: &str,
    policy: &forkfs::retention::Policy,
    dry_run: bool,
    json: bool,
) -> i32 {
    let now = forkfs::version::now_ms();
    let pruned = match forkfs::Store::open(dir).and_then(|s| s.prune(volume, policy, now, dry_run))
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("forkfs-fsck: {e}");
            return if e.kind() == forkfs::ErrorKind::NotFound { 66 } else { 69 };
        }
    };
    if json {
        let ids: Vec<String> = pruned.iter().map(|v| v.id.to_string()).collect();
        println!("{}", serde_json::json!({ "volume": volume, "dry_run": dry_run, "pruned": ids }));
    } else {
        for v in &pruned {
            println!(
                "{} {}@{}",
                if dry_run { "would prune" } else { "pruned" },
                v.volume_name,
                v.id.short()
            );
        }
        println!(
            "{} versions {}",
            pruned.len(),
            if dry_run { "would be pruned" } else { "pruned" }
        );
    }
    0
}

fn check(dir: &std::path::Path, json: bool) -> i32 {
    let report = match forkfs::Store::open(dir).and_then(|s| s.check()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("forkfs-fsck: {e}");
            return 69;
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    } else {
        for p in &report.problems {
            println!("problem: {p}");
        }
        println!(
            "checked {} packs, {} volumes, {} versions, {} chunks: {}",
            report.packs,
            report.volumes,
            report.versions,
            report.chunks,
            if report.ok() { "ok" } else { "PROBLEMS FOUND" }
        );
    }
    if report.ok() { 0 } else { 1 }
}
