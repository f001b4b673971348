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
}

fn main() {
    let cli = Cli::parse();
    let Some(dir) = cli.store.clone().or_else(default_store) else {
        eprintln!("forkfs-fsck: no store given (use --store or FORKFS_STORE)");
        std::process::exit(64);
    };
    match cli.command.unwrap_or(Command::Check) {
        Command::Check => std::process::exit(check(&dir, cli.json)),
    }
}

fn default_store() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("forkfs"))
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
            "checked {} volumes, {} versions, {} chunks: {}",
            report.volumes,
            report.versions,
            report.chunks,
            if report.ok() { "ok" } else { "PROBLEMS FOUND" }
        );
    }
    if report.ok() { 0 } else { 1 }
}
