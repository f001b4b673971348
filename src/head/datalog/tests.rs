//! The data log's unit tests: appends, syncs and marks, rotation and
//! recycling, and what counts as lost data or damage.

use super::*;

/// A data log in a new directory (removed when the first is dropped).
fn new_log() -> (tempfile::TempDir, DataLog) {
    let dir = tempfile::tempdir().unwrap();
    let log = DataLog::open(dir.path().to_path_buf()).unwrap();
    (dir, log)
}

fn data(r: Result<Read>) -> Vec<u8> {
    match r.unwrap() {
        Read::Data(d) => d.to_vec(),
        Read::Lost(why) => panic!("lost: {why}"),
    }
}

#[test]
fn appends_read_back_and_rotation_drops_old_segments() {
    let (dir, log) = new_log();
    let v = VolumeId(3);
    let a = log.append(v, b"first block").unwrap();
    let b = log.append(v, b"second").unwrap();
    assert_eq!(data(log.read(v, &b)), b"second");
    log.sync().unwrap();
    let floor = log.rotate(v).unwrap();
    let c = log.append(v, b"after rotation").unwrap();
    assert_eq!(data(log.read(v, &a)), b"first block");
    log.drop_below(v, floor).unwrap();
    assert!(matches!(log.read(v, &a).unwrap(), Read::Lost(_)), "a dropped segment is gone");
    assert_eq!(data(log.read(v, &c)), b"after rotation");
    assert_eq!(LogRef::decode(&c.encode()).unwrap(), c);
    // A reopened log starts a new segment and still reads the old one.
    drop(log);
    let log = DataLog::open(dir.path().to_path_buf()).unwrap();
    let d = log.append(v, b"new process").unwrap();
    assert!(d.seq > c.seq);
    assert_eq!(data(log.read(v, &c)), b"after rotation");
    // Damaged data is detected, not returned; so is data cut short.
    let bad = LogRef { crc: c.crc ^ 1, ..c };
    assert!(matches!(log.read(v, &bad).unwrap(), Read::Lost(_)));
    let short = LogRef { offset: c.offset + 4096, ..c };
    assert!(matches!(log.read(v, &short).unwrap(), Read::Lost(_)));
}

#[test]
fn a_sync_covers_rotated_segments_and_marks_what_it_made_durable() {
    let (_dir, log) = new_log();
    let v = VolumeId(1);
    let a = log.append(v, &[1u8; 100]).unwrap();
    // Rotated before any sync: the next sync still covers it.
    let next = log.rotate(v).unwrap();
    let b = log.append(v, &[2u8; 50]).unwrap();
    let mut marks = log.sync().unwrap();
    marks.sort_by_key(|m| m.seq);
    assert_eq!(
        marks,
        vec![Mark { vol: v, seq: a.seq, upto: 100 }, Mark { vol: v, seq: next, upto: 50 }]
    );
    assert_eq!(b.seq, next);
    // Nothing new: nothing to sync, no marks.
    assert!(log.sync().unwrap().is_empty());
}

/// The marks of this process's segments are known here (no index
/// lookup): none before a sync, the sync's after it; an earlier
/// process's segment, or one below the floor, is the index's question.
#[test]
fn own_segments_answer_their_marks_and_earlier_ones_do_not() {
    let (dir, log) = new_log();
    let v = VolumeId(4);
    let a = log.append(v, &[1u8; 100]).unwrap();
    assert_eq!(log.durable_here(v, a.seq), Some(None), "appended, never synced");
    log.sync().unwrap();
    assert_eq!(log.durable_here(v, a.seq), Some(Some(100)));
    log.append(v, &[2u8; 20]).unwrap();
    assert_eq!(log.durable_here(v, a.seq), Some(Some(100)), "the append after is not durable");
    log.sync().unwrap();
    assert_eq!(log.durable_here(v, a.seq), Some(Some(120)));
    assert_eq!(log.durable_here(VolumeId(5), a.seq), None, "another volume's");
    drop(log);
    let log = DataLog::open(dir.path().to_path_buf()).unwrap();
    assert_eq!(log.durable_here(v, a.seq), None, "a segment of an earlier process");
    let b = log.append(v, &[3u8; 10]).unwrap();
    assert_eq!(log.durable_here(v, b.seq), Some(None));
    log.sync().unwrap();
    let floor = log.rotate(v).unwrap();
    log.drop_below(v, floor).unwrap();
    assert_eq!(log.durable_here(v, b.seq), None, "below the floor: forgotten here");
}

