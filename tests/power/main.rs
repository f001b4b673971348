//! Power cuts: the store on a filesystem that loses every write not yet
//! synced ([`lazyfs`]), a workload through the real front-ends, and the
//! power cut at a random moment, round after round. After each cut the
//! store reopens from what was synced and must hold every write it
//! acknowledged as durable (an fsync that returned, an NBD FLUSH, a
//! snapshot that returned), and `forkfs fsck` must find nothing wrong.
//!
//! `FORKFS_POWER_ROUNDS` sets the rounds per workload (default 12);
//! `FORKFS_POWER_SEED` repeats a run. The negative control turns off the
//! data log's fdatasync (`FORKFS_TEST_SKIP_LOG_SYNC=1`) and must be caught.
//! The same filesystem fails chosen reads with EIO for `eio.rs`.
//! One test binary.

#[path = "../common/mod.rs"]
mod common;

mod eio;
mod inline;
mod lazyfs;
mod mount;
mod nbd;

use std::path::{Path, PathBuf};

/// Rounds per workload.
pub fn rounds() -> usize {
    std::env::var("FORKFS_POWER_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(12)
}

/// The seed of this run (printed, so a failure can be repeated).
pub fn seed() -> u64 {
    let seed = std::env::var("FORKFS_POWER_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    println!("power-cut seed {seed} (FORKFS_POWER_SEED={seed} repeats it)");
    seed
}

/// A store directory on a lazy filesystem, re-mounted after each cut.
pub struct Machine {
    /// Declared (so dropped) before the directory it is mounted in: the
    /// directory's removal then finds nothing mounted under it.
    fs: Option<lazyfs::Mounted>,
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mountpoint: PathBuf,
    /// Extra environment for every forkfs process on the store.
    pub env: Vec<(&'static str, &'static str)>,
}

impl Default for Machine {
    fn default() -> Machine {
        Machine::new()
    }
}

impl Machine {
    pub fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let (backing, mountpoint) = (dir.path().join("disk"), dir.path().join("fs"));
        std::fs::create_dir(&backing).unwrap();
        std::fs::create_dir(&mountpoint).unwrap();
        let fs = Some(lazyfs::Mounted::mount(&backing, &mountpoint));
        Machine { _dir: dir, backing, mountpoint, fs, env: Vec::new() }
    }

    /// The store's directory (on the lazy filesystem).
    pub fn store(&self) -> PathBuf {
        self.mountpoint.join("store")
    }

    /// `forkfs --store STORE ARGS...` with this machine's environment.
    pub fn forkfs(&self, args: &[&str]) -> std::process::Command {
        let mut c = common::command(&self.store(), args);
        c.envs(self.env.iter().copied());
        c
    }

    /// Runs forkfs, asserting success; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.forkfs(args).output().unwrap();
        assert!(
            out.status.success(),
            "forkfs {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The power goes (every process on the store must be dead already)
    /// and comes back. Returns the unsynced bytes lost.
    pub fn cut_power(&mut self) -> u64 {
        let dropped = self.fs.take().expect("mounted").cut_power();
        self.fs = Some(lazyfs::Mounted::mount(&self.backing, &self.mountpoint));
        dropped
    }

    /// Reads of files under the store whose path contains one of
    /// `patterns` fail with EIO from now on (none: all read again).
    pub fn fail_reads(&self, patterns: &[&str]) {
        self.fs.as_ref().expect("mounted").fail_reads(patterns);
    }

    /// Writes and fsyncs of files under the store whose path contains one
    /// of `patterns` fail with EIO from now on (none: all work again).
    pub fn fail_writes(&self, patterns: &[&str]) {
        self.fs.as_ref().expect("mounted").fail_writes(patterns);
    }

    /// `forkfs fsck --json`: (ok, problems).
    pub fn fsck(&self) -> (bool, Vec<String>) {
        let out = self.forkfs(&["--json", "fsck"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("fsck said: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        let problems = v["problems"].as_array().cloned().unwrap_or_default();
        (v["ok"] == true, problems.iter().map(|p| p.as_str().unwrap_or("?").to_string()).collect())
    }
}

/// SIGKILL, and wait until the process is gone.
pub fn kill(pid: u32) {
    // SAFETY: kill(2) on a process this test started; no memory involved.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(common::mount::wait_gone(pid, 30), "pid {pid} survived SIGKILL");
}

/// Every regular file under `dir`, relative path -> content.
pub fn tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}
