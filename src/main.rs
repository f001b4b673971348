//! The `forkfs` command, as a launcher. `snapshot`, `restore` and `fork`
//! of a store that a mount or NBD server holds are control requests to
//! that process: this binary sends them itself, with no store code linked
//! in (RocksDB's alone costs milliseconds to load), so an agent's
//! checkpoint costs little more than the holder's work. Every other
//! command, and those three when no holder answers, it hands to
//! `forkfs-core` (the whole command, `core.rs`) by replacing itself with
//! it.

#[path = "cli/held.rs"]
mod held;
mod home;

use clap::{Parser, Subcommand};
use serde_json::Value;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The commands answered here; anything else fails to parse and goes to
/// `forkfs-core`, which parses the same arguments with the same types.
#[derive(Parser)]
#[command(name = "forkfs")]
struct Quick {
    #[command(flatten)]
    global: held::Global,
    #[command(subcommand)]
    command: QuickCommand,
}

#[derive(Subcommand)]
enum QuickCommand {
    Snapshot(held::SnapshotArgs),
    Fork(held::ForkArgs),
    Restore(held::RestoreArgs),
}

fn main() {
    // Like other command-line tools: `forkfs log | head` ends quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = answer_here(&args) {
        std::process::exit(code);
    }
    // The binary beside this one (as installed, or in a build's target
    // directory), else forkfs-core on PATH.
    const CORE: &str = "forkfs-core";
    let sibling = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(CORE)));
    let program = sibling.filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from(CORE));
    let mut cmd = std::process::Command::new(&program);
    cmd.args(args.iter().skip(1));
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    // Replaces this process: signals, exit codes and the terminal are the
    // command's own.
    let e = cmd.exec();
    eprintln!("forkfs: cannot run {}: {e}", program.display());
    std::process::exit(69);
}

/// Sends a snapshot, restore or fork to the process holding the store
/// and shows its answer; the exit code, or `None` for `forkfs-core` to
/// run the command: another command, bad arguments, or anything but a
/// clean answer from a holder (none answers: the store is free, held
/// without a socket, or its holder is on its way out; or it answered with
/// an error). `forkfs-core` then runs it here or sends it again, and
/// reports whatever is wrong in its words and exit codes. Sending again
/// is safe: a holder that failed a request changed nothing, and one that
/// closes a connection unanswered never read its request.
fn answer_here(args: &[OsString]) -> Option<i32> {
    let quick = Quick::try_parse_from(args).ok()?;
    let held = match &quick.command {
        QuickCommand::Snapshot(a) => a.held(),
        QuickCommand::Fork(a) => a.held(),
        QuickCommand::Restore(a) => a.held(),
    };
    let held = held.ok().flatten()?;
    let dir = quick.global.store_dir();
    let answer = match ask(&dir, held.request()) {
        Ok(Some(answer)) => answer,
        Ok(None) => return None,
        // Silent past the holder's heartbeats: stopped or hung, possibly
        // in the middle of this very request (not one to send twice).
        Err(e) => {
            eprintln!(
                "forkfs: the process holding the store at {} has not answered ({e}): it is \
                 stopped (kill -CONT) or hung (kill it)",
                dir.display()
            );
            return Some(69);
        }
    };
    match held.show(quick.global.json, answer) {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("forkfs: {e:#}");
            Some(1)
        }
    }
}

/// The control socket's exchange (`forkfs::service::call`): one JSON
/// request line; empty lines (heartbeats, one a second while the holder
/// works) and then `{"ok": ANSWER}` or `{"err": ...}`. `Ok(None)` for
/// no connection, no answer or an error answer; `Err` when the holder
/// went silent.
fn ask(dir: &Path, req: &Value) -> std::io::Result<Option<Value>> {
    let Ok(mut s) = UnixStream::connect(dir.join("control.sock")) else { return Ok(None) };
    // As forkfs::service::SILENCE: ten heartbeats missed.
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    if s.write_all(&line).is_err() {
        return Ok(None);
    }
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while line.trim().is_empty() {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(e);
            }
            Err(_) => return Ok(None),
        }
    }
    let answer: Value = serde_json::from_str(&line).unwrap_or_default();
    Ok(answer.get("ok").cloned())
}