/// Another thread's sync has taken a segment's dirty flag and is in
/// its fdatasync (simulated: its lock held, the flag cleared): a sync
/// now must wait for it, whether the segment is current or rotated
/// away, not return and let its caller acknowledge data not on disk.
#[test]
fn a_sync_waits_for_another_sync_of_the_same_appends() {
    for rotated in [false, true] {
        let (_dir, log) = new_log();
        let v = VolumeId(1);
        log.append(v, &[1u8; 100]).unwrap();
        let seg = log.volumes.lock()[&v].current.clone().unwrap();
        let held = seg.syncing.lock();
        seg.dirty.store(false, Ordering::SeqCst);
        if rotated {
            log.rotate(v).unwrap();
        }
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                log.sync().unwrap();
                done.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            let early = done.load(Ordering::SeqCst);
            drop(held);
            assert!(!early, "rotated {rotated}: a sync returned during another's");
        });
        assert!(done.load(Ordering::SeqCst));
        // Clean and synced: a rotated segment is no longer listed.
        let listed = log.volumes.lock()[&v].unsynced.len();
        assert_eq!(listed, 0, "rotated {rotated}: a synced segment stays listed");
    }
}

/// Blocks appended in one write each read back as themselves, after
/// an append before them; what is not whole blocks is refused.
#[test]
fn blocks_appended_in_one_write_read_back_one_by_one() {
    let (_dir, log) = new_log();
    let v = VolumeId(4);
    let before = log.append(v, b"before").unwrap();
    let blocks: Vec<u8> = (0..3 * 512).map(|i| (i / 512 + i % 7) as u8).collect();
    let refs = log.append_blocks(v, &blocks, 512).unwrap();
    assert_eq!(refs.len(), 3);
    for (r, want) in refs.iter().zip(blocks.chunks(512)) {
        assert_eq!(r.len, 512);
        assert_eq!(data(log.read(v, r)), want);
    }
    assert_eq!(refs[0].offset, before.offset + before.len as u64);
    assert_eq!(data(log.read(v, &before)), b"before");
    for (bad, bs) in [(&blocks[..100], 512), (&blocks[..0], 512), (&blocks[..512], 0)] {
        assert!(log.append_blocks(v, bad, bs).is_err(), "{} bytes in blocks of {bs}", bad.len());
    }
    assert!(log.append(v, b"").is_err());
}

#[test]
fn an_unreadable_segment_is_an_error_not_lost_data() {
    let (dir, log) = new_log();
    let v = VolumeId(2);
    let a = log.append(v, b"x").unwrap();
    log.rotate(v).unwrap();
    drop(log);
    // A directory where the segment was: opening it for reading fails
    // with an I/O error other than "not found".
    let seg = seg_path(dir.path(), v, a.seq);
    std::fs::remove_file(&seg).unwrap();
    std::fs::create_dir(&seg).unwrap();
    let log = DataLog::open(dir.path().to_path_buf()).unwrap();
    match log.read(v, &a) {
        Err(e) => assert_ne!(e.kind(), crate::error::ErrorKind::Corrupt, "{e}"),
        Ok(r) => panic!("an unreadable segment read as {r:?}"),
    }
}

