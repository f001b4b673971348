//! Real programs on a kernel FUSE mount of an fs volume: tar, git and
//! cargo, judged against the same work on the native filesystem or against
//! their own integrity checks; and versions taken, diffed and restored
//! while the volume is mounted.

use crate::common::mount::{Mounted, cpath, diff, lstat, new_store, require_tool, run};
use crate::common::{fails, json, ok};
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;
use std::process::Command;

/// Extra tarball entries the repository lacks: symlinks, a hard link,
/// unusual modes, an empty directory, odd names, a multi-block file.
fn extras(d: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let x = d.join("extras");
    std::fs::create_dir_all(x.join("empty dir")).unwrap();
    std::fs::create_dir_all(x.join("deep/er/still/deeper")).unwrap();
    std::fs::write(x.join("big.bin"), crate::common::random(700_000, 3)).unwrap();
    std::fs::write(x.join("inline-edge"), crate::common::random(2048, 4)).unwrap();
    std::fs::write(x.join("nämé with spaces ✓"), b"unicode").unwrap();
    std::fs::write(x.join(format!("{}.txt", "L".repeat(250))), b"long name").unwrap();
    std::fs::write(x.join("deep/er/still/deeper/leaf"), b"leaf").unwrap();
    for (name, mode) in [("private", 0o600), ("script", 0o755), ("odd", 0o4751), ("none", 0)] {
        std::fs::write(x.join(name), name).unwrap();
        std::fs::set_permissions(x.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::hard_link(x.join("big.bin"), x.join("big-link.bin")).unwrap();
    symlink("big.bin", x.join("rel-link")).unwrap();
    symlink("/nonexistent/target", x.join("dangling")).unwrap();
    symlink("deep/er", x.join("dir-link")).unwrap();
}

#[test]
fn tarball_unpacks_identically_to_native() {
    for t in ["tar", "diff"] {
        require_tool(t);
    }
    let (d, store) = new_store();
    extras(d.path());
    let tarball = d.path().join("t.tar");
    let repo = env!("CARGO_MANIFEST_DIR");
    // Exit 1 only warns that a file changed while read (others edit the
    // repository); the tarball is the reference either way.
    let out = Command::new("tar")
        .args(["--exclude=./target", "--exclude=./.git", "--exclude=./demo-store", "-cf"])
        .arg(&tarball)
        .args(["-C", repo, ".", "-C"])
        .arg(d.path())
        .arg("extras")
        .output()
        .unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "tar -c: {out:?}");
    let native = d.path().join("native");
    std::fs::create_dir(&native).unwrap();
    run(Command::new("tar").arg("-xpf").arg(&tarball).arg("-C").arg(&native));

    let m = Mounted::new(&store, "tar", &[]);
    run(Command::new("tar").arg("-xpf").arg(&tarball).arg("-C").arg(m.dir()));
    // tar's own check: content, mode, owner, mtime and link targets.
    run(Command::new("tar").arg("-df").arg(&tarball).arg("-C").arg(m.dir()));
    run(Command::new("diff").arg("-r").arg("--no-dereference").arg(&native).arg(m.dir()));

    let (a, b) = (walk(&native), walk(m.dir()));
    assert!(a.len() > 150, "only {} entries unpacked", a.len());
    assert_eq!(a, b, "modes, sizes, link counts or mtimes differ from the native unpack");

    // The same after a remount (from the store, not the kernel's caches).
    m.unmount();
    let m = Mounted::new(&store, "tar", &[]);
    assert_eq!(walk(m.dir()), a, "differs after a remount");
    run(Command::new("tar").arg("-df").arg(&tarball).arg("-C").arg(m.dir()));
}

/// (path, mode, size, nlink, mtime) of everything below `root`.
fn walk(root: &Path) -> BTreeSet<(String, u32, u64, u64, i64)> {
    let mut out = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let size = if md.is_dir() { 0 } else { md.len() };
            let mtime = if md.is_dir() { 0 } else { md.mtime() };
            let nlink = if md.is_dir() { 0 } else { md.nlink() };
            out.insert((rel, md.mode(), size, nlink, mtime));
            if md.is_dir() {
                todo.push(p);
            }
        }
    }
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let mut c = Command::new("git");
    c.current_dir(dir).args(args).env("GIT_CONFIG_GLOBAL", "/dev/null");
    run(c.env("GIT_CONFIG_NOSYSTEM", "1"))
}

