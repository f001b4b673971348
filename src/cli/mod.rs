//! The `forkfs` CLI (`forkfs-core`): one module per subcommand, shared
//! flags in [`Global`]; `held.rs` is also the `forkfs` launcher's.

mod bundle;
mod data;
mod debug;
mod fork;
mod group;
pub mod held;
mod init;
mod log;
mod output;
mod run;
mod snapshot;
mod status;
mod volume;

use clap::{Parser, Subcommand};
use forkfs::service::Request;
use forkfs::{Settings, Store};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "forkfs",
    version,
    about = "Forkable, versioned workspaces and disks on a copy-on-write, content-addressed store"
)]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

pub use held::Global;

impl Global {
    /// How this process uses the store (from the `FORKFS_*` environment).
    pub fn settings(&self) -> Settings {
        Settings::from_env()
    }

    /// Runs a control request here, or in the process that holds the
    /// store; its answer, decoded.
    pub fn call<T: serde::de::DeserializeOwned>(&self, req: &Request) -> anyhow::Result<T> {
        self.call_with(req, &forkfs::Quiet)
    }

    /// [`Global::call`], showing the request's progress.
    pub fn call_with<T: serde::de::DeserializeOwned>(
        &self,
        req: &Request,
        progress: &dyn forkfs::Progress,
    ) -> anyhow::Result<T> {
        let v = forkfs::service::run(&self.store_dir(), &self.settings(), req, progress)?;
        Ok(serde_json::from_value(v)?)
    }

    /// Runs the one request of a snapshot, restore or fork (`held.rs`)
    /// and shows its answer.
    pub fn run_held(&self, held: &held::Held) -> anyhow::Result<()> {
        let req: Request = serde_json::from_value(held.request().clone())?;
        held.show(self.json, self.call(&req)?)
    }

    pub fn open(&self) -> forkfs::Result<Store> {
        Store::open_with(&self.store_dir(), &self.settings())
    }
}

#[derive(Subcommand)]
enum Command {
    /// Create a new store
    Init(init::Args),
    /// Create, list or delete volumes
    #[command(subcommand)]
    Volume(volume::Cmd),
    /// Record a volume's current state as a new version
    Snapshot(snapshot::Args),
    /// Make every write so far durable in the store's object store (a
    /// version of each changed volume; with a remote store, in the bucket)
    Sync(snapshot::SyncArgs),
    /// Create a new volume from a version (constant time)
    Fork(fork::ForkArgs),
    /// Set a volume's head to a version (the old head is kept as a version)
    Restore(fork::RestoreArgs),
    /// Name a version (named versions are never pruned)
    Tag(snapshot::TagArgs),
    /// Remove a version's name
    Untag(snapshot::UntagArgs),
    /// Delete a version
    #[command(name = "delete-version")]
    DeleteVersion(snapshot::DeleteArgs),
    /// List a volume's versions, newest first
    Log(log::LogArgs),
    /// Show what changed between two versions, or a version and the head
    Diff(log::DiffArgs),
    /// Copy a raw image (block volume) or a directory tree (fs volume) into a volume
    Import(data::ImportArgs),
    /// Copy a volume or version out to a raw image or a directory tree
    Export(data::ExportArgs),
    /// Volume groups: volumes snapshotted, restored and forked together
    /// (snapshot, restore, fork, log and diff take --group)
    #[command(subcommand)]
    Group(group::Cmd),
    /// Carry a volume's history to another store: create, import or verify a bundle
    #[command(subcommand)]
    Bundle(bundle::Cmd),
    /// Volumes, sizes, stored bytes and dedupe ratio
    Status(status::Args),
    /// Mount an fs volume (or a version, read-only) through FUSE
    Mount(forkfs::mount::Args),
    /// Run a command between two versions of a volume (one reversible step)
    Run(run::Args),
    /// Unmount a mounted volume and wait for its process to finish
    Umount(forkfs::mount::UmountArgs),
    /// Serve volumes over NBD (runs forkfs-nbd)
    #[command(external_subcommand)]
    External(Vec<String>),
    /// Internal tools for tests
    #[command(subcommand, hide = true)]
    Debug(debug::Cmd),
}

/// Runs the CLI and returns the process exit code.
pub fn run() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    init_tracing(cli.global.verbose);
    let g = cli.global.clone();
    let result = match cli.command {
        Command::Init(a) => init::run(&g, a),
        Command::Volume(c) => volume::run(&g, c),
        Command::Snapshot(a) => snapshot::run(&g, a),
        Command::Sync(a) => snapshot::sync(&g, a),
        Command::Fork(a) => fork::fork(&g, a),
        Command::Restore(a) => fork::restore(&g, a),
        Command::Tag(a) => snapshot::tag(&g, a),
        Command::Untag(a) => snapshot::untag(&g, a),
        Command::DeleteVersion(a) => snapshot::delete(&g, a),
        Command::Log(a) => log::log(&g, a),
        Command::Diff(a) => log::diff(&g, a),
        Command::Import(a) => data::import(&g, a),
        Command::Export(a) => data::export(&g, a),
        Command::Bundle(c) => bundle::run(&g, c),
        Command::Group(c) => group::run(&g, c),
        Command::Status(a) => status::run(&g, a),
        Command::Mount(a) => forkfs::mount::mount(&g.store_dir(), &g.settings(), a),
        Command::Umount(a) => forkfs::mount::umount(&g.store_dir(), a),
        Command::Run(a) => match run::run(&g, a) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::External(args) => return external(&g, args),
        Command::Debug(c) => debug::run(&g, c),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("forkfs: {}", one_line(&e));
            exit_code(&e)
        }
    }
}

fn one_line(e: &anyhow::Error) -> String {
    forkfs::one_line(e.as_ref())
}

/// Exit codes by error kind (sysexits-style), so scripts can tell them apart.
fn exit_code(e: &anyhow::Error) -> i32 {
    forkfs::exit_code(e.as_ref())
}

/// `forkfs nbd ...` runs `forkfs-nbd ...`, `forkfs fsck ...` runs
/// `forkfs-fsck check ...`, `forkfs gc|prune ...` run `forkfs-fsck gc|prune ...`.
fn external(g: &Global, args: Vec<String>) -> i32 {
    let Some(sub) = args.first() else { return 2 };
    let (bin, rest): (&str, Vec<String>) = match sub.as_str() {
        "nbd" => ("forkfs-nbd", args[1..].to_vec()),
        "fsck" => ("forkfs-fsck", [&["check".to_string()], &args[1..]].concat()),
        "gc" | "prune" => ("forkfs-fsck", args.clone()),
        other => {
            eprintln!("forkfs: unknown command {other:?} (see forkfs --help)");
            return 2;
        }
    };
    // Prefer the binary next to this one, then PATH.
    let sibling = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(bin)));
    let program = sibling.filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from(bin));
    let mut cmd = std::process::Command::new(&program);
    if let Some(s) = &g.store {
        cmd.env("FORKFS_STORE", s);
    }
    cmd.args(&rest);
    if g.json {
        cmd.arg("--json");
    }
    // Replace this process (like git): signals, exit codes and a SIGKILL
    // reach the program itself, and no child outlives a killed parent.
    use std::os::unix::process::CommandExt;
    let e = cmd.exec();
    eprintln!("forkfs: cannot run {}: {e}", program.display());
    69
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // fuser warns when its own unmount finds the mount already gone.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},fuser=error")));
    // A log on a full disk must not panic the thread that logs (the
    // fmt layer reports its own write errors with eprintln!, which panics
    // when stderr fails: a daemon's stderr is its log file).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .try_init();
}
