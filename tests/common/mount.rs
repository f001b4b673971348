//! Kernel FUSE mounts for the mount tests: a store in its own tempdir, a
//! volume mounted with `forkfs mount --daemon` on its own mount point, and
//! a guard that always unmounts. Plus the small libc wrappers the tests
//! share.
#![allow(dead_code)]

use super::{forkfs, ok};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a command that must succeed; its stdout (not every test binary
/// uses it).
#[allow(unused_imports)]
pub use super::postgres::run;

/// A fresh, initialised store: (its tempdir, the store directory).
pub fn new_store() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let s = d.path().join("store");
    ok(&s, &["init"]);
    (d, s)
}

/// A volume mounted through the kernel; dropping it unmounts.
pub struct Mounted {
    store: PathBuf,
    vol: String,
    pid: u32,
    /// Served by a process that held the store already (and outlives it).
    hosted: bool,
    log: PathBuf,
    // Declared last: removed after the unmount in `drop`.
    dir: tempfile::TempDir,
}

impl Mounted {
    /// Creates fs volume `vol` unless it exists, and mounts it (`--daemon`
    /// plus `extra` arguments) on a new, empty directory.
    pub fn new(store: &Path, vol: &str, extra: &[&str]) -> Mounted {
        let name = vol.split('@').next().expect("a volume name");
        let vols = super::json(store, &["volume", "list"]);
        let vols = vols.as_array().expect("volume list is an array");
        let exists = vols.iter().any(|v| v["name"].as_str() == Some(name));
        if !exists {
            ok(store, &["volume", "create", name]);
        }
        let dir = tempfile::Builder::new().prefix("forkfs-mnt-").tempdir().expect("mount dir");
        let path = dir.path().to_str().expect("utf-8 path").to_string();
        let mut args = vec!["mount", vol, &path, "--daemon"];
        args.extend_from_slice(extra);
        let out = ok(store, &args);
        let pid = mount_pid(&out);
        let hosted = out.contains("hosted by the process that holds the store");
        let log = match out.trim_end().rsplit_once("; log ") {
            Some((_, l)) => PathBuf::from(l.trim_end_matches(')')),
            None => PathBuf::new(),
        };
        let m = Mounted { store: store.to_path_buf(), vol: vol.to_string(), pid, hosted, log, dir };
        assert!(is_fuse_mount(m.dir()), "{path} is not a FUSE mount after: {out}");
        m
    }

    /// Unmounts and mounts the volume again (on a new directory).
    pub fn remount(self) -> Mounted {
        self.remount_with(&[])
    }

    /// [`Mounted::remount`] with `extra` mount arguments.
    pub fn remount_with(self, extra: &[&str]) -> Mounted {
        let (store, vol) = (self.store.clone(), self.vol.clone());
        self.unmount();
        Mounted::new(&store, &vol, extra)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn store(&self) -> &Path {
        &self.store
    }

    pub fn vol(&self) -> &str {
        &self.vol
    }

    /// The mount process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `dir()/rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Unmounts now (as `forkfs umount` does), reporting failure.
    pub fn unmount(self) {
        let out = forkfs(&self.store, &["umount", self.dir.path().to_str().expect("utf-8")]);
        assert!(
            out.status.success(),
            "forkfs umount failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        assert!(!is_fuse_mount(self.dir.path()), "still mounted after umount");
        // umount returns once the mount process has released the store,
        // unless it still serves other mounts.
        let serving = || records_of(&self.store, self.pid) > 0;
        assert!(
            wait_gone(self.pid, 0) || serving(),
            "mount process {} outlived forkfs umount with no mounts left",
            self.pid
        );
        // Drop runs again: a second umount fails harmlessly.
    }

    /// SIGKILLs the mount process and detaches its dead mount.
    pub fn kill(&self) {
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        assert!(wait_gone(self.pid, 60), "mount process {} survived SIGKILL", self.pid);
        lazy_unmount(self.dir.path());
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- mount log tail ({}) ---", self.log.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        if is_fuse_mount(self.dir.path()) {
            let out = forkfs(&self.store, &["umount", self.dir.path().to_str().unwrap_or("")]);
            if !out.status.success() {
                lazy_unmount(self.dir.path());
            }
        }
        // A detached mount lives on while something holds a file in it
        // (a failed test): the process is ours, so end it.
        let serving = records_of(&self.store, self.pid) > 0;
        if !self.hosted && !serving && !wait_gone(self.pid, 5) {
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
            wait_gone(self.pid, 10);
        }
    }
}

/// How many mounts the store's records say process `pid` serves.
pub fn records_of(store: &Path, pid: u32) -> usize {
    let Ok(rd) = std::fs::read_dir(store.join("mounts")) else { return 0 };
    let pid_of = |p: PathBuf| -> Option<u64> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).ok()?).ok()?;
        v["pid"].as_u64()
    };
    rd.flatten().filter(|e| pid_of(e.path()) == Some(pid as u64)).count()
}