#[test]
fn git_repository_stays_sound_across_branches_and_gc() {
    require_tool("git");
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "git", &[]);
    let r = m.path("repo");
    std::fs::create_dir(&r).unwrap();
    git(&r, &["init", "-q", "-b", "main"]);
    git(&r, &["config", "user.name", "Mount Test"]);
    git(&r, &["config", "user.email", "mount@test"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/head/fs");
    let mut main_files = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let body = std::fs::read(&p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::write(r.join(&name), &body).unwrap();
        main_files.push((name, body));
    }
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "main: fs head sources"]);
    git(&r, &["switch", "-q", "-c", "topic"]);
    let (first, _) = &main_files[0];
    std::fs::write(r.join(first), b"rewritten on topic\n").unwrap();
    std::fs::write(r.join("topic-only"), crate::common::random(300_000, 9)).unwrap();
    git(&r, &["rm", "-q", &main_files[1].0]);
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "topic"]);
    for _ in 0..3 {
        git(&r, &["switch", "-q", "main"]);
        for (name, body) in &main_files {
            assert_eq!(&std::fs::read(r.join(name)).unwrap(), body, "{name} on main");
        }
        assert!(!r.join("topic-only").exists());
        git(&r, &["switch", "-q", "topic"]);
        assert_eq!(std::fs::read(r.join(first)).unwrap(), b"rewritten on topic\n");
        assert_eq!(std::fs::read(r.join("topic-only")).unwrap(), crate::common::random(300_000, 9));
        assert!(!r.join(&main_files[1].0).exists());
    }
    git(&r, &["fsck", "--full", "--strict"]);
    assert_eq!(git(&r, &["status", "--porcelain"]), "");
    // Repacking rewrites, renames and deletes objects.
    git(&r, &["gc", "-q", "--aggressive", "--prune=now"]);
    git(&r, &["fsck", "--full", "--strict"]);
    assert_eq!(git(&r, &["status", "--porcelain"]), "");
    assert_eq!(git(&r, &["rev-list", "--count", "--all"]).trim(), "2");
    let diff = git(&r, &["diff", "--name-status", "main", "topic"]);
    let want = format!("M\t{}\nD\t{}\nA\ttopic-only\n", main_files[0].0, main_files[1].0);
    let sorted = |s: &str| s.lines().map(String::from).collect::<BTreeSet<_>>();
    assert_eq!(sorted(&diff), sorted(&want));
}

#[test]
fn cargo_builds_and_runs_a_crate_inside_the_mount() {
    require_tool("cargo");
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "cargo", &[]);
    let cargo = || {
        let mut c = Command::new("cargo");
        c.env("CARGO_TARGET_DIR", m.path("hello/target")).env_remove("RUSTFLAGS");
        c
    };
    run(cargo().current_dir(m.dir()).args(["new", "-q", "--vcs", "none", "hello"]));
    let hello = m.path("hello");
    run(cargo().current_dir(&hello).args(["build", "--offline"]));
    let exe = m.path("hello/target/debug/hello");
    assert_eq!(run(&mut Command::new(&exe)), "Hello, world!\n");
    // A second build finds everything fresh (mtimes and fingerprints hold).
    let out = cargo().current_dir(&hello).args(["build", "--offline", "-v"]).output().unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("Fresh hello"), "not fresh on the second build:\n{log}");
    // An edit rebuilds.
    std::fs::write(hello.join("src/main.rs"), "fn main() { println!(\"edited\"); }\n").unwrap();
    run(cargo().current_dir(&hello).args(["build", "--offline"]));
    assert_eq!(run(&mut Command::new(&exe)), "edited\n");
}

/// (change, path, from) triples, the shape `forkfs diff` lines are compared in.
fn set(items: &[(&str, &str, &str)]) -> BTreeSet<(String, String, String)> {
    items.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect()
}

/// The names a directory stream yields after rewinddir.
fn reread(dir: *mut libc::DIR) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    unsafe {
        libc::rewinddir(dir);
        loop {
            let e = libc::readdir(dir);
            if e.is_null() {
                break;
            }
            let n = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy().into_owned();
            if n != "." && n != ".." {
                names.insert(n);
            }
        }
    }
    names
}

