//! Replays what kernel btrfs really sent to a disk, recorded by
//! `scripts/record-btrfs-trace` (nbdkit + `scripts/nbdkit-trace-plugin.py`
//! -> nbdfuse -> loop device -> kernel btrfs; mkfs.btrfs, commits, fsyncs,
//! a snapshot, umount), one fixture per checksum type.
//!
//! Trace format (`nbd/tests/fixtures/btrfs-*.trace.zst`): zstd-compressed
//! text, one request per line, in the order the (serialized) server
//! completed them:
//!
//! ```text
//! W <offset> <length> <fua 0|1> [<at>=<hex>]...   write
//! Z <offset> <length> <fua 0|1>                   write zeroes
//! T <offset> <length> <fua 0|1>                   trim
//! F                                               flush
//! # <text>                                        comment; `# step NAME` marks a workload step
//! ```
//!
//! A write carries data (`at` = absolute offset of its first byte, then the
//! bytes in hex) only for the parts overlapping a superblock copy (64 KiB,
//! 64 MiB, 256 GiB; 4 KiB each); the rest of its data is not recorded and is
//! replayed as zeros. Reads are not recorded.
//!
//! The expected safe points are derived from the trace's structure, without
//! the detector's checks: each whole 4 KiB write to 65536 with the final
//! magic is pending until a FLUSH (or is done at once with FUA); a later
//! write or zeroing over the primary cancels it.

use super::super_block::{MAGIC, MIRROR_OFFSETS, SUPER_OFFSET, SUPER_SIZE};
use super::{Detector, SafePoint};

#[derive(Debug)]
enum Op {
    Write { offset: u64, len: u64, fua: bool, captured: Vec<(u64, Vec<u8>)> },
    Zero { offset: u64, len: u64, fua: bool },
    Flush,
    Step(String),
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn overlaps(offset: u64, len: u64, at: u64) -> bool {
    offset < at + SUPER_SIZE as u64 && at < offset + len
}

fn load(compressed: &[u8]) -> Vec<Op> {
    let text = zstd::decode_all(compressed).expect("zstd fixture");
    let text = String::from_utf8(text).expect("utf-8 trace");
    let mut ops = Vec::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("# step ") {
            ops.push(Op::Step(c.to_string()));
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(' ').collect();
        let num =
            |i: usize| -> u64 { f[i].parse().unwrap_or_else(|_| panic!("bad number in {line:?}")) };
        let op = match f[0] {
            "F" => Op::Flush,
            "W" => {
                let (offset, len) = (num(1), num(2));
                let captured: Vec<(u64, Vec<u8>)> = f[4..]
                    .iter()
                    .map(|c| {
                        let (at, h) = c.split_once('=').expect("at=hex");
                        (at.parse().expect("capture offset"), hex(h))
                    })
                    .collect();
                // Every overlap with a superblock copy must have been captured.
                for at in [SUPER_OFFSET, MIRROR_OFFSETS[0], MIRROR_OFFSETS[1]] {
                    if overlaps(offset, len, at) {
                        assert!(
                            captured.iter().any(|(a, _)| overlaps(*a, 1, at)),
                            "uncaptured: {line:.80}"
                        );
                    }
                }
                Op::Write { offset, len, fua: num(3) == 1, captured }
            }
            "Z" | "T" => Op::Zero { offset: num(1), len: num(2), fua: num(3) == 1 },
            _ => panic!("unknown trace line {line:?}"),
        };
        ops.push(op);
    }
    ops
}

/// A safe point, the index of the request that completed it, and the
/// workload step it fell in.
type Found = (usize, SafePoint, String);

/// Runs the detector over a trace.
fn replay(ops: &[Op], seed: Option<&[u8]>) -> (Vec<Found>, Detector) {
    let mut d = Detector::new(seed);
    let mut step = String::new();
    let mut found = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let got = match op {
            Op::Step(s) => {
                step = s.clone();
                None
            }
            Op::Write { offset, len, fua, captured } => {
                let mut data = vec![0u8; *len as usize];
                for (at, bytes) in captured {
                    let i = (at - offset) as usize;
                    data[i..i + bytes.len()].copy_from_slice(bytes);
                }
                d.on_write(*offset, &data, *fua)
            }
            Op::Zero { offset, len, fua } => d.on_zero(*offset, *len, *fua),
            Op::Flush => d.on_flush(),
        };
        if let Some(sp) = got {
            assert_eq!(d.invalid_reason(), None);
            found.push((i, sp, step.clone()));
        }
    }
    (found, d)
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The safe points the trace shows, from its structure alone (see the module
/// header), with the index of the request that completes each; also counts
/// the superblock writes to the mirrors.
fn expected(ops: &[Op]) -> (Vec<(usize, SafePoint)>, usize) {
    let mut want = Vec::new();
    let mut pending = None;
    let mut mirrors = 0;
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Write { offset, len, fua, captured } => {
                for (at, bytes) in captured {
                    if MIRROR_OFFSETS.contains(at)
                        && bytes.len() == SUPER_SIZE
                        && &bytes[64..72] == MAGIC
                    {
                        mirrors += 1;
                    }
                }
                if overlaps(*offset, *len, SUPER_OFFSET) {
                    let whole = captured
                        .iter()
                        .find(|(at, b)| *at == SUPER_OFFSET && b.len() == SUPER_SIZE);
                    pending = whole.filter(|(_, b)| &b[64..72] == MAGIC).map(|(_, b)| SafePoint {
                        generation: le64(b, 72),
                        tree_log: le64(b, 96) != 0,
                    });
                    if *fua {
                        want.extend(pending.take().map(|sp| (i, sp)));
                    }
                }
            }
            Op::Zero { offset, len, .. } if overlaps(*offset, *len, SUPER_OFFSET) => pending = None,
            Op::Zero { .. } | Op::Step(_) => {}
            Op::Flush => want.extend(pending.take().map(|sp| (i, sp))),
        }
    }
    (want, mirrors)
}

