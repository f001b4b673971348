//! `scripts/demo`, the README's first command, on the binaries under test
//! (FORKFS_DEMO_PREBUILT: no install-deps, no build): it passes, announces
//! and times every step, takes under two minutes, and leaves nothing
//! mounted or in its temporary directory.

use crate::common::{forkfs_bin, ok};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The demo's steps, in order, as it announces them and names them in its
/// summary (scripts/demo).
const STEPS: [&str; 10] =
    ["mount", "run", "break", "diff", "restore", "fork", "versions", "umount", "nbd", "status"];

/// The summary's rows, (step, seconds), up to and including `total`:
///
/// ```text
/// == summary (binaries: prebuilt, from DIR)
/// step       seconds  what it showed
/// mount         0.50  fs volume ws mounted (FUSE), a project copied in
/// ...
/// total         2.58  after the build
/// ```
fn summary(stdout: &str) -> Vec<(String, f64)> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("== summary"));
    assert!(lines.next().is_some(), "no summary in the demo's output:\n{stdout}");
    let header = lines.next().unwrap_or_default();
    assert!(header.starts_with("step"), "the summary's header is {header:?}");
    let mut rows = Vec::new();
    for line in lines {
        let mut cols = line.split_whitespace();
        let (Some(step), Some(secs)) = (cols.next(), cols.next()) else {
            break;
        };
        let secs: f64 = secs.parse().unwrap_or_else(|_| panic!("summary row {line:?}: no seconds"));
        rows.push((step.to_string(), secs));
        if step == "total" {
            break;
        }
    }
    rows
}

#[test]
fn the_demo_shows_every_step_in_under_two_minutes_and_leaves_nothing_behind() {
    let bins = forkfs_bin().parent().expect("the binaries' directory").to_path_buf();
    for b in ["forkfs", "forkfs-core", "forkfs-nbd", "forkfs-fsck"] {
        assert!(
            bins.join(b).is_file(),
            "{} is missing: the demo needs the workspace's binaries \
             (cargo build --release --workspace --bins)",
            bins.join(b).display()
        );
    }
    let d = tempfile::tempdir().expect("tempdir");
    // The demo makes its temporary directory (mount points, NBD socket,
    // scratch files) with mktemp, under TMPDIR: here, to see that it is gone.
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let store = d.path().join("store");
    let out_path = d.path().join("stdout");
    let err_path = d.path().join("stderr");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo");
    // Output to files, not pipes: a process the demo failed to stop cannot
    // keep the test waiting for the end of its output.
    let mut child = Command::new(&script)
        .env("FORKFS_DEMO_PREBUILT", &bins)
        .env("FORKFS_STORE", &store)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("running scripts/demo");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for scripts/demo") {
            break s;
        }
        if started.elapsed() > Duration::from_secs(300) {
            // SIGTERM: its trap unmounts and stops what it started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            let so_far = std::fs::read_to_string(&out_path).unwrap_or_default();
            panic!("scripts/demo was still running after 300 s:\n{so_far}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "scripts/demo failed ({status}):\n{stdout}\n{stderr}");

    // Every step announced, in order, and in the summary with its time.
    for (i, step) in STEPS.iter().enumerate() {
        let header = format!("== {}/{} {step}: ", i + 1, STEPS.len());
        assert!(stdout.contains(&header), "step {step} was not announced ({header:?}):\n{stdout}");
    }
    let rows = summary(&stdout);
    let names: Vec<&str> = rows.iter().map(|(s, _)| s.as_str()).collect();
    let mut want = STEPS.to_vec();
    want.push("total");
    assert_eq!(names, want, "the summary's rows:\n{stdout}");
    let total = rows[STEPS.len()].1;
    assert!(total < 120.0, "the demo took {total} s after the build (at most 120):\n{stdout}");
    let steps: f64 = rows[..STEPS.len()].iter().map(|(_, s)| s).sum();
    assert!(steps <= total + 0.1, "the steps' {steps} s do not fit in the total {total} s");

    // Nothing left behind: no mount under the test's directory, and the
    // demo's temporary directory removed.
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let root = d.path().to_str().expect("utf-8 path");
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(root)).collect();
    assert!(left.is_empty(), "the demo left mounts behind: {left:?}");
    let in_tmp: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(in_tmp.is_empty(), "the demo left {in_tmp:?} in TMPDIR");

    // The store named by FORKFS_STORE is kept and holds what the demo
    // showed. Export needs the store to itself (it exits 75 while a mount
    // or a server holds it), so this also finds a process left holding it.
    let built = d.path().join("built");
    ok(&store, &["export", "ws@built", built.to_str().expect("utf-8 path")]);
    assert!(built.join("dist/app").is_file(), "ws@built has no dist/app");
    assert!(built.join("src/main.sh").is_file(), "ws@built has no src/main.sh");
    ok(&store, &["fsck"]);
}
