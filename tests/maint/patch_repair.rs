//! `fsck --repair` of a block written in parts whose data is partly gone:
//! each part is an acknowledged write of its own (a span of a patch,
//! `head/patch.rs`), so repair drops the parts whose data is lost and keeps
//! the others. It used to drop the whole entry, and with it every other
//! flushed write to the block.
//!
//! Negative control (by hand, `maint/unsaved.rs` `without` returning
//! `None`): the other span's bytes read as the last version and the test
//! fails.

use crate::common::random;
use forkfs::{Quiet, SnapshotOptions, Store, StoreConfig, VolumeKind};

const BS: usize = 65536;
const PART: usize = 4096;

/// The file under `dir` holding `needle`, and where.
fn find(dir: &std::path::Path, needle: &[u8]) -> Option<(std::path::PathBuf, usize)> {
    for f in std::fs::read_dir(dir).unwrap() {
        let path = f.unwrap().path();
        let found = match path.is_dir() {
            true => find(&path, needle),
            false => {
                let data = std::fs::read(&path).unwrap();
                data.windows(needle.len()).position(|w| w == needle).map(|at| (path, at))
            }
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

#[test]
fn repair_drops_only_the_lost_parts_of_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s");
    let base = random(BS, 1);
    let (first, second) = (random(PART, 2), random(PART, 3));
    {
        let store = Store::init(&s, StoreConfig::default()).unwrap();
        store
            .volumes()
            .create("d", VolumeKind::Block, Some(4 * BS as u64), Some(BS as u32))
            .unwrap();
        let head = store.volumes().open_block("d").unwrap();
        head.write_at(0, &base).unwrap();
        store.graph().snapshot("d", &SnapshotOptions::default()).unwrap();
        // Two parts of block 0, each flushed: both acknowledged.
        head.write_at(0, &first).unwrap();
        head.flush().unwrap();
        head.write_at(4 * PART as u64, &second).unwrap();
        head.flush().unwrap();
    }
    // The first part's data is damaged in the data log.
    let (segment, at) = find(&s.join("log"), &first).expect("the first part in the data log");
    let mut data = std::fs::read(&segment).unwrap();
    data[at + PART / 2] ^= 0xff;
    std::fs::write(&segment, &data).unwrap();

    let store = Store::open(&s).unwrap();
    let report = store.repair(&Quiet).unwrap();
    assert_eq!(report.lost_writes_dropped.len(), 1, "{:?}", report.lost_writes_dropped);
    let mut got = vec![0u8; BS];
    store.volumes().open_block("d").unwrap().read_at(0, &mut got).unwrap();
    let mut want = base.clone();
    want[4 * PART..5 * PART].copy_from_slice(&second);
    assert!(got[..PART] == base[..PART], "the lost part does not read as the last version");
    assert!(
        got[4 * PART..5 * PART] == second[..],
        "a flushed part whose data is there was dropped"
    );
    assert!(got == want, "block 0 differs elsewhere");
    let check = store.check().unwrap();
    assert!(check.ok(), "{:?}", check.problems);
}
