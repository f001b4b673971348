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
use crate::common::command;
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
    for n in [12, 16, 20, 24, 32, 48, 64, 128, 1024] {
        for (i, target) in TARGETS.iter().enumerate() {
            let _ = std::fs::remove_file(&out);
            let (okay, code, err) = limited(&f, n, &["export", target, out.to_str().unwrap()]);
            if okay {
                let got = std::fs::read(&out).unwrap();
                assert!(got == f.imgs[i], "nofile {n}: {target} read other content");
                continue;
            }
            refused += 1;
            println!("nofile {n}: export {target}: exit {code}: {err}");
            assert!(!err.contains("panicked"), "nofile {n}: {target}: {err}");
            assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{err:?}");
            assert!(err.contains("Too many open files"), "nofile {n}: not EMFILE: {err}");
            assert!(!err.contains("--force"), "nofile {n}: a hint for another error: {err}");
        }
    }
    assert!(refused > 0, "no limit was low enough to fail a read");
    // Nothing changed: every read is exact and fsck passes.
    f.reads(&[Img(0), Img(1), Img(2)], "after the EMFILE runs");
    let (code, found, _) = f.fsck(&[]);
    assert_eq!(code, 0, "{found:?}");
}

#[test]
fn emfile_while_writing_loses_no_acknowledged_write() {
    let f = Fixture::new();
    let img = f.file("img-emfile");
    std::fs::write(&img, &f.imgs[0]).unwrap();
    let mut refused = 0;
    for n in [12, 16, 20, 24, 32, 48, 64] {
        // A snapshot that fails leaves the head as it was: image 2 (the
        // unsaved writes) or, if this import got through, image 0.
        let (okay, code, err) = limited(&f, n, &["import", "disk", img.to_str().unwrap()]);
        println!("nofile {n}: import: success {okay}, exit {code}: {err}");
        if !okay {
            refused += 1;
            assert!(err.starts_with("forkfs: ") && err.lines().count() == 1, "{err:?}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    assert!(refused > 0, "no limit was low enough to fail an import");
    // The versions are intact; the head holds some state a process wrote
    // whole (an import's blocks are all of image 0 or all as before, per
    // block), and fsck passes.
    let head = f.export("disk").expect("the head reads");
    for b in 0..BLOCKS {
        let r = b * BS..(b + 1) * BS;
        assert!(
            head[r.clone()] == f.imgs[0][r.clone()] || head[r.clone()] == f.imgs[2][r],
            "block {b} of the head is neither the import's nor the earlier write's"
        );
    }
    f.reads(&[Img(0), Img(1)], "after the EMFILE imports");
    let (code, found, _) = f.fsck(&[]);
    assert_eq!(code, 0, "{found:?}");
}
