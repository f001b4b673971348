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
use std::io::{BufRead, BufReader, ErrorKind, Write};
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
    // The binary beside this one, as installed or built, never another
    // build's from PATH (which is searched only if this binary's own path
    // cannot be read).
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("forkfs-core")))
        .unwrap_or_else(|| PathBuf::from("forkfs-core"));
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
/// run the command: another command, bad arguments, or no answer from a
/// holder (none listens: the store is free or held without a socket; the
/// holder is on its way out, says so, or closed the connection
/// unanswered), which forkfs-core then waits out or runs itself, as it
/// would have. The holder's errors are shown here, as forkfs-core shows
/// them: it has done what it will of the request, which is not sent twice.
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
        Answer::Ok(answer) => answer,
        Answer::Elsewhere => return None,
        Answer::Err { kind, message } => {
            eprintln!("forkfs: {}", message.replace('\n', " "));
            return Some(exit_code(&kind));
        }
        // Silent past the holder's heartbeats: stopped or hung, possibly
        // in the middle of this very request.
        Answer::Silent => {
            eprintln!(
                "forkfs: the process holding the store at {} has not answered for 10 s: it is \
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

/// What the holder of a store said to a request.
enum Answer {
    Ok(Value),
    Err {
        kind: String,
        message: String,
    },
    /// Nobody took the request: for forkfs-core to run.
    Elsewhere,
    Silent,
}

/// The control socket's exchange (`forkfs::service::call`): one JSON
/// request line; empty lines (heartbeats, one a second while the holder
/// works) and then `{"ok": ANSWER}` or `{"err": {"kind", "message",
/// "exiting"}}`.
fn ask(dir: &Path, req: &Value) -> Answer {
    let Ok(mut s) = UnixStream::connect(dir.join("control.sock")) else { return Answer::Elsewhere };
    // As forkfs::service::SILENCE: ten heartbeats missed.
    let silence = Some(Duration::from_secs(10));
    if s.set_read_timeout(silence).and_then(|()| s.set_write_timeout(silence)).is_err() {
        return Answer::Elsewhere;
    }
    let Ok(mut line) = serde_json::to_vec(req) else { return Answer::Elsewhere };
    line.push(b'\n');
    if s.write_all(&line).is_err() {
        return Answer::Elsewhere;
    }
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while line.trim().is_empty() {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Answer::Elsewhere,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Answer::Silent;
            }
            Err(_) => return Answer::Elsewhere,
        }
    }
    let answer: Value = serde_json::from_str(&line).unwrap_or_default();
    if let Some(ok) = answer.get("ok") {
        return Answer::Ok(ok.clone());
    }
    let err = &answer["err"];
    match (err["kind"].as_str(), err["message"].as_str()) {
        (Some(kind), Some(message)) if err["exiting"] != Value::Bool(true) => {
            Answer::Err { kind: kind.to_string(), message: message.to_string() }
        }
        _ => Answer::Elsewhere,
    }
}

/// The exit code of an error of this kind, as the control socket names
/// it (`forkfs::ErrorKind`, whose `exit_code` this follows; a test checks
/// it): sysexits-style, 1 for a kind this build does not know.
fn exit_code(kind: &str) -> i32 {
    match kind {
        "invalid-input" => 64,
        "corrupt" => 65,
        "not-found" => 66,
        "unavailable" => 69,
        "no-space" => 73,
        "read-only" | "conflict" => 75,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::exit_code;
    use super::{Quick, QuickCommand};
    use clap::Parser;
    use forkfs::service::Request;

    fn request(args: &[&str]) -> Request {
        let quick = Quick::try_parse_from([&["forkfs"], args].concat()).unwrap();
        let held = match quick.command {
            QuickCommand::Snapshot(a) => a.held(),
            QuickCommand::Fork(a) => a.held(),
            QuickCommand::Restore(a) => a.held(),
        };
        let held = held.unwrap().expect("one request");
        serde_json::from_value(held.request().clone()).expect("a control request")
    }

    /// The JSON written here is the control socket's `Request`, field by field.
    #[test]
    fn requests_are_the_control_sockets() {
        let s = request(&["snapshot", "w", "--name", "n", "-m", "label"]);
        assert!(
            matches!(&s, Request::Snapshot { volume, name: Some(n), label: Some(l) }
                if volume == "w" && n == "n" && l == "label"),
            "{s:?}"
        );
        let f = request(&["fork", "w@v", "w2"]);
        assert!(
            matches!(&f, Request::Fork { source, new } if source == "w@v" && new == "w2"),
            "{f:?}"
        );
        let r = request(&["restore", "w", "~1"]);
        assert!(
            matches!(&r, Request::Restore { volume, version } if volume == "w" && version == "~1"),
            "{r:?}"
        );
    }

    /// Exit codes by kind name are the library's.
    #[test]
    fn exit_codes_are_the_librarys() {
        use forkfs::ErrorKind::*;
        for k in [NotFound, Corrupt, Unavailable, InvalidInput, ReadOnly, NoSpace, Conflict] {
            let name = serde_json::to_value(k).unwrap();
            assert_eq!(exit_code(name.as_str().unwrap()), k.exit_code(), "{k:?}");
        }
    }
}
