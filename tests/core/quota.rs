//! Per-volume quotas: what an fs volume's files count against its quota,
//! kept exactly through every kind of change, enforced with ENOSPC, and
//! restored with the tree.

use crate::common::{fails, json, ok};
use forkfs::fs::{FileKind, QUOTA_UNIT, ROOT_INO, SetAttr, charged, never_open};
use forkfs::{FsHead, Posix, SnapshotOptions, Store, StoreConfig, VolumeKind};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const KIB: u64 = 1024;

fn setup(quota: Option<u64>) -> (tempfile::TempDir, Store, FsHead) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    store.volumes().create("ws", VolumeKind::Fs, None, None).unwrap();
    if quota.is_some() {
        store.volumes().set_quota("ws", quota).unwrap();
    }
    let h = store.volumes().open_fs("ws").unwrap();
    (dir, store, h)
}

fn file(h: &FsHead, name: &str) -> u64 {
    h.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, (0, 0), None).unwrap().ino
}

fn size(h: &FsHead, ino: u64, size: u64) -> forkfs::Result<()> {
    h.set_attr(ino, &SetAttr { size: Some(size), ..Default::default() }).map(|_| ())
}

fn is_enospc(r: forkfs::Result<()>) -> bool {
    matches!(r, Err(e) if e.posix_condition() == Some(Posix::NoSpace))
}

#[test]
fn a_quota_counts_files_once_and_refuses_only_growth_past_it() {
    let (_d, store, h) = setup(Some(64 * KIB));
    let a = file(&h, "a");
    h.write_file(a, 0, &[1; 40 * 1024]).unwrap();
    let b = file(&h, "b");
    h.write_file(b, 0, &[2; 20 * 1024]).unwrap();
    assert_eq!(h.used().unwrap(), 60 * KIB);
    // 8 KiB more would take 68 KiB: refused, and nothing of it is kept.
    assert!(is_enospc(h.write_file(b, 20 * 1024, &[3; 8 * 1024])));
    assert_eq!(h.reader().inode(b).unwrap().size, 20 * KIB);
    assert_eq!(h.used().unwrap(), 60 * KIB);
    // Within the last 4 KiB unit a file already counts: allowed.
    h.write_file(b, 20 * 1024, &[3; 4 * 1024]).unwrap();
    assert_eq!(h.used().unwrap(), 64 * KIB);
    assert!(is_enospc(h.write_file(b, 24 * 1024, &[3; 1])));
    assert!(is_enospc(size(&h, a, 41 * KIB)));
    // A second name counts nothing; the file counts until its last name
    // goes and, unlinked while open, until its last close.
    h.link(a, ROOT_INO, b"a2").unwrap();
    assert_eq!(h.used().unwrap(), 64 * KIB);
    h.unlink(ROOT_INO, b"a", &never_open).unwrap();
    assert_eq!(h.used().unwrap(), 64 * KIB);
    h.unlink(ROOT_INO, b"a2", &|_| true).unwrap();
    assert_eq!(h.used().unwrap(), 64 * KIB);
    h.release(a).unwrap();
    assert_eq!(h.used().unwrap(), 24 * KIB);

    // A quota below the use: growth refused, shrinking and removal not.
    let (rec, used) = store.volumes().set_quota("ws", Some(16 * KIB)).unwrap();
    assert_eq!((rec.quota, used), (Some(16 * KIB), 24 * KIB));
    let c = file(&h, "c");
    assert!(is_enospc(h.write_file(c, 0, b"x")));
    size(&h, b, 10 * KIB).unwrap();
    assert_eq!(h.used().unwrap(), 12 * KIB);
    h.write_file(c, 0, b"x").unwrap();
    assert_eq!(h.used().unwrap(), 16 * KIB);

    // The count is the tree's: a restore brings back the version's.
    let v = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    h.unlink(ROOT_INO, b"b", &never_open).unwrap();
    assert_eq!(h.used().unwrap(), 4 * KIB);
    store.graph().restore("ws", &v).unwrap();
    assert_eq!(h.used().unwrap(), 16 * KIB);
    assert!(is_enospc(h.write_file(c, 4096, b"y")));
    // Removed, the quota limits nothing.
    store.volumes().set_quota("ws", None).unwrap();
    h.write_file(c, 0, &[5; 100 * 1024]).unwrap();
    assert_eq!(h.used().unwrap(), 112 * KIB);
}

#[test]
fn the_quota_and_the_count_survive_a_reopen_and_go_with_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let store = Store::init(&path, StoreConfig::default()).unwrap();
        store.volumes().create("ws", VolumeKind::Fs, None, None).unwrap();
        store.volumes().set_quota("ws", Some(8 * KIB)).unwrap();
        let h = store.volumes().open_fs("ws").unwrap();
        let f = file(&h, "f");
        h.write_file(f, 0, &[1; 5000]).unwrap();
        h.flush().unwrap();
    }
    let store = Store::open(&path).unwrap();
    let h = store.volumes().open_fs("ws").unwrap();
    assert_eq!((h.head().quota(), h.used().unwrap()), (Some(8 * KIB), 8 * KIB));
    let g = file(&h, "g");
    assert!(is_enospc(h.write_file(g, 0, b"z")));
    // A fork starts from the version's count, without the quota.
    let v = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    store.graph().fork(&v, "copy").unwrap();
    let copy = store.volumes().open_fs("copy").unwrap();
    assert_eq!((copy.head().quota(), copy.used().unwrap()), (None, 8 * KIB));
}