fn check(fixture: &[u8]) {
    let ops = load(fixture);
    let (want, mirrors) = expected(&ops);
    // The new disk reads as zeros; an unreadable one starts unknown.
    for seed in [Some(&[0u8; SUPER_SIZE][..]), None] {
        let (found, d) = replay(&ops, seed);
        let got: Vec<(usize, SafePoint)> = found.iter().map(|(i, sp, _)| (*i, *sp)).collect();
        assert_eq!(got, want, "seed {:?}", seed.is_some());
        assert!(d.is_btrfs());
        assert_eq!(d.last_generation(), want.last().map(|(_, s)| s.generation));
        assert!(
            got.windows(2).all(|w| w[0].1.generation <= w[1].1.generation),
            "generations went back"
        );

        // mkfs ends with one safe point; each step then ends with its own.
        let steps: Vec<&str> = found.iter().map(|(_, _, s)| s.as_str()).collect();
        assert_eq!(steps.iter().filter(|s| **s == "mkfs").count(), 1, "{steps:?}");
        for s in ["mkfs", "write-and-sync", "fsync-new-file", "dd-fsync", "snapshot", "umount"] {
            assert!(steps.contains(&s), "no safe point in step {s}: {steps:?}");
        }
        // fsync is a tree-log sync: the commit's generation again.
        for w in found.windows(2) {
            let ((_, before, _), (_, sp, step)) = (&w[0], &w[1]);
            if step.starts_with("fsync") || step == "dd-fsync" {
                assert!(sp.tree_log, "{w:?}");
                assert_eq!(sp.generation, before.generation, "{w:?}");
            }
        }
    }
    // Commits write both mirrors; none of those writes was a safe point.
    let commits = want.iter().filter(|(_, s)| !s.tree_log).count();
    assert!(mirrors >= 2 * commits, "{mirrors} mirror writes for {commits} commits");
    let mirror_ops: Vec<Op> = ops
        .into_iter()
        .filter(|op| match op {
            Op::Write { offset, len, .. } => !overlaps(*offset, *len, SUPER_OFFSET),
            _ => true,
        })
        .collect();
    let (found, d) = replay(&mirror_ops, Some(&[0u8; SUPER_SIZE]));
    assert_eq!(found.len(), 0, "mirror writes alone made safe points");
    assert!(!d.is_btrfs());
}

#[test]
fn replay_crc32c() {
    check(include_bytes!("../../tests/fixtures/btrfs-crc32c.trace.zst"));
}

#[test]
fn replay_xxhash64() {
    check(include_bytes!("../../tests/fixtures/btrfs-xxhash64.trace.zst"));
}

#[test]
fn replay_sha256() {
    check(include_bytes!("../../tests/fixtures/btrfs-sha256.trace.zst"));
}

#[test]
fn replay_blake2b() {
    check(include_bytes!("../../tests/fixtures/btrfs-blake2b.trace.zst"));
}
