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

/// A volume deleted while a group adds it: either the delete fails (the
/// volume is a member) or the add does (no such volume), never both
/// succeed and leave a group naming a volume that is gone.
#[test]
fn a_volume_deleted_while_a_group_adds_it_is_never_left_in_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    s.volumes().create("keep", VolumeKind::Fs, None, None).unwrap();
    s.graph().group_create("env", &["keep".into()]).unwrap();
    let s = std::sync::Arc::new(s);
    let (mut deleted_first, mut added_first) = (0, 0);
    for i in 0..60 {
        let name = format!("v{i}");
        s.volumes().create(&name, VolumeKind::Fs, None, None).unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let adder = {
            let (s, b, name) = (s.clone(), barrier.clone(), name.clone());
            std::thread::spawn(move || {
                b.wait();
                // Staggered, so that either may come first.
                std::thread::sleep(std::time::Duration::from_micros((i % 10) * 300));
                s.graph().group_change("env", &[name], &[]).is_ok()
            })
        };
        barrier.wait();
        let deleted = s.volumes().delete(&name).is_ok();
        let added = adder.join().unwrap();
        let members = s.graph().group("env").unwrap().members;
        let named = members.iter().any(|m| m.as_str() == name);
        assert!(
            !(deleted && named),
            "round {i}: {name} was deleted and group env still names it (added: {added})"
        );
        assert!(deleted != added, "round {i}: delete {deleted}, add {added}");
        if named {
            added_first += 1;
            s.graph().group_change("env", &[], std::slice::from_ref(&name)).unwrap();
            s.volumes().delete(&name).unwrap();
        } else {
            deleted_first += 1;
        }
    }
    eprintln!("the add won {added_first} rounds, the delete {deleted_first}");
}

/// A store with fs volumes a and b in group env, and its group version `one`.
fn env_with_one() -> (tempfile::TempDir, std::path::PathBuf) {
    let (d, s) = store();
    ok(&s, &["volume", "create", "a"]);
    ok(&s, &["volume", "create", "b"]);
    ok(&s, &["group", "create", "env", "a", "b"]);
    ok(&s, &["snapshot", "--group", "env", "--name", "one"]);
    (d, s)
}

/// A member volume, or one whose versions a group version names, is not
/// deleted from under its group.
#[test]
fn a_group_keeps_its_members() {
    let (_d, s) = env_with_one();
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
    let (_d, s) = env_with_one();
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

/// Group versions are thinned as units: a pruned group version leaves the
/// group's log with its members' versions, unless something else keeps
/// them; named group versions and restore undo points stay whole.
#[test]
fn group_versions_are_thinned_as_units() {
    use forkfs::Policy;
    use forkfs::fs::{FileKind, ROOT_INO};
    let dir = tempfile::tempdir().unwrap();
    let s = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    let (g, v) = (s.graph(), s.volumes());
    for name in ["a", "b"] {
        v.create(name, VolumeKind::Fs, None, None).unwrap();
    }
    g.group_create("env", &["a".to_string(), "b".to_string()]).unwrap();
    let a = v.open_fs("a").unwrap();
    let f = a.create(ROOT_INO, b"f", FileKind::File, 0o644, (0, 0), None).unwrap();
    let mut taken = Vec::new();
    for i in 0..12u8 {
        a.write_file(f.ino, 0, &[i; 10]).unwrap();
        taken.push(g.group_snapshot("env", &SnapshotOptions::default()).unwrap());
    }
    let named = SnapshotOptions { name: Some("keep".into()), ..Default::default() };
    let named = g.group_snapshot("env", &named).unwrap();
    let undo = g.group_restore("env", &taken[3]).unwrap();
    // A member version named on its own stays when its group version goes.
    let tagged = g.member_versions(&taken[1]).unwrap().remove(0);
    g.tag(&tagged, "mine").unwrap();
    let seqs = |l: &[forkfs::GroupVersion]| l.iter().map(|x| x.seq).collect::<Vec<_>>();
    let before = g.group_log("env").unwrap();

    let policy = Policy { keep_recent: 2, unit_ms: 1, per_bucket: 1 };
    let later = forkfs::now_ms() + 3_600_000;
    let would = g.prune_group("env", &policy, later, true).unwrap();
    assert_eq!(seqs(&g.group_log("env").unwrap()), seqs(&before), "a dry run changed the log");
    let pruned = g.prune_group("env", &policy, later, false).unwrap();
    assert_eq!(seqs(&pruned), seqs(&would));
    assert!(pruned.len() >= 6, "only {} of 12 unnamed group versions pruned", pruned.len());

    let after = g.group_log("env").unwrap();
    assert_eq!(after.len() + pruned.len(), before.len());
    for kept in [&named, &undo] {
        assert!(after.iter().any(|x| x.seq == kept.seq), "group version {} went", kept.seq);
    }
    // What stays is whole; what went took its members along.
    for x in &after {
        assert_eq!(g.member_versions(x).unwrap().len(), 2, "group version {}", x.seq);
    }
    // Kept apart from any group version: a name, the heads' bases (the
    // restore moved them to taken[3]'s members), a group version that stays.
    let mut keep = vec![tagged.id];
    for name in ["a", "b"] {
        keep.extend(v.head_base(&v.get(name).unwrap()).unwrap());
    }
    keep.extend(after.iter().flat_map(|x| x.members.iter().map(|n| n.version)));
    let mut gone = 0;
    for m in pruned.iter().flat_map(|x| &x.members) {
        let found = g.resolve(&format!("{}@{}", m.volume, m.version)).is_ok();
        assert_eq!(found, keep.contains(&m.version), "{}@{}", m.volume, m.version.short());
        gone += usize::from(!found);
    }
    assert!(gone >= 2 * pruned.len() - 3, "{gone} member versions went");
    // The store stays sound, and a second prune at the same time has nothing left.
    assert!(s.check().unwrap().ok(), "{:?}", s.check().unwrap().problems);
    assert!(g.prune_group("env", &policy, later, false).unwrap().is_empty());
}

#[test]
fn group_prune_from_the_command_line() {
    let (_d, s) = store();
    ok(&s, &["volume", "create", "a"]);
    ok(&s, &["group", "create", "env", "a"]);
    for _ in 0..4 {
        ok(&s, &["snapshot", "--group", "env"]);
    }
    let out = ok(&s, &["group", "prune", "env", "--keep-recent", "1", "--dry-run"]);
    assert!(out.starts_with("would prune "), "{out}");
    let all = crate::common::json(&s, &["log", "--group", "env"]);
    assert_eq!(all.as_array().unwrap().len(), 4);
    // Everything that may go goes, but the newest: its number is not
    // given again, so `env@3` keeps naming the same cut.
    let prune = ["group", "prune", "env", "--keep-recent", "0", "--per-bucket", "0"];
    let out = ok(&s, &prune);
    assert!(out.starts_with("pruned 3 "), "{out}");
    ok(&s, &["snapshot", "--group", "env"]);
    let log = crate::common::json(&s, &["log", "--group", "env"]);
    let seqs: Vec<u64> =
        log.as_array().unwrap().iter().map(|g| g["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![4, 3], "{log}");
    let (code, err) = fails(&s, &["group", "prune", "nope"]);
    assert_eq!(code, 66, "{err}");
}
