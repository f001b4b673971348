//! Synthetic write sequences; each asserts the exact outcome of every step.

use super::super_block::{CsumType, MIRROR_OFFSETS, make, reseal, set_bytenr, set_fsid};
use super::*;

const SO: u64 = SUPER_OFFSET;
const CRC32C: u16 = 0;

fn sp(generation: u64) -> Option<SafePoint> {
    Some(SafePoint { generation, tree_log: false })
}

fn log_sp(generation: u64) -> Option<SafePoint> {
    Some(SafePoint { generation, tree_log: true })
}

/// A detector attached to a disk whose superblock has `generation`.
fn attached(generation: u64) -> Detector {
    let d = Detector::new(Some(&make(generation, 0, CRC32C)));
    assert!(d.is_btrfs());
    assert_eq!(d.last_generation(), Some(generation));
    assert_eq!(d.invalid_reason(), None);
    d
}

#[test]
fn fua_super_is_a_safe_point() {
    let mut d = attached(5);
    assert_eq!(d.on_write(SO, &make(6, 0, CRC32C), true), sp(6));
    assert_eq!(d.last_generation(), Some(6));
    assert_eq!(d.on_flush(), None, "already reported");
}

#[test]
fn super_then_flush_is_a_safe_point() {
    let mut d = attached(5);
    assert_eq!(d.on_write(SO, &make(6, 0, CRC32C), false), None);
    assert_eq!(d.last_generation(), Some(5));
    assert_eq!(d.on_write(1 << 30, &[7; 4096], false), None, "unrelated data");
    assert_eq!(d.on_flush(), sp(6));
    assert_eq!(d.last_generation(), Some(6));
    assert_eq!(d.on_flush(), None);
}

#[test]
fn write_without_fua_or_flush_is_no_safe_point() {
    let mut d = attached(5);
    assert_eq!(d.on_write(SO, &make(6, 0, CRC32C), false), None);
    // FUA on another write makes only that write durable.
    assert_eq!(d.on_write(1 << 20, &[1; 512], true), None);
    assert_eq!(d.last_generation(), Some(5));
    assert_eq!(d.invalid_reason(), None, "valid, just not durable");
}

/// The new superblock arrives in three writes, out of order, the first and
/// last also covering data on either side of it.
#[test]
fn torn_super_then_flush() {
    let new = make(8, 0, CRC32C);
    for seed in [Some(make(7, 0, CRC32C)), None] {
        let mut d = Detector::new(seed.as_deref());
        let mut head = vec![0xEE; 512];
        head.extend_from_slice(&new[..1000]);
        let mut tail = new[3000..].to_vec();
        tail.extend_from_slice(&[0xDD; 3000]);
        assert_eq!(d.on_write(SO + 1000, &new[1000..3000], false), None);
        assert_eq!(d.on_write(SO + 3000, &tail, false), None);
        let partial = if seed.is_some() {
            Invalid::BadCsum(CsumType::Crc32c)
        } else {
            Invalid::Incomplete { known: 3096 }
        };
        assert_eq!(d.invalid_reason(), Some(&partial));
        assert_eq!(d.on_write(SO - 512, &head, false), None);
        assert_eq!(d.invalid_reason(), None);
        assert!(d.is_btrfs());
        assert_eq!(d.on_flush(), sp(8));
    }
}

#[test]
fn torn_super_is_durable_only_when_every_piece_is() {
    let new = make(8, 0, CRC32C);
    let mut d = attached(7);
    assert_eq!(d.on_write(SO, &new[..2048], false), None);
    assert_eq!(d.on_write(SO + 2048, &new[2048..], true), None, "first half not durable yet");
    assert_eq!(d.on_flush(), sp(8));

    let newer = make(9, 0, CRC32C);
    assert_eq!(d.on_write(SO, &newer[..2048], true), None);
    assert_eq!(d.on_write(SO + 2048, &newer[2048..], true), sp(9), "both halves FUA");
}

