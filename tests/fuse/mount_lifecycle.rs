//! The mount's life cycle (issue 17): a volume is mountable again the
//! moment its unmount returns, whoever unmounted it; `forkfs umount` says
//! who keeps a busy mount busy and has `--lazy`; it never unmounts what
//! forkfs did not mount; a removed control socket comes back, and the
//! mount process stays stoppable without it.

use crate::common::mount::{Mounted, is_fuse_mount, mount_pid, new_store, statfs_type, wait_gone};
use crate::common::{Tmpfs, fails, forkfs, ok};

/// Rounds of each unmount kind (`FORKFS_REMOUNT_ROUNDS`, default 100).
fn rounds() -> usize {
    std::env::var("FORKFS_REMOUNT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

/// Mount, write, unmount (the kernel's `umount`, `fusermount3 -u`, or
/// `forkfs umount`), and mount again at once, round after round: every
/// mount succeeds and finds every earlier round's file.
#[test]
fn a_volume_is_mountable_again_the_moment_its_unmount_returns() {
    let (d, store) = new_store();
    ok(&store, &["volume", "create", "ws"]);
    let dir = d.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let dir_s = dir.to_str().unwrap();
    let n = rounds();
    let mut pids = Vec::new();
    let mut failures = Vec::new();
    for round in 0..n * 3 {
        let out = forkfs(&store, &["mount", "ws", dir_s, "--daemon", "--checkpoint-every", "0"]);
        if !out.status.success() {
            failures.push(format!(
                "round {round}: mount: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            if failures.len() > 5 {
                break;
            }
            continue;
        }
        pids.push(mount_pid(&String::from_utf8_lossy(&out.stdout)));
        for earlier in 0..round {
            let p = dir.join(format!("f{earlier}"));
            if failures.is_empty() && std::fs::read(&p).ok() != Some(earlier.to_le_bytes().to_vec())
            {
                failures.push(format!("round {round}: f{earlier} lost"));
            }
        }
        std::fs::write(dir.join(format!("f{round}")), round.to_le_bytes()).unwrap();
        let how = ["umount", "fusermount3", "forkfs"][round % 3];
        let done = match how {
            "umount" => std::process::Command::new("umount").arg(&dir).status().unwrap().success(),
            "fusermount3" => std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(&dir)
                .status()
                .unwrap()
                .success(),
            _ => forkfs(&store, &["umount", dir_s]).status.success(),
        };
        assert!(done, "round {round}: {how} failed");
        assert!(!is_fuse_mount(&dir), "round {round}: still mounted after {how}");
    }
    for pid in pids {
        assert!(wait_gone(pid, 30), "mount process {pid} stays");
    }
    assert!(failures.is_empty(), "{} rounds:\n{}", n * 3, failures.join("\n"));
}

/// `forkfs umount` unmounts only forkfs mounts: a tmpfs (or a directory
/// with nothing mounted) is refused as bad input, and stays as it was.
#[test]
fn umount_refuses_what_forkfs_did_not_mount() {
    let (d, store) = new_store();
    let other = d.path().join("tmpfs");
    let _tmpfs = Tmpfs::mount(&other, "size=1m");
    std::fs::write(other.join("kept"), b"not ours").unwrap();
    let (code, err) = fails(&store, &["umount", other.to_str().unwrap()]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("is not a forkfs mount (it is tmpfs from tmpfs)"), "{err}");
    assert_eq!(statfs_type(&other), libc::TMPFS_MAGIC, "the tmpfs was unmounted");
    assert_eq!(std::fs::read(other.join("kept")).unwrap(), b"not ours");
    let plain = d.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let (code, err) = fails(&store, &["umount", plain.to_str().unwrap()]);
    assert_eq!((code, err.contains("is not mounted")), (64, true), "{err}");
}

/// A busy mount: `forkfs umount` fails at once naming the processes that
/// use it (as `fuser -m` would), and leaves it mounted; `--lazy` detaches
/// it, and the mount ends, with its last checkpoint, when they let go.
#[test]
fn umount_of_a_busy_mount_names_its_users_and_lazy_detaches_it() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    let dir = m.dir().to_str().unwrap().to_string();
    std::fs::write(m.path("kept"), b"written before the umount").unwrap();
    let open = std::fs::File::open(m.path("kept")).unwrap();
    let t = std::time::Instant::now();
    let (code, err) = fails(&store, &["umount", &dir]);
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "umount waited on a busy mount");
    assert_eq!(code, 75, "{err}");
    let me = format!("({})", std::process::id());
    assert!(err.contains("is busy") && err.contains(&me) && err.contains("--lazy"), "{err}");
    assert!(is_fuse_mount(m.dir()), "a busy mount was unmounted");

    let out = ok(&store, &["umount", &dir, "--lazy"]);
    assert!(out.contains("detached"), "{out}");
    assert!(!is_fuse_mount(m.dir()), "still mounted after --lazy");
    assert!(!wait_gone(m.pid(), 1), "the mount ended while a file in it is open");
    drop(open);
    assert!(wait_gone(m.pid(), 30), "the mount outlived its last user");
    // Its last checkpoint holds the file.
    let again = Mounted::new(&store, "ws", &[]);
    assert_eq!(std::fs::read(again.path("kept")).unwrap(), b"written before the umount");
}

/// The control socket removed or replaced under a running mount (a tmp
/// cleaner, a person): the mount binds it again, so commands reach it
/// and `forkfs umount` returns; after one more removal SIGTERM still ends
/// the mount process with its writes saved. Before, commands failed with
/// "its control socket does not answer" until someone SIGKILLed the
/// process, and SIGTERM left it running.
#[test]
fn a_removed_control_socket_comes_back_and_the_mount_stays_stoppable() {
    let (d, store) = new_store();
    let sock = store.join("control.sock");
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("a"), b"before").unwrap();
    std::fs::remove_file(&sock).unwrap();
    let t = std::time::Instant::now();
    ok(&store, &["snapshot", "ws", "--name", "after-removal"]);
    assert!(t.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t.elapsed());
    std::fs::remove_file(&sock).unwrap();
    std::fs::write(&sock, b"not a socket").unwrap();
    ok(&store, &["log", "ws"]);
    m.unmount();

    // SIGTERM to a mount whose socket is gone.
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("b"), b"written last").unwrap();
    std::fs::remove_file(&sock).unwrap();
    unsafe { libc::kill(m.pid() as i32, libc::SIGTERM) };
    assert!(wait_gone(m.pid(), 30), "the mount process outlived SIGTERM by 30 s:\n{}", m.log());
    assert!(!is_fuse_mount(m.dir()), "still mounted after SIGTERM");
    // The store is free and holds both writes.
    let out = d.path().join("out");
    ok(&store, &["export", "ws", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("a")).unwrap(), b"before");
    assert_eq!(std::fs::read(out.join("b")).unwrap(), b"written last");
}

