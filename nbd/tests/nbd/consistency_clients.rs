//! `--consistency btrfs` with several clients on one export (issue 18): a
//! client whose connection drops loses only its own writes since the last
//! safe point; the other clients keep theirs and their connections. A
//! client is a peer process here (the server listens on a Unix socket):
//! each nbdsh below is one. The negative control serves with `--client-by
//! export` (every connection one client, the whole-export rollback of
//! before) and shows the first test's assertions fail there; over TCP, two
//! processes of one host are one client and fail the same way.

use crate::common::{Server, nbdsh};
use crate::consistency::{MIB, SUPER, read_at, real_super, rollbacks, wait_rollbacks};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const BLOCK: u64 = 65536;
/// Client A's block, and client B's two.
const A_AT: u64 = 100 * MIB;
const B_AT: u64 = 200 * MIB;
const B2_AT: u64 = 300 * MIB;

/// An nbdsh process that runs a script step by step: the script prints a
/// line and waits for one on stdin between steps.
struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Held {
    fn start(uri: &str, script: &str) -> Held {
        let mut child = Command::new("nbdsh")
            .args(["-u", uri, "-c", script])
            .env("PATH", format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start nbdsh");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Held { child, stdin, stdout }
    }

    /// The next line the script prints.
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).expect("read nbdsh output");
        assert!(!l.is_empty(), "nbdsh ended early: {:?}", self.child.try_wait());
        l.trim().to_string()
    }

    /// Lets the script go on past its next `sys.stdin.readline()`.
    fn go(&mut self) {
        let w = self.stdin.as_mut().expect("stdin open");
        w.write_all(b"go\n").and_then(|()| w.flush()).expect("signal nbdsh");
    }

    /// Drops the connection without NBD_CMD_DISC: the process dies.
    fn kill(mut self) {
        self.child.kill().expect("kill nbdsh");
        self.child.wait().expect("reap nbdsh");
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().expect("reap nbdsh").success(), "nbdsh failed");
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A btrfs-mode server whose disk is at a safe point (a real superblock,
/// made durable by a FLUSH); `extra` adds serve flags.
fn btrfs_server(extra: &[&str]) -> Server {
    let mut srv = Server::create(&[("vm", 512 * MIB)]);
    let mut flags = vec!["--consistency", "btrfs"];
    flags.extend_from_slice(extra);
    srv.spawn(&flags);
    let (_, sb) = real_super(srv.dir.path());
    let f = srv.path("super");
    std::fs::write(&f, &sb).unwrap();
    let script = format!("h.pwrite(open({:?}, 'rb').read(), {SUPER})\nh.flush()\nh.shutdown()", f);
    nbdsh(&srv.uri("vm"), &script);
    srv
}

/// What client B saw and kept after client A was cut.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// B's connection still served reads and writes.
    b_served: bool,
    /// B's write from before the cut is on the disk.
    b_kept: bool,
    /// A's write is gone.
    a_gone: bool,
    /// Bytes the rollback record says it discarded.
    discarded: u64,
}

/// Client A writes a block, client B writes another (no safe point), A is
/// killed; then B reads its block and writes a second one, and leaves
/// cleanly. Fresh readers then look at the disk. A and B use `uri`.
fn two_writers_one_cut(srv: &Server, uri: &str) -> Outcome {
    let writer = |byte: char, at: u64| {
        format!(
            r#"
import sys, nbd
h.pwrite(b'{byte}' * {BLOCK}, {at})
print('WROTE', flush=True)
sys.stdin.readline()
"#
        )
    };
    let mut b = Held::start(
        uri,
        &format!(
            r#"{}
try:
    kept = h.pread({BLOCK}, {B_AT}) == b'B' * {BLOCK}
    h.pwrite(b'b' * {BLOCK}, {B2_AT})
    print('SERVED', kept, flush=True)
    h.shutdown()
except nbd.Error as e:
    print('FAILED', e.errno, flush=True)
"#,
            writer('B', B_AT)
        ),
    );
    let mut a = Held::start(uri, &writer('A', A_AT));
    assert_eq!(a.line(), "WROTE");
    assert_eq!(b.line(), "WROTE");
    a.kill();
    wait_rollbacks(srv, 1);
    b.go();
    let said = b.line();
    b.finish();
    let rb = rollbacks(srv);
    assert_eq!(rb.len(), 1, "one cut, one rollback: {rb:?}");
    Outcome {
        b_served: said == "SERVED True",
        b_kept: read_at(srv, B_AT, 4) == b"BBBB" && read_at(srv, B2_AT, 4) == b"bbbb",
        a_gone: read_at(srv, A_AT, 4) == [0; 4],
        discarded: rb[0]["discarded_bytes"].as_u64().unwrap_or(0),
    }
}