#[test]
fn tree_log_sync_may_repeat_the_generation() {
    let mut d = attached(7);
    assert_eq!(d.on_write(SO, &make(7, 30 << 20, CRC32C), false), None);
    assert_eq!(d.on_flush(), log_sp(7));
    assert_eq!(d.on_write(SO, &make(7, 31 << 20, CRC32C), false), None);
    assert_eq!(d.on_flush(), log_sp(7));
    assert_eq!(d.on_write(SO, &make(8, 0, CRC32C), false), None);
    assert_eq!(d.on_flush(), sp(8));
}

#[test]
fn mirror_writes_are_never_safe_points() {
    for seed in [None, Some(make(5, 0, CRC32C))] {
        let mut d = Detector::new(seed.as_deref());
        let before = d.last_generation();
        for at in MIRROR_OFFSETS {
            let mut mirror = make(6, 0, CRC32C);
            set_bytenr(&mut mirror, at);
            assert_eq!(d.on_write(at, &mirror, true), None);
            assert_eq!(d.on_write(at, &mirror, false), None);
            assert_eq!(d.on_flush(), None);
        }
        assert_eq!(d.last_generation(), before);
        assert_eq!(d.is_btrfs(), seed.is_some(), "mirrors do not make a disk btrfs");
    }
}

#[test]
fn mirror_copy_at_the_primary_offset_is_not_valid() {
    let mut d = attached(5);
    let mut wrong = make(6, 0, CRC32C);
    set_bytenr(&mut wrong, MIRROR_OFFSETS[0]);
    assert_eq!(d.on_write(SO, &wrong, true), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::WrongBytenr(64 << 20)));
}

#[test]
fn a_disk_that_is_not_btrfs_has_no_safe_points() {
    let ext4ish: Vec<u8> = (0..SUPER_SIZE).map(|i| (i * 7 + 3) as u8).collect();
    for seed in [None, Some(vec![0u8; SUPER_SIZE]), Some(ext4ish.clone())] {
        let mut d = Detector::new(seed.as_deref());
        assert_eq!(d.on_write(0, &vec![0x55; 1 << 20], true), None, "covers the superblock");
        assert_eq!(d.on_write(SO, &ext4ish, false), None);
        assert_eq!(d.on_flush(), None);
        assert_eq!(d.on_zero(0, 1 << 30, true), None);
        assert_eq!(d.on_flush(), None);
        assert!(!d.is_btrfs());
        assert_eq!(d.last_generation(), None);
        assert_eq!(d.invalid_reason(), Some(&Invalid::BadMagic));
    }
}

#[test]
fn bad_checksum_is_no_safe_point() {
    let mut d = attached(5);
    let mut bad = make(6, 0, CRC32C);
    bad[4000] ^= 1;
    assert_eq!(d.on_write(SO, &bad, true), None);
    assert_eq!(d.on_flush(), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::BadCsum(CsumType::Crc32c)));
    assert!(d.is_btrfs());
    assert_eq!(d.last_generation(), Some(5));
}

#[test]
fn every_supported_checksum_type_and_no_other() {
    for (raw, t) in [
        (0, CsumType::Crc32c),
        (1, CsumType::Xxhash64),
        (2, CsumType::Sha256),
        (3, CsumType::Blake2b),
    ] {
        let mut d = Detector::new(None);
        assert_eq!(d.on_write(SO, &make(3, 0, raw), true), sp(3), "{t}");
        let mut bad = make(4, 0, raw);
        bad[100] ^= 0x80;
        assert_eq!(d.on_write(SO, &bad, true), None, "{t}");
        assert_eq!(d.invalid_reason(), Some(&Invalid::BadCsum(t)));
    }
    let mut d = Detector::new(None);
    assert_eq!(d.on_write(SO, &make(3, 0, 7), true), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::UnsupportedCsum(7)));
    assert_eq!(
        d.invalid_reason().map(|r| r.to_string()).as_deref(),
        Some("unsupported checksum type 7")
    );
    assert!(d.is_btrfs());
}

