//! The inode-level API of fs volumes, and path diffs between their states.

use forkfs::fs::SetAttr;
use forkfs::fs::{FileKind, ROOT_INO};
use forkfs::{Diff, PathChange, SnapshotOptions, Store, StoreConfig, Target, VolumeKind};

fn setup() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("s"), StoreConfig::default()).unwrap();
    store.volumes().create("ws", VolumeKind::Fs, None, None).unwrap();
    (dir, store)
}

fn paths(d: Diff) -> Vec<(PathChange, String)> {
    let Diff::Fs { paths } = d else { panic!("not an fs diff") };
    paths.into_iter().map(|p| (p.change, p.path)).collect()
}

#[test]
fn files_grow_from_inline_to_blocks_and_truncate() {
    let (_d, store) = setup();
    let h = store.volumes().open_fs("ws").unwrap();
    let f = h.create(ROOT_INO, b"f", FileKind::File, 0o644, (0, 0), None).unwrap();
    let mut model = Vec::new();
    let writes: [(u64, usize); 6] =
        [(0, 100), (50, 3000), (70_000, 10), (200_000, 140_000), (5, 1), (0, 0)];
    for (i, (off, len)) in writes.iter().enumerate() {
        let data: Vec<u8> = (0..*len).map(|j| (i * 31 + j) as u8).collect();
        h.write_file(f.ino, *off, &data).unwrap();
        let end = *off as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[*off as usize..end].copy_from_slice(&data);
    }
    let read_all = |store: &Store| {
        let h = store.volumes().open_fs("ws").unwrap();
        let r = h.reader();
        let i = r.inode(f.ino).unwrap();
        let mut buf = vec![0u8; i.size as usize + 10];
        let n = r.read(&i, 0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    assert_eq!(read_all(&store), model);
    let v1 = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    assert_eq!(read_all(&store), model);
    h.set_attr(f.ino, &SetAttr { size: Some(70_003), ..Default::default() }).unwrap();
    model.truncate(70_003);
    h.set_attr(f.ino, &SetAttr { size: Some(90_000), ..Default::default() }).unwrap();
    model.resize(90_000, 0);
    assert_eq!(read_all(&store), model);
    store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    assert_eq!(read_all(&store), model);
    let d = paths(
        store.graph().diff(&Target::Version(v1), &store.graph().resolve("ws@~0").unwrap()).unwrap(),
    );
    assert_eq!(d, vec![(PathChange::Modified, "/f".to_string())]);
}

#[test]
fn path_diffs_see_adds_deletes_renames_and_the_dirty_head() {
    let (_d, store) = setup();
    let h = store.volumes().open_fs("ws").unwrap();
    let dir = h.create(ROOT_INO, b"dir", FileKind::Dir, 0o755, (0, 0), None).unwrap();
    let a = h.create(dir.ino, b"a", FileKind::File, 0o644, (0, 0), None).unwrap();
    h.write_file(a.ino, 0, b"aaa").unwrap();
    h.create(ROOT_INO, b"gone", FileKind::File, 0o644, (0, 0), None).unwrap();
    let base = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();

    h.create(ROOT_INO, b"new", FileKind::Symlink, 0o777, (0, 0), Some(b"dir/a")).unwrap();
    h.unlink(ROOT_INO, b"gone", &forkfs::fs::never_open).unwrap();
    h.write_file(a.ino, 100_000, b"grown into blocks").unwrap();
    // Against the live head, before any snapshot.
    let live = paths(
        store
            .graph()
            .diff(&Target::Version(base.clone()), &store.graph().resolve("ws").unwrap())
            .unwrap(),
    );
    assert_eq!(
        live,
        vec![
            (PathChange::Modified, "/dir/a".to_string()),
            (PathChange::Deleted, "/gone".to_string()),
            (PathChange::Added, "/new".to_string()),
        ]
    );
    let after = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    let committed = paths(
        store
            .graph()
            .diff(&Target::Version(base.clone()), &Target::Version(after.clone()))
            .unwrap(),
    );
    assert_eq!(committed, live, "the snapshot holds exactly what the head showed");
    // rmdir of a non-empty directory is refused and changes nothing.
    assert!(h.rmdir(ROOT_INO, b"dir", &forkfs::fs::never_open).is_err());
    assert!(h.is_clean().unwrap());
    let back = paths(store.graph().diff(&Target::Version(after), &Target::Version(base)).unwrap());
    assert_eq!(back.len(), 3);
    assert!(back.contains(&(PathChange::Added, "/gone".to_string())));
}

/// A file saved the way editors and `sed -i` save (a new file renamed
/// over the old) is one modification of its path; a file deleted and
/// another of another kind made under its name stay two changes.
#[test]
fn a_file_replaced_under_its_name_is_modified() {
    let (_d, store) = setup();
    let h = store.volumes().open_fs("ws").unwrap();
    let f = h.create(ROOT_INO, b"config", FileKind::File, 0o644, (0, 0), None).unwrap();
    h.write_file(f.ino, 0, b"port = 1").unwrap();
    h.create(ROOT_INO, b"link", FileKind::Symlink, 0o777, (0, 0), Some(b"config")).unwrap();
    let base = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    let tmp = h.create(ROOT_INO, b".config.swp", FileKind::File, 0o644, (0, 0), None).unwrap();
    h.write_file(tmp.ino, 0, b"port = 22").unwrap();
    let never = &forkfs::fs::never_open;
    h.rename(ROOT_INO, b".config.swp", ROOT_INO, b"config", forkfs::fs::RenameMode::Replace, never)
        .unwrap();
    h.unlink(ROOT_INO, b"link", never).unwrap();
    h.create(ROOT_INO, b"link", FileKind::Dir, 0o755, (0, 0), None).unwrap();
    let d = store.graph().diff(&Target::Version(base), &store.graph().resolve("ws").unwrap());
    let Diff::Fs { paths } = d.unwrap() else { panic!("not an fs diff") };
    let got: Vec<_> =
        paths.iter().map(|p| (p.change, p.path.as_str(), p.old_size, p.new_size)).collect();
    assert_eq!(
        got,
        vec![
            (PathChange::Modified, "/config", Some(8), Some(9)),
            (PathChange::Added, "/link", None, Some(0)),
            (PathChange::Deleted, "/link", Some(6), None),
        ]
    );
}

/// What a restore hands its hooks: exactly the inodes and names that differ
/// (a mount drops only those from the kernel's caches), however large the
/// unchanged rest of the tree.
#[test]
fn restore_hooks_get_the_changed_inodes_and_names_only() {
    use forkfs::fs::RenameMode;
    use forkfs::fs::{FsChanges, fs_changes};
    use std::sync::{Arc, Mutex};
    let (_d, store) = setup();
    let h = store.volumes().open_fs("ws").unwrap();
    let bulk = h.create(ROOT_INO, b"bulk", FileKind::Dir, 0o755, (0, 0), None).unwrap();
    for i in 0..2000 {
        let name = format!("f{i}");
        h.create(bulk.ino, name.as_bytes(), FileKind::File, 0o644, (0, 0), None).unwrap();
    }
    let d = h.create(ROOT_INO, b"d", FileKind::Dir, 0o755, (0, 0), None).unwrap();
    let kept = h.create(d.ino, b"kept", FileKind::File, 0o644, (0, 0), None).unwrap();
    let moved = h.create(d.ino, b"moved", FileKind::File, 0o644, (0, 0), None).unwrap();
    let base = store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();

    let added = h.create(ROOT_INO, b"added", FileKind::File, 0o644, (0, 0), None).unwrap();
    h.write_file(kept.ino, 0, b"new bytes").unwrap();
    h.rename(d.ino, b"moved", ROOT_INO, b"moved-here", RenameMode::Replace, &|_| false).unwrap();

    let seen: Arc<Mutex<Vec<FsChanges>>> = Arc::default();
    let (s2, seen2) = (store.clone(), seen.clone());
    store.graph().on_restore(Arc::new(move |r: &forkfs::Restored<'_>| {
        assert_eq!(r.volume, "ws");
        seen2.lock().unwrap().push(fs_changes(s2.chunks(), r.before.root, r.to.root).unwrap());
    }));
    store.graph().restore("ws", &base).unwrap();
    let got = seen.lock().unwrap().pop().expect("the hook ran");
    let mut inodes = got.inodes.clone();
    inodes.sort();
    let mut want = vec![ROOT_INO, d.ino, kept.ino, moved.ino, added.ino];
    want.sort();
    assert_eq!(inodes, want, "root and d (entries), kept (data), moved (name), added");
    let names: Vec<(u64, &[u8])> = got.entries.iter().map(|(p, n)| (*p, n.as_slice())).collect();
    for e in [(ROOT_INO, &b"added"[..]), (ROOT_INO, b"moved-here"), (d.ino, b"moved")] {
        assert!(names.contains(&e), "{e:?} missing from {names:?}");
    }
    assert!(names.len() <= 4, "only the changed names (and hash-group neighbours): {names:?}");
    assert!(!names.iter().any(|(p, _)| *p == bulk.ino), "the untouched directory is not listed");
    // After the restore the head holds exactly the base again.
    let back = fs_changes(store.chunks(), base.root, got_root(&store)).unwrap();
    assert_eq!(back, FsChanges { inodes: vec![], entries: vec![] }, "restored = base");
}

fn got_root(store: &Store) -> forkfs::MapRoot {
    store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap().root
}
