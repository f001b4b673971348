//! EIO from the disk under the store (the corruption matrix's injected
//! I/O errors, docs/RELIABILITY.md): a read that meets one fails in one
//! line as "unavailable" (exit 69), never returns other content and is
//! never taken for damage: `fsck --repair` and `gc` run during the failure
//! drop and delete nothing, and once the disk reads again every version
//! and the head's acknowledged writes read exact.
//!
//! Before issue 18 the data log took every failed read for a write lost
//! in a crash and dropped it: the head read `first`'s blocks through the
//! EIO (this test's first assertion), and `fsck --repair` dropped them for
//! good. `tests/power/main.rs`'s lazy filesystem injects the EIO.

use crate::Machine;
use crate::common::random;

const BS: usize = 64 << 10;
const BLOCKS: usize = 16;

/// A forkfs run: (success, exit code, stderr, stdout).
fn run(m: &Machine, args: &[&str]) -> (bool, i32, String, String) {
    let o = m.forkfs(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).trim_end().to_string();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    (o.status.success(), o.status.code().unwrap_or(-1), err, out)
}

#[test]
fn eio_is_an_error_never_lost_data_and_repair_and_gc_change_nothing() {
    let m = Machine::new();
    let outside = tempfile::tempdir().unwrap();
    let file = |name: &str| outside.path().join(name).to_str().unwrap().to_string();
    m.ok(&["init", "--pack-size", "64KiB"]);
    // `first` in packs; the head's acknowledged writes (blocks 8..16
    // rewritten, flushed, in no version) in the data log.
    let first = random(BS * BLOCKS, 1);
    let mut head = first.clone();
    head[8 * BS..].copy_from_slice(&random(8 * BS, 2));
    std::fs::write(file("first"), &first).unwrap();
    std::fs::write(file("head"), &head).unwrap();
    m.ok(&["import", "disk", &file("first")]);
    m.ok(&["tag", "disk@~0", "first"]);
    m.ok(&["import", "disk", &file("head"), "--no-snapshot"]);
    let want = |target: &str| if target == "disk" { &head } else { &first };
    let exact = |target: &str, when: &str| {
        let out = file("out");
        let _ = std::fs::remove_file(&out);
        let (okay, code, err, _) = run(&m, &["export", target, &out]);
        assert!(okay, "{when}: export {target}: exit {code}: {err}");
        assert!(&std::fs::read(&out).unwrap() == want(target), "{when}: {target}: other content");
    };

    let mut report = Vec::new();
    // The data log (the head's writes) and the packs (`first`).
    for (pattern, target) in [("log/", "disk"), ("objects/packs/", "disk@first")] {
        m.fail_reads(&[pattern]);
        let out = file("out");
        let _ = std::fs::remove_file(&out);
        let (okay, code, err, _) = run(&m, &["export", target, &out]);
        report.push(format!("EIO on {pattern}: export {target}: exit {code}: {err}"));
        assert!(!okay, "export {target} read through EIO on {pattern}");
        assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{err:?}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(code, 69, "EIO on {pattern} is not 'unavailable': {err}");
        assert!(!std::path::Path::new(&out).exists(), "a partial image was left");

        let (okay, code, err, out) = run(&m, &["--json", "fsck", "--repair"]);
        report.push(format!("EIO on {pattern}: fsck --repair: exit {code}: {err}{out}"));
        assert!(!okay, "fsck --repair passed while {pattern} fails to read");
        let (_, code, err, _) = run(&m, &["gc", "--grace", "0s"]);
        report.push(format!("EIO on {pattern}: gc: exit {code}: {err}"));
        if pattern == "objects/packs/" {
            // It cannot see what the unreadable pack references: it stops.
            assert_eq!(code, 69, "gc through EIO on a live pack: {err}");
        }

        m.fail_reads(&[]);
        for t in ["disk@first", "disk"] {
            exact(t, &format!("after EIO on {pattern}, repair and gc"));
        }
    }
    println!("{}", report.join("\n"));
    let (ok, problems) = m.fsck();
    assert!(ok, "{problems:?}");
}

/// The disk under the store stops taking writes (EIO on every write and
/// fsync) while a workspace is mounted (issue 25): an fsync after it
/// fails, `forkfs snapshot` fails, SIGTERM still ends the mount process
/// within a bound; with the disk back, and after a power cut that drops
/// whatever was not synced, the file fsynced before reads exact.
/// Negative control (by hand, `mount/fuse/mod.rs` answering write and fsync
/// with success whatever the store said): `b`'s write and fsync succeed,
/// and the test fails there.
#[test]
fn eio_on_writes_under_a_mount_fails_fsync_and_the_mount_stays_stoppable() {
    use crate::common::mount::{lazy_unmount, mount_pid, wait_gone};
    use std::io::Write;
    let mut m = Machine::new();
    m.ok(&["init"]);
    m.ok(&["volume", "create", "ws"]);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().to_str().unwrap();
    let out = m.ok(&["mount", "ws", ws, "--daemon", "--checkpoint-every", "0"]);
    let pid = mount_pid(&out);
    let synced = |name: &str, data: &[u8]| -> std::io::Result<()> {
        let mut f = std::fs::File::create(dir.path().join(name))?;
        f.write_all(data)?;
        f.sync_all()
    };
    let a = random(1 << 20, 61);
    synced("a", &a).expect("a written and fsynced");
    // Opened before: its writes after the failure need no new inode.
    let mut b = std::fs::File::create(dir.path().join("b")).unwrap();
    m.fail_writes(&["store/"]);
    let wrote = b.write_all(&random(1 << 20, 63)).and_then(|()| b.sync_all());
    let err = wrote.expect_err("written and fsynced while the disk fails writes");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    drop(b);
    let (okay, code, err, _) = run(&m, &["snapshot", "ws"]);
    assert!(!okay && !err.contains("panicked"), "snapshot while writes fail: {code} {err}");
    // SAFETY: a signal to the mount process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(wait_gone(pid, 30), "the mount outlived SIGTERM while writes fail");
    lazy_unmount(dir.path());
    m.fail_writes(&[]);
    m.cut_power();
    let got = tempfile::tempdir().unwrap();
    let to = got.path().join("out");
    m.ok(&["export", "ws", to.to_str().unwrap()]);
    assert!(std::fs::read(to.join("a")).unwrap() == a, "a, fsynced before the failure, lost");
    let (ok, problems) = m.fsck();
    assert!(ok, "{problems:?}");
}