#[test]
fn versions_taken_diffed_and_restored_while_mounted() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "live", &["--checkpoint-every", "0"]);
    std::fs::create_dir(m.path("dir")).unwrap();
    std::fs::write(m.path("keep"), b"unchanged").unwrap();
    std::fs::write(m.path("edit"), crate::common::random(100_000, 1)).unwrap();
    std::fs::write(m.path("gone"), b"to be deleted").unwrap();
    std::fs::write(m.path("dir/moved"), b"to be renamed").unwrap();
    ok(&store, &["snapshot", "live", "--name", "s1"]);
    let s1_names = ["dir", "edit", "gone", "keep"].map(String::from).into();

    let root = unsafe { libc::opendir(cpath(m.dir()).as_ptr()) };
    assert!(!root.is_null());
    assert_eq!(reread(root), s1_names);
    std::fs::write(m.path("edit"), crate::common::random(100_000, 2)).unwrap();
    std::fs::remove_file(m.path("gone")).unwrap();
    std::fs::write(m.path("new"), b"added").unwrap();
    std::fs::rename(m.path("dir/moved"), m.path("moved-up")).unwrap();
    let changes = set(&[
        ("modified", "/edit", ""),
        ("deleted", "/gone", ""),
        ("added", "/new", ""),
        ("renamed", "/moved-up", "/dir/moved"),
    ]);
    assert_eq!(diff(&store, "live@s1", "live"), changes);
    assert_eq!(reread(root).len(), 5);

    // Restore while mounted: the mount shows s1 at once, through paths
    // and through the directory stream opened before.
    let r = json(&store, &["restore", "live", "s1"]);
    let previous = r["previous_head"].as_str().unwrap().to_string();
    assert_eq!(reread(root), s1_names);
    assert_eq!(std::fs::read(m.path("edit")).unwrap(), crate::common::random(100_000, 1));
    assert_eq!(std::fs::read(m.path("gone")).unwrap(), b"to be deleted");
    assert_eq!(std::fs::read(m.path("dir/moved")).unwrap(), b"to be renamed");
    assert!(!m.path("new").exists(), "/new (created after s1) survived the restore");
    assert!(!m.path("moved-up").exists(), "/moved-up (renamed after s1) survived the restore");
    assert_eq!(diff(&store, "live@s1", "live"), BTreeSet::new());
    // Writes after a restore land on the restored tree.
    std::fs::write(m.path("after-restore"), b"x").unwrap();
    assert_eq!(diff(&store, "live@s1", "live"), set(&[("added", "/after-restore", "")]));

    // Undo: back to the state before the restore.
    ok(&store, &["restore", "live", &previous]);
    assert_eq!(reread(root).len(), 5);
    assert_eq!(std::fs::read(m.path("edit")).unwrap(), crate::common::random(100_000, 2));
    assert_eq!(std::fs::read(m.path("new")).unwrap(), b"added");
    assert!(!m.path("gone").exists() && !m.path("after-restore").exists());
    assert_eq!(diff(&store, "live@s1", "live"), changes);
    unsafe { libc::closedir(root) };

    // A fork while mounted shares s1.
    ok(&store, &["fork", "live@s1", "copy"]);
    assert_eq!(diff(&store, "live@s1", "copy"), BTreeSet::new());
    m.unmount();

    // A version mounts read-only, with its content.
    let v = Mounted::new(&store, "live@s1", &["--read-only"]);
    assert_eq!(std::fs::read(v.path("edit")).unwrap(), crate::common::random(100_000, 1));
    assert_eq!(std::fs::read(v.path("dir/moved")).unwrap(), b"to be renamed");
    let err = std::fs::write(v.path("edit"), b"no").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(std::fs::create_dir(v.path("d")).unwrap_err().raw_os_error(), Some(libc::EROFS));
}

