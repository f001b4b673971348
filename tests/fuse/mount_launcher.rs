//! The `forkfs` launcher (`src/main.rs`): a snapshot, restore or fork of a
//! mounted workspace is answered without `forkfs-core`, and the launcher
//! links no store code (RocksDB's loading alone took milliseconds of every
//! command), so an agent's checkpoint costs little more than the mount's
//! work.

use crate::common::mount::{Mounted, new_store};
use crate::common::{forkfs_bin, ok};
use std::path::Path;
use std::process::{Command, Output};

/// The launcher run from a directory of its own (no forkfs-core beside it;
/// PATH is that directory, which the launcher would not search anyway).
fn alone(launcher: &Path, store: &Path, args: &[&str]) -> Output {
    Command::new(launcher)
        .arg("--store")
        .arg(store)
        .args(args)
        .env("PATH", launcher.parent().expect("the launcher's directory"))
        .env_remove("FORKFS_STORE")
        .output()
        .expect("run the launcher")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_launcher_answers_a_mounted_store_alone_and_links_no_store_code() {
    let bytes = std::fs::read(forkfs_bin()).expect("read the launcher");
    assert!(
        !bytes.windows(7).any(|w| w == b"rocksdb"),
        "the forkfs launcher links RocksDB: it must not use the forkfs library"
    );
    let d = tempfile::tempdir().unwrap();
    let launcher = d.path().join("forkfs");
    std::fs::copy(forkfs_bin(), &launcher).unwrap();
    let (_s, store) = new_store();
    let m = Mounted::new(&store, "w", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("f"), b"one").unwrap();
    let snap = alone(&launcher, &store, &["snapshot", "w", "--name", "one"]);
    assert!(snap.status.success(), "snapshot: {}", text(&snap.stderr));
    assert!(text(&snap.stdout).starts_with("w@"), "snapshot printed {}", text(&snap.stdout));
    std::fs::write(m.path("f"), b"two").unwrap();
    let back = alone(&launcher, &store, &["restore", "w", "one", "--json"]);
    assert!(back.status.success(), "restore: {}", text(&back.stderr));
    let ids: serde_json::Value = serde_json::from_slice(&back.stdout).unwrap();
    assert!(ids["restored"].is_string() && ids["previous_head"].is_string(), "{ids}");
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"one", "the restore did not land");
    let fork = alone(&launcher, &store, &["fork", "w@one", "w2"]);
    assert!(fork.status.success(), "fork: {}", text(&fork.stderr));
    assert!(text(&fork.stdout).ends_with("as w2\n"), "fork printed {}", text(&fork.stdout));
    // The holder's error, shown as forkfs-core shows it, and not sent
    // again (forkfs-core is not here to send it).
    let again = alone(&launcher, &store, &["fork", "w@one", "w2"]);
    assert_eq!(again.status.code(), Some(75), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("already exists"), "{}", text(&again.stderr));
    // The versions are there for the whole command too.
    let log = ok(&store, &["log", "w"]);
    assert!(log.contains("before restore to"), "{log}");
    // Everything else is forkfs-core's, which this directory lacks.
    let other = alone(&launcher, &store, &["log", "w"]);
    assert_eq!(other.status.code(), Some(69), "{}", text(&other.stderr));
    let why = text(&other.stderr);
    assert!(why.contains("cannot run") && why.contains("forkfs-core"), "{why}");
    drop(m);
}
