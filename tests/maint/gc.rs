//! Garbage collection: what it reclaims, what it must leave (grace period,
//! dry run, live data), compaction, and GC running while writers write and
//! deduplicate against garbage (with a negative control showing the test
//! catches a GC that ignores writers).

use crate::common::json;
use forkfs::Quiet;
use forkfs::{GcOptions, GcReport};
use forkfs::{SnapshotOptions, Store, StoreConfig, VersionId, VolumeKind};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const BS: usize = 4096;

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random()).collect()
}

fn read(store: &Store, spec: &str, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    match store.graph().resolve(spec).unwrap() {
        forkfs::Target::Head(v) => {
            store.volumes().open_block(v.name.as_str()).unwrap().read_at(0, &mut buf).unwrap()
        }
        forkfs::Target::Version(v) => {
            store.graph().frozen(&v).unwrap().read_at(0, &mut buf).unwrap()
        }
    }
    buf
}

fn pack_bytes(store: &Path) -> u64 {
    std::fs::read_dir(store.join("objects/packs"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn now_gc(store: &Store, compact_below: f64) -> GcReport {
    let opts = GcOptions { grace: Duration::ZERO, compact_below, ..Default::default() };
    store.gc(&opts, &Quiet).unwrap()
}

#[test]
fn gc_reclaims_a_deleted_version_and_honours_dry_run_and_grace() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("store");
    const SIZE: usize = 1 << 20;
    let (old, new) = (random(SIZE, 1), random(SIZE, 2));
    {
        let cfg = StoreConfig { pack_target: 128 << 10, ..Default::default() };
        let store = Store::init(&s, cfg).unwrap();
        store
            .volumes()
            .create("disk", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32))
            .unwrap();
        let head = store.volumes().open_block("disk").unwrap();
        head.write_at(0, &old).unwrap();
        let v1 = store.graph().snapshot("disk", &SnapshotOptions::default()).unwrap();
        head.write_at(0, &new).unwrap();
        store
            .graph()
            .snapshot("disk", &SnapshotOptions { name: Some("keep".into()), ..Default::default() })
            .unwrap();
        store.graph().delete_version(&v1).unwrap();
    }
    let before = pack_bytes(&s);

    let dry = json(&s, &["gc", "--dry-run", "--grace", "0s"]);
    assert!(dry["bytes_reclaimed"].as_u64().unwrap() >= SIZE as u64 * 9 / 10, "{dry}");
    assert_eq!(pack_bytes(&s), before, "a dry run changed the store");

    let graced = json(&s, &["gc"]);
    assert_eq!(graced["packs_deleted"], 0, "the default grace period protects new packs: {graced}");
    assert!(graced["packs_in_grace"].as_u64().unwrap() > 0, "{graced}");
    assert_eq!(pack_bytes(&s), before);

    let done = json(&s, &["gc", "--grace", "0s"]);
    assert!(done["packs_deleted"].as_u64().unwrap() > 0, "{done}");
    let after = pack_bytes(&s);
    assert!(before - after >= SIZE as u64 * 9 / 10, "reclaimed only {} bytes", before - after);

    let store = Store::open(&s).unwrap();
    assert!(read(&store, "disk@keep", SIZE) == new, "the kept version changed");
    assert!(read(&store, "disk", SIZE) == new, "the head changed");
    let report = store.check().unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.unindexed_packs, 0);
}

#[test]
fn compaction_rewrites_mostly_dead_packs_and_keeps_live_chunks() {
    let d = tempfile::tempdir().unwrap();
    const SIZE: usize = 1 << 20;
    let cfg = StoreConfig { pack_target: 4 << 20, ..Default::default() };
    let store = Store::init(d.path(), cfg).unwrap();
    store.volumes().create("disk", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32)).unwrap();
    let head = store.volumes().open_block("disk").unwrap();
    let mut data = random(SIZE, 3);
    head.write_at(0, &data).unwrap();
    let v1 = store.graph().snapshot("disk", &SnapshotOptions::default()).unwrap();
    // Overwrite 15/16 of the device: the first pack keeps 1/16 live.
    let fresh = random(SIZE - SIZE / 16, 4);
    head.write_at((SIZE / 16) as u64, &fresh).unwrap();
    data[SIZE / 16..].copy_from_slice(&fresh);
    store.graph().snapshot("disk", &SnapshotOptions::default()).unwrap();
    store.graph().delete_version(&v1).unwrap();

    let r = now_gc(&store, 0.5);
    assert!(r.packs_compacted >= 1 && r.packs_written >= 1, "{r:?}");
    assert!(r.bytes_reclaimed >= (SIZE as u64) * 3 / 4, "{r:?}");
    assert!(read(&store, "disk@~0", SIZE) == data);
    let check = store.check().unwrap();
    assert!(check.ok(), "{:?}", check.problems);
    // Nothing left to do.
    let again = now_gc(&store, 0.5);
    assert_eq!((again.packs_deleted, again.packs_compacted), (0, 0), "{again:?}");
}