/// A restore changes files behind the kernel's back; their sizes and
/// bytes follow it, also through a descriptor held open across it (the
/// kernel keeps the inode then). The kernel's writeback cache
/// (FUSE_WRITEBACK_CACHE) would break this: with it the kernel keeps its
/// own size for a file it caches, and never takes the mount's again. By
/// hand, a build asking for that cache failed this test: a file restored
/// from 70,006 bytes to 6 read as 70,006, zeros past the sixth (see
/// docs/BENCHMARKS.md, issue 16).
#[test]
fn a_restore_resizes_files_held_open() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "sizes", &["--checkpoint-every", "0"]);
    let long = crate::common::random(70_000, 3);
    std::fs::write(m.path("grows"), b"short\n").unwrap();
    std::fs::write(m.path("shrinks"), &long).unwrap();
    ok(&store, &["snapshot", "sizes", "--name", "one"]);
    let open =
        |n: &str| std::fs::OpenOptions::new().read(true).write(true).open(m.path(n)).unwrap();
    let (mut grows, mut shrinks) = (open("grows"), open("shrinks"));
    grows.seek(SeekFrom::End(0)).unwrap();
    grows.write_all(&long).unwrap();
    shrinks.set_len(0).unwrap();
    shrinks.write_all(b"short\n").unwrap();
    // (size, bytes read, whether they are `want`): short on failure.
    let whole = |f: &mut std::fs::File, want: &[u8]| {
        let mut v = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut v).unwrap();
        (f.metadata().unwrap().len(), v.len(), v == want)
    };
    // The kernel has both files' pages and sizes now.
    let grown = [&b"short\n"[..], &long].concat();
    assert_eq!(whole(&mut grows, &grown), (70_006, 70_006, true));
    assert_eq!(whole(&mut shrinks, b"short\n"), (6, 6, true));

    ok(&store, &["restore", "sizes", "one"]);
    assert_eq!(whole(&mut grows, b"short\n"), (6, 6, true), "a held file restored smaller");
    assert_eq!(whole(&mut shrinks, &long), (70_000, 70_000, true), "a held file restored larger");
    assert!(std::fs::read(m.path("grows")).unwrap() == b"short\n", "grows, by its path");
    assert!(std::fs::read(m.path("shrinks")).unwrap() == long, "shrinks, by its path");
}

/// A name looked up and missing is kept missing by the kernel (a
/// negative entry, for the TTL) in the tree's own directories, yet
/// appears at once when created through the mount or brought back by a
/// live restore; under `.forkfs`, a version made after its name was
/// looked up is found (`late` is taken away and brought back by
/// restores, `back` unlinked, then looked up, and brought back).
/// Negative controls (by hand): with the restore's `inval_entry` calls
/// removed (`mount::invalidate`) `back` stays missing, its LOOKUP's
/// negative entry unchanged; with those calls removed and no negative
/// entries either, the test passes, so it sees the negative entries;
/// with misses cached under `.forkfs` too, the new version stays missing.
#[test]
fn missing_names_follow_creates_restores_and_new_versions() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "misses", &["--checkpoint-every", "0"]);
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/back"), b"one").unwrap();
    ok(&store, &["snapshot", "misses", "--name", "zero"]);
    std::fs::write(m.path("d/late"), b"late").unwrap();
    ok(&store, &["snapshot", "misses", "--name", "one"]);
    ok(&store, &["restore", "misses", "zero"]);
    std::fs::remove_file(m.path("d/back")).unwrap();
    for n in ["late", "back", "new", "never"] {
        assert!(!m.path("d").join(n).exists(), "{n}");
    }
    std::fs::write(m.path("d/new"), b"x").unwrap();
    assert_eq!(std::fs::read(m.path("d/new")).unwrap(), b"x", "a name created through the mount");
    ok(&store, &["restore", "misses", "one"]);
    let read = |n: &str| std::fs::read(m.path("d").join(n)).ok();
    assert_eq!(read("late").as_deref(), Some(&b"late"[..]), "a restored name stayed missing");
    assert_eq!(read("back").as_deref(), Some(&b"one"[..]), "an unlinked name, restored");
    assert!(!m.path("d/new").exists(), "a name the restore took away");
    assert!(!m.path("d/never").exists());
    let two = m.path(".forkfs/versions/two");
    assert!(!two.exists());
    ok(&store, &["snapshot", "misses", "--name", "two"]);
    assert!(two.join("d/back").exists(), "a new version's name stayed missing");
}

