//! Crash safety of GC: `forkfs gc` is SIGKILLed at random points while it
//! sweeps and compacts; after each kill the store must pass a deep check,
//! every live version must read back bit-for-bit, and a later GC must
//! finish the job. The negative control shows the verification notices what
//! a wrong order (object deleted before its index entries) would leave.

use crate::common::forkfs_bin;
use forkfs::{SnapshotOptions, Store, StoreConfig, VersionId, VolumeKind};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const SIZE: usize = 4 << 20;
const BS: usize = 4096;

type Kept = HashMap<VersionId, blake3::Hash>;

fn content(store: &Store, id: &VersionId) -> forkfs::Result<blake3::Hash> {
    let v = store.graph().version(id)?;
    let mut buf = vec![0u8; SIZE];
    store.graph().frozen(&v)?.read_at(0, &mut buf)?;
    Ok(blake3::hash(&buf))
}

/// Writes, snapshots, and deletes some old versions: garbage for the next GC.
fn churn(dir: &Path, rng: &mut rand::rngs::StdRng, kept: &mut Kept) {
    let store = Store::open(dir).unwrap();
    let head = store.volumes().open_block("disk").unwrap();
    for _ in 0..3 {
        for _ in 0..64 {
            let block = rng.random_range(0..SIZE / BS);
            let data: Vec<u8> = (0..BS).map(|_| rng.random()).collect();
            head.write_at((block * BS) as u64, &data).unwrap();
        }
        let v = store.graph().snapshot("disk", &SnapshotOptions::default()).unwrap();
        kept.insert(v.id, content(&store, &v.id).unwrap());
    }
    let mut ids: Vec<VersionId> = kept.keys().copied().collect();
    ids.sort();
    for id in ids.iter().filter(|_| rng.random_bool(0.5)).take(kept.len().saturating_sub(2)) {
        store.graph().delete_version(&store.graph().version(id).unwrap()).unwrap();
        kept.remove(id);
    }
}

fn verify(dir: &Path, kept: &Kept) -> Vec<String> {
    let store = Store::open(dir).expect("store reopens after SIGKILL");
    let mut problems = store.check().expect("check runs").problems;
    for (id, want) in kept {
        match content(&store, id) {
            Ok(h) if h == *want => {}
            Ok(_) => problems.push(format!("version {id} differs")),
            Err(e) => problems.push(format!("version {id} unreadable: {e}")),
        }
    }
    problems
}

fn gc(dir: &Path, kill_after: Option<Duration>) -> bool {
    let mut child = Command::new(forkfs_bin())
        .arg("--store")
        .arg(dir)
        .args(["gc", "--grace", "0s", "--compact-below", "0.9"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn forkfs gc");
    if let Some(d) = kill_after {
        std::thread::sleep(d);
        if child.try_wait().unwrap().is_none() {
            // SIGKILL: no destructors, no flushes.
            child.kill().unwrap();
            child.wait().unwrap();
            return true;
        }
    }
    assert!(child.wait().unwrap().success(), "gc failed");
    false
}

fn setup() -> (tempfile::TempDir, rand::rngs::StdRng, Kept) {
    let d = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { pack_target: 16 << 10, ..Default::default() };
    let store = Store::init(d.path(), cfg).unwrap();
    store.volumes().create("disk", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32)).unwrap();
    (d, rand::rngs::StdRng::seed_from_u64(0x9c), Kept::new())
}

#[test]
fn sigkill_during_gc_leaves_a_sound_store() {
    let (d, mut rng, mut kept) = setup();
    // Kill delays adapt to this machine: a GC that finished before its kill
    // shrinks the range, so most kills land inside a GC however fast it is.
    let (mut killed, mut rounds, mut max_ms) = (0, 0, 400u64);
    while killed < 12 && rounds < 40 {
        churn(d.path(), &mut rng, &mut kept);
        let delay = Duration::from_millis(rng.random_range(30..max_ms.max(31)));
        if gc(d.path(), Some(delay)) {
            killed += 1;
        } else {
            max_ms = delay.as_millis() as u64;
        }
        let problems = verify(d.path(), &kept);
        assert!(problems.is_empty(), "after round {rounds} ({delay:?}): {problems:#?}");
        rounds += 1;
    }
    assert!(
        killed >= 12,
        "only {killed} of {rounds} GCs were killed mid-way: the test means little"
    );
    // A GC that runs to the end cleans up whatever the killed ones left.
    gc(d.path(), None);
    let store = Store::open(d.path()).unwrap();
    let report = store.check().unwrap();
    assert!(report.ok() && report.unindexed_packs == 0, "{report:?}");
}

#[test]
fn the_gc_crash_check_catches_a_live_pack_deleted_before_its_index_entries() {
    let (d, mut rng, mut kept) = setup();
    churn(d.path(), &mut rng, &mut kept);
    gc(d.path(), None);
    assert!(verify(d.path(), &kept).is_empty(), "a clean run must verify");
    // What a kill between "delete object" and "drop index entries" leaves
    // when the order is wrong and the pack still held live chunks.
    let packs = d.path().join("objects/packs");
    let victim = std::fs::read_dir(&packs).unwrap().next().unwrap().unwrap().path();
    std::fs::remove_file(victim).unwrap();
    assert!(!verify(d.path(), &kept).is_empty(), "the check missed a deleted live pack");
}
