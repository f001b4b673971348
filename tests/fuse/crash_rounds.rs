//! SIGKILL of the mount in the middle of real developer work (issue 16),
//! shared by the untar and the npm install tests: a workload makes a tree
//! in a new directory of the workspace again and again, and after each
//! run everything it made is fsynced (coreutils `sync`, which fsyncs each
//! path it is given: files, their directories, the root that names the
//! run); the mount checkpoints every second and is killed at a random
//! moment, in the workload or in its fsyncs. After a remount every
//! acknowledged run is exactly the expected tree (contents, modes,
//! symbolic links), every file of the run cut short reads, and `forkfs
//! fsck` passes. FORKFS_CRASH_SEED reruns a seed.
//!
//! A run counts as acknowledged only if the kill had not begun when its
//! fsyncs returned (after the kill a path under the mount's directory is
//! the bare directory); a run that fails before the kill began is a
//! failure of the mount, and fails the test.
//!
//! What SIGKILL can show is acknowledged state held only in the process;
//! no knob of the mount holds it back yet, so the negative control shows
//! the verifier itself: the store rolled back under a round (runs
//! acknowledged and then gone) must be reported, and so must a run
//! changed by hand.

use crate::common::mount::{Mounted, run};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// One path of a tree, as compared.
#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(PathBuf),
}

/// A tree: every path under a root, relative, with what it is.
pub type Tree = BTreeMap<String, Node>;

/// Makes a tree in the (new, empty) directory it is given; why not, when
/// it failed (as it does once the mount is gone).
pub type Workload = Arc<dyn Fn(&Path) -> Result<(), String> + Send + Sync>;

