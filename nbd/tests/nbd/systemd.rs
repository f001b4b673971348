//! `forkfs-nbd` under a service manager (issues 19 and 25): socket
//! activation and readiness notification as systemd does them. systemd's
//! own `systemd-socket-activate` holds the listening socket and starts the
//! server on the first connection, passing the socket (LISTEN_FDS); the
//! test is the notification socket (NOTIFY_SOCKET). A server started on
//! demand with `--exit-when-idle` ends once its last client left, and the
//! next connection starts a new one that has the data.
//!
//! Negative control (by hand, `server.rs` without the idle branch): the
//! server is still running 15 s after its client left, and the test fails
//! there.

use crate::common::{Server, need, run};
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// `systemd-socket-activate` listening on the server's socket, starting
/// `forkfs-nbd serve --exit-when-idle 1s` on the first connection with
/// NOTIFY_SOCKET set to `notify`.
fn activator(srv: &Server, notify: &std::path::Path) -> Child {
    need("systemd-socket-activate");
    let _ = std::fs::remove_file(&srv.sock);
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(srv.path("server.log")).unwrap();
    let child = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&srv.sock)
        .arg("-E")
        .arg(format!("NOTIFY_SOCKET={}", notify.display()))
        .arg(&srv.bin)
        .arg("--store")
        .arg(&srv.store)
        .args(["serve", "--exit-when-idle", "1s"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("systemd-socket-activate (Debian package systemd)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !srv.sock.exists() {
        assert!(Instant::now() < deadline, "systemd-socket-activate did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// The next notification the server sent.
fn notified(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("a notification within 30 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Waits up to `limit` for `child` to exit.
fn exited(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn a_socket_activated_server_is_ready_serves_and_exits_when_its_last_client_left() {
    let srv = Server::create(&[("disk", 64 * MIB)]);
    let path = srv.path("notify.sock");
    let notify = UnixDatagram::bind(&path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let uri = srv.uri("disk");
    let write = "h.pwrite(b'\\x3c' * 65536, 4096)\nh.flush()";
    let read = "assert h.pread(65536, 4096) == b'\\x3c' * 65536";
    for script in [write, read] {
        let mut guard = Reaped(Some(activator(&srv, &path)));
        let server = guard.0.as_mut().unwrap();
        // The first connection starts the server, which takes it.
        let out = run("nbdsh", &["-u", &uri, "-c", script]);
        assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), {
            std::fs::read_to_string(srv.path("server.log")).unwrap_or_default()
        });
        assert_eq!(notified(&notify).trim(), "READY=1");
        // Its only client left: it stops on its own, as on SIGTERM.
        let st = exited(server, Duration::from_secs(15));
        let log = std::fs::read_to_string(srv.path("server.log")).unwrap_or_default();
        let st = st.unwrap_or_else(|| panic!("still running 15 s after its client left:\n{log}"));
        assert_eq!(st.code(), Some(0), "{log}");
        assert_eq!(notified(&notify).trim(), "STOPPING=1");
        assert!(log.contains("no client: stopping (--exit-when-idle)"), "{log}");
    }
    // Given --socket as well, a socket-activated server refuses in one line.
    let _ = std::fs::remove_file(&srv.sock);
    let refused = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&srv.sock)
        .arg(&srv.bin)
        .arg("--store")
        .arg(&srv.store)
        .args(["serve", "--socket"])
        .arg(srv.path("other.sock"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut refused = Reaped(Some(refused));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !srv.sock.exists() {
        assert!(Instant::now() < deadline, "systemd-socket-activate did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = run("nbdinfo", &[&uri]);
    let child = refused.0.as_mut().unwrap();
    let st = exited(child, Duration::from_secs(15)).expect("the refusing server exits");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(st.code(), Some(64), "{err}");
    assert!(err.contains("socket-activated"), "{err}");
}

/// A child killed (and reaped) when dropped: a failed assertion leaves
/// no server behind.
struct Reaped(Option<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The units shipped in `docs/systemd/` pass `systemd-analyze verify`
/// without a word (ExecStart pointed at this build's binary).
#[test]
fn the_shipped_systemd_units_verify() {
    need("systemd-analyze");
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/systemd");
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_forkfs-nbd");
    let mut units = Vec::new();
    for name in ["forkfs-nbd.socket", "forkfs-nbd.service"] {
        let text = std::fs::read_to_string(docs.join(name)).unwrap();
        assert!(name.ends_with(".socket") || text.contains("/usr/local/bin/forkfs-nbd"));
        let path = dir.path().join(name);
        std::fs::write(&path, text.replace("/usr/local/bin/forkfs-nbd", bin)).unwrap();
        units.push(path.to_str().unwrap().to_string());
    }
    let args: Vec<&str> = ["verify"].into_iter().chain(units.iter().map(String::as_str)).collect();
    let out = run("systemd-analyze", &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
}
