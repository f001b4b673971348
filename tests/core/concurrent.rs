//! Snapshots of a block volume taken while a writer goes on: every version
//! must be exactly the volume after some prefix of the writes (never a mix),
//! and nothing written during a fold may be lost. Run on 4 KiB blocks with
//! writes of every size, and on 64 KiB blocks with small writes, whose
//! spans (`head/patch.rs`) are added to entries a fold is folding.

use forkfs::{SnapshotOptions, Store, StoreConfig, Target, VolumeKind};
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// (zero?, offset, length, op number)
type Op = (bool, usize, usize, u32);

fn op_data((_, _, len, i): Op) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 7 + j / 100) as u8 | 1).collect()
}

fn apply(m: &mut [u8], op: Op) {
    let (zero, off, len, _) = op;
    if zero {
        m[off..off + len].fill(0);
    } else {
        m[off..off + len].copy_from_slice(&op_data(op));
    }
}

/// On failure: the prefix state closest to a bad version, and what differs.
fn explain(ops: &[Op], version: &[u8]) {
    let size = version.len();
    let differing = |m: &[u8]| -> Vec<usize> {
        let pairs = m.chunks(4096).zip(version.chunks(4096)).enumerate();
        pairs.filter(|(_, (a, b))| a != b).map(|(k, _)| k).collect()
    };
    let mut m = vec![0u8; size];
    let mut best = (usize::MAX, 0, Vec::new());
    for (n, op) in ops.iter().enumerate() {
        apply(&mut m, *op);
        let d = differing(&m);
        if d.len() < best.0 {
            best = (d.len(), n, d);
        }
    }
    let (count, n, blocks) = best;
    eprintln!(
        "closest prefix: after op {n} {:?}; {count} blocks differ: {:?}",
        ops[n],
        &blocks[..count.min(20)]
    );
    for (k, op) in ops.iter().enumerate().skip(n.saturating_sub(3)).take(8) {
        eprintln!("  op {k}: {op:?} blocks {}..{}", op.1 / 4096, (op.1 + op.2 - 1) / 4096);
    }
}

#[test]
fn versions_taken_during_writes_are_prefix_states() {
    prefix_states(4096, 8 << 20, 400, &|rng| match rng.random_range(0..4) {
        0 => rng.random_range(1..10_000),
        1 => rng.random_range(1..500_000),
        // 256+ whole blocks: a range tombstone.
        2 => rng.random_range(1_100_000..3_000_000),
        _ => 4096,
    });
}

#[test]
fn versions_taken_during_small_writes_to_large_blocks_are_prefix_states() {
    prefix_states(64 << 10, 1 << 20, 1500, &|rng| match rng.random_range(0..8) {
        0 => rng.random_range(60_000..140_000),
        _ => rng.random_range(1..6000),
    });
}

/// Writes `ops` random writes and zeroings of lengths `len` draws to a
/// volume of `size` bytes in blocks of `bs` while snapshots are taken.
fn prefix_states(bs: u32, size: usize, ops_n: u32, len: &dyn Fn(&mut rand::rngs::StdRng) -> usize) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { default_block_size: bs, ..StoreConfig::default() };
    let store = Store::init(dir.path(), cfg).unwrap();
    store.volumes().create("v", VolumeKind::Block, Some(size as u64), None).unwrap();
    let head = store.volumes().open_block("v").unwrap();
    let states = Arc::new(Mutex::new(HashSet::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut model = vec![0u8; size];
    states.lock().unwrap().insert(blake3::hash(&model));
    let mut ops: Vec<Op> = Vec::new();

    let snapper = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            let mut versions = Vec::new();
            while !done.load(Ordering::Acquire) {
                versions.push(store.graph().snapshot("v", &SnapshotOptions::default()).unwrap());
            }
            versions
        })
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for i in 0..ops_n {
        let off = rng.random_range(0..size - 1);
        let len = len(&mut rng).min(size - off);
        let op = (i % 5 == 2, off, len, i);
        ops.push(op);
        if op.0 {
            head.write_zeroes(off as u64, len as u64).unwrap();
        } else {
            head.write_at(off as u64, &op_data(op)).unwrap();
        }
        apply(&mut model, op);
        states.lock().unwrap().insert(blake3::hash(&model));
    }
    done.store(true, Ordering::Release);
    let versions = snapper.join().unwrap();
    assert!(versions.len() > 3, "only {} snapshots overlapped the writes", versions.len());
    let states = states.lock().unwrap();
    let mut buf = vec![0u8; size];
    for v in &versions {
        store.graph().frozen(v).unwrap().read_at(0, &mut buf).unwrap();
        if !states.contains(&blake3::hash(&buf)) {
            explain(&ops, &buf);
        }
        assert!(
            states.contains(&blake3::hash(&buf)),
            "version {} is not a prefix state",
            v.id.short()
        );
    }
    // The head still holds everything, and a final snapshot captures it.
    head.read_at(0, &mut buf).unwrap();
    assert!(buf == model, "head lost writes made during folds");
    let last = store.graph().snapshot("v", &SnapshotOptions::default()).unwrap();
    store.graph().frozen(&last).unwrap().read_at(0, &mut buf).unwrap();
    assert!(buf == model, "final version differs from the model");
    assert!(store.check().unwrap().ok());
    // Reopened, the head is the same (overlay entries left by folds survive).
    drop((head, versions));
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let Target::Head(_) = store.graph().resolve("v").unwrap() else { panic!() };
    store.volumes().open_block("v").unwrap().read_at(0, &mut buf).unwrap();
    assert!(buf == model);
}
