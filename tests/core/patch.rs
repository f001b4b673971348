//! Writes of parts of a block, logged as spans over it (`head/patch.rs`):
//! a model of the disk against random small and whole-block writes,
//! zeroing, flushes, checkpoints and reopenings, on 64 KiB blocks so that
//! spans pile up past the point where a write logs its whole block; every
//! version reads back as the model did when it was taken.

use forkfs::fs::{FileKind, ROOT_INO, SetAttr};
use forkfs::{SnapshotOptions, Store, StoreConfig, VolumeKind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use proptest::test_runner::TestCaseError;
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
    /// Cuts everything from `off` on: a disk zeroes it, a file is
    /// truncated to `off` and grown back (its blocks past `off` dropped,
    /// the block `off` is in zeroed past it).
    Cut {
        off: usize,
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
        1 => (0..SIZE).prop_map(|off| Op::Cut { off }),
        2 => Just(Op::Flush),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Reopen),
    ]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1).collect()
}

/// What the model runs against: a block volume, or one file of an fs
/// volume (its blocks are patched the same way).
enum Dut {
    Disk(forkfs::BlockHead),
    File(forkfs::FsHead, u64),
}

impl Dut {
    fn write(&self, off: usize, data: &[u8]) {
        match self {
            Dut::Disk(h) => h.write_at(off as u64, data).unwrap(),
            Dut::File(h, ino) => h.write_file(*ino, off as u64, data).unwrap(),
        }
    }

    fn zero(&self, off: usize, len: usize) {
        match self {
            Dut::Disk(h) => h.write_zeroes(off as u64, len as u64).unwrap(),
            Dut::File(h, ino) => h.punch_hole(*ino, off as u64, len as u64).unwrap(),
        }
    }

    fn cut(&self, off: usize) {
        match self {
            Dut::Disk(h) => h.write_zeroes(off as u64, (SIZE - off) as u64).unwrap(),
            Dut::File(h, ino) => {
                for size in [off, SIZE] {
                    let size = Some(size as u64);
                    h.set_attr(*ino, &SetAttr { size, ..Default::default() }).unwrap();
                }
            }
        }
    }

    fn read(&self, off: usize, buf: &mut [u8]) {
        match self {
            Dut::Disk(h) => h.read_at(off as u64, buf).unwrap(),
            Dut::File(h, ino) => read_file(&h.reader(), *ino, off, buf),
        }
    }

    fn flush(&self) {
        match self {
            Dut::Disk(h) => h.flush().unwrap(),
            Dut::File(h, _) => h.flush().unwrap(),
        }
    }
}

/// Reads all of `buf` from file `ino` at `off` (the file is SIZE bytes).
fn read_file(r: &forkfs::fs::FsReader<'_>, ino: u64, off: usize, buf: &mut [u8]) {
    let inode = r.inode(ino).unwrap();
    assert_eq!(r.read(&inode, off as u64, buf).unwrap(), buf.len(), "a short read");
}

fn open(dir: &Path, kind: VolumeKind, ino: u64) -> (Store, Dut) {
    let store = Store::open(dir).unwrap();
    let dut = match kind {
        VolumeKind::Block => Dut::Disk(store.volumes().open_block("d").unwrap()),
        VolumeKind::Fs => Dut::File(store.volumes().open_fs("d").unwrap(), ino),
    };
    (store, dut)
}

/// A store with volume `d`: a SIZE-byte disk, or an fs volume with one
/// SIZE-byte file of zeros (its inode number returned).
fn fresh(kind: VolumeKind) -> (tempfile::TempDir, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path(), StoreConfig::default()).unwrap();
    if kind == VolumeKind::Block {
        store.volumes().create("d", kind, Some(SIZE as u64), Some(BS as u32)).unwrap();
        return (dir, 0);
    }
    store.volumes().create("d", kind, None, Some(BS as u32)).unwrap();
    let h = store.volumes().open_fs("d").unwrap();
    let f = h.create(ROOT_INO, b"f", FileKind::File, 0o644, (0, 0), None).unwrap();
    h.set_attr(f.ino, &SetAttr { size: Some(SIZE as u64), ..Default::default() }).unwrap();
    (dir, f.ino)
}

fn read_all(dut: &Dut) -> Vec<u8> {
    let mut buf = vec![0u8; SIZE];
    dut.read(0, &mut buf);
    buf
}

/// What version `v` holds (of the disk, or of the file).
fn read_version(store: &Store, v: &forkfs::VersionRecord, ino: u64) -> Vec<u8> {
    let frozen = store.graph().frozen(v).unwrap();
    let mut got = vec![0u8; SIZE];
    match ino {
        0 => frozen.read_at(0, &mut got).unwrap(),
        _ => read_file(&frozen.fs(), ino, 0, &mut got),
    }
    got
}

/// The first differing byte, for a readable failure.
fn first_diff(a: &[u8], b: &[u8]) -> Option<(usize, u8, u8)> {
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x != y).map(|(i, (x, y))| (i, *x, *y))
}

