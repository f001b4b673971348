//! Deferred persistence (the core of `--consistency btrfs`) against a
//! model of two disks: what the head reads (`live`) and its last sealed
//! state (`sealed`). Random writes, small and range-tombstone zeroing,
//! seals, discards (whole, or of some blocks), checkpoints (which must capture `sealed`, never
//! pending writes) and store reopenings (a process dying: `live` falls
//! back to `sealed`, and the loss is recorded).

use forkfs::{Store, StoreConfig, VolumeKind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const BS: usize = 4096;
/// 512 blocks: zeroing 256+ of them takes the range-tombstone path.
const SIZE: usize = 512 * BS;

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: usize,
        len: usize,
        seed: u8,
    },
    Zero {
        off: usize,
        len: usize,
    },
    Seal,
    Discard,
    /// Discards the pending writes of blocks `[first, end)` only.
    DiscardBlocks {
        first: usize,
        end: usize,
    },
    Checkpoint,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SIZE, 1..3 * BS, any::<u8>())
            .prop_map(|(off, len, seed)| Op::Write { off, len: len.min(SIZE - off), seed }),
        1 => (0..SIZE, 1..SIZE).prop_map(|(off, len)| Op::Zero { off, len: len.min(SIZE - off) }),
        2 => Just(Op::Seal),
        1 => Just(Op::Discard),
        1 => (0..SIZE / BS, 1..SIZE / BS)
            .prop_map(|(first, n)| Op::DiscardBlocks { first, end: (first + n).min(SIZE / BS) }),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
    ]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

fn open(dir: &std::path::Path) -> (Store, forkfs::BlockHead) {
    let store = Store::open(dir).unwrap();
    let head = store.volumes().open_block("d").unwrap();
    head.set_deferred(true).unwrap();
    (store, head)
}

/// A new store with an empty deferred block volume "d".
fn fresh() -> (tempfile::TempDir, Store, forkfs::BlockHead) {
    let dir = tempfile::tempdir().unwrap();
    Store::init(dir.path(), StoreConfig::default())
        .unwrap()
        .volumes()
        .create("d", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32))
        .unwrap();
    let (store, head) = open(dir.path());
    (dir, store, head)
}

fn read_all(head: &forkfs::BlockHead) -> Vec<u8> {
    let mut buf = vec![0u8; SIZE];
    head.read_at(0, &mut buf).unwrap();
    buf
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 40,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn deferred_head_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), StoreConfig::default()).unwrap()
            .volumes().create("d", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32)).unwrap();
        let (mut store, mut head) = open(dir.path());
        let mut live = vec![0u8; SIZE];
        let mut sealed = live.clone();
        let mut pending = false;
        // Blocks with pending writes (for partial discards).
        let mut touched = vec![false; SIZE / BS];
        let mut rollbacks = 0;
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Write { off, len, seed } => {
                    let data = pattern(*len, *seed);
                    head.write_at(*off as u64, &data).unwrap();
                    live[*off..off + len].copy_from_slice(&data);
                    touched[off / BS..=(off + len - 1) / BS].fill(true);
                    pending = true;
                }
                Op::Zero { off, len } => {
                    head.write_zeroes(*off as u64, *len as u64).unwrap();
                    live[*off..off + len].fill(0);
                    touched[off / BS..=(off + len - 1) / BS].fill(true);
                    pending = true;
                }
                Op::Seal => {
                    head.seal(Some(i as u64)).unwrap();
                    sealed = live.clone();
                    pending = false;
                    touched.fill(false);
                    prop_assert_eq!(head.sealed_generation(), Some(i as u64));
                }
                Op::Discard => {
                    let st = store.graph().roll_back(&head, "test").unwrap();
                    prop_assert_eq!(st.since_ms.is_some(), pending);
                    rollbacks += usize::from(pending);
                    live = sealed.clone();
                    pending = false;
                    touched.fill(false);
                }
                Op::DiscardBlocks { first, end } => {
                    let st = store.graph().roll_back_blocks(&head, &[(*first as u64, *end as u64)], 0, "test").unwrap();
                    let hit = touched[*first..*end].iter().any(|t| *t);
                    prop_assert_eq!(st.since_ms.is_some(), hit, "op {}: what was discarded", i);
                    rollbacks += usize::from(hit);
                    live[first * BS..end * BS].copy_from_slice(&sealed[first * BS..end * BS]);
                    touched[*first..*end].fill(false);
                    pending = touched.iter().any(|t| *t);
                }
                Op::Checkpoint => {
                    let v = store.graph().snapshot("d", &Default::default()).unwrap();
                    let mut got = vec![0u8; SIZE];
                    store.graph().frozen(&v).unwrap().read_at(0, &mut got).unwrap();
                    prop_assert!(got == sealed, "op {}: a version holds unsealed writes", i);
                }
                Op::Reopen => {
                    drop(head);
                    drop(store);
                    (store, head) = open(dir.path());
                    rollbacks += usize::from(pending);
                    live = sealed.clone();
                    pending = false;
                    touched.fill(false);
                }
            }
            prop_assert!(read_all(&head) == live, "op {} ({:?}): head differs from the model", i, op);
            // Allocation agrees with content: every block with data is allocated.
            let alloc: std::collections::BTreeSet<u64> = head.allocated_blocks().unwrap().into_iter().collect();
            for (b, block) in live.chunks(BS).enumerate() {
                prop_assert!(
                    block.iter().all(|x| *x == 0) || alloc.contains(&(b as u64)),
                    "op {}: block {} has data but is not allocated", i, b
                );
            }
        }
        let vol = store.volumes().get("d").unwrap();
        prop_assert_eq!(store.graph().rollbacks(&vol).unwrap().len(), rollbacks);
    }
}

