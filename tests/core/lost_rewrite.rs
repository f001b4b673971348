//! Power loss after an unflushed rewrite of a flushed block: RocksDB may
//! keep the rewrite's overlay entry (a memtable flush or a later WAL sync
//! makes it durable) while the data log loses its data. The rewrite was
//! never acknowledged and may go, but the flushed write it replaced was:
//! the block must read as that, not as the last version. (The NBD
//! power-cut test found the old behaviour: 4 KiB writes into 64 KiB
//! blocks, one flushed, the next one's read-modify-write lost.)

use forkfs::{Store, StoreConfig, VolumeKind};
use std::path::{Path, PathBuf};

const BS: usize = 64 << 10;

/// The newest data log segment of the store.
fn newest_segment(store: &Path) -> PathBuf {
    let mut segs = Vec::new();
    for vol in std::fs::read_dir(store.join("log")).unwrap() {
        for seg in std::fs::read_dir(vol.unwrap().path()).unwrap() {
            segs.push(seg.unwrap().path());
        }
    }
    segs.sort();
    segs.pop().expect("a data log segment")
}

/// Writes `first` (flushed), then `then` (not flushed), both 4 KiB into
/// block 0; power loss takes every unflushed byte of the data log but
/// RocksDB keeps the entries. Returns block 0's first 8 KiB afterwards.
fn lose_the_rewrite(first: &[(u64, u8)], then: &[(u64, u8)]) -> forkfs::Result<Vec<u8>> {
    lose(first, then, Loss::Cut)
}

/// A new store with a 1 MiB block volume "v" of 64 KiB blocks.
fn fresh() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    Store::init(dir.path(), StoreConfig::default())
        .unwrap()
        .volumes()
        .create("v", VolumeKind::Block, Some(1 << 20), Some(BS as u32))
        .unwrap();
    dir
}

/// How power loss left the unflushed end of the segment.
enum Loss {
    /// Cut off (the file is as long as its durable part).
    Cut,
    /// As long as written, its bytes zeros (blocks allocated, data lost).
    Zeroed,
}

fn lose(first: &[(u64, u8)], then: &[(u64, u8)], loss: Loss) -> forkfs::Result<Vec<u8>> {
    lose_writes(first, then, 4096, loss)
}

/// [`lose`] with writes of `len` bytes.
fn lose_writes(
    first: &[(u64, u8)],
    then: &[(u64, u8)],
    len: usize,
    loss: Loss,
) -> forkfs::Result<Vec<u8>> {
    let dir = fresh();
    let durable = {
        let store = Store::open(dir.path()).unwrap();
        let head = store.volumes().open_block("v").unwrap();
        for (off, b) in first {
            head.write_at(*off, &vec![*b; len]).unwrap();
        }
        head.flush().unwrap();
        let durable = std::fs::metadata(newest_segment(dir.path())).unwrap().len();
        for (off, b) in then {
            head.write_at(*off, &vec![*b; len]).unwrap();
        }
        durable
        // Closed: RocksDB keeps the entries of the unflushed writes.
    };
    let seg = std::fs::OpenOptions::new().write(true).open(newest_segment(dir.path())).unwrap();
    assert!(seg.metadata().unwrap().len() > durable, "the rewrite went to the data log");
    match loss {
        Loss::Cut => seg.set_len(durable).unwrap(),
        Loss::Zeroed => {
            let len = seg.metadata().unwrap().len();
            let zeros = vec![0u8; (len - durable) as usize];
            std::os::unix::fs::FileExt::write_all_at(&seg, &zeros, durable).unwrap();
        }
    }
    let store = Store::open(dir.path()).unwrap();
    let head = store.volumes().open_block("v").unwrap();
    let mut buf = vec![0u8; 8192];
    head.read_at(0, &mut buf)?;
    Ok(buf)
}