/// Listings the kernel keeps across opens (FOPEN_CACHE_DIR; with
/// noatime no listing has to reach the mount) follow changes made through
/// the mount and restores, which drop the listings they change.
#[test]
fn cached_listings_follow_changes_and_restores() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "lists", &["--checkpoint-every", "0", "-o", "noatime"]);
    std::fs::create_dir(m.path("d")).unwrap();
    for n in ["a", "b"] {
        std::fs::write(m.path("d").join(n), b"x").unwrap();
    }
    // The sorted names a listing of `dir` gives.
    let listed = |dir: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(m.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let names = || listed("d");
    for _ in 0..3 {
        assert_eq!(names(), ["a", "b"]);
    }
    ok(&store, &["snapshot", "lists", "--name", "two"]);
    std::fs::write(m.path("d/c"), b"x").unwrap();
    std::fs::remove_file(m.path("d/a")).unwrap();
    for _ in 0..3 {
        assert_eq!(names(), ["b", "c"], "after changes through the mount");
    }
    ok(&store, &["restore", "lists", "two"]);
    assert_eq!(names(), ["a", "b"], "after a restore");
    assert_eq!(names(), ["a", "b"], "after a restore, listed again");

    // A directory moved to another parent lists its new "..", though its
    // mtime (all the kernel checks) stays.
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(m.path("d/sub")).unwrap();
    std::fs::create_dir(m.path("e")).unwrap();
    let d_ino = std::fs::metadata(m.path("d")).unwrap().ino();
    for _ in 0..2 {
        assert_eq!(dotdot(&m.path("d/sub")), d_ino);
    }
    std::fs::rename(m.path("d/sub"), m.path("e/sub")).unwrap();
    let e_ino = std::fs::metadata(m.path("e")).unwrap().ino();
    for _ in 0..2 {
        assert_eq!(dotdot(&m.path("e/sub")), e_ino, "\"..\" of a moved directory");
    }

    // `.forkfs/versions` lists versions and tags as they come and go,
    // though none of them passes through the kernel.
    let versions = || listed(".forkfs/versions");
    let has = |names: &[String], n: &str| names.iter().any(|x| x == n);
    assert!(has(&versions(), "two") && !has(&versions(), "three"));
    ok(&store, &["snapshot", "lists", "--name", "three"]);
    assert!(has(&versions(), "three"), "a new version stayed unlisted");
    ok(&store, &["tag", "lists@three", "four"]);
    assert!(has(&versions(), "four"), "a new tag stayed unlisted");
    ok(&store, &["untag", "lists", "four"]);
    assert!(!has(&versions(), "four"), "a removed tag stayed listed");
    ok(&store, &["delete-version", "lists@three"]);
    assert!(!has(&versions(), "three"), "a deleted version stayed listed");
}

/// The inode number a listing of `dir` gives "..".
fn dotdot(dir: &Path) -> u64 {
    let d = unsafe { libc::opendir(cpath(dir).as_ptr()) };
    assert!(!d.is_null(), "opendir {}", dir.display());
    let mut found = None;
    loop {
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        if name.to_bytes() == b".." {
            found = Some(unsafe { (*e).d_ino });
        }
    }
    unsafe { libc::closedir(d) };
    found.expect("a listing has \"..\"")
}

#[test]
fn open_unlinked_file_lives_until_closed_and_never_shows_in_versions() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "orphan", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("other"), b"stays").unwrap();
    ok(&store, &["snapshot", "orphan", "--name", "before"]);
    let p = m.path("tmpfile");
    let mut f =
        std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&p).unwrap();
    f.write_all(&crate::common::random(5000, 5)).unwrap();
    std::fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    f.write_all(&crate::common::random(200_000, 6)).unwrap();
    f.sync_all().unwrap();
    let md = f.metadata().unwrap();
    assert_eq!((md.nlink(), md.len()), (0, 205_000));
    ok(&store, &["snapshot", "orphan", "--name", "while-open"]);
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    let mut want = crate::common::random(5000, 5);
    want.extend(crate::common::random(200_000, 6));
    assert!(back == want, "content through the unlinked fd differs");
    assert_eq!(diff(&store, "orphan@before", "orphan@while-open"), BTreeSet::new());
    drop(f);
    let names: Vec<_> =
        std::fs::read_dir(m.dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["other"]);
    ok(&store, &["snapshot", "orphan", "--name", "after"]);
    assert_eq!(diff(&store, "orphan@before", "orphan@after"), BTreeSet::new());
    m.unmount();
    let fsck = crate::common::forkfs(&store, &["fsck"]);
    assert!(fsck.status.success(), "fsck: {}", String::from_utf8_lossy(&fsck.stdout));
}