/// Runs `ops` on a fresh volume of `kind` against a model of its bytes.
fn run_model(kind: VolumeKind, ops: &[Op]) -> Result<(), TestCaseError> {
    let (dir, ino) = fresh(kind);
    let (mut store, mut dut) = open(dir.path(), kind, ino);
    let mut model = vec![0u8; SIZE];
    let mut versions = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Write { off, len, seed } => {
                let data = pattern(len, seed);
                dut.write(off, &data);
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
                    dut.write(at, &data);
                    model[at..at + len].copy_from_slice(&data);
                }
            }
            Op::Zero { off, len } => {
                dut.zero(off, len);
                model[off..off + len].fill(0);
            }
            Op::Read { off, len } => {
                let mut got = vec![0u8; len];
                dut.read(off, &mut got);
                let want = &model[off..off + len];
                prop_assert!(got == want, "op {i} {op:?}: {:?}", first_diff(&got, want));
            }
            Op::Cut { off } => {
                dut.cut(off);
                model[off..].fill(0);
            }
            Op::Flush => dut.flush(),
            Op::Snapshot => {
                let v = store.graph().snapshot("d", &SnapshotOptions::default()).unwrap();
                versions.push((v, model.clone()));
            }
            Op::Reopen => {
                dut.flush();
                drop(dut);
                drop(store);
                (store, dut) = open(dir.path(), kind, ino);
            }
        }
        let got = read_all(&dut);
        prop_assert!(got == model, "after op {i} {op:?}: {:?}", first_diff(&got, &model));
    }
    for (v, want) in &versions {
        let got = read_version(&store, v, ino);
        prop_assert!(&got == want, "version {}: {:?}", v.id.short(), first_diff(&got, want));
    }
    prop_assert!(store.check().unwrap().ok());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 40,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn patched_blocks_match_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run_model(VolumeKind::Block, &ops)?;
    }

    #[test]
    fn patched_file_blocks_match_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run_model(VolumeKind::Fs, &ops)?;
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
/// blocks). They read back exactly, and so does their version. The same
/// for a disk and for a file.
#[test]
fn small_writes_log_their_own_bytes_not_their_blocks() {
    for kind in [VolumeKind::Block, VolumeKind::Fs] {
        let (dir, ino) = fresh(kind);
        let (store, dut) = open(dir.path(), kind, ino);
        let before = log_bytes(dir.path());
        let mut model = vec![0u8; SIZE];
        for i in 0..(2 * BS / 1024) {
            let data = pattern(1024, i as u8);
            dut.write(i * 1024, &data);
            model[i * 1024..(i + 1) * 1024].copy_from_slice(&data);
        }
        let logged = log_bytes(dir.path()) - before;
        assert!(
            logged <= 3 * BS as u64,
            "{kind:?}: 128 writes of 1 KiB in order logged {logged} bytes, over 1.5 times what they wrote"
        );
        assert!(read_all(&dut) == model, "{kind:?}");
        let v = store.graph().snapshot("d", &SnapshotOptions::default()).unwrap();
        let got = read_version(&store, &v, ino);
        assert!(got == model, "{kind:?}: {:?}", first_diff(&got, &model));
    }
}

/// A small file written in tar's 10 KiB pieces logs its own bytes, and
/// so do the inline bytes of a file that grows past them: neither logs
/// whole blocks.
#[test]
fn a_file_written_in_pieces_logs_its_own_bytes() {
    let (dir, _) = fresh(VolumeKind::Fs);
    let store = Store::open(dir.path()).unwrap();
    let h = store.volumes().open_fs("d").unwrap();
    let before = log_bytes(dir.path());
    let mut files = Vec::new();
    for n in 0..20u8 {
        let f = h.create(ROOT_INO, &[b'g', b'a' + n], FileKind::File, 0o644, (0, 0), None).unwrap();
        // 100 inline bytes, then 25 KiB in 10 KiB writes.
        let data = pattern(100 + 25 * 1024, n);
        h.write_file(f.ino, 0, &data[..100]).unwrap();
        for at in (100..data.len()).step_by(10 * 1024) {
            let end = (at + 10 * 1024).min(data.len());
            h.write_file(f.ino, at as u64, &data[at..end]).unwrap();
        }
        files.push((f.ino, data));
    }
    let logged = log_bytes(dir.path()) - before;
    let wrote: usize = files.iter().map(|(_, d)| d.len()).sum();
    assert!(
        logged <= 2 * wrote as u64,
        "20 files of {} bytes logged {logged} bytes, over twice what they wrote",
        files[0].1.len()
    );
    let v = store.graph().snapshot("d", &SnapshotOptions::default()).unwrap();
    let frozen = store.graph().frozen(&v).unwrap();
    for (ino, data) in &files {
        for r in [h.reader(), frozen.fs()] {
            let mut got = vec![0u8; data.len()];
            read_file(&r, *ino, 0, &mut got);
            assert!(&got == data, "file {ino}: {:?}", first_diff(&got, data));
        }
    }
}
