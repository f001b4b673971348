//! Takeover after an outage (a proxy between forkfs and a real S3 server
//! closes every connection while the bucket is "down"): a host cut off
//! from the bucket must never publish over the host that took its volume
//! over, and keeps what it wrote meanwhile in its own history.

use crate::common::mount::Mounted;
use crate::common::s3::S3;
use crate::common::{json, ok};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The safety half of an outage: host A, cut off from the bucket, goes on
/// committing locally while its lease runs out; host B takes the volume
/// over (it has not written yet, so the head object is still the one A
/// last published). When the bucket is back, A must not publish: its lease
/// is gone, though a conditional put naming the head's version would still
/// succeed. A reports the volume diverged and keeps its version locally; B
/// writes and publishes as the single writer; a third host sees B's files,
/// never A's late one.
#[test]
fn a_host_that_lost_its_lease_in_an_outage_never_publishes_over_the_new_writer() {
    let s3 = S3::start("takeover");
    let down = Arc::new(AtomicBool::new(false));
    let via = crate::common::proxy::switchable(s3.port, down.clone());
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    // Short leases, for every forkfs this test starts on the three hosts.
    for host in [&a, &b, &c] {
        crate::common::store_env(host, "FORKFS_LEASE_TTL", "2s");
    }
    let init = |store: &std::path::Path, port: u16| {
        let endpoint = format!("http://127.0.0.1:{port}");
        let args = ["init", "--remote", "s3://takeover/s", "--endpoint", &endpoint];
        let mut args = args.to_vec();
        args.extend_from_slice(&["--allow-http", "--read-deadline", "2s"]);
        ok(store, &args);
    };
    init(&a, via);
    let ma = Mounted::new(&a, "ws", &["--checkpoint-every", "1s"]);
    std::fs::write(ma.path("shared"), b"before the outage").unwrap();
    ok(&a, &["sync"]);
    let versions = |store: &std::path::Path| -> Vec<String> {
        let log = json(store, &["log", "ws"]);
        let events = log.as_array().expect("log is an array").iter();
        events
            .filter(|e| e["event"] == "version")
            .map(|e| e["id"].as_str().unwrap().into())
            .collect()
    };
    let before = versions(&a).len();

    down.store(true, Ordering::SeqCst);
    let _up = crate::common::proxy::Up(down.clone());
    std::fs::write(ma.path("mine"), b"written by A while cut off").unwrap();
    let t0 = Instant::now();
    while json(&a, &["status"])["upload"]["heads_pending"] != serde_json::json!(["ws"]) {
        assert!(t0.elapsed() < Duration::from_secs(30), "A committed nothing locally");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3)); // A's lease expires

    init(&b, s3.port);
    let mb = Mounted::new(&b, "ws", &[]);
    assert!(mb.path("shared").exists());
    assert!(!mb.path("mine").exists(), "B started from a head A never published");

    down.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    loop {
        let st = json(&a, &["status"]);
        if st["upload"]["diverged"] == serde_json::json!(["ws"]) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "A never saw it lost the volume: {st}");
        std::thread::sleep(Duration::from_millis(300));
    }
    std::fs::write(mb.path("theirs"), b"written by B").unwrap();
    let synced = json(&b, &["sync"]);
    let version = synced[0]["version"].as_str().expect("B's sync names a version").to_string();
    let st = json(&b, &["status"]);
    assert_eq!(st["upload"]["diverged"], serde_json::json!([]), "{st}");
    assert_eq!(st["upload"]["heads_pending"], serde_json::json!([]), "{st}");
    // A keeps its late version, with its file, in its own history.
    let late = versions(&a);
    assert!(late.len() > before, "A's late version is gone from its history: {late:?}");
    let mine = ma.path(&format!(".forkfs/versions/{}/mine", late[0]));
    assert_eq!(std::fs::read(&mine).unwrap(), b"written by A while cut off");

    init(&c, s3.port);
    let out = dir.path().join("out");
    // The head object names B's version (C reads that version: B still
    // holds the volume's lease).
    let log = ok(&c, &["log", "ws"]);
    let head = log.lines().find(|l| l.contains("HEAD")).unwrap_or_default();
    assert!(head.starts_with(&version[..12]), "the head is not B's {version}:\n{log}");
    ok(&c, &["export", &format!("ws@{version}"), out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("theirs")).unwrap(), b"written by B");
    assert_eq!(std::fs::read(out.join("shared")).unwrap(), b"before the outage");
    assert!(!out.join("mine").exists(), "A's version became the head after B took over");
    mb.unmount();
    drop(ma);
}
