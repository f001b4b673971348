//! Operability and local access control (issue 19): the Unix socket's
//! peer-credential allowlist (`--allow-uid`, `--allow-gid`), and logs as
//! JSON lines (`--log-format json`).

use crate::common::{Server, run};

const MIB: u64 = 1 << 20;

/// This process's user and primary group (the tests run as root).
fn me() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// With an allowlist, only the listed users or groups get in: another is
/// refused (NBD_REP_ERR_POLICY with the reason, which the log shows too);
/// listed by uid or by gid,
/// it gets in. Negative control: the same client, refused under
/// `--allow-uid` of someone else, gets in without the flag (the first case).
#[test]
fn the_unix_socket_admits_only_the_listed_users_and_groups() {
    let (uid, gid) = me();
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let other = (uid + 4242).to_string();
    let cases: [(Vec<String>, bool); 5] = [
        (vec![], true),
        (vec!["--allow-uid".into(), other.clone()], false),
        (vec!["--allow-gid".into(), other.clone()], false),
        (vec!["--allow-uid".into(), other.clone(), "--allow-uid".into(), uid.to_string()], true),
        (vec!["--allow-gid".into(), gid.to_string()], true),
    ];
    for (args, admitted) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        srv.spawn(&args);
        let out = run("nbdinfo", &[&srv.uri("disk")]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), admitted, "{args:?}: {said}\n{}", srv.log());
        if !admitted {
            // Refused by policy (NBD_REP_ERR_POLICY, which libnbd reports
            // as "not supported"), the reason in the server's log.
            assert!(said.contains("not supported"), "{args:?}: {said}");
            let log = srv.log();
            assert!(log.contains("may not connect") && log.contains("refusing"), "{log}");
        }
        srv.stop();
    }
}

/// `--log-format json`: every line the server logs is one JSON object
/// with a timestamp, a level and the message.
#[test]
fn logs_are_json_lines_when_asked() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    srv.spawn(&["--log-format", "json"]);
    let out = run("nbdinfo", &[&srv.uri("disk")]);
    assert!(out.status.success());
    srv.stop();
    let log = srv.log();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 3, "{log}");
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
        assert!(v["fields"]["message"].is_string(), "{l}");
    }
    assert!(log.contains("\"listening (unix)\""), "{log}");
}

/// Peers that `--allow-uid` turns away are not clients: connecting again
/// and again, they keep no `--exit-when-idle` server alive (it would hold
/// the store locked). Negative control (by hand, refusals counted as
/// connections again): the server was still running after 6 s of
/// refusals, and the test failed.
#[test]
fn refused_peers_keep_no_idle_server_alive() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let other = (unsafe { libc::getuid() } + 1).to_string();
    srv.spawn(&["--exit-when-idle", "1s", "--allow-uid", &other]);
    let started = std::time::Instant::now();
    let mut child = srv.child.take().unwrap();
    let exited = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > std::time::Duration::from_secs(6) {
            let _ = child.kill();
            break None;
        }
        // Refused at once; the next one follows 100 ms later.
        let _ = std::os::unix::net::UnixStream::connect(&srv.sock);
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let log = srv.log();
    assert!(log.contains("refusing a connection"), "no refusal logged: {log}");
    let st = exited.unwrap_or_else(|| panic!("still running after 6 s of refusals:\n{log}"));
    assert_eq!(st.code(), Some(0), "{log}");
}

/// A flood of idle connections to `--metrics` holds no more than a few
/// descriptors in the server (the rest wait unaccepted in the kernel's
/// backlog), NBD clients are served meanwhile, and once the flood is gone
/// a scrape is answered. Negative control (by hand, the scrape cap
/// removed): the server held one descriptor per idle connection, 100 more,
/// and the test failed.
#[test]
fn a_flood_of_idle_metrics_connections_holds_few_descriptors() {
    use std::io::{Read, Write};
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    srv.spawn(&["--metrics", "127.0.0.1:0"]);
    let log = srv.log();
    let line = log.lines().find(|l| l.contains("metrics (GET /metrics)")).unwrap();
    let addr = line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let pid = srv.child.as_ref().unwrap().id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let before = fds();
    // Within the listen backlog (128): every connect completes at once.
    let idle: Vec<_> = (0..100).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let during = fds();
    assert!(
        during <= before + 8 + 2,
        "{before} descriptors before, {during} with 100 idle scrapers"
    );
    let out = run("nbdsh", &["-u", &srv.uri("disk"), "-c", "assert h.pread(512, 0) == bytes(512)"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    drop(idle);
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    srv.stop();
}

/// `--metrics ADDR`: `GET /metrics` answers in Prometheus' text format
/// with the export's requests, bytes and latency histograms (after a
/// client wrote, flushed and read); another path is 404; a public address
/// is refused without `--insecure-listen`. Negative control: the counts
/// are read back from what the client did (1 write of 65536 bytes, 1
/// flush, 1 read), so a server that counted nothing fails.
#[test]
fn metrics_show_requests_bytes_and_latency_in_prometheus_text() {
    use std::io::{Read, Write};
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    srv.spawn(&["--metrics", "127.0.0.1:0"]);
    let log = srv.log();
    let line = log.lines().find(|l| l.contains("metrics (GET /metrics)")).unwrap_or_else(|| {
        panic!("no metrics address logged: {log}");
    });
    let addr = line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let script = "h.pwrite(b'\\x11' * 65536, 0)\nh.flush()\nh.pread(65536, 0)";
    let out = run("nbdsh", &["-u", &srv.uri("disk"), "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    };
    let reply = get("/metrics");
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("text/plain; version=0.0.4"),
        "{head}"
    );
    for want in [
        "forkfs_nbd_writes_total{export=\"disk\"} 1",
        "forkfs_nbd_written_bytes_total{export=\"disk\"} 65536",
        "forkfs_nbd_flushes_total{export=\"disk\"} 1",
        "forkfs_nbd_reads_total{export=\"disk\"} 1",
        "forkfs_nbd_request_duration_seconds_count{export=\"disk\",op=\"write\"} 1",
        "forkfs_nbd_request_duration_seconds_bucket{export=\"disk\",op=\"read\",le=\"+Inf\"} 1",
    ] {
        assert!(body.lines().any(|l| l == want), "missing {want:?} in:\n{body}");
    }
    // Every sample line is `name{labels} number`, every family typed.
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {l:?}"));
        assert!(value.parse::<f64>().is_ok(), "bad value in {l:?}");
        let family = name.split('{').next().unwrap();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| family.strip_suffix(s))
            .filter(|b| body.contains(&format!("# TYPE {b} histogram")))
            .unwrap_or(family);
        assert!(body.contains(&format!("# TYPE {base} ")), "{family} has no TYPE line");
    }
    assert!(get("/other").starts_with("HTTP/1.1 404"));
    srv.stop();
    let out = std::process::Command::new(&srv.bin)
        .arg("--store")
        .arg(&srv.store)
        .args(["serve", "--socket"])
        .arg(srv.path("x.sock"))
        .args(["--metrics", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
}