#[test]
fn a_lost_rewrite_falls_back_to_the_flushed_write_it_replaced() {
    // 181 at 0 flushed; 99 at 4096 (the same 64 KiB block) lost.
    let got = lose_the_rewrite(&[(0, 181)], &[(4096, 99)]).expect("the block reads");
    assert!(got[..4096].iter().all(|b| *b == 181), "the flushed write is gone: {}", got[0]);
    assert!(got[4096..].iter().all(|b| *b == 0), "the lost write came back");
}

#[test]
fn several_lost_rewrites_fall_back_past_each_other() {
    // Three unflushed rewrites of the block, all lost.
    let got = lose_the_rewrite(&[(0, 7)], &[(4096, 1), (4096, 2), (0, 3)]).expect("reads");
    assert!(got[..4096].iter().all(|b| *b == 7), "the flushed write is gone: {}", got[0]);
    assert!(got[4096..].iter().all(|b| *b == 0));
}

/// Whole blocks rewritten more often than the chain of earlier states
/// keeps, all lost: what the block held before them is unknown.
#[test]
fn more_lost_rewrites_than_the_chain_keeps_are_an_error_not_old_content() {
    let then: Vec<(u64, u8)> = (0..forkfs::MAX_PRIOR_CHAIN as u8 + 2).map(|i| (0, i + 1)).collect();
    match lose_writes(&[(0, 7)], &then, BS, Loss::Cut) {
        Err(e) => assert!(e.to_string().contains("unknown"), "{e}"),
        Ok(got) => panic!("read {} {}: older content guessed", got[0], got[4096]),
    }
}

/// Parts of a block are written as spans over it, each checked on its
/// own: far more lost small rewrites than the chain of whole-block states
/// keeps fall back to the flushed bytes, including a write of the whole
/// block that a full patch made (more than MAX_SPANS spans).
#[test]
fn many_lost_small_rewrites_fall_back_to_the_flushed_bytes() {
    let mut then: Vec<(u64, u8)> =
        (0..40u8).map(|i| (4096 * (1 + u64::from(i % 3)), i + 1)).collect();
    then.extend((0..20u8).map(|i| (16384 + 4096 * u64::from(i), 200 + i)));
    // Written out of order, the two flushed spans stay two (in order they
    // would join), and rewrites cover the second.
    let got = lose_writes(&[(4096, 8), (0, 7)], &then, 4096, Loss::Cut).expect("the block reads");
    assert!(got[..4096].iter().all(|b| *b == 7), "the first flushed write is gone: {}", got[0]);
    assert!(got[4096..].iter().all(|b| *b == 8), "the second flushed write is gone: {}", got[4096]);
}

/// Data lost though a flush acknowledged it is damage, in a span too:
/// an error, never the older bytes.
#[test]
fn a_lost_flushed_span_is_an_error() {
    let dir = fresh();
    {
        let store = Store::open(dir.path()).unwrap();
        let head = store.volumes().open_block("v").unwrap();
        head.write_at(0, &[5u8; 4096]).unwrap();
        head.write_at(8192, &[6u8; 4096]).unwrap();
        head.flush().unwrap();
    }
    let seg = std::fs::OpenOptions::new().write(true).open(newest_segment(dir.path())).unwrap();
    seg.set_len(4096).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let head = store.volumes().open_block("v").unwrap();
    let mut buf = vec![0u8; 4096];
    match head.read_at(8192, &mut buf) {
        Err(e) => assert!(e.to_string().contains("acknowledged"), "{e}"),
        Ok(()) => panic!("a flushed span read as {} after its data was lost", buf[0]),
    }
}

/// Small reads of a block read only their own bytes from the data log when
/// this process wrote them; after a restart they must still verify the
/// whole block, or zeros a power cut left would read as data.
#[test]
fn a_rewrite_lost_as_zeros_falls_back_too() {
    let got = lose(&[(0, 181)], &[(4096, 99), (0, 55)], Loss::Zeroed).expect("the block reads");
    assert!(got[..4096].iter().all(|b| *b == 181), "lost zeros read as data: {}", got[0]);
    assert!(got[4096..].iter().all(|b| *b == 0), "the lost write came back");
}