/// SIGTERM to a mount kept busy by an open file cannot unmount it: the
/// process waits out `--stop-timeout`, detaches the mount and exits; a
/// second signal does the same at once. Writes fsynced before are kept.
/// Before, such a process ran on after SIGTERM until its users let go.
#[test]
fn sigterm_ends_a_busy_mount_after_its_stop_timeout_or_a_second_signal() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let (d, store) = new_store();
    for (name, extra) in [("timeout", &["--stop-timeout", "2s"][..]), ("second-signal", &[][..])] {
        let args = [&["--checkpoint-every", "0"][..], extra].concat();
        let m = Mounted::new(&store, "ws", &args);
        let mut f = std::fs::File::create(m.path(name)).unwrap();
        f.write_all(name.as_bytes()).unwrap();
        f.sync_all().unwrap();
        let t = Instant::now();
        unsafe { libc::kill(m.pid() as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(1000));
        assert!(!wait_gone(m.pid(), 0), "{name}: a busy mount went at once (not busy?)");
        if name == "second-signal" {
            unsafe { libc::kill(m.pid() as i32, libc::SIGTERM) };
        }
        assert!(wait_gone(m.pid(), 15), "{name}: still running 15 s after SIGTERM:\n{}", m.log());
        let took = t.elapsed();
        if name == "timeout" {
            assert!(took >= Duration::from_secs(2), "{name}: exited before its timeout: {took:?}");
        }
        assert!(!is_fuse_mount(m.dir()), "{name}: left mounted");
        assert!(m.log().contains("stopping now"), "{name}: {}", m.log());
        drop(f);
    }
    let out = d.path().join("out");
    ok(&store, &["export", "ws", out.to_str().unwrap()]);
    for name in ["timeout", "second-signal"] {
        assert_eq!(std::fs::read(out.join(name)).unwrap(), name.as_bytes(), "{name} lost");
    }
}

