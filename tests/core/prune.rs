//! Retention pruning on a real store: only unprotected automatic versions
//! go, and every version that stays still reads back.

use forkfs::Policy;
use forkfs::{Origin, SnapshotOptions, Store, StoreConfig, VolumeKind};

#[test]
fn prune_thins_auto_versions_and_protects_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    store.volumes().create("v", VolumeKind::Block, Some(1 << 20), Some(4096)).unwrap();
    // Pruning by hand only: automatic pruning has its own test below.
    store.volumes().set_retention("v", None, false).unwrap();
    let head = store.volumes().open_block("v").unwrap();
    let auto = SnapshotOptions { origin: Some(Origin::Auto), ..Default::default() };
    let mut all = Vec::new();
    for i in 0..40u8 {
        head.write_at(i as u64 * 4096, &[i + 1; 4096]).unwrap();
        let opts = match i {
            5 => SnapshotOptions {
                name: Some("named".into()),
                origin: Some(Origin::Auto),
                ..Default::default()
            },
            9 => SnapshotOptions::default(), // manual
            _ => auto.clone(),
        };
        all.push(store.graph().snapshot("v", &opts).unwrap());
    }
    store.graph().fork(&all[12], "child").unwrap();
    // A year later, with buckets of 1 ms: almost every auto version is surplus.
    let now = all.last().unwrap().created_at_ms + 365 * 24 * 3600 * 1000;
    let policy = Policy { keep_recent: 3, unit_ms: 1, per_bucket: 1 };
    let planned = store.graph().prune("v", &policy, now, true).unwrap();
    assert_eq!(
        store.graph().log(&store.volumes().get("v").unwrap()).unwrap().len(),
        40,
        "dry run changed nothing"
    );
    let pruned = store.graph().prune("v", &policy, now, false).unwrap();
    assert_eq!(planned, pruned);
    assert!(pruned.len() > 25, "only {} pruned", pruned.len());
    let gone: std::collections::HashSet<_> = pruned.iter().map(|v| v.id).collect();
    for (i, v) in all.iter().enumerate() {
        let protected = i == 5 || i == 9 || i == 12 || i == 39;
        assert!(!(protected && gone.contains(&v.id)), "protected version {i} was pruned");
        if !gone.contains(&v.id) {
            let mut buf = vec![0u8; 4096];
            store.graph().frozen(v).unwrap().read_at(i as u64 * 4096, &mut buf).unwrap();
            assert_eq!(buf, vec![i as u8 + 1; 4096], "kept version {i} reads back");
        }
    }
    assert!(store.check().unwrap().ok());
}

#[test]
fn prune_dispatches_from_the_forkfs_cli() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("store");
    crate::common::ok(&s, &["init"]);
    crate::common::ok(&s, &["volume", "create", "v", "--block", "--size", "1M"]);
    let out = crate::common::ok(&s, &["prune", "v", "--dry-run"]);
    assert!(out.contains("0 versions would be pruned"), "{out}");
    let (code, _) = crate::common::fails(&s, &["prune", "nope"]);
    assert_eq!(code, 66);
}

#[test]
fn automatic_checkpoints_prune_by_the_volume_policy() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    for (name, auto_prune) in [("on", true), ("off", false)] {
        store.volumes().create(name, VolumeKind::Block, Some(1 << 20), Some(4096)).unwrap();
        let policy = Policy { keep_recent: 3, unit_ms: 3_600_000, per_bucket: 1 };
        store.volumes().set_retention(name, Some(policy), auto_prune).unwrap();
        let head = store.volumes().open_block(name).unwrap();
        let auto = SnapshotOptions { origin: Some(Origin::Auto), ..Default::default() };
        let named = SnapshotOptions { name: Some("keep".into()), ..auto.clone() };
        for i in 0..12u8 {
            head.write_at(i as u64 * 4096, &[i + 1; 4096]).unwrap();
            store.graph().snapshot(name, if i == 1 { &named } else { &auto }).unwrap();
        }
    }
    let count = |name: &str| store.graph().log(&store.volumes().get(name).unwrap()).unwrap().len();
    assert_eq!(count("off"), 12, "auto-prune off must keep every version");
    // The head's base (the newest, protected), the 3 newest candidates, one
    // per bucket (all are in the first hour's bucket), and the named one.
    let kept = store.graph().log(&store.volumes().get("on").unwrap()).unwrap();
    let seqs: Vec<u64> = kept.iter().map(|v| v.seq).collect();
    assert_eq!(kept.len(), 1 + 3 + 1 + 1, "kept {seqs:?}");
    assert!(store.graph().resolve("on@keep").is_ok(), "a named version was pruned");
    assert_eq!(seqs[seqs.len() - 4..], [8, 9, 10, 11], "the newest versions must stay");
}

/// The automatic pruning a control request's version calls for, held
/// until the request is answered (see the test below for the holding),
/// still happens.
#[test]
fn pruning_a_control_request_calls_for_still_happens() {
    use forkfs::service::{Request, call, serve};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let store = Store::init(&path, StoreConfig::default()).unwrap();
    store.volumes().create("v", VolumeKind::Block, Some(1 << 20), Some(4096)).unwrap();
    let policy = Policy { keep_recent: 2, unit_ms: 3_600_000, per_bucket: 1 };
    store.volumes().set_retention("v", Some(policy), true).unwrap();
    let head = store.volumes().open_block("v").unwrap();
    let _server = serve(store.clone(), Default::default()).unwrap();
    for i in 0..6u8 {
        head.write_at(0, &[i + 1; 4096]).unwrap();
        // A fork of the head takes an automatic version of it first; the
        // fork goes again, so nothing protects that version.
        let new = format!("f{i}");
        call(&path, &Request::Fork { source: "v".into(), new: new.clone() }).unwrap();
        call(&path, &Request::DeleteVolume { name: new }).unwrap();
    }
    // The head's base (the newest), the 2 newest candidates before it and
    // the oldest of the hour's bucket: 4 of the 6.
    let count = || store.graph().log(&store.volumes().get("v").unwrap()).unwrap().len();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while count() != 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(count(), 4, "the automatic versions were not pruned");
}

/// Inside [`forkfs::Graph::pruning_after`] an automatic version's pruning
/// waits, and happens when the held prunings run.
#[test]
fn pruning_held_by_a_request_waits_for_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    store.volumes().create("v", VolumeKind::Block, Some(1 << 20), Some(4096)).unwrap();
    let policy = Policy { keep_recent: 2, unit_ms: 3_600_000, per_bucket: 1 };
    store.volumes().set_retention("v", Some(policy), true).unwrap();
    let head = store.volumes().open_block("v").unwrap();
    let auto = SnapshotOptions { origin: Some(Origin::Auto), ..Default::default() };
    let count = || store.graph().log(&store.volumes().get("v").unwrap()).unwrap().len();
    let ((), held) = store.graph().pruning_after(|| {
        for i in 0..6u8 {
            head.write_at(0, &[i + 1; 4096]).unwrap();
            store.graph().snapshot("v", &auto).unwrap();
        }
    });
    assert_eq!(count(), 6, "pruned before the request was answered");
    assert_eq!(held.volumes(), ["v"]);
    held.run(store.graph());
    // The head's base, the 2 newest candidates and the hour's oldest.
    assert_eq!(count(), 4);
}
