//! Access times in the mount: `relatime` (the default) beside ext4 (which
//! /tmp is mounted with), `strictatime` and `noatime`; reads change no
//! version's diff.

use crate::common::mount::{Mounted, diff, new_store, require_tool, run};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

fn atime(p: &Path) -> (i64, i64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.atime(), m.atime_nsec())
}

/// The access time set two days back (as `touch -a -d` does).
fn set_back(p: &Path) {
    run(Command::new("touch").args(["-a", "-d", "2 days ago"]).arg(p));
}

/// What each step did to the access time: "recorded" or "kept".
fn story(dir: &Path) -> Vec<String> {
    let (f, d) = (dir.join("f"), dir.join("d"));
    std::fs::write(&f, b"data").unwrap();
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("x"), b"x").unwrap();
    let mut out = Vec::new();
    let mut step = |label: &str, p: &Path, action: &dyn Fn()| {
        let before = atime(p);
        action();
        let what = if atime(p) == before { "kept" } else { "recorded" };
        out.push(format!("{label}: {what}"));
    };
    let read = || drop(std::fs::read(&f).unwrap());
    let list = || {
        let _ = std::fs::read_dir(&d).unwrap().count();
    };
    set_back(&f);
    step("read, last access two days back", &f, &read);
    step("read again", &f, &read);
    // A write, whose bytes the kernel's page cache keeps: the read after it
    // must still reach the mount.
    let append = |b: &[u8]| {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&f).unwrap().write_all(b).unwrap();
    };
    append(b" more");
    step("read after a change", &f, &read);
    step("read again after the change", &f, &read);
    set_back(&d);
    step("list, last access two days back", &d, &list);
    step("list again", &d, &list);
    // The kernel keeps the listing now; setting the time back drops it.
    set_back(&d);
    step("list, cached, after its access was set back", &d, &list);
    run(Command::new("chattr").args(["+A"]).arg(&f));
    set_back(&f);
    step("read with chattr +A", &f, &read);
    run(Command::new("chattr").args(["-A"]).arg(&f));
    out
}

#[test]
fn relatime_by_default_as_on_ext4_and_strictatime_and_noatime_on_request() {
    require_tool("chattr");
    let ext4 = crate::common::mount::ext4_reference_dir();
    let native = story(ext4.path());
    let want = [
        "read, last access two days back: recorded",
        "read again: kept",
        "read after a change: recorded",
        "read again after the change: kept",
        "list, last access two days back: recorded",
        "list again: kept",
        "list, cached, after its access was set back: recorded",
        "read with chattr +A: kept",
    ];
    assert_eq!(native, want, "ext4 (relatime) itself, the reference");
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "rel", &[]);
    assert_eq!(story(m.dir()), native, "the same steps in a default mount");

    // Reads record access times but change nothing a diff shows.
    crate::common::ok(&store, &["snapshot", "rel", "--name", "before"]);
    set_back(&m.path("f"));
    crate::common::ok(&store, &["snapshot", "rel", "--name", "set-back"]);
    std::fs::read(m.path("f")).unwrap();
    std::fs::read(m.path(".forkfs/versions/before/f")).unwrap();
    assert!(diff(&store, "rel@set-back", "rel").is_empty(), "a read shows in no diff");

    // Nor do they make versions: the periodic checkpoint after reads
    // alone takes none (the access times wait for the next change).
    let every = Mounted::new(&store, "every", &["--checkpoint-every", "1s"]);
    std::fs::write(every.path("f"), b"data").unwrap();
    let versions = || crate::common::json(&store, &["log", "every"]).as_array().unwrap().len();
    let settled = wait_for_versions(&versions);
    let before = atime(&every.path("f"));
    std::fs::read(every.path("f")).unwrap();
    assert_ne!(atime(&every.path("f")), before, "the read recorded its access");
    std::thread::sleep(std::time::Duration::from_millis(3500));
    assert_eq!(versions(), settled, "reads alone made a version");
    // Nor after a remount: the new mount finds only access times pending.
    let every = every.remount_with(&["--checkpoint-every", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(3500));
    assert_eq!(versions(), settled, "reads before a remount made a version");
    std::fs::write(every.path("g"), b"a change").unwrap();
    assert!(wait_for_versions(&versions) > settled, "a change makes one");

    let strict = Mounted::new(&store, "strict", &["-o", "strictatime"]);
    let s = story(strict.dir());
    assert_eq!(s[1], "read again: recorded", "strictatime records every read: {s:?}");
    let never = Mounted::new(&store, "never", &["-o", "noatime"]);
    let n = story(never.dir());
    assert!(n.iter().all(|l| l.ends_with("kept")), "noatime records no read: {n:?}");
}

/// The number of versions once the periodic checkpoint stopped adding
/// them (the same for 2.5 s), at most 30 s.
fn wait_for_versions(count: &dyn Fn() -> usize) -> usize {
    let (mut last, mut since) = (count(), std::time::Instant::now());
    let start = std::time::Instant::now();
    while since.elapsed() < std::time::Duration::from_millis(2500) {
        assert!(start.elapsed().as_secs() < 30, "versions kept coming");
        std::thread::sleep(std::time::Duration::from_millis(250));
        let n = count();
        if n != last {
            (last, since) = (n, std::time::Instant::now());
        }
    }
    last
}
