//! SIGKILL of the mount in the middle of real untars (issue 16): tar
//! extracts a source tree into the workspace again and again, and after
//! each extraction everything it made is fsynced (coreutils `sync`, which
//! fsyncs each path it is given: files, their directories, the root that
//! names the extraction); the mount checkpoints every second and is killed
//! at a random moment, in a tar or in its fsyncs. After a remount every
//! acknowledged extraction is exactly the source tree (contents, modes,
//! symbolic links), every file of the extraction cut short reads, and
//! `forkfs fsck` passes. FORKFS_CRASH_SEED reruns a seed.
//!
//! What SIGKILL can show is acknowledged state held only in the process;
//! no knob of the mount holds it back yet, so the negative control shows
//! the verifier itself: the store rolled back under a round (extractions
//! acknowledged and then gone) must be reported.

use crate::common::mount::{Mounted, new_store, require_tool, run};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const VOL: &str = "untar";

/// One path of a tree, as compared.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(PathBuf),
}

/// Every path under `root`, relative, with what it is.
fn tree(root: &Path) -> std::io::Result<BTreeMap<String, Node>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir)? {
            let path = e?.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&path)?;
            let mode = meta.permissions().mode() & 0o7777;
            let node = if meta.file_type().is_symlink() {
                Node::Link(std::fs::read_link(&path)?)
            } else if meta.is_dir() {
                todo.push(path.clone());
                Node::Dir(mode)
            } else {
                Node::File(mode, std::fs::read(&path)?)
            };
            out.insert(rel, node);
        }
    }
    Ok(out)
}

/// A source tree of small, inline, multi-block and empty files in nested
/// directories, with executables and symbolic links; its tarball.
fn source(dir: &Path, seed: u64) -> (BTreeMap<String, Node>, PathBuf) {
    let src = dir.join("src");
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..240u64 {
        let d = src.join(format!("d{}/e{}", i % 12, i % 5));
        std::fs::create_dir_all(&d).unwrap();
        let len = match i % 8 {
            0 => 0,
            1..=4 => rng.random_range(1..2048),
            5 | 6 => rng.random_range(2048..40_000),
            _ => rng.random_range(64 * 1024..200_000),
        };
        let f = d.join(format!("f{i}"));
        std::fs::write(&f, crate::common::random(len, seed ^ i)).unwrap();
        if i % 9 == 0 {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if i % 31 == 0 {
            std::os::unix::fs::symlink(format!("f{i}"), d.join(format!("l{i}"))).unwrap();
        }
    }
    let tarball = dir.join("src.tar");
    run(Command::new("tar").arg("-C").arg(&src).arg("-cf").arg(&tarball).arg("."));
    (tree(&src).unwrap(), tarball)
}

/// Extracts `tarball` into `root/name` and fsyncs all of it; false once
/// the mount is gone.
fn untar_and_sync(root: &Path, name: &str, tarball: &Path) -> bool {
    let to = root.join(name);
    if std::fs::create_dir(&to).is_err() {
        return false;
    }
    let tar = Command::new("tar").arg("-C").arg(&to).arg("-xf").arg(tarball).output();
    if !tar.is_ok_and(|o| o.status.success()) {
        return false;
    }
    // Every path tar made (not through symbolic links), then the root.
    let synced = Command::new("sh")
        .arg("-c")
        .arg("find \"$1\" ! -type l -exec sync {} + && sync \"$2\"")
        .arg("sh")
        .arg(&to)
        .arg(root)
        .output();
    synced.is_ok_and(|o| o.status.success())
}

/// One round: untars until the kill; the extractions acknowledged.
fn crash_round(store: &Path, round: u64, tarball: &Path, run_for: Duration) -> Vec<String> {
    let m = Mounted::new(store, VOL, &["--checkpoint-every", "1s"]);
    let root = m.dir().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, tarball) = (stop.clone(), tarball.to_path_buf());
    let worker = std::thread::spawn(move || {
        let mut acked = Vec::new();
        for i in 0.. {
            let name = format!("r{round}-{i}");
            if stop2.load(Ordering::Relaxed) || !untar_and_sync(&root, &name, &tarball) {
                break;
            }
            acked.push(name);
        }
        acked
    });
    std::thread::sleep(run_for);
    // First: the kill detaches the mount, and an extraction started after
    // it would go to the bare directory under it.
    stop.store(true, Ordering::Relaxed);
    m.kill();
    let acked = worker.join().unwrap();
    drop(m);
    acked
}

/// What is wrong with the remounted workspace: acknowledged extractions
/// that differ from the source, files that do not read.
fn verify(root: &Path, want: &BTreeMap<String, Node>, acked: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for name in acked {
        match tree(&root.join(name)) {
            Ok(got) if got == *want => {}
            Ok(got) => {
                let differ: Vec<_> = want
                    .keys()
                    .chain(got.keys())
                    .filter(|k| want.get(*k) != got.get(*k))
                    .take(5)
                    .collect();
                problems.push(format!("{name}: differs from the source at {differ:?}"));
            }
            Err(e) => problems.push(format!("{name}: unreadable: {e}")),
        }
    }
    // The rest (an extraction cut short) need not be whole, but must read.
    if let Err(e) = tree(root) {
        problems.push(format!("the workspace does not read: {e}"));
    }
    problems
}

fn base_seed() -> u64 {
    std::env::var("FORKFS_CRASH_SEED")
        .map(|s| s.parse().expect("FORKFS_CRASH_SEED is a number"))
        .unwrap_or_else(|_| rand::rng().random())
}

fn fsck(store: &Path) {
    let out = crate::common::forkfs(store, &["fsck"]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn fsynced_untars_survive_sigkill_of_the_mount() {
    require_tool("tar");
    require_tool("find");
    let seed = base_seed();
    println!("FORKFS_CRASH_SEED={seed}");
    let (d, store) = new_store();
    let (want, tarball) = source(d.path(), seed);
    crate::common::ok(&store, &["volume", "create", VOL]);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acked = Vec::new();
    for round in 0..8 {
        let run_for = Duration::from_millis(rng.random_range(300..2500));
        let new = crash_round(&store, round, &tarball, run_for);
        println!(
            "round {round}: {} extractions acknowledged in {run_for:?} before the kill",
            new.len()
        );
        acked.extend(new);
        let m = Mounted::new(&store, VOL, &[]);
        let problems = verify(m.dir(), &want, &acked);
        m.unmount();
        assert!(problems.is_empty(), "seed {seed} round {round}:\n{}", problems.join("\n"));
        fsck(&store);
    }
    assert!(!acked.is_empty(), "no extraction was ever acknowledged");
}

/// The verifier's negative control: the store is rolled back to a copy
/// taken before a round (acknowledged extractions gone); the verifier must
/// report them.
#[test]
fn untar_crash_check_detects_lost_extractions() {
    require_tool("tar");
    require_tool("cp");
    let (d, store) = new_store();
    let (want, tarball) = source(d.path(), base_seed());
    crate::common::ok(&store, &["volume", "create", VOL]);
    let before = d.path().join("store-before");
    run(Command::new("cp").arg("-a").arg(&store).arg(&before));
    let acked = crash_round(&store, 0, &tarball, Duration::from_millis(2500));
    assert!(!acked.is_empty(), "no extraction was acknowledged in 2.5 s");
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::rename(&before, &store).unwrap();
    let m = Mounted::new(&store, VOL, &[]);
    let problems = verify(m.dir(), &want, &acked);
    m.unmount();
    assert!(!problems.is_empty(), "{} acknowledged extractions were lost unnoticed", acked.len());
    println!("the verifier found: {problems:?}");
}
