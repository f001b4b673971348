//! Writes of parts of a block, logged as spans over it (`head/patch.rs`):
//! a model of the disk against random small and whole-block writes,
//! zeroing, flushes, checkpoints and reopenings, on 64 KiB blocks so that
//! spans pile up past the point where a write logs its whole block; every
//! version reads back as the model did when it was taken.

use forkfs::{SnapshotOptions, Store, StoreConfig, VolumeKind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::path::Path;

const BS: usize = 64 << 10;
/// Four blocks: small writes land on the same blocks again and again.
const SIZE: usize = 4 * BS;

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: usize,
        len: usize,
        seed: u8,
    },
    /// `n` writes of `len` bytes one after the other from `off` (their
    /// spans join).
    Run {
        off: usize,
        n: usize,
        len: usize,
        seed: u8,
    },
    Zero {
        off: usize,
        len: usize,
    },
    /// Reads a range and checks it (a part of a block reads spans, or
    /// the entry under them, alone).
    Read {
        off: usize,
        len: usize,
    },
    Flush,
    Snapshot,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..SIZE, 1..9000usize, any::<u8>())
            .prop_map(|(off, len, seed)| Op::Write { off, len: len.min(SIZE - off), seed }),
        1 => (0..SIZE / BS, 1..3usize, any::<u8>()).prop_map(|(b, n, seed)| Op::Write {
            off: b * BS,
            len: (n * BS).min(SIZE - b * BS),
            seed
        }),
        2 => (0..SIZE, 2..40usize, 1..3000usize, any::<u8>())
            .prop_map(|(off, n, len, seed)| Op::Run { off, n, len, seed }),
        1 => (0..SIZE, 1..9000usize).prop_map(|(off, len)| Op::Zero { off, len: len.min(SIZE - off) }),
        3 => (0..SIZE, 1..9000usize).prop_map(|(off, len)| Op::Read { off, len: len.min(SIZE - off) }),
        2 => Just(Op::Flush),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Reopen),
    ]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1).collect()
}

fn open(dir: &Path) -> (Store, forkfs::BlockHead) {
    let store = Store::open(dir).unwrap();
    let head = store.volumes().open_block("d").unwrap();
    (store, head)
}

fn fresh() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    Store::init(dir.path(), StoreConfig::default())
        .unwrap()
        .volumes()
        .create("d", VolumeKind::Block, Some(SIZE as u64), Some(BS as u32))
        .unwrap();
    dir
}

fn read_all(head: &forkfs::BlockHead) -> Vec<u8> {
    let mut buf = vec![0u8; SIZE];
    head.read_at(0, &mut buf).unwrap();
    buf
}

/// The first differing byte, for a readable failure.
fn first_diff(a: &[u8], b: &[u8]) -> Option<(usize, u8, u8)> {
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x != y).map(|(i, (x, y))| (i, *x, *y))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 40,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn patched_blocks_match_the_model(ops in prop::collection::vec(op(), 1..80)) {
        let dir = fresh();
        let (mut store, mut head) = open(dir.path());
        let mut model = vec![0u8; SIZE];
        let mut versions = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Write { off, len, seed } => {
                    let data = pattern(len, seed);
                    head.write_at(off as u64, &data).unwrap();
                    model[off..off + len].copy_from_slice(&data);
                }
                Op::Run { off, n, len, seed } => {
                    for k in 0..n {
                        let at = off + k * len;
                        let len = len.min(SIZE.saturating_sub(at));
                        if len == 0 {
                            break;
                        }
                        let data = pattern(len, seed.wrapping_add(k as u8));
                        head.write_at(at as u64, &data).unwrap();
                        model[at..at + len].copy_from_slice(&data);
                    }
                }
                Op::Zero { off, len } => {
                    head.write_zeroes(off as u64, len as u64).unwrap();
                    model[off..off + len].fill(0);
                }
                Op::Read { off, len } => {
                    let mut got = vec![0u8; len];
                    head.read_at(off as u64, &mut got).unwrap();
                    let want = &model[off..off + len];
                    prop_assert!(got == want, "op {i} {op:?}: {:?}", first_diff(&got, want));
                }
                Op::Flush => head.flush().unwrap(),
                Op::Snapshot => {
                    let v = store.graph().snapshot("d", &SnapshotOptions::default()).unwrap();
                    versions.push((v, model.clone()));
                }
                Op::Reopen => {
                    head.flush().unwrap();
                    drop(head);
                    drop(store);
                    (store, head) = open(dir.path());
                }
            }
            let got = read_all(&head);
            prop_assert!(got == model, "after op {i} {op:?}: {:?}", first_diff(&got, &model));
        }
        for (v, want) in &versions {
            let mut got = vec![0u8; SIZE];
            store.graph().frozen(v).unwrap().read_at(0, &mut got).unwrap();
            prop_assert!(&got == want, "version {}: {:?}", v.id.short(), first_diff(&got, want));
        }
        prop_assert!(store.check().unwrap().ok());
    }
}

/// Bytes in the store's data log.
fn log_bytes(store: &Path) -> u64 {
    let mut n = 0;
    for vol in std::fs::read_dir(store.join("log")).unwrap() {
        for seg in std::fs::read_dir(vol.unwrap().path()).unwrap() {
            n += seg.unwrap().metadata().unwrap().len();
        }
    }
    n
}

/// Two 64 KiB blocks filled by 1 KiB writes in order log about their own
/// bytes: the spans join (a whole block per write, 64 blocks' worth, was
/// logged before spans; 5 without the joining, as full patches log their
/// blocks). They read back exactly, and so does their version.
#[test]
fn small_writes_log_their_own_bytes_not_their_blocks() {
    let dir = fresh();
    let (store, head) = open(dir.path());
    let mut model = vec![0u8; SIZE];
    for i in 0..(2 * BS / 1024) {
        let data = pattern(1024, i as u8);
        head.write_at((i * 1024) as u64, &data).unwrap();
        model[i * 1024..(i + 1) * 1024].copy_from_slice(&data);
    }
    let logged = log_bytes(dir.path());
    assert!(
        logged <= 3 * BS as u64,
        "128 writes of 1 KiB in order logged {logged} bytes, over 1.5 times what they wrote"
    );
    assert!(read_all(&head) == model);
    let v = store.graph().snapshot("d", &SnapshotOptions::default()).unwrap();
    let mut got = vec![0u8; SIZE];
    store.graph().frozen(&v).unwrap().read_at(0, &mut got).unwrap();
    assert!(got == model, "{:?}", first_diff(&got, &model));
}