#[test]
fn open_removed_directory_lives_until_closed_and_never_shows_in_versions() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "odir", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("other"), b"stays").unwrap();
    ok(&store, &["snapshot", "odir", "--name", "before"]);
    std::fs::create_dir(m.path("d")).unwrap();
    let held = std::fs::File::open(m.path("d")).unwrap();
    std::fs::remove_dir(m.path("d")).unwrap();
    let md = held.metadata().expect("fstat of the removed directory through its descriptor");
    assert!(md.is_dir());
    assert_eq!(md.nlink(), 0);
    held.set_permissions(std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(held.metadata().unwrap().permissions().mode() & 0o7777, 0o700);
    ok(&store, &["snapshot", "odir", "--name", "while-open"]);
    assert_eq!(diff(&store, "odir@before", "odir@while-open"), BTreeSet::new());
    drop(held);
    ok(&store, &["snapshot", "odir", "--name", "after"]);
    assert_eq!(diff(&store, "odir@before", "odir@after"), BTreeSet::new());
    // The kernel let go of it at the close (its FORGET, queued then,
    // comes first among the mount's requests): it is gone, and the next
    // mount finds no orphan to delete.
    std::thread::sleep(std::time::Duration::from_millis(200));
    m.unmount();
    let again = Mounted::new(&store, "odir", &["-v"]);
    again.unmount();
    let log = std::fs::read_to_string(store.join("logs/mount-odir.log")).unwrap();
    assert!(!log.contains("left open by an earlier mount"), "the removed directory stayed: {log}");
    let fsck = crate::common::forkfs(&store, &["fsck"]);
    assert!(fsck.status.success(), "fsck: {}", String::from_utf8_lossy(&fsck.stdout));
}

/// Every mount of a store is served by the process that holds it: forks
/// read-write and any number of versions read-only, next to the first
/// mount, which may end first; one writer per volume.
#[test]
fn later_mounts_are_hosted_by_the_process_holding_the_store() {
    let (_d, store) = new_store();
    let live = Mounted::new(&store, "live", &["--checkpoint-every", "0"]);
    std::fs::write(live.path("f"), b"one").unwrap();
    ok(&store, &["snapshot", "live", "--name", "s1"]);
    std::fs::write(live.path("f"), b"two").unwrap();
    ok(&store, &["snapshot", "live", "--name", "s2"]);
    ok(&store, &["fork", "live@s1", "copy"]);

    let copy = Mounted::new(&store, "copy", &[]);
    assert_eq!(copy.pid(), live.pid(), "the holder of the store serves the fork");
    let v1 = Mounted::new(&store, "live@s1", &["--read-only"]);
    let v2 = Mounted::new(&store, "live@s2", &["--read-only"]);
    let v1b = Mounted::new(&store, "live@s1", &["--read-only"]);
    assert_eq!(std::fs::read(copy.path("f")).unwrap(), b"one");
    assert_eq!(std::fs::read(v1.path("f")).unwrap(), b"one");
    assert_eq!(std::fs::read(v2.path("f")).unwrap(), b"two");
    assert_eq!(std::fs::read(v1b.path("f")).unwrap(), b"one");
    std::fs::write(copy.path("f"), b"forked").unwrap();
    assert_eq!(std::fs::read(live.path("f")).unwrap(), b"two", "forks share nothing mutable");

    // One mount of a volume's live state: a second one is refused, also
    // read-only (its caches would not see the writer's changes).
    let other = tempfile::tempdir().unwrap();
    let (code, msg) = fails(&store, &["mount", "live", other.path().to_str().unwrap(), "--daemon"]);
    assert_eq!(code, 75, "{msg}");
    assert!(msg.contains("already mounted"), "{msg}");
    let (code, msg) = fails(
        &store,
        &["mount", "live", other.path().to_str().unwrap(), "--daemon", "--read-only"],
    );
    assert_eq!(code, 75, "a live read-only mount next to the writer: {msg}");
    assert!(!crate::common::mount::is_fuse_mount(other.path()));

    // A restore of live drops the kernel's caches of live only.
    ok(&store, &["restore", "live", "s1"]);
    assert_eq!(std::fs::read(live.path("f")).unwrap(), b"one");
    assert_eq!(std::fs::read(v2.path("f")).unwrap(), b"two");

    // The first mount ends first; the others go on, then the process ends.
    let pid = live.pid();
    live.unmount();
    assert!(!crate::common::mount::wait_gone(pid, 0), "the holder left with mounts still up");
    std::fs::write(copy.path("g"), b"after").unwrap();
    for m in [v1, v2, v1b] {
        m.unmount();
    }
    copy.unmount();
    assert!(crate::common::mount::wait_gone(pid, 10), "the holder outlived its last mount");
    let want = set(&[("modified", "/f", ""), ("added", "/g", "")]);
    assert_eq!(diff(&store, "live@s1", "copy"), want, "the fork's writes were kept");
}