/// The pid in `VOL mounted on DIR (pid N; log PATH)` or `(pid N, which ...)`.
pub fn mount_pid(out: &str) -> u32 {
    let rest = out.split("(pid ").nth(1).unwrap_or_else(|| panic!("no pid in {out:?}"));
    rest.split([';', ','])
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("pid in {out:?}"))
}

/// Whether `dir` is itself a FUSE mount point (per /proc/self/mountinfo).
pub fn is_fuse_mount(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let want = dir.to_str().expect("utf-8");
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("");
        f.get(4) == Some(&want) && fstype.starts_with("fuse")
    })
}

/// `umount -l DIR`, falling back to `fusermount3 -uz DIR`.
pub fn lazy_unmount(dir: &Path) {
    let ok = Command::new("umount").arg("-l").arg(dir).status().is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("fusermount3").arg("-uz").arg(dir).status();
    }
}

/// Waits up to `secs` seconds for process `pid` to exit; whether it did.
pub fn wait_gone(pid: u32, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    // Gone when no thread of it is left but zombies: a first thread that
    // is a zombie while others are torn down still holds the process's
    // files (the store's lock).
    let live = |stat: &str| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !stat.is_empty() && !state.starts_with('Z') && !state.starts_with('X')
    };
    loop {
        let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        if !tasks.iter().any(|s| live(s)) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `forkfs diff FROM TO` as (change, path, from) triples.
pub fn diff(
    store: &Path,
    from: &str,
    to: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    let d = super::json(store, &["diff", from, to]);
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let paths = d["paths"].as_array().unwrap_or_else(|| panic!("not an fs diff: {d}"));
    paths.iter().map(|p| (s(&p["change"]), s(&p["path"]), s(&p["from"]))).collect()
}

/// A scratch directory on native ext4, the reference the mount is judged
/// against (fails the test if /tmp is not ext4).
pub fn ext4_reference_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/tmp").expect("tempdir in /tmp");
    assert_eq!(statfs_type(d.path()), 0xEF53, "the reference directory /tmp must be on ext4");
    d
}

/// Asserts that the reference run `native` (ext4) printed each of `lines`:
/// the steps do what the test expects there, so a mount that matches the
/// reference does too.
pub fn assert_shows(native: &[String], lines: &[&str]) {
    for line in lines {
        assert!(native.iter().any(|l| l == line), "ext4 did not show {line:?}: {native:#?}");
    }
}

/// The lines a shell script prints, run in `dir` (the steps of a test
/// told beside ext4: one line per step).
pub fn script_lines(script: &str, dir: &Path) -> Vec<String> {
    let out = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    out.lines().map(str::to_string).collect()
}

/// Fails the test (instead of skipping) when `tool` is not installed.
pub fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "this test needs `{tool}` on PATH; install it (scripts/test does)");
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The syscall's result: Ok(return value) or Err(errno).
pub fn check(r: i64) -> Result<i64, i32> {
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// lstat(2) of `p`.
pub fn lstat(p: &Path) -> libc::stat {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::lstat(cpath(p).as_ptr(), &mut st) };
    assert_eq!(r, 0, "lstat {}: {}", p.display(), std::io::Error::last_os_error());
    st
}

/// renameat2(2) with `flags` (RENAME_NOREPLACE, RENAME_EXCHANGE).
pub fn renameat2(from: &Path, to: &Path, flags: u32) -> Result<i64, i32> {
    let (a, b) = (cpath(from), cpath(to));
    check(unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) }
        as i64)
}

pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<i64, i32> {
    let n = CString::new(name).unwrap();
    let r = unsafe {
        libc::setxattr(cpath(p).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags)
    };
    check(r as i64)
}

/// getxattr(2) into a buffer of `size` bytes: Ok(the value) or Err(errno).
pub fn getxattr(p: &Path, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; size];
    let r = unsafe {
        libc::getxattr(cpath(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    };
    check(r as i64).map(|len| {
        buf.truncate(if size == 0 { 0 } else { len as usize });
        if size == 0 { len.to_le_bytes().to_vec() } else { buf }
    })
}

/// listxattr(2) with a buffer of `size` bytes: the names, or Err(errno).
pub fn listxattr(p: &Path, size: usize) -> Result<Vec<String>, i32> {
    let mut buf = vec![0u8; size];
    let r = unsafe { libc::listxattr(cpath(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let len = check(r as i64)? as usize;
    buf.truncate(len);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

pub fn removexattr(p: &Path, name: &str) -> Result<i64, i32> {
    let n = CString::new(name).unwrap();
    check(unsafe { libc::removexattr(cpath(p).as_ptr(), n.as_ptr()) } as i64)
}

/// statfs(2)'s f_type of the filesystem holding `p` (0xEF53: ext4).
pub fn statfs_type(p: &Path) -> i64 {
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(cpath(p).as_ptr(), &mut s) }, 0, "statfs {}", p.display());
    s.f_type as i64
}
