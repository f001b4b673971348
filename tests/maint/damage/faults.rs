//! Faults of the environment rather than damage on disk: a process that
//! runs out of file descriptors (EMFILE) must fail in one line, never
//! return other content, and leave the store as it was.
//!
//! EIO is not injected here: it needs the store on a filesystem that fails
//! chosen reads (a FUSE passthrough such as tests/power/lazyfs.rs with a
//! "fail reads of PATH" switch); the data log's own unit test
//! (`an_unreadable_segment_is_an_error_not_lost_data`) covers the rule that
//! an I/O error is never taken for lost data. See docs/RELIABILITY.md.

use super::Want::Img;
use super::{BLOCKS, BS, Fixture, TARGETS};
use crate::common::{Tmpfs, command};
use std::os::unix::process::CommandExt;

/// Runs forkfs with at most `n` open files; (success, exit code, stderr).
fn limited(f: &Fixture, n: u64, args: &[&str]) -> (bool, i32, String) {
    let mut c = command(&f.s, args);
    // SAFETY: between fork and exec only setrlimit(2) runs, which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).trim_end().to_string();
    (o.status.success(), o.status.code().unwrap_or(-1), err)
}

#[test]
fn emfile_fails_reads_in_one_line_and_changes_nothing() {
    let f = Fixture::new();
    let out = f.file("out.img");
    let mut refused = 0;
    // Every outcome so far, in each failure's message (a CI log shows the
    // whole run, not only the last line).
    let mut log = String::new();
    // Every limit from too few to enough, one by one: EMFILE can strike
    // at any open, and which one a limit hits depends on how many files
    // the index holds (a limit between the index's opens and the I/O
    // runtime's once made tokio panic).
    for n in limits() {
        for (i, target) in TARGETS.iter().enumerate() {
            let _ = std::fs::remove_file(&out);
            let (okay, code, err) = limited(&f, n, &["export", target, out.to_str().unwrap()]);
            log += &format!("nofile {n}: export {target}: success {okay}, exit {code}: {err}\n");
            if okay {
                let got = std::fs::read(&out).unwrap();
                assert!(got == f.imgs[i], "nofile {n}: {target} read other content\n{log}");
                continue;
            }
            refused += 1;
            assert!(!err.contains("panicked"), "{log}");
            assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{log}");
            assert!(err.contains("Too many open files"), "not EMFILE:\n{log}");
            assert_eq!(code, 69, "EMFILE is no usage error (64) or other:\n{log}");
            assert!(!err.contains("--force"), "a hint for another error:\n{log}");
            assert!(!out.exists(), "a failed export left a partial image:\n{log}");
        }
    }
    print!("{log}");
    assert!(refused > 0, "no limit was low enough to fail a read");
    // Nothing changed: every read is exact and fsck passes.
    f.reads(&[Img(0), Img(1), Img(2)], "after the EMFILE runs");
    let (code, found, _) = f.fsck(&[]);
    assert_eq!(code, 0, "{found:?}\n{log}");
}

#[test]
fn emfile_while_writing_loses_no_acknowledged_write() {
    let f = Fixture::new();
    let img = f.file("img-emfile");
    std::fs::write(&img, &f.imgs[0]).unwrap();
    let mut refused = 0;
    let mut log = String::new();
    for n in limits() {
        // A snapshot that fails leaves the head as it was: image 2 (the
        // unsaved writes) or, if this import got through, image 0.
        let (okay, code, err) = limited(&f, n, &["import", "disk", img.to_str().unwrap()]);
        log += &format!("nofile {n}: import: success {okay}, exit {code}: {err}\n");
        if !okay {
            refused += 1;
            assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{log}");
            assert!(!err.contains("panicked"), "{log}");
        }
    }
    print!("{log}");
    assert!(refused > 0, "no limit was low enough to fail an import");
    // The versions are intact; the head holds some state a process wrote
    // whole (an import's blocks are all of image 0 or all as before, per
    // block), and fsck passes.
    imports_left_whole_blocks(&f, "after the EMFILE imports", &log);
}