#[test]
fn hard_link_paths_in_diffs_follow_the_remaining_name() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "links", &["--checkpoint-every", "0"]);
    for (case, rmdir) in [("keep", false), ("rmdir", true)] {
        let d = m.path(case);
        std::fs::create_dir(&d).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/first"), b"one").unwrap();
        std::fs::hard_link(d.join("sub/first"), d.join("second")).unwrap();
        ok(&store, &["snapshot", "links", "--name", case]);
        // The first name goes (and, in one case, its directory too).
        std::fs::remove_file(d.join("sub/first")).unwrap();
        if rmdir {
            std::fs::remove_dir(d.join("sub")).unwrap();
        }
        std::fs::write(d.join("second"), b"one, then two").unwrap();
        assert_eq!(lstat(&d.join("second")).st_nlink, 1);
        let out =
            crate::common::forkfs(&store, &["--json", "diff", &format!("links@{case}"), "links"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{case}: diff failed: {err}");
        let got = diff(&store, &format!("links@{case}"), "links");
        let exists = |p: &str| std::fs::symlink_metadata(m.path(&p[1..])).is_ok();
        for (change, path, _) in &got {
            let now = change != "deleted";
            assert_eq!(exists(path), now, "{case}: {change} {path}, yet it exists: {}", !now);
        }
        let second = format!("/{case}/second");
        assert!(got.iter().any(|(_, p, _)| *p == second), "{case}: {second} missing in {got:?}");
    }
}

/// The workspace as an overlayfs upper directory (containers): deleting
/// and renaming lower files leaves whiteouts in the workspace, which hide
/// them again after the overlay is mounted anew, and are versioned.
#[test]
fn overlayfs_uses_the_workspace_as_its_upper_directory() {
    struct Overlay(std::path::PathBuf);
    impl Drop for Overlay {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let mount_overlay = |lower: &Path, m: &Mounted, at: &Path| {
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            m.path("upper").display(),
            m.path("work").display()
        );
        run(Command::new("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(at));
        Overlay(at.to_path_buf())
    };
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "ovl", &["--checkpoint-every", "0"]);
    let lower = tempfile::tempdir().unwrap();
    for f in ["gone", "kept", "moved"] {
        std::fs::write(lower.path().join(f), format!("lower {f}")).unwrap();
    }
    std::fs::create_dir(m.path("upper")).unwrap();
    std::fs::create_dir(m.path("work")).unwrap();
    ok(&store, &["snapshot", "ovl", "--name", "empty"]);
    let merged = tempfile::tempdir().unwrap();
    let o = mount_overlay(lower.path(), &m, merged.path());
    let at = |f: &str| merged.path().join(f);
    std::fs::remove_file(at("gone")).unwrap();
    std::fs::rename(at("moved"), at("renamed")).unwrap();
    std::fs::write(at("kept"), b"upper kept").unwrap();
    std::fs::write(at("new"), b"upper new").unwrap();
    let names = |d: &Path| -> BTreeSet<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let want: BTreeSet<String> = ["kept", "new", "renamed"].map(String::from).into();
    assert_eq!(names(merged.path()), want);
    drop(o);
    // Whiteouts in the workspace: 0:0 character devices.
    for f in ["gone", "moved"] {
        let st = lstat(&m.path(&format!("upper/{f}")));
        assert_eq!((st.st_mode & libc::S_IFMT, st.st_rdev), (libc::S_IFCHR, 0), "upper/{f}");
    }
    let o = mount_overlay(lower.path(), &m, merged.path());
    assert_eq!(names(merged.path()), want, "after the overlay is mounted again");
    assert_eq!(std::fs::read(at("renamed")).unwrap(), b"lower moved");
    assert_eq!(std::fs::read(at("kept")).unwrap(), b"upper kept");
    drop(o);
    ok(&store, &["snapshot", "ovl", "--name", "changed"]);
    let changed: BTreeSet<String> =
        diff(&store, "ovl@empty", "ovl@changed").into_iter().map(|(_, p, _)| p).collect();
    for f in ["upper/gone", "upper/moved", "upper/kept", "upper/renamed"] {
        assert!(changed.iter().any(|p| p.trim_start_matches('/') == f), "{f} in {changed:?}");
    }
}