#[test]
fn consistency_a_lost_client_rolls_back_only_its_own_writes() {
    let srv = btrfs_server(&[]);
    let out = two_writers_one_cut(&srv, &srv.uri("vm"));
    assert_eq!(
        out,
        Outcome { b_served: true, b_kept: true, a_gone: true, discarded: BLOCK },
        "{}",
        srv.log()
    );
}

/// The negative control: with every connection one client (the
/// whole-export rollback this change replaced), the same run loses B's
/// write and fails B, so the test above can fail.
#[test]
fn consistency_negative_control_whole_export_rollback_fails_the_other_client() {
    let srv = btrfs_server(&["--client-by", "export"]);
    let out = two_writers_one_cut(&srv, &srv.uri("vm"));
    assert_eq!(
        out,
        Outcome { b_served: false, b_kept: false, a_gone: true, discarded: 2 * BLOCK },
        "{}",
        srv.log()
    );
}

/// Over TCP a client is an IP address: two processes on one host are one
/// client (the documented limit), so the same run rolls both back.
#[test]
fn consistency_tcp_connections_from_one_host_are_one_client() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let srv = btrfs_server(&["--listen", &listen]);
    let out = two_writers_one_cut(&srv, &format!("nbd://{listen}/vm"));
    assert_eq!(
        out,
        Outcome { b_served: false, b_kept: false, a_gone: true, discarded: 2 * BLOCK },
        "{}",
        srv.log()
    );
}

/// Waits until the server has logged the end of `n` connections.
fn wait_ended(srv: &Server, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let log = srv.log();
        let ended =
            log.lines().filter(|l| l.contains("detached") || l.contains("connection ended"));
        if ended.count() >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{n} connections did not end: {log}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn consistency_a_reader_dropping_disturbs_no_writer() {
    let srv = btrfs_server(&[]);
    let uri = srv.uri("vm");
    let mut w = Held::start(
        &uri,
        &format!(
            r#"
import sys
h.pwrite(b'W' * {BLOCK}, {B_AT})
print('WROTE', flush=True)
sys.stdin.readline()
assert h.pread({BLOCK}, {B_AT}) == b'W' * {BLOCK}
h.pwrite(b'w' * {BLOCK}, {B2_AT})
print('SERVED', flush=True)
sys.stdin.readline()
h.shutdown()
"#
        ),
    );
    assert_eq!(w.line(), "WROTE");
    // A reader of the writer's pending block (and of others) is killed
    // mid-connection, and another leaves without NBD_CMD_DISC.
    let mut r = Held::start(
        &uri,
        &format!(
            "import sys\nassert h.pread({BLOCK}, {B_AT}) == b'W' * {BLOCK}\nh.pread({BLOCK}, 0)\nprint('READ', flush=True)\nsys.stdin.readline()"
        ),
    );
    assert_eq!(r.line(), "READ");
    r.kill();
    // The server has seen both connections that ended so far (the setup's
    // and the reader's) end.
    wait_ended(&srv, 2);
    assert!(rollbacks(&srv).is_empty(), "a reader's drop rolled back: {:?}", rollbacks(&srv));
    assert_eq!(read_at(&srv, B_AT, 4), b"WWWW");
    wait_ended(&srv, 3);
    w.go();
    assert_eq!(w.line(), "SERVED", "{}", srv.log());
    w.go();
    w.finish();
    assert_eq!(read_at(&srv, B_AT, 4), b"WWWW");
    assert_eq!(read_at(&srv, B2_AT, 4), b"wwww");
    assert!(rollbacks(&srv).is_empty(), "{:?}", rollbacks(&srv));
}
