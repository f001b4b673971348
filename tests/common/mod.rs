//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod mount;
pub mod postgres;
pub mod proxy;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn forkfs_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_forkfs"))
}

/// Environment variables every forkfs process on a store gets (a test's
/// own settings, e.g. short leases), without touching this process's.
static STORE_ENV: std::sync::Mutex<Vec<(PathBuf, String, String)>> =
    std::sync::Mutex::new(Vec::new());

/// Sets `key=value` for every forkfs process later run on `store`.
pub fn store_env(store: &Path, key: &str, value: &str) {
    let mut env = STORE_ENV.lock().unwrap();
    env.push((store.to_path_buf(), key.to_string(), value.to_string()));
}

/// `forkfs --store STORE ARGS...`, with the credentials of the loopback
/// S3 server (`s3::S3`; unused by local stores).
pub fn command(store: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(forkfs_bin());
    c.arg("--store").arg(store).args(args);
    c.env("AWS_ACCESS_KEY_ID", "test").env("AWS_SECRET_ACCESS_KEY", "test");
    c.env("AWS_REGION", "us-east-1");
    for (s, k, v) in STORE_ENV.lock().unwrap().iter() {
        if s == store {
            c.env(k, v);
        }
    }
    c
}

/// Runs `forkfs --store STORE ARGS...`.
pub fn forkfs(store: &Path, args: &[&str]) -> Output {
    command(store, args).output().expect("forkfs binary runs")
}

/// Runs forkfs and asserts success, returning stdout.
pub fn ok(store: &Path, args: &[&str]) -> String {
    let out = forkfs(store, args);
    assert!(
        out.status.success(),
        "forkfs {args:?} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Runs forkfs and asserts a one-line error with a non-zero exit.
pub fn fails(store: &Path, args: &[&str]) -> (i32, String) {
    let out = forkfs(store, args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "forkfs {args:?} unexpectedly succeeded");
    let ours = ["forkfs: ", "forkfs-fsck: ", "forkfs-nbd: "];
    assert!(ours.iter().any(|p| err.starts_with(p)), "error is not a forkfs message: {err:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "error is not one line: {err:?}");
    assert!(!err.contains("panicked"), "forkfs panicked: {err}");
    (out.status.code().unwrap_or(-1), err)
}

pub fn json(store: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    serde_json::from_str(&ok(store, &a)).expect("valid JSON")
}

/// `len` pseudo-random bytes (xorshift; the same for the same seed).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// A tmpfs mounted at `dir` (created) with `options` (e.g. "size=48m"),
/// unmounted when dropped: a small disk to fill, or a reference
/// filesystem. The tests run as root.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount(8)");
        assert!(mounted.success(), "mounting a tmpfs at {} (needs root)", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    /// Fills the filesystem with one file, `fill`, until only about
    /// `leave` bytes are free.
    pub fn fill(&self, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("fill");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let block = vec![0x5au8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        // The last partial block may still fit in smaller writes.
        while f.write_all(&block[..512]).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `forkfs --store A BUNDLE_CREATE... | forkfs --store B BUNDLE_IMPORT...`:
/// the outputs of both sides (the first's stdout is the pipe).
pub fn piped(a: &Path, first: &[&str], b: &Path, second: &[&str]) -> (Output, Output) {
    let mut left = command(a, first)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("forkfs binary runs");
    let right = command(b, second)
        .stdin(left.stdout.take().expect("a pipe"))
        .output()
        .expect("forkfs binary runs");
    (left.wait_with_output().expect("forkfs binary ends"), right)
}
