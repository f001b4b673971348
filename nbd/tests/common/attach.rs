//! The kernel path without a kernel nbd driver: nbdfuse exposes an export as
//! a file, `losetup` makes that file a block device. Every command that can
//! hang runs under a timeout, and teardown never waits forever: after a
//! connection is cut, I/O on the device fails and nothing must block on it.

use super::{Server, need};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` for at most `limit`. Err: it could not start or it timed out
/// (then it is killed and left to be reaped by a thread: a process stuck in
/// the kernel must not stall the caller).
pub fn run_timeout(cmd: &str, args: &[&str], limit: Duration) -> Result<Output, String> {
    let mut child = Command::new(cmd)
        .args(args)
        .env(
            "PATH",
            format!("/usr/sbin:/usr/bin:/sbin:/bin:{}", std::env::var("PATH").unwrap_or_default()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd}: {e}"))?;
    // Pipes are drained on threads: a full pipe must not stall the child.
    let drain = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
        rx
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let get = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
                rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default()
            };
            return Ok(Output { status, stdout: get(out), stderr: get(err) });
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            std::thread::spawn(move || child.wait());
            return Err(format!("{cmd} {args:?} timed out after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`run_timeout`] that must succeed; Err carries the command's output.
pub fn ok_timeout(cmd: &str, args: &[&str], limit: Duration) -> Result<String, String> {
    let out = run_timeout(cmd, args, limit)?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

const CMD: Duration = Duration::from_secs(60);

/// Whether `path` is a mount point right now (per /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*p))
}

/// One export attached as a loop device through nbdfuse; detached on drop.
pub struct Attached {
    pub fuse_dir: PathBuf,
    fuse: Option<Child>,
    pub loopdev: String,
    pub mnt: Option<PathBuf>,
}

impl Attached {
    /// Export `export` of `srv`, over its Unix socket.
    pub fn new(srv: &Server, export: &str, tag: &str, read_only: bool) -> Attached {
        Attached::uri(srv.dir.path(), &srv.uri(export), tag, read_only)
            .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", srv.log()))
    }

    /// Attaches `uri`: the file is `DIR/fuse-TAG/disk`, nbdfuse's messages
    /// go to `DIR/fuse-TAG.log`.
    pub fn uri(dir: &Path, uri: &str, tag: &str, read_only: bool) -> Result<Attached, String> {
        need("nbdfuse");
        need("losetup");
        need("fusermount3");
        let fuse_dir = dir.join(format!("fuse-{tag}"));
        std::fs::create_dir_all(&fuse_dir).unwrap();
        let file = fuse_dir.join("disk");
        let log = std::fs::File::create(dir.join(format!("fuse-{tag}.log"))).unwrap();
        let mut cmd = Command::new("nbdfuse");
        if read_only {
            cmd.arg("-r");
        }
        let fuse = cmd
            .arg(&file)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("nbdfuse: {e}"))?;
        let mut a = Attached { fuse_dir, fuse: Some(fuse), loopdev: String::new(), mnt: None };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !file.exists() {
            let exited = a.fuse.as_mut().unwrap().try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let msg = std::fs::read_to_string(dir.join(format!("fuse-{tag}.log")));
                return Err(format!(
                    "nbdfuse did not expose {uri} ({exited:?}): {}",
                    msg.unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let f = file.to_string_lossy().into_owned();
        let mut la = vec!["-f", "--show"];
        if read_only {
            la.push("-r");
        }
        la.push(&f);
        a.loopdev = ok_timeout("losetup", &la, CMD)?.trim().to_string();
        Ok(a)
    }

    pub fn mount(&mut self, at: &Path, opts: &str) -> Result<(), String> {
        std::fs::create_dir_all(at).unwrap();
        ok_timeout("mount", &["-o", opts, &self.loopdev, at.to_str().unwrap()], CMD)?;
        self.mnt = Some(at.to_path_buf());
        Ok(())
    }

    /// A clean unmount; Err if it failed (the mount is then detached lazily).
    pub fn unmount(&mut self) -> Result<(), String> {
        let Some(m) = self.mnt.take() else { return Ok(()) };
        let m = m.to_string_lossy().into_owned();
        ok_timeout("umount", &[&m], CMD).map(|_| ()).inspect_err(|_| {
            let _ = run_timeout("umount", &["-l", &m], Duration::from_secs(10));
        })
    }

    /// Kills nbdfuse: the kernel aborts its FUSE connection, so every I/O
    /// still pending on the device fails at once instead of waiting.
    pub fn kill_fuse(&mut self) {
        if let Some(f) = self.fuse.as_mut() {
            let _ = f.kill();
        }
    }

    /// Unmounts, detaches the loop device, unmounts nbdfuse and reaps it,
    /// each step bounded in time. Returns what did not go cleanly.
    pub fn detach(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = self.unmount() {
            problems.push(format!("unmount: {e}"));
        }
        if !self.loopdev.is_empty() {
            let dev = std::mem::take(&mut self.loopdev);
            if let Err(e) = ok_timeout("losetup", &["-d", &dev], CMD) {
                problems.push(format!("losetup -d: {e}"));
            }
        }
        let Some(mut fuse) = self.fuse.take() else { return problems };
        let dir = self.fuse_dir.to_string_lossy().into_owned();
        if is_mounted(&self.fuse_dir)
            && ok_timeout("fusermount3", &["-u", &dir], Duration::from_secs(20)).is_err()
        {
            let _ = fuse.kill();
            let _ = run_timeout("fusermount3", &["-u", "-z", &dir], Duration::from_secs(10));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match fuse.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    problems.push("nbdfuse did not exit; killed".into());
                    let _ = fuse.kill();
                    std::thread::spawn(move || fuse.wait());
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if is_mounted(&self.fuse_dir) {
            problems.push(format!("{dir} is still mounted"));
        }
        problems
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        for p in self.detach() {
            eprintln!("detach {}: {p}", self.fuse_dir.display());
        }
    }
}
