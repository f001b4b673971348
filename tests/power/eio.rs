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
