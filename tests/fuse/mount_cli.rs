//! The mount process itself: failures are reported alike with and without
//! --daemon, and SIGTERM unmounts after a final checkpoint.

use crate::common::mount::{Mounted, diff, is_fuse_mount, new_store, wait_gone};
use crate::common::{fails, json, ok};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The same failure exits alike in the foreground and with --daemon, and
/// like other commands meeting the same condition (README: 64 bad input,
/// 66 not found, 75 conflict).
#[test]
fn mount_errors_keep_their_exit_codes_with_daemon() {
    let (d, store) = new_store();
    ok(&store, &["volume", "create", "blk", "--block", "--size", "1M"]);
    ok(&store, &["volume", "create", "fs"]);
    ok(&store, &["snapshot", "fs", "--name", "v1"]);
    let dir = d.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let dir = dir.to_str().unwrap();
    let missing = d.path().join("no-such-dir");
    let missing = missing.to_str().unwrap();
    let nope = fails(&store, &["snapshot", "nope"]).0;
    let cases: [(&[&str], Option<i32>); 4] = [
        (&["nope", dir], Some(nope)),
        (&["blk", dir], None),
        (&["fs@v1", dir], None),
        (&["fs", missing], Some(nope)),
    ];
    let mut wrong = Vec::new();
    let mut check = |args: &[&str], want: Option<i32>| {
        let fg = fails(&store, &[&["mount"], args].concat());
        let bg = fails(&store, &[&["mount"], args, &["--daemon"]].concat());
        if bg.0 != fg.0 || want.is_some_and(|w| w != fg.0) {
            wrong.push(format!("{args:?}: foreground {fg:?}, --daemon {bg:?}, expected {want:?}"));
        }
        if args[1] == missing && !fg.1.contains("No such file") {
            wrong.push(format!("{args:?}: the reason is missing: {}", fg.1));
        }
    };
    for (args, want) in cases {
        check(args, want);
    }
    // The store held by another mount.
    let m = Mounted::new(&store, "fs", &[]);
    check(&["fs", dir], None);
    drop(m);
    assert!(!is_fuse_mount(Path::new(dir)));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn sigterm_unmounts_after_a_final_checkpoint() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "term", &["--checkpoint-every", "0"]);
    ok(&store, &["snapshot", "term", "--name", "before"]);
    std::fs::write(m.path("late"), b"written just before SIGTERM").unwrap();
    let versions = json(&store, &["log", "term"]).as_array().unwrap().len();
    assert_eq!(unsafe { libc::kill(m.pid() as i32, libc::SIGTERM) }, 0);
    assert!(wait_gone(m.pid(), 60), "still running after SIGTERM");
    assert!(!is_fuse_mount(m.dir()), "still mounted after SIGTERM");
    let log = json(&store, &["log", "term"]);
    assert_eq!(log.as_array().unwrap().len(), versions + 1, "no final checkpoint");
    assert_eq!(log[0]["origin"], "auto");
    let new = format!("term@{}", log[0]["id"].as_str().unwrap());
    let want = [("added".to_string(), "/late".to_string(), String::new())];
    assert_eq!(diff(&store, "term@before", &new), want.into());
}

/// A full disk at the mount's end: its last checkpoint fails, and
/// `forkfs umount` says so with the no-space code (73, as every command
/// meeting a full disk), not 0. Before, the failure went unrecorded (its
/// note needed space) and the daemon hung: its logger panicked on the full
/// disk. The store sits on a 48 MiB tmpfs filled by one file.
#[test]
fn umount_fails_with_no_space_when_the_last_checkpoint_cannot_be_saved() {
    let d = tempfile::tempdir().unwrap();
    let small = d.path().join("small");
    let _tmpfs = crate::common::Tmpfs::mount(&small, "size=48m");
    let store = small.join("store");
    ok(&store, &["init"]);
    ok(&store, &["volume", "create", "ws"]);
    let dir = d.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let out = ok(&store, &["mount", "ws", dir.to_str().unwrap(), "--daemon"]);
    let pid = crate::common::mount::mount_pid(&out);
    // Fills the disk (the write itself may fail with ENOSPC: fine).
    let _ = std::fs::write(dir.join("big"), crate::common::random(30 << 20, 7));
    let (code, err) = fails(&store, &["umount", dir.to_str().unwrap()]);
    assert_eq!(code, 73, "umount on a full disk: {err}");
    assert!(err.contains("not all was saved"), "{err}");
    assert!(wait_gone(pid, 30), "the mount process stays after its end");
    assert!(!is_fuse_mount(&dir));
}