/// `forkfs umount --force` on a busy mount: detached at once, its process
/// stopped, the command returns 0; the fsynced write is kept and the
/// volume mounts again. Plain `forkfs umount` refuses the same mount.
#[test]
fn umount_force_detaches_a_busy_mount_and_stops_its_process() {
    use std::io::Write;
    let (d, store) = new_store();
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    let mut f = std::fs::File::create(m.path("kept")).unwrap();
    f.write_all(b"fsynced").unwrap();
    f.sync_all().unwrap();
    let dir = m.dir().to_str().unwrap().to_string();
    let refused = forkfs(&store, &["umount", &dir]);
    assert_eq!(refused.status.code(), Some(75), "a busy mount was unmounted");
    let t = std::time::Instant::now();
    ok(&store, &["umount", "--force", &dir]);
    assert!(t.elapsed() < std::time::Duration::from_secs(15), "took {:?}", t.elapsed());
    assert!(wait_gone(m.pid(), 0), "the mount process still runs:\n{}", m.log());
    assert!(!is_fuse_mount(m.dir()), "still mounted");
    drop(f);
    let out = d.path().join("out");
    ok(&store, &["export", "ws", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("kept")).unwrap(), b"fsynced");
    let again = Mounted::new(&store, "ws", &[]);
    assert_eq!(std::fs::read(again.path("kept")).unwrap(), b"fsynced");
}

/// The FUSE connection aborted through the kernel
/// (`/sys/fs/fuse/connections/N/abort`, as an administrator does with a
/// hung mount): the mount process notices, ends its mount with a last
/// checkpoint and exits on its own; the store is free and holds the
/// fsynced write.
#[test]
fn a_mount_whose_fuse_connection_is_aborted_exits_on_its_own() {
    use std::io::Write;
    let ctl = std::path::Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(ctl).map(|mut d| d.next().is_none()).unwrap_or(true) {
        // Not mounted yet (fusectl); an error if it was meanwhile is fine.
        let _ =
            std::process::Command::new("mount").args(["-t", "fusectl", "none"]).arg(ctl).status();
    }
    let (d, store) = new_store();
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    let mut f = std::fs::File::create(m.path("kept")).unwrap();
    f.write_all(b"fsynced").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let dev = crate::common::mount::lstat(m.dir()).st_dev;
    assert_eq!(libc::major(dev), 0, "a FUSE mount has an anonymous device");
    let abort = ctl.join(libc::minor(dev).to_string()).join("abort");
    std::fs::write(&abort, b"1").unwrap_or_else(|e| panic!("{}: {e}", abort.display()));
    assert!(
        wait_gone(m.pid(), 30),
        "the mount process outlived its aborted connection:\n{}",
        m.log()
    );
    crate::common::mount::lazy_unmount(m.dir());
    let out = d.path().join("out");
    ok(&store, &["export", "ws", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("kept")).unwrap(), b"fsynced");
}