#[test]
fn generation_going_backwards_is_no_safe_point() {
    let mut d = attached(10);
    assert_eq!(d.on_write(SO, &make(9, 0, CRC32C), true), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::GenerationWentBack { generation: 9, last: 10 }));
    assert_eq!(d.on_flush(), None);
    assert_eq!(d.on_write(SO, &make(11, 0, CRC32C), false), None);
    assert_eq!(d.on_flush(), sp(11));
    assert_eq!(d.on_write(SO, &make(10, 0, CRC32C), false), None);
    assert_eq!(d.on_flush(), None, "behind the last safe point, not just the attach generation");
    assert_eq!(d.last_generation(), Some(11));
}

/// mkfs.btrfs over an old filesystem: a new fsid starts its own sequence.
#[test]
fn new_filesystem_restarts_the_generation() {
    let mut d = attached(1000);
    let mut fresh = make(6, 0, CRC32C);
    set_fsid(&mut fresh, [0x17; 16]);
    assert_eq!(d.on_write(SO, &fresh, false), None);
    assert_eq!(d.on_flush(), sp(6));
    let mut older = make(5, 0, CRC32C);
    set_fsid(&mut older, [0x17; 16]);
    assert_eq!(d.on_write(SO, &older, true), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::GenerationWentBack { generation: 5, last: 6 }));
}

#[test]
fn garbage_over_a_pending_super_cancels_it() {
    let mut d = attached(5);
    assert_eq!(d.on_write(SO, &make(6, 0, CRC32C), false), None);
    assert_eq!(d.on_write(SO + 1024, &[0xAB; 512], false), None);
    assert_eq!(d.on_flush(), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::BadCsum(CsumType::Crc32c)));
    assert_eq!(d.last_generation(), Some(5));
}

#[test]
fn zeroing_the_super_makes_it_invalid() {
    let mut d = attached(5);
    assert_eq!(d.on_write(SO, &make(6, 0, CRC32C), false), None);
    assert_eq!(d.on_zero(SO + 64, 8, false), None);
    assert_eq!(d.on_flush(), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::BadMagic));
    // A whole-disk TRIM.
    assert_eq!(d.on_write(SO, &make(7, 0, CRC32C), true), sp(7));
    assert_eq!(d.on_zero(0, 1 << 40, true), None);
    assert_eq!(d.on_flush(), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::BadMagic));
    assert_eq!(d.last_generation(), Some(7));
    assert!(d.is_btrfs(), "seen once is enough");
}

#[test]
fn zeros_that_leave_it_valid_change_nothing() {
    // The tail of a superblock is zero padding: zeroing it again keeps it valid.
    let mut d = attached(5);
    assert_eq!(d.on_zero(SO + 4000, 1 << 20, false), None);
    assert_eq!(d.invalid_reason(), None);
    assert_eq!(d.on_flush(), sp(5), "rewritten and flushed: a safe point again");
}

#[test]
fn extreme_offsets_and_lengths_never_panic() {
    let mut d = attached(5);
    let data = vec![1u8; 8192];
    for offset in [0, SO - 1, SO + 4095, SO + 4096, u64::MAX - 100, u64::MAX] {
        assert_eq!(d.on_write(offset, &data, true), None);
        assert_eq!(d.on_write(offset, &[], true), None);
        assert_eq!(d.on_zero(offset, u64::MAX, true), None);
        assert_eq!(d.on_zero(offset, 0, true), None);
    }
    assert_eq!(d.on_flush(), None);
    let mut d = Detector::new(Some(&[]));
    assert_eq!(d.invalid_reason(), Some(&Invalid::Incomplete { known: 0 }));
    let mut long = make(6, 0, CRC32C);
    long.extend_from_slice(&[9; 100]);
    let d2 = Detector::new(Some(&long));
    assert_eq!(d2.last_generation(), Some(6), "extra bytes beyond 4 KiB are ignored");
    assert_eq!(d.on_write(SO + 4000, &long[4000..4096], false), None);
    assert_eq!(d.invalid_reason(), Some(&Invalid::Incomplete { known: 96 }));
}