/// `-o nodev,nosuid,noexec` (and dev, suid) reach the kernel as on any filesystem: statvfs
/// reports the flags and a script in the mount does not run (EACCES), the
/// same on a tmpfs mounted with them; without them the script runs.
/// Unknown options are refused as bad input.
#[test]
fn mount_options_reach_the_kernel_as_on_another_filesystem() {
    let (d, store) = new_store();
    let m = Mounted::new(&store, "opts", &["-o", "nodev,nosuid,noexec"]);
    let reference = d.path().join("tmpfs");
    let _tmpfs = crate::common::Tmpfs::mount(&reference, "size=1m,nodev,nosuid,noexec");
    let plain = Mounted::new(&store, "plain", &[]);
    let runs = |dir: &Path| {
        let script = dir.join("hello.sh");
        std::fs::write(&script, "#!/bin/sh\necho hello\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::process::Command::new(&script).output().map_err(|e| e.kind())
    };
    let flags = |dir: &Path| {
        let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
        s.f_flag & (libc::ST_NODEV | libc::ST_NOSUID | libc::ST_NOEXEC)
    };
    let all = libc::ST_NODEV | libc::ST_NOSUID | libc::ST_NOEXEC;
    for dir in [m.dir(), reference.as_path()] {
        assert_eq!(flags(dir), all, "{}", dir.display());
        let ran = runs(dir);
        assert_eq!(ran.err(), Some(std::io::ErrorKind::PermissionDenied), "{}", dir.display());
    }
    // By default a FUSE mount is nodev,nosuid (as fusermount3 makes it);
    // `-o dev,suid` lifts both.
    assert_eq!(flags(plain.dir()), libc::ST_NODEV | libc::ST_NOSUID);
    let open = Mounted::new(&store, "open", &["-o", "dev,suid"]);
    assert_eq!(flags(open.dir()), 0);
    let out = runs(plain.dir()).expect("a script runs on a mount without noexec");
    assert_eq!(out.stdout, b"hello\n");
    let dir = d.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    for bad in ["bogus", "relatime,bogus"] {
        let (code, err) = fails(&store, &["mount", "other", dir.to_str().unwrap(), "-o", bad]);
        assert_eq!(code, 64, "-o {bad}: {err}");
        assert!(err.contains("bogus"), "{err}");
    }
}

/// The top directory of a new volume belongs to whoever created it; an
/// imported tree's to the tree's owner, with its mode: a user mounting
/// their own workspace can write at its top.
#[test]
fn the_top_directory_belongs_to_the_volumes_creator_or_the_imported_tree() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    crate::common::mount::require_tool("su");
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = d.path().join("store");
    crate::common::ok(&s, &["init"]);
    // `nobody` creates a volume in a store it may write.
    let chown = |p: &std::path::Path, uid: u32, gid: u32| {
        let st = std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    };
    chown(&s, 65534, 65534);
    // The binaries where `nobody` may run them (the build directory may be
    // private): the launcher and the forkfs-core it runs.
    let bin = d.path().join("forkfs");
    for name in ["forkfs", "forkfs-core"] {
        let from = crate::common::forkfs_bin().with_file_name(name);
        let to = d.path().join(name);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    let made = std::process::Command::new("su")
        .args(["-s", "/bin/sh", "nobody", "-c"])
        .arg(format!("{} --store {} volume create mine", bin.display(), s.display()))
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    chown(&s, 0, 0);
    let tree = d.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), "x").unwrap();
    chown(&tree, 1234, 5678);
    std::fs::set_permissions(&tree, std::fs::Permissions::from_mode(0o710)).unwrap();
    crate::common::ok(&s, &["import", "theirs", tree.to_str().unwrap()]);
    let mine = Mounted::new(&s, "mine", &[]);
    let m = std::fs::metadata(mine.dir()).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65534, 0o755));
    let theirs = Mounted::new(&s, "theirs", &[]);
    let m = std::fs::metadata(theirs.dir()).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1234, 5678, 0o710));
    theirs.unmount();
    mine.unmount();
}