/// A command to a holder stopped with SIGSTOP returns within the control
/// socket's silence bound (10 s), in one line that names the holder; once
/// the holder runs again, commands reach it. A request that takes longer
/// than the bound (a sync of many writes) is kept alive by heartbeats.
/// Negative control (by hand, `service/socket.rs` without the read
/// timeout): the command waits until this test's 40 s deadline kills it.
#[test]
fn a_command_to_a_stopped_holder_returns_within_a_bound() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("a"), b"before the stop").unwrap();
    let pid = m.pid() as i32;
    // SAFETY: signals to the mount process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let resume = || unsafe { libc::kill(pid, libc::SIGCONT) };
    let t = std::time::Instant::now();
    let mut child = crate::common::command(&store, &["status"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > std::time::Duration::from_secs(40) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let took = t.elapsed();
    resume();
    let status =
        status.unwrap_or_else(|| panic!("status to a stopped holder still waits after 40 s"));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "status succeeded against a stopped holder");
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    assert!(err.contains("has not answered") && err.contains(&pid.to_string()), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // Running again, it answers, and keeps what it was given.
    ok(&store, &["status"]);
    ok(&store, &["sync"]);
    m.unmount();
    let out = _d.path().join("out");
    ok(&store, &["export", "ws", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("a")).unwrap(), b"before the stop");
}

/// A store on a 64 MiB tmpfs under `outer`: the tmpfs, its mount point
/// and the store (initialized).
fn small_store(outer: &std::path::Path) -> (Tmpfs, std::path::PathBuf, std::path::PathBuf) {
    let small = outer.join("small");
    let tmpfs = Tmpfs::mount(&small, "size=64m");
    let store = small.join("store");
    ok(&store, &["init"]);
    (tmpfs, small, store)
}

/// fallocate asks for room: more than the disk under the store has fails
/// with ENOSPC, as on that disk itself (a 64 MiB tmpfs), and what fits is
/// granted; allocating what a file already holds needs no room.
#[test]
fn fallocate_beyond_the_store_disk_fails_with_enospc_as_on_the_disk_itself() {
    use std::os::unix::io::AsRawFd;
    let outer = tempfile::tempdir().unwrap();
    let (tmpfs, small, store) = small_store(outer.path());
    let m = Mounted::new(&store, "room", &["--checkpoint-every", "0"]);
    let fallocate = |p: &std::path::Path, len: i64| {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(p).unwrap();
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) };
        if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().raw_os_error()) }
    };
    for (dir, what) in [(small.as_path(), "the tmpfs itself"), (m.dir(), "the mount")] {
        assert_eq!(fallocate(&dir.join("huge"), 1 << 30), Err(Some(libc::ENOSPC)), "{what}");
        assert_eq!(fallocate(&dir.join("fits"), 1 << 20), Ok(()), "{what}");
    }
    std::fs::write(m.path("held"), vec![7u8; 8 << 20]).unwrap();
    let fill = tmpfs.fill(0);
    assert_eq!(fallocate(&m.path("held"), 8 << 20), Ok(()), "a range already held");
    assert_eq!(fallocate(&m.path("more"), 8 << 20), Err(Some(libc::ENOSPC)), "on a full disk");
    std::fs::remove_file(fill).unwrap();
}

/// The disk under the store fills while a workspace is mounted: writes
/// that cannot reach the store fail (at the write or at fsync, never
/// acknowledged by a successful fsync), `forkfs snapshot` fails in one
/// line with the no-space code, the fsynced file of before is kept; with
/// room again the store takes writes and snapshots, and with the disk
/// full again SIGTERM still ends the mount process. Negative control (by
/// hand, `mount/fuse/mod.rs` answering write and fsync with success whatever
/// the store said): the 16 MiB write and fsync succeed, and the test fails.
#[test]
fn a_full_store_disk_under_a_mount_fails_writes_and_the_mount_stays_stoppable() {
    use std::io::Write;
    let outer = tempfile::tempdir().unwrap();
    let (tmpfs, _small, store) = small_store(outer.path());
    let m = Mounted::new(&store, "ws", &["--checkpoint-every", "0"]);
    let before = crate::common::random(1 << 20, 41);
    let mut f = std::fs::File::create(m.path("a")).unwrap();
    f.write_all(&before).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let fill = tmpfs.fill(0);
    // 16 MiB more than there is room for: it fails somewhere.
    let big = crate::common::random(16 << 20, 43);
    let wrote = std::fs::File::create(m.path("b")).and_then(|mut f| {
        f.write_all(&big)?;
        f.sync_all()
    });
    let err = wrote.expect_err("16 MiB written and fsynced on a full disk");
    assert!(
        matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EIO)),
        "not ENOSPC or EIO: {err}\n{}",
        m.log()
    );
    let (code, msg) = fails(&store, &["snapshot", "ws"]);
    assert_eq!(code, 73, "{msg}");
    // Room again: the store takes writes and a snapshot, `a` intact.
    std::fs::remove_file(&fill).unwrap();
    let _ = std::fs::remove_file(m.path("b"));
    std::fs::write(m.path("c"), b"after the room came back").unwrap();
    ok(&store, &["snapshot", "ws", "--name", "after"]);
    assert!(std::fs::read(m.path("a")).unwrap() == before, "a changed under the full disk");
    // Full again: SIGTERM ends the process all the same.
    let fill = tmpfs.fill(0);
    let pid = m.pid();
    // SAFETY: a signal to the mount process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(wait_gone(pid, 30), "the mount outlived SIGTERM on a full disk:\n{}", m.log());
    std::fs::remove_file(&fill).unwrap();
    let out = outer.path().join("out");
    ok(&store, &["export", "ws@after", out.to_str().unwrap()]);
    assert!(std::fs::read(out.join("a")).unwrap() == before, "a lost");
    assert_eq!(std::fs::read(out.join("c")).unwrap(), b"after the room came back");
}
