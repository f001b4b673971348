//! Golden tests of the head layer's formats (docs/FORMAT.md: the `overlay`
//! column family, data log segments, inode records, directory entry
//! groups, the fs record): fixed inputs encoded by the real code are
//! compared byte for byte with `tests/golden/`, and the checked-in bytes
//! decode to the inputs. `FORKFS_BLESS=1` rewrites the files (see
//! `files::golden`).

use super::datalog::{DataLog, LogRef, Read};
use super::fs::inode::{
    Content, DirEntry, FL_IMMUTABLE, FL_NODUMP, FileKind, Inode, Meta, Time, decode_entries,
    encode_entries,
};
use super::overlay::{self, Dirty, Space};
use super::patch::{Patch, Span};
use super::prior::{Earlier, Prior};
use crate::files::golden;
use crate::id::{ChunkId, VolumeId};
use bytes::Bytes;

#[test]
fn golden_overlay_entries() {
    let r = LogRef { seq: 5, offset: 0x1_0000, len: 4096, crc: 0xdead_beef };
    let cases = [
        ("overlay-delete.bin", Space::Root, Dirty::Delete),
        ("overlay-value.bin", Space::Dir, Dirty::Value(Bytes::from_static(b"value"))),
        ("overlay-logged.bin", Space::File, Dirty::Logged(r)),
        (
            "overlay-over.bin",
            Space::Root,
            Dirty::Over(
                r,
                Prior::chained(
                    Earlier::Logged(LogRef { seq: 4, offset: 0x2000, len: 4096, crc: 7 }),
                    Some(&Prior {
                        chain: vec![Earlier::Value(Bytes::from_static(b"id")), Earlier::Hole],
                        cut: false,
                    }),
                ),
            ),
        ),
        (
            "overlay-patch.bin",
            Space::Root,
            Dirty::Patch(Box::new(Patch {
                under: Some(Dirty::Value(Bytes::from_static(b"chunk id"))),
                spans: vec![
                    Span { at: 4096, r },
                    Span { at: 512, r: LogRef { seq: 6, offset: 0x40, len: 1024, crc: 9 } },
                ],
            })),
        ),
    ];
    for (name, space, dirty) in cases {
        let key = overlay::key(VolumeId(3), space, 42, 0x0102);
        let mut stored = key.to_vec();
        stored.extend_from_slice(&dirty.encode());
        let want = golden(name, &stored);
        let (k, v) = want.split_at(overlay::KEY_LEN);
        let decoded = overlay::decode_raw(k, v).expect("decodes");
        assert_eq!(decoded, (VolumeId(3), space, 42, 0x0102, dirty), "{name}");
    }
}

#[test]
fn golden_data_log_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = DataLog::open(dir.path().to_path_buf()).expect("opens");
    let vol = VolumeId(1);
    let a = log.append(vol, b"first block").expect("append");
    let b = log.append(vol, b"second").expect("append");
    log.sync().expect("sync");
    let seg = dir.path().join("0000000000000001/0000000000000001.seg");
    let want = golden("datalog-segment.bin", &std::fs::read(&seg).expect("segment"));
    let refs = golden("datalog-refs.bin", &[a.encode(), b.encode()].concat());
    // The checked-in segment, read through the checked-in references.
    std::fs::write(&seg, &want).expect("rewrite");
    drop(log);
    let log = DataLog::open(dir.path().to_path_buf()).expect("reopens");
    for (chunk, plain) in refs.chunks(LogRef::LEN).zip([&b"first block"[..], b"second"]) {
        let r = LogRef::decode(chunk).expect("decodes");
        assert_eq!(log.read(vol, &r).expect("reads"), Read::Data(Bytes::copy_from_slice(plain)));
    }
}

fn inode(links: Vec<(u64, Bytes)>) -> Inode {
    let t = |s| Time { secs: s, nanos: 123_456_789 };
    Inode {
        ino: 42,
        kind: FileKind::File,
        perm: 0o644,
        uid: 1000,
        gid: 100,
        nlink: 1 + links.len() as u32,
        size: 5,
        rdev: 0,
        atime: t(1_790_000_000),
        mtime: t(1_790_000_001),
        ctime: t(-2),
        crtime: t(1_790_000_003),
        parent: 1,
        name: Bytes::from_static(b"file.txt"),
        content: Content::Inline(Bytes::from_static(b"hello")),
        xattrs: vec![(Bytes::from_static(b"user.k"), Bytes::from_static(b"v"))],
        links,
        flags: 0,
    }
}

#[test]
fn golden_inode_records() {
    let one = inode(Vec::new());
    let want = golden("inode-file.bin", &one.encode());
    assert_eq!(Inode::decode(&Bytes::from(want)).expect("decodes"), one);
    let linked = inode(vec![(7, Bytes::from_static(b"other name"))]);
    let want = golden("inode-file-links.bin", &linked.encode());
    assert_eq!(Inode::decode(&Bytes::from(want)).expect("decodes"), linked);
    // Flags (chattr) follow the links in the tail.
    let flagged = Inode { flags: FL_IMMUTABLE | FL_NODUMP, ..linked.clone() };
    let want = golden("inode-file-links-flags.bin", &flagged.encode());
    assert_eq!(Inode::decode(&Bytes::from(want)).expect("decodes"), flagged);
    let dir = Inode {
        kind: FileKind::Dir,
        content: Content::Entries(Some(ChunkId([0x33; 32]))),
        xattrs: Vec::new(),
        ..inode(Vec::new())
    };
    let want = golden("inode-dir.bin", &dir.encode());
    assert_eq!(Inode::decode(&Bytes::from(want)).expect("decodes"), dir);
}

#[test]
fn golden_directory_entries_and_fs_record() {
    let entries = vec![
        DirEntry { name: Bytes::from_static(b"a"), ino: 2, kind: FileKind::File },
        DirEntry { name: Bytes::from_static(b"sub"), ino: 3, kind: FileKind::Dir },
    ];
    let want = golden("dir-entries.bin", &encode_entries(&entries));
    assert_eq!(decode_entries(&Bytes::from(want)).expect("decodes"), entries);
    let cases = [
        ("fs-record.bin", vec![], None),
        ("fs-record-orphans.bin", vec![9, 10], None),
        ("fs-record-used.bin", vec![], Some(3 << 12)),
    ];
    for (name, orphans, used) in cases {
        let meta = Meta { next_ino: 11, orphans, used };
        let want = golden(name, &meta.encode());
        assert_eq!(Meta::decode(&Bytes::from(want)).expect("decodes"), meta);
    }
}