/// A segment below the floor becomes a spare, and a later new segment
/// is that file written over: its appends read back, and bytes a
/// power cut took from it read as lost, not as the old bytes there.
/// Only the largest [`SPARES`] stay, cut to [`SPARE_BYTES`]; a deleted
/// volume keeps none.
#[test]
fn segments_below_the_floor_are_recycled_as_new_segments() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v = VolumeId(5);
    let log = DataLog::open(d.to_path_buf()).unwrap();
    let inode = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
    let old = log.append(v, &[9u8; 8192]).unwrap();
    let old_inode = inode(seg_path(d, v, old.seq));
    log.sync().unwrap();
    let floor = log.rotate(v).unwrap();
    log.drop_below(v, floor).unwrap();
    assert!(!seg_path(d, v, old.seq).exists());
    assert_eq!(std::fs::metadata(spare_path(d, v, old.seq)).unwrap().len(), 8192);
    assert!(matches!(log.read(v, &old).unwrap(), Read::Lost(_)));
    log.append(v, b"in the floor's segment").unwrap();
    // While a drop_below works on the spares, a new segment is a new file.
    let busy = log.spares.lock();
    let fresh = log.rotate(v).unwrap();
    assert_ne!(inode(seg_path(d, v, fresh)), old_inode);
    assert!(spare_path(d, v, old.seq).exists());
    drop(busy);
    log.append(v, b"in a new file").unwrap();
    let next = log.rotate(v).unwrap();
    assert_eq!(inode(seg_path(d, v, next)), old_inode, "the spare became the new segment");
    assert!(!spare_path(d, v, old.seq).exists());
    let a = log.append(v, &[1u8; 100]).unwrap();
    assert_eq!((a.seq, a.offset), (next, 0));
    assert_eq!(data(log.read(v, &a)), [1u8; 100]);
    // Written after `a` and taken by a power cut: the old bytes are there.
    let gone = LogRef { seq: next, offset: 100, len: 4000, crc: crc32fast::hash(&[2u8; 4000]) };
    log.sync().unwrap();
    drop(log);
    let log = DataLog::open(d.to_path_buf()).unwrap();
    assert_eq!(data(log.read(v, &a)), [1u8; 100]);
    assert!(matches!(log.read(v, &gone).unwrap(), Read::Lost(_)));

    // Four segments below a floor, and the largest two stay.
    let mut segs = Vec::new();
    for len in [3 << 20, SPARE_BYTES + (1 << 20), 1 << 20, 2 << 20] {
        let r = log.append(v, b"x").unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(seg_path(d, v, r.seq)).unwrap();
        f.set_len(len).unwrap();
        segs.push(r.seq);
        log.rotate(v).unwrap();
    }
    let floor = log.rotate(v).unwrap();
    log.drop_below(v, floor).unwrap();
    let spares = list_files(d, v, ".spare").unwrap();
    assert_eq!(spares, vec![segs[0], segs[1]], "the largest two");
    let len = |seq| std::fs::metadata(spare_path(d, v, seq)).unwrap().len();
    assert_eq!((len(segs[0]), len(segs[1])), (3 << 20, SPARE_BYTES));
    assert!(list_segments(d, v).unwrap().iter().all(|s| *s >= floor));
    log.drop_below(v, u64::MAX).unwrap();
    assert!(!vol_dir(d, v).exists(), "a deleted volume leaves no spare");
}

/// Data a crash took is a lost write only in a segment of an earlier
/// process; gone from one this process wrote, it is damage. (The
/// power-cut test's filesystem once showed a short file mid-fsync, and
/// a checkpoint then folded the flushed write away as "lost".)
#[test]
fn data_gone_from_this_processs_segment_is_damage_not_a_lost_write() {
    let dir = tempfile::tempdir().unwrap();
    let v = VolumeId(3);
    let log = DataLog::open(dir.path().to_path_buf()).unwrap();
    let a = log.append(v, &[7u8; 4096]).unwrap();
    let seg = seg_path(dir.path(), v, a.seq);
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(100).unwrap();
    match log.read(v, &a) {
        Err(e) => assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt, "{e}"),
        Ok(r) => panic!("data this process wrote, then lost, read as {r:?}"),
    }
    drop(log);
    // The next process: what a crash may have taken.
    let log = DataLog::open(dir.path().to_path_buf()).unwrap();
    assert!(matches!(log.read(v, &a).unwrap(), Read::Lost(_)));
}

#[test]
fn usage_counts_segments_and_spares_of_every_volume() {
    let (dir, log) = new_log();
    assert_eq!(log.usage().unwrap(), LogUsage::default());
    let (v, w) = (VolumeId(1), VolumeId(2));
    log.append(v, &[1u8; 5000]).unwrap();
    log.append(w, &[2u8; 700]).unwrap();
    let u = log.usage().unwrap();
    assert_eq!((u.bytes, u.segments, u.spare_bytes, u.spares), (5700, 2, 0, 0));
    // Below the floor, v's segment becomes a spare; its next segment is new.
    log.sync().unwrap();
    let floor = log.rotate(v).unwrap();
    log.drop_below(v, floor).unwrap();
    log.append(v, &[3u8; 300]).unwrap();
    let u = log.usage().unwrap();
    assert_eq!((u.bytes, u.segments, u.spare_bytes, u.spares), (1000, 2, 5000, 1));
    // A segment made from the spare counts its length on disk (the
    // spare's), whatever its appends wrote over so far.
    log.rotate(v).unwrap();
    log.append(v, &[4u8; 100]).unwrap();
    let u = log.usage().unwrap();
    assert_eq!((u.bytes, u.segments, u.spare_bytes, u.spares), (6000, 3, 0, 0));
    // Other files in the log's directories are not the log's.
    std::fs::write(dir.path().join(format!("{:016x}", v.0)).join("stray.tmp"), b"x").unwrap();
    std::fs::write(dir.path().join("note"), b"x").unwrap();
    std::fs::write(dir.path().join(format!("{:016x}", 9)), b"a file, not a volume").unwrap();
    assert_eq!(log.usage().unwrap(), u);
}