#[test]
fn reseal_helper_really_fixes_the_checksum() {
    // Guards the test helper itself: a hand-edited field fails until resealed.
    let mut b = make(6, 0, CRC32C);
    b[200] = 1;
    assert_eq!(
        super_block::parse(b.as_slice().try_into().unwrap()),
        Err(Invalid::BadCsum(CsumType::Crc32c))
    );
    reseal(&mut b);
    assert!(super_block::parse(b.as_slice().try_into().unwrap()).is_ok());
}

mod model {
    //! Random sequences against a model: the superblock region as bytes, a
    //! per-byte durability flag, and a list of the valid superblocks that
    //! may appear. A safe point is reported exactly when the region equals
    //! one of them, not older than the last one reported, every byte is
    //! durable, and it was written since the last report.

    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    #[derive(Debug, Clone)]
    enum Op {
        /// Bytes `start..start+len` of candidate `cand` (the last one is
        /// garbage), inside a write that begins `before` bytes earlier.
        Piece {
            cand: usize,
            start: usize,
            len: usize,
            before: u64,
            fua: bool,
        },
        Zero {
            start: usize,
            len: usize,
            fua: bool,
        },
        Flush,
    }

    fn candidates() -> Vec<Vec<u8>> {
        let mut c: Vec<Vec<u8>> = (4..8).map(|g| make(g, 0, CRC32C)).collect();
        c.push((0..SUPER_SIZE).map(|i| (i * 13) as u8).collect());
        c
    }

    fn op() -> impl Strategy<Value = Op> {
        let start = prop_oneof![Just(0usize), Just(2048), 0..SUPER_SIZE];
        prop_oneof![
            4 => (0..5usize, start.clone(), 1..=SUPER_SIZE, 0..600u64, any::<bool>())
                .prop_map(|(cand, start, len, before, fua)| Op::Piece { cand, start, len, before, fua }),
            1 => (start, 1..=SUPER_SIZE, any::<bool>()).prop_map(|(start, len, fua)| Op::Zero { start, len, fua }),
            2 => Just(Op::Flush),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            // Regressions live next to this file (tests.proptest-regressions).
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
            ..ProptestConfig::default()
        })]

        #[test]
        fn matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
            let cands = candidates();
            let mut d = Detector::new(Some(&cands[1])); // generation 5
            let mut disk = cands[1].clone();
            let mut durable = vec![true; SUPER_SIZE];
            let mut last = 5u64;
            let mut touched = false;
            for op in ops {
                let fua = match op {
                    Op::Piece { fua, .. } | Op::Zero { fua, .. } => Some(fua),
                    Op::Flush => None,
                };
                let got = match op {
                    Op::Piece { cand, start, len, before, fua } => {
                        let end = (start + len).min(SUPER_SIZE);
                        let mut data = vec![0xC3; before as usize];
                        data.extend_from_slice(&cands[cand][start..end]);
                        // The junk before the piece may land in the superblock too.
                        let lo = start.saturating_sub(before as usize);
                        disk[lo..start].fill(0xC3);
                        disk[start..end].copy_from_slice(&cands[cand][start..end]);
                        durable[lo..end].fill(fua);
                        touched = true;
                        d.on_write(SO + start as u64 - before, &data, fua)
                    }
                    Op::Zero { start, len, fua } => {
                        let end = (start + len).min(SUPER_SIZE);
                        disk[start..end].fill(0);
                        durable[start..end].fill(fua);
                        touched = true;
                        d.on_zero(SO + start as u64, len as u64, fua)
                    }
                    Op::Flush => {
                        durable.fill(true);
                        d.on_flush()
                    }
                };
                let valid = cands[..4].iter().position(|c| *c == disk).map(|i| 4 + i as u64);
                let want = match valid {
                    Some(g) if g >= last && touched && durable.iter().all(|&b| b) => Some(g),
                    _ => None,
                };
                prop_assert_eq!(got, want.and_then(sp), "after {:?} (fua {:?})", op, fua);
                if let Some(g) = want {
                    last = g;
                    touched = false;
                }
                prop_assert_eq!(d.last_generation(), Some(last));
            }
        }
    }
}