/// A checkpoint folds the sealed state while writers keep adding pending
/// writes: the version never contains one of them.
#[test]
fn checkpoints_beside_writers_hold_only_sealed_writes() {
    let (_dir, store, head) = fresh();
    // Sealed state: every block holds 1; pending writes hold 2.
    head.write_at(0, &vec![1u8; SIZE]).unwrap();
    head.seal(Some(1)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                head.write_at((n % 512) * BS as u64, &[2u8; BS]).unwrap();
                n += 1;
            }
        });
        for _ in 0..20 {
            let v = store.graph().snapshot("d", &Default::default()).unwrap();
            assert_eq!(v.generation, Some(1));
            let mut got = vec![0u8; SIZE];
            store.graph().frozen(&v).unwrap().read_at(0, &mut got).unwrap();
            assert!(got.iter().all(|b| *b == 1), "a version captured a pending write");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // The writes were never sealed: discarding restores the sealed state.
    store.graph().roll_back(&head, "test").unwrap();
    assert!(read_all(&head).iter().all(|b| *b == 1));
}

/// Seals beside checkpoints: a checkpoint's commit deletes the overlay
/// entries it folded only if unchanged, so a seal must never land between
/// that check and the commit (it takes the head's gate like any writer);
/// otherwise a sealed write could be deleted and the head read older data.
/// Seals run on their own thread, as FLUSHes of another connection do.
/// (The window is microseconds: this test did not catch a seal without the
/// gate in four tries; it guards the property, the chaos test the timing.)
#[test]
fn seals_beside_checkpoints_lose_nothing() {
    let (_dir, store, head) = fresh();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let expected = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut model = vec![0u8; SIZE / BS];
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let b = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 55) as usize % model.len();
                let v = (n % 251) as u8 + 1;
                head.write_at((b * BS) as u64, &[v; BS]).unwrap();
                model[b] = v;
                n += 1;
            }
            model
        });
        s.spawn(|| {
            let mut g = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                head.seal(Some(g)).unwrap();
                g += 1;
            }
        });
        for _ in 0..300 {
            store.graph().snapshot("d", &Default::default()).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap()
    });
    head.seal(None).unwrap();
    let got = read_all(&head);
    let lost: Vec<usize> = expected
        .iter()
        .enumerate()
        .filter(|(b, v)| !got[b * BS..(b + 1) * BS].iter().all(|x| x == *v))
        .map(|(b, _)| b)
        .collect();
    assert!(lost.is_empty(), "sealed writes lost beside checkpoints in blocks {lost:?}");
}

/// Switching a head back to flush semantics keeps what was pending: it is
/// sealed, and writes after the switch go straight to the overlay.
#[test]
fn turning_deferral_off_seals_what_is_pending() {
    let (dir, store, head) = fresh();
    head.write_at(0, &[3u8; BS]).unwrap();
    head.set_deferred(false).unwrap();
    assert!(!head.is_deferred());
    head.write_at(BS as u64, &[4u8; BS]).unwrap();
    head.flush().unwrap();
    drop(head);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let head = store.volumes().open_block("d").unwrap();
    let got = read_all(&head);
    assert!(got[..BS].iter().all(|b| *b == 3), "a pending write was dropped by the switch");
    assert!(got[BS..2 * BS].iter().all(|b| *b == 4));
    assert!(store.graph().rollbacks(&store.volumes().get("d").unwrap()).unwrap().is_empty());
}