/// Random changes of every kind, each checked against a model of the
/// files' sizes: the kept count always equals what the model's files
/// charge, and a change is refused exactly when it would grow the count
/// past the quota.
#[test]
fn the_count_follows_a_model_through_random_changes() {
    const QUOTA: u64 = 300 * KIB;
    let (_d, _store, h) = setup(Some(QUOTA));
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    // ino -> (size, names)
    let mut files: BTreeMap<u64, (u64, Vec<String>)> = BTreeMap::new();
    let used = |files: &BTreeMap<u64, (u64, Vec<String>)>| -> u64 {
        files.values().map(|(s, _)| charged(FileKind::File, *s)).sum()
    };
    let (mut refused, mut n) = (0, 0);
    for step in 0..600 {
        let before = used(&files);
        let pick = |rng: &mut rand::rngs::StdRng, files: &BTreeMap<u64, (u64, Vec<String>)>| {
            let keys: Vec<u64> = files.keys().copied().collect();
            keys[rng.random_range(0..keys.len())]
        };
        match rng.random_range(0..10) {
            0 | 1 if files.len() < 40 => {
                let name = format!("f{n}");
                n += 1;
                let ino = file(&h, &name);
                files.insert(ino, (0, vec![name]));
            }
            _ if files.is_empty() => continue,
            // A write or a resize: the model says its new size, and whether
            // the quota must refuse it.
            k @ 2..=6 => {
                let ino = pick(&mut rng, &files);
                let (r, new_size) = if k <= 4 {
                    let off = rng.random_range(0..100 * KIB);
                    let len = rng.random_range(1..40 * KIB) as usize;
                    (h.write_file(ino, off, &vec![7; len]), files[&ino].0.max(off + len as u64))
                } else {
                    let to = rng.random_range(0..120 * KIB);
                    (size(&h, ino, to), to)
                };
                let after = before - charged(FileKind::File, files[&ino].0)
                    + charged(FileKind::File, new_size);
                if after > before && after > QUOTA {
                    assert!(is_enospc(r), "step {step}: growth past the quota passed");
                    refused += 1;
                } else {
                    r.unwrap();
                    files.get_mut(&ino).unwrap().0 = new_size;
                }
            }
            7 => {
                let ino = pick(&mut rng, &files);
                let name = format!("l{n}");
                n += 1;
                h.link(ino, ROOT_INO, name.as_bytes()).unwrap();
                files.get_mut(&ino).unwrap().1.push(name);
            }
            _ => {
                let ino = pick(&mut rng, &files);
                let name = files.get_mut(&ino).unwrap().1.pop().unwrap();
                h.unlink(ROOT_INO, name.as_bytes(), &never_open).unwrap();
                if files[&ino].1.is_empty() {
                    files.remove(&ino);
                }
            }
        }
        assert_eq!(h.used().unwrap(), used(&files), "step {step}");
        assert!(used(&files) <= QUOTA.max(before), "step {step}");
        assert_eq!(used(&files) % QUOTA_UNIT, 0);
    }
    assert!(refused > 10, "the quota was hit only {refused} times: the test is too weak");
}

#[test]
fn quotas_from_the_command_line() {
    let (_d, s) = crate::common::mount::new_store();
    let out = ok(&s, &["volume", "create", "ws", "--quota", "1M"]);
    assert!(out.contains("quota 1.0 MiB"), "{out}");
    let r = json(&s, &["volume", "quota", "ws"]);
    assert_eq!((r["quota"].as_u64(), r["used"].as_u64()), (Some(1 << 20), Some(0)));
    let r = json(&s, &["volume", "quota", "ws", "2M"]);
    assert_eq!(r["quota"].as_u64(), Some(2 << 20));
    let out = ok(&s, &["volume", "quota", "ws", "--none"]);
    assert!(out.contains("no quota"), "{out}");
    // Where a quota cannot be: one line, a non-zero exit, nothing made.
    ok(&s, &["volume", "create", "disk", "--block", "--size", "1M"]);
    let (code, err) = fails(&s, &["volume", "quota", "disk", "1M"]);
    assert!(code != 0 && err.contains("a quota is for fs volumes"), "{err}");
    let (_, err) = fails(&s, &["volume", "create", "ws2", "--quota", "0"]);
    assert!(err.contains("more than zero"), "{err}");
    let vols = json(&s, &["volume", "list"]);
    assert!(!vols.to_string().contains("ws2"), "{vols}");
}