/// A writer that keeps reviving old content (so it deduplicates against
/// chunks that are garbage at the moment) while GCs run back to back.
/// Returns the problems found afterwards.
fn gc_during_writes(opts: GcOptions, seed: u64) -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    // Two blocks cycling through three contents each: every round the last
    // version's data and nodes become garbage, and come back two rounds
    // later, deduplicated against chunks a GC may be about to sweep.
    const SIZE: usize = 2 * BS;
    let cfg = StoreConfig { pack_target: 16 << 10, ..Default::default() };
    let store = Store::init(d.path(), cfg).unwrap();
    store.volumes().create("disk", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32)).unwrap();
    let stop = AtomicBool::new(false);
    let pattern = |p: u64| random(BS, 1000 + p);
    let mut problems = Vec::new();
    let kept: HashMap<VersionId, Vec<u8>> = std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let head = store.volumes().open_block("disk").unwrap();
            let mut model = vec![0u8; SIZE];
            let mut kept: Vec<(VersionId, Vec<u8>)> = Vec::new();
            let mut run = || -> forkfs::Result<()> {
                for round in 0..400u64 {
                    for block in 0..SIZE / BS {
                        let data = pattern(block as u64 * 3 + (round + rng.random_range(0..2)) % 3);
                        head.write_at((block * BS) as u64, &data)?;
                        model[block * BS..(block + 1) * BS].copy_from_slice(&data);
                    }
                    let v = store.graph().snapshot("disk", &SnapshotOptions::default())?;
                    kept.push((v.id, model.clone()));
                    // Keep a few versions: the rest become garbage to revive later.
                    if kept.len() > 1 {
                        // Each version is verified before it goes, so damage
                        // shows even when the version does not last.
                        let (old, want) = kept.remove(rng.random_range(0..kept.len() - 1));
                        let v = store.graph().version(&old)?;
                        let mut buf = vec![0u8; SIZE];
                        store.graph().frozen(&v)?.read_at(0, &mut buf)?;
                        if buf != want {
                            return Err(forkfs::Error::corrupt(format!("version {old} differs")));
                        }
                        store.graph().delete_version(&v)?;
                    }
                }
                Ok(())
            };
            let res = run();
            stop.store(true, Ordering::SeqCst);
            (kept.into_iter().collect(), res)
        });
        while !stop.load(Ordering::SeqCst) {
            if let Err(e) = store.gc(&opts, &Quiet) {
                // A GC that ignores writers may find the store already damaged.
                assert!(opts.unsafe_ignore_writers, "gc failed: {e}");
            }
        }
        let (kept, res) = writer.join().unwrap();
        if let Err(e) = res {
            problems.push(format!("writer failed: {e}"));
        }
        kept
    });
    for (id, want) in &kept {
        let v = store.graph().version(id).unwrap();
        let mut buf = vec![0u8; SIZE];
        match store.graph().frozen(&v).and_then(|f| f.read_at(0, &mut buf)) {
            Ok(()) if buf == *want => {}
            Ok(()) => problems.push(format!("version {id} differs")),
            Err(e) => problems.push(format!("version {id} unreadable: {e}")),
        }
    }
    let opts = GcOptions { grace: Duration::ZERO, compact_below: 0.9, ..Default::default() };
    if let Err(e) = store.gc(&opts, &Quiet) {
        problems.push(format!("final gc: {e}"));
    }
    problems.extend(store.check().unwrap().problems);
    problems
}

#[test]
fn gc_running_beside_writers_loses_nothing() {
    for seed in 0..5 {
        let opts = GcOptions { grace: Duration::ZERO, compact_below: 0.9, ..Default::default() };
        let problems = gc_during_writes(opts, seed);
        assert!(problems.is_empty(), "seed {seed}: {problems:#?}");
    }
}

/// Negative control: the same test catches a GC that ignores writers.
#[test]
fn the_concurrency_test_catches_a_gc_that_ignores_writers() {
    let caught = (0..3).any(|seed| {
        let opts = GcOptions {
            grace: Duration::ZERO,
            compact_below: 0.9,
            unsafe_ignore_writers: true,
            ..Default::default()
        };
        !gc_during_writes(opts, seed).is_empty()
    });
    assert!(caught, "a GC that ignores writers went unnoticed");
}