/// The open-file limits the EMFILE tests run forkfs under.
fn limits() -> impl Iterator<Item = u64> {
    (8..=48).chain([64, 128, 1024])
}

/// After imports of image 0 over a head holding image 2 that may have
/// failed part way: every head block is one or the other, the versions
/// read exact and fsck passes (`log`: the run, for the messages).
fn imports_left_whole_blocks(f: &Fixture, when: &str, log: &str) {
    let head = f.export("disk").expect("the head reads");
    for b in 0..BLOCKS {
        let r = b * BS..(b + 1) * BS;
        assert!(
            head[r.clone()] == f.imgs[0][r.clone()] || head[r.clone()] == f.imgs[2][r],
            "{when}: block {b} of the head is neither the import's nor the earlier write's\n{log}"
        );
    }
    f.reads(&[Img(0), Img(1)], when);
    let (code, found, _) = f.fsck(&[]);
    assert_eq!(code, 0, "{found:?}\n{log}");
}

/// A full disk under the store: every command that writes fails in one
/// line with the no-space code (73, as `umount` does on a full disk:
/// tests/fuse/mount_cli.rs), none exits 0 with its work unsaved; once
/// space is freed, every read is exact and fsck passes.
#[test]
fn a_full_disk_fails_each_writing_command_with_73_and_loses_nothing() {
    // Dropped in reverse: the fixture, the tmpfs, then the directory.
    let outer = tempfile::tempdir().unwrap();
    let small = outer.path().join("small");
    let tmpfs = Tmpfs::mount(&small, "size=24m");
    let f = Fixture::at(tempfile::tempdir().unwrap(), Some(small.join("store")));
    let img = outer.path().join("img-full");
    std::fs::write(&img, &f.imgs[0]).unwrap();
    let fill = tmpfs.fill(0);
    let img = img.to_str().unwrap();
    let mut log = String::new();
    for args in [
        &["snapshot", "disk"][..],
        &["import", "disk", img],
        &["import", "disk", img, "--no-snapshot"],
        &["volume", "create", "other", "--size", "1MiB"],
        &["tag", "disk@second", "again"],
        &["fork", "disk@first", "copy"],
        &["restore", "disk", "disk@first"],
    ] {
        let (okay, code, err) = limited(&f, 1024, args);
        log += &format!("{args:?}: success {okay}, exit {code}: {err}\n");
        assert!(!okay, "{args:?} succeeded on a full disk:\n{log}");
        assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{log}");
        assert_eq!(code, 73, "{args:?}: not the no-space code:\n{log}");
    }
    // A read on the full disk is exact or fails the same way (opening the
    // index writes a new MANIFEST).
    for (i, target) in TARGETS.iter().enumerate() {
        match f.export(target) {
            Ok(got) => assert!(got == f.imgs[i], "{target} read other content on a full disk"),
            Err((code, err)) => {
                log += &format!("export {target}: exit {code}: {err}\n");
                assert_eq!(code, 73, "export {target}:\n{log}");
            }
        }
    }
    // With a little room the store opens and the write fails further
    // in (or fits): a failure is 73 in one line and the head holds, per
    // block, the import's data or what it had.
    let mut refused = 0;
    for leave in [64u64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20] {
        std::fs::remove_file(&fill).unwrap();
        tmpfs.fill(leave);
        let args = ["import", "disk", img, "--no-snapshot"];
        let (okay, code, err) = limited(&f, 1024, &args);
        log += &format!("{leave} bytes free: import: success {okay}, exit {code}: {err}\n");
        if !okay {
            refused += 1;
            assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{log}");
            assert_eq!(code, 73, "not the no-space code:\n{log}");
        }
    }
    print!("{log}");
    assert!(refused > 0, "no room was small enough to fail the import:\n{log}");
    std::fs::remove_file(fill).unwrap();
    imports_left_whole_blocks(&f, "after the full disk", &log);
}
