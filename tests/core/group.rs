//! Volume groups through the library: the cut's locks against other
//! paths that take two heads, and what a group protects.

use crate::common::mount::new_store as store;
use crate::common::{fails, ok};
use forkfs::{SnapshotOptions, Store, StoreConfig, Target, VolumeKind};

/// A diff of two live heads, named in the order opposite to the volumes'
/// ids, runs beside group snapshots of both without a deadlock.
#[test]
fn a_diff_of_two_heads_and_a_group_snapshot_do_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    for v in ["a", "b"] {
        s.volumes().create(v, VolumeKind::Fs, None, None).unwrap();
    }
    s.graph().group_create("env", &["a".into(), "b".into()]).unwrap();
    let s = std::sync::Arc::new(s);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let differ = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let (b, a) = (s.volumes().get("b").unwrap(), s.volumes().get("a").unwrap());
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                s.graph().diff(&Target::Head(b.clone()), &Target::Head(a.clone())).unwrap();
            }
        })
    };
    let snapper = {
        let s = s.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                s.graph().group_snapshot("env", &SnapshotOptions::default()).unwrap();
            }
        })
    };
    let start = std::time::Instant::now();
    while !snapper.is_finished() {
        assert!(start.elapsed().as_secs() < 60, "group snapshots and a diff deadlocked");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    snapper.join().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    differ.join().unwrap();
    assert_eq!(s.graph().group_log("env").unwrap().len(), 200);
}

/// A member volume, or one whose versions a group version names, is not
/// deleted from under its group.
#[test]
fn a_group_keeps_its_members() {
    let (_d, s) = store();
    ok(&s, &["volume", "create", "a"]);
    ok(&s, &["volume", "create", "b"]);
    ok(&s, &["group", "create", "env", "a", "b"]);
    ok(&s, &["snapshot", "--group", "env", "--name", "one"]);
    let (code, msg) = fails(&s, &["volume", "delete", "b"]);
    assert_eq!(code, 75, "{msg}");
    assert!(msg.contains("group remove env b"), "{msg}");
    ok(&s, &["group", "remove", "env", "b"]);
    let (code, msg) = fails(&s, &["volume", "delete", "b"]);
    assert_eq!(code, 75, "{msg}");
    assert!(msg.contains("group delete env"), "{msg}");
    ok(&s, &["group", "delete", "env"]);
    ok(&s, &["volume", "delete", "b"]);
    let (code, _) = fails(&s, &["snapshot", "--group", "env"]);
    assert_eq!(code, 66);
}

/// A lost index comes back with its groups and group versions.
#[test]
fn groups_survive_an_index_rebuild() {
    let (_d, s) = store();
    ok(&s, &["volume", "create", "a"]);
    ok(&s, &["volume", "create", "b"]);
    ok(&s, &["group", "create", "env", "a", "b"]);
    ok(&s, &["snapshot", "--group", "env", "--name", "one"]);
    ok(&s, &["snapshot", "--group", "env"]);
    let before = (
        crate::common::json(&s, &["group", "list"]),
        crate::common::json(&s, &["log", "--group", "env"]),
    );
    std::fs::remove_dir_all(s.join("index")).unwrap();
    ok(&s, &["fsck", "--repair"]);
    let after = (
        crate::common::json(&s, &["group", "list"]),
        crate::common::json(&s, &["log", "--group", "env"]),
    );
    assert_eq!(before, after);
    assert_eq!(after.1.as_array().unwrap().len(), 2);
}