/// `forkfs umount` run from inside the mount says that it is the user in
/// the way, not just a pid.
#[test]
fn umount_from_inside_the_mount_says_so() {
    let (_d, s) = new_store();
    let m = Mounted::new(&s, "w", &[]);
    let out = crate::common::command(&s, &["umount", m.dir().to_str().unwrap()])
        .current_dir(m.dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("this command") && err.contains("working directory"), "{err}");
    assert!(is_fuse_mount(m.dir()), "still mounted");
    m.unmount();
}

/// Naming, deleting and retention reach the mount that holds the store;
/// a mounted volume cannot be deleted from under it.
#[test]
fn names_deletions_and_retention_work_while_mounted() {
    let (_d, s) = new_store();
    ok(&s, &["volume", "create", "spare"]);
    let m = Mounted::new(&s, "w", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("f"), "1").unwrap();
    ok(&s, &["snapshot", "w"]);
    std::fs::write(m.path("f"), "2").unwrap();
    ok(&s, &["snapshot", "w"]);
    assert!(ok(&s, &["tag", "w@~1", "first"]).contains("w@first"));
    assert_eq!(std::fs::read_to_string(m.path(".forkfs/versions/first/f")).unwrap(), "1");
    ok(&s, &["untag", "w", "first"]);
    let before = json(&s, &["log", "w"]).as_array().unwrap().len();
    ok(&s, &["delete-version", "w@~1"]);
    assert_eq!(json(&s, &["log", "w"]).as_array().unwrap().len(), before - 1);
    let r = json(&s, &["volume", "retention", "w", "--keep-recent", "7"]);
    assert_eq!(r["policy"]["keep_recent"], 7, "{r}");
    assert_eq!(json(&s, &["volume", "retention", "w"])["policy"]["keep_recent"], 7);
    let (code, msg) = fails(&s, &["volume", "delete", "w"]);
    assert_eq!(code, 75, "{msg}");
    assert!(msg.contains("unmount"), "{msg}");
    assert_eq!(std::fs::read_to_string(m.path("f")).unwrap(), "2", "the mount goes on");
    ok(&s, &["volume", "delete", "spare"]);
    let names: Vec<String> = json(&s, &["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["w"]);
    m.unmount();
}

/// A restore leaves the head at the version's state: no automatic version
/// follows it (sync, unmount) unless something changes, and a file made
/// after it still gets an inode number no earlier file had.
#[test]
fn a_restore_takes_no_extra_version() {
    let (_d, s) = new_store();
    let m = Mounted::new(&s, "w", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("a"), "1").unwrap();
    ok(&s, &["snapshot", "w", "--name", "one"]);
    std::fs::write(m.path("b"), "2").unwrap();
    let b_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(m.path("b")).unwrap());
    ok(&s, &["snapshot", "w"]);
    ok(&s, &["restore", "w", "one"]);
    let n = json(&s, &["log", "w"]).as_array().unwrap().len();
    let synced = json(&s, &["sync", "w"]);
    assert_eq!(synced[0]["recorded"], false, "{synced}");
    assert_eq!(json(&s, &["log", "w"]).as_array().unwrap().len(), n);
    std::fs::write(m.path("c"), "3").unwrap();
    let c_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(m.path("c")).unwrap());
    assert!(c_ino > b_ino, "inode {c_ino} after the restore, {b_ino} before it");
    std::fs::remove_file(m.path("c")).unwrap();
    let m = m.remount();
    assert!(!m.path("b").exists() && !m.path("c").exists());
    assert_eq!(std::fs::read_to_string(m.path("a")).unwrap(), "1");
    m.unmount();
}
