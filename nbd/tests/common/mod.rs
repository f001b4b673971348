//! A real `forkfs-nbd` server on a Unix socket, and the real NBD clients.
#![allow(dead_code)]

pub mod attach;
pub mod raw;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub store: PathBuf,
    pub sock: PathBuf,
    /// Extra environment for the server process (e.g. test-only modes).
    pub env: Vec<(String, String)>,
    /// The `forkfs-nbd` to run (a long test may pin a copy of the build).
    pub bin: PathBuf,
}

/// Fails with a clear message when a client tool is missing (CI installs them).
pub fn need(tool: &str) {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output();
    assert!(
        found.map(|o| o.status.success()).unwrap_or(false),
        "{tool} is not installed: run scripts/install-deps (Debian packages libnbd-bin, nbdkit, qemu-utils, python3-libnbd)"
    );
}

impl Server {
    /// A store with block volumes `(name, size)`, served by a new server.
    pub fn start(volumes: &[(&str, u64)]) -> Server {
        let mut srv = Server::create(volumes);
        srv.spawn(&[]);
        srv
    }

    /// The store of [`Server::start`], without starting the server.
    pub fn create(volumes: &[(&str, u64)]) -> Server {
        Server::create_with(volumes, false)
    }

    /// [`Server::create`] with the store's objects in a bucket: a `file://`
    /// one in the test's directory (no server; the store is remote all
    /// the same).
    pub fn create_in_bucket(volumes: &[(&str, u64)]) -> Server {
        Server::create_with(volumes, true)
    }

    fn create_with(volumes: &[(&str, u64)], in_bucket: bool) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let mut config = forkfs::StoreConfig::default();
        if in_bucket {
            let bucket = dir.path().join("bucket");
            std::fs::create_dir(&bucket).unwrap();
            config.remote = Some(forkfs::RemoteConfig {
                url: format!("file://{}", bucket.display()),
                endpoint: None,
                allow_http: false,
                region: None,
                read_deadline_ms: None,
                pending_limit: None,
            });
        }
        {
            let s = forkfs::Store::init(&store, config).unwrap();
            for (name, size) in volumes {
                s.volumes().create(name, forkfs::VolumeKind::Block, Some(*size), None).unwrap();
            }
        }
        let sock = dir.path().join("nbd.sock");
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_forkfs-nbd"));
        Server { child: None, dir, store, sock, env: Vec::new(), bin }
    }

    pub fn spawn(&mut self, extra: &[&str]) {
        let _ = std::fs::remove_file(&self.sock);
        // Appended: the log of a killed server stays readable after a restart.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("--store")
            .arg(&self.store)
            .args(["serve", "--socket"])
            .arg(&self.sock)
            .args(extra)
            .envs(self.env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start forkfs-nbd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&self.sock).is_err() {
            assert!(Instant::now() < deadline, "server did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    /// SIGTERM, then wait: the graceful shutdown path.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("server running");
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap()
    }

    /// SIGKILL, then wait: the server dies without any shutdown path.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("server running");
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    need(cmd);
    Command::new(cmd)
        .args(args)
        .env("PATH", format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default()))
        .output()
        .unwrap()
}

/// Runs and asserts success; returns stdout.
pub fn ok(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a Python script under nbdsh (libnbd) against `uri`.
pub fn nbdsh(uri: &str, script: &str) -> String {
    ok("nbdsh", &["-u", uri, "-c", script])
}

pub fn write_random(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut data = vec![0u8; len];
    for c in data.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        c.copy_from_slice(&s.to_le_bytes()[..c.len()]);
    }
    std::fs::write(path, &data).unwrap();
    data
}
