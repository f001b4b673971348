//! The store directory failing under a running mount (issue 25): moved
//! away, removed, or its filesystem turned read-only by an error. Each
//! time an fsync after the failure fails (never acknowledged as durable),
//! the mount process still ends on SIGTERM within a bound, and what was
//! fsynced before is in the store when a new process opens it.
//!
//! Negative controls (by hand): `db/mod.rs`'s synced writes without the
//! directory check: the fsync after the move or the removal succeeds,
//! and both of those tests fail there; `mount/fuse/mod.rs` answering write
//! and fsync with success whatever the store said: the read-only test
//! fails at `b`'s fsync. (The full disk is
//! `mount_lifecycle::a_full_store_disk_under_a_mount_fails_writes_and_the_mount_stays_stoppable`.)

use crate::common::mount::{Mounted, wait_gone};
use crate::common::{fails, ok, random};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes `data` to `path` in the mount and fsyncs it.
fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// SIGTERM to the mount process; asserts it is gone within 30 s.
fn stop(m: &Mounted) {
    let pid = m.pid();
    // SAFETY: a signal to the mount process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(wait_gone(pid, 30), "the mount outlived SIGTERM");
}

/// A mounted workspace `ws` of a new store at `store`, with `a` (1 MiB)
/// written and fsynced: returns the mount and `a`'s bytes.
fn mounted_with_a(store: &Path) -> (Mounted, Vec<u8>) {
    ok(store, &["init"]);
    let m = Mounted::new(store, "ws", &["--checkpoint-every", "0"]);
    let a = random(1 << 20, 51);
    write_synced(&m.path("a"), &a).expect("a written and fsynced");
    (m, a)
}

#[test]
fn a_store_directory_moved_away_under_a_mount_fails_fsync_and_keeps_what_was_synced() {
    let outer = tempfile::tempdir().unwrap();
    let store = outer.path().join("store");
    let (m, a) = mounted_with_a(&store);
    let moved = outer.path().join("moved");
    std::fs::rename(&store, &moved).unwrap();
    let err = write_synced(&m.path("b"), b"after the move").expect_err("fsync after the move");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    stop(&m);
    // The store, where it is now, opens in a new process with `a` intact.
    let out = outer.path().join("out");
    ok(&moved, &["export", "ws", out.to_str().unwrap()]);
    assert!(std::fs::read(out.join("a")).unwrap() == a, "a lost");
    let log = std::fs::read_to_string(moved.join("logs/mount-ws.log")).unwrap_or_default();
    assert!(log.contains("was removed, moved or replaced"), "the log does not say why: {log}");
}

#[test]
fn a_store_directory_removed_under_a_mount_fails_fsync_and_the_mount_stays_stoppable() {
    let outer = tempfile::tempdir().unwrap();
    let store = outer.path().join("store");
    let (m, _) = mounted_with_a(&store);
    std::fs::remove_dir_all(&store).unwrap();
    let err = write_synced(&m.path("b"), b"after the removal").expect_err("fsync after rm -rf");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // A new store at the same path is not the mount's: it stays untouched.
    ok(&store, &["init"]);
    let err = write_synced(&m.path("c"), b"after a new store").expect_err("fsync, new store");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    stop(&m);
    let vols = ok(&store, &["volume", "list"]);
    assert!(!vols.contains("ws"), "the old mount wrote into the new store: {vols}");
}

/// An ext4 filesystem in a file, on a loop device, mounted with
/// `errors=remount-ro`; unmounted when dropped.
struct Ext4 {
    img: PathBuf,
    dir: PathBuf,
}

impl Ext4 {
    fn new(img: PathBuf, dir: PathBuf) -> Ext4 {
        std::fs::File::create(&img).unwrap().set_len(256 << 20).unwrap();
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
        std::fs::create_dir_all(&dir).unwrap();
        let fs = Ext4 { img, dir };
        fs.mount();
        fs
    }

    fn mount(&self) {
        run(Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&self.img)
            .arg(&self.dir));
    }

    /// An error as the disk would raise one: ext4 turns read-only.
    fn fail(&self) {
        let dev = run(Command::new("findmnt").args(["-n", "-o", "SOURCE"]).arg(&self.dir));
        let dev = dev.trim().rsplit('/').next().unwrap().to_string();
        std::fs::write(format!("/sys/fs/ext4/{dev}/trigger_fs_error"), "test\n")
            .expect("ext4's trigger_fs_error");
    }

    /// Unmounted, checked and mounted read-write again.
    fn repair(&self) {
        run(Command::new("umount").arg(&self.dir));
        // 1: errors corrected.
        let st = Command::new("e2fsck").arg("-fy").arg(&self.img).output().expect("e2fsck");
        assert!(st.status.code().is_some_and(|c| c <= 1), "e2fsck: {st:?}");
        self.mount();
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Runs `cmd`, asserting success; its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e} (needs root, e2fsprogs)"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_store_filesystem_turned_read_only_under_a_mount_fails_writes_and_keeps_what_was_synced() {
    let outer = tempfile::tempdir().unwrap();
    let fs = Ext4::new(outer.path().join("disk.img"), outer.path().join("disk"));
    let store = fs.dir.join("store");
    let (m, a) = mounted_with_a(&store);
    // Opened before: its writes after the failure need no new inode.
    let mut b = std::fs::File::create(m.path("b")).unwrap();
    fs.fail();
    let wrote = b.write_all(&random(1 << 20, 53)).and_then(|()| b.sync_all());
    let err = wrote.expect_err("written and fsynced on a read-only store");
    assert!(matches!(err.raw_os_error(), Some(libc::EIO) | Some(libc::EROFS)), "{err}");
    drop(b);
    let (code, msg) = fails(&store, &["snapshot", "ws"]);
    assert!(code != 0 && msg.lines().count() == 1, "snapshot: {code} {msg}");
    stop(&m);
    drop(m);
    fs.repair();
    let out = outer.path().join("out");
    ok(&store, &["export", "ws", out.to_str().unwrap()]);
    assert!(std::fs::read(out.join("a")).unwrap() == a, "a lost");
}