/// Ok if a command succeeded, else why not (its exit and the last 20
/// lines of its stderr).
pub fn failed(what: &str, out: std::io::Result<std::process::Output>) -> Result<(), String> {
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let mut tail: Vec<&str> = err.lines().rev().take(20).collect();
            tail.reverse();
            Err(format!("{what}: {}: {}", o.status, tail.join("\n")))
        }
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Every path under `root`, relative, with what it is.
pub fn tree(root: &Path) -> std::io::Result<Tree> {
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

/// Runs `work` in `root/name` and fsyncs all it made; why not, once the
/// mount is gone.
fn work_and_sync(root: &Path, name: &str, work: &Workload) -> Result<(), String> {
    let to = root.join(name);
    std::fs::create_dir(&to).map_err(|e| format!("mkdir {name}: {e}"))?;
    work(&to)?;
    // Every path made (not through symbolic links), then the root.
    let synced = Command::new("sh")
        .arg("-c")
        .arg("find \"$1\" ! -type l -exec sync {} + && sync \"$2\"")
        .arg("sh")
        .arg(&to)
        .arg(root)
        .output();
    failed("find | sync", synced)
}

/// One round: runs the workload until the kill, which comes after
/// `run_for` and once `min_acked` runs are acknowledged (60 s at most);
/// the runs acknowledged.
fn crash_round(
    store: &Path,
    vol: &str,
    round: u64,
    work: &Workload,
    run_for: Duration,
    min_acked: usize,
) -> Vec<String> {
    let m = Mounted::new(store, vol, &["--checkpoint-every", "1s"]);
    let root = m.dir().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let (stop2, count2, work) = (stop.clone(), count.clone(), work.clone());
    let worker = std::thread::spawn(move || {
        let mut acked = Vec::new();
        for i in 0.. {
            let name = format!("r{round}-{i}");
            if stop2.load(Ordering::SeqCst) {
                break;
            }
            let done = work_and_sync(&root, &name, &work);
            // Still unset now: the kill had not begun when the run ended,
            // so it ran on the live mount (after the kill detaches it, a
            // path under its directory is the bare directory).
            let live = !stop2.load(Ordering::SeqCst);
            match done {
                Ok(()) if live => {
                    acked.push(name);
                    count2.fetch_add(1, Ordering::SeqCst);
                }
                Err(why) if live => return Err(format!("{name} failed on the live mount: {why}")),
                _ => break,
            }
        }
        Ok(acked)
    });
    std::thread::sleep(run_for);
    let waited = std::time::Instant::now();
    while count.load(Ordering::SeqCst) < min_acked && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    m.kill();
    let acked = worker.join().unwrap();
    drop(m);
    acked.unwrap_or_else(|e| panic!("round {round}: {e}"))
}

/// What is wrong with the remounted workspace: acknowledged runs whose
/// tree (as `seen` shows it) differs from `want`, files that do not read.
fn verify(root: &Path, want: &Tree, acked: &[String], seen: fn(Tree) -> Tree) -> Vec<String> {
    let mut problems = Vec::new();
    for name in acked {
        match tree(&root.join(name)).map(seen) {
            Ok(got) if got == *want => {}
            Ok(got) => {
                let differ: std::collections::BTreeSet<_> = want
                    .keys()
                    .chain(got.keys())
                    .filter(|k| want.get(*k) != got.get(*k))
                    .take(10)
                    .collect();
                problems.push(format!("{name}: differs from the expected tree at {differ:?}"));
            }
            Err(e) => problems.push(format!("{name}: unreadable: {e}")),
        }
    }
    // The rest (a run cut short) need not be whole, but must read.
    if let Err(e) = tree(root) {
        problems.push(format!("the workspace does not read: {e}"));
    }
    problems
}

pub fn base_seed() -> u64 {
    std::env::var("FORKFS_CRASH_SEED")
        .map(|s| s.parse().expect("FORKFS_CRASH_SEED is a number"))
        .unwrap_or_else(|_| rand::rng().random())
}

fn fsck(store: &Path) {
    let out = crate::common::forkfs(store, &["fsck"]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}

/// The crash test: `rounds` rounds of `work` on volume `vol`, each killed
/// after a random time in `millis`; after each, every acknowledged run is
/// `want` (as `seen` shows a tree) and fsck passes.
pub struct Rounds<'a> {
    pub store: &'a Path,
    pub vol: &'a str,
    pub work: Workload,
    pub want: &'a Tree,
    pub seen: fn(Tree) -> Tree,
    /// Changes a run's tree by hand (the control's second half): a
    /// change the verifier must report.
    pub tamper: fn(&Path),
}

impl Rounds<'_> {
    pub fn run(&self, seed: u64, rounds: u64, millis: std::ops::Range<u64>) {
        crate::common::mount::require_tool("find");
        println!("FORKFS_CRASH_SEED={seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut acked = Vec::new();
        for round in 0..rounds {
            let run_for = Duration::from_millis(rng.random_range(millis.clone()));
            let new = crash_round(self.store, self.vol, round, &self.work, run_for, 0);
            println!(
                "round {round}: {} runs acknowledged in {run_for:?} before the kill",
                new.len()
            );
            acked.extend(new);
            let m = Mounted::new(self.store, self.vol, &[]);
            let problems = verify(m.dir(), self.want, &acked, self.seen);
            m.unmount();
            assert!(problems.is_empty(), "seed {seed} round {round}:\n{}", problems.join("\n"));
            fsck(self.store);
        }
        assert!(!acked.is_empty(), "no run was ever acknowledged");
    }

    /// The verifier's negative control: the store is rolled back to a copy
    /// taken before a round (killed once a run is acknowledged: acknowledged
    /// runs gone), and the verifier must report them. Then, on that
    /// workspace, a run made afresh passes the verifier and the same run
    /// changed by `tamper` does not.
    pub fn control(&self) {
        crate::common::mount::require_tool("cp");
        crate::common::mount::require_tool("find");
        let before = self.store.with_extension("before");
        run(Command::new("cp").arg("-a").arg(self.store).arg(&before));
        let acked = crash_round(self.store, self.vol, 0, &self.work, Duration::ZERO, 1);
        assert!(!acked.is_empty(), "no run was acknowledged in 60 s");
        std::fs::remove_dir_all(self.store).unwrap();
        std::fs::rename(&before, self.store).unwrap();
        let m = Mounted::new(self.store, self.vol, &[]);
        let problems = verify(m.dir(), self.want, &acked, self.seen);
        assert!(!problems.is_empty(), "{} acknowledged runs were lost unnoticed", acked.len());
        println!("the verifier found: {problems:?}");
        let probe = vec!["probe".to_string()];
        work_and_sync(m.dir(), &probe[0], &self.work).expect("a run on the live mount");
        let whole = verify(m.dir(), self.want, &probe, self.seen);
        assert!(whole.is_empty(), "a whole run was reported: {whole:?}");
        (self.tamper)(&m.dir().join(&probe[0]));
        let changed = verify(m.dir(), self.want, &probe, self.seen);
        m.unmount();
        assert!(!changed.is_empty(), "a run changed by hand went unnoticed");
        println!("and in the changed run: {changed:?}");
    }
}
