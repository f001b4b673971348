//! The object store becomes unreachable under a mounted workspace (a proxy
//! between forkfs and a real S3 server closes every connection): writes go
//! on to local disk, checkpoints queue their packs, and once the queue is
//! over `--pending-limit` writers wait instead of filling the disk. `forkfs
//! status` shows what waits and why, `forkfs sync` fails with one line
//! instead of hanging, and nothing is lost: once the store answers again
//! the writer finishes, a sync empties the queue, and a second host joined
//! directly to the bucket reads every file bit for bit.

use crate::common::mount::Mounted;
use crate::common::s3::S3;
use crate::common::{fails, json, ok, random};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const FILES: u64 = 40;

fn content(i: u64) -> Vec<u8> {
    random(1 << 20, 100 + i)
}

#[test]
fn writes_go_on_locally_while_the_bucket_is_unreachable_and_upload_after() {
    let s3 = S3::start("outage");
    let down = Arc::new(AtomicBool::new(false));
    let via = crate::common::proxy::switchable(s3.port, down.clone());
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let endpoint = format!("http://127.0.0.1:{via}");
    let init = ["init", "--remote", "s3://outage/s", "--endpoint", &endpoint, "--allow-http"];
    let mut args = init.to_vec();
    args.extend_from_slice(&["--read-deadline", "2s", "--pending-limit", "4MiB"]);
    ok(&a, &args);
    let m = Mounted::new(&a, "ws", &["--checkpoint-every", "1s"]);
    let _show = Defer(|| eprintln!("mount log:\n{}", m.log()));
    std::fs::write(m.path("before"), content(99)).unwrap();
    ok(&a, &["sync"]);

    down.store(true, Ordering::SeqCst);
    // A failing assertion must not leave the writer blocked for good.
    let _up = crate::common::proxy::Up(down.clone());
    let path = m.dir().to_path_buf();
    let done = Arc::new(AtomicU64::new(0));
    let progress = done.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..FILES {
            std::fs::write(path.join(format!("f{i}")), content(i)).unwrap();
            progress.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    // Checkpoints queue packs on local disk until the limit is passed...
    let t0 = Instant::now();
    loop {
        let st = json(&a, &["status"]);
        if st["upload"]["pending_bytes"].as_u64().unwrap_or(0) > 4 << 20 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "nothing queued: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // ...then the writer waits: at most the write in hand gets through.
    let before = done.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(3));
    let after = done.load(Ordering::SeqCst);
    assert!(after <= before + 1, "the writer went on past the limit: {before} -> {after} files");
    assert!(after < FILES, "the writer finished before the limit was reached");
    // The reason shows once the client's own retries of an upload give up.
    let t0 = Instant::now();
    let st = loop {
        let st = json(&a, &["status"]);
        if st["upload"]["last_error"].is_string() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "no upload error shown: {st}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(st["upload"]["heads_pending"], serde_json::json!(["ws"]), "{st}");
    let (code, err) = fails(&a, &["sync"]);
    assert_eq!(code, 69, "{err}");
    assert!(err.contains("not yet in the object store"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");

    down.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    while !writer.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the writer never resumed");
        std::thread::sleep(Duration::from_millis(100));
    }
    writer.join().unwrap();
    let synced = json(&a, &["sync"]);
    let version = synced[0]["version"].as_str().expect("sync names the version").to_string();
    let st = json(&a, &["status"]);
    assert_eq!(st["upload"]["pending_bytes"], 0, "{st}");
    assert_eq!(st["upload"]["heads_pending"], serde_json::json!([]), "{st}");
    drop(_show);
    m.unmount();

    let direct = format!("http://127.0.0.1:{}", s3.port);
    ok(&b, &["init", "--remote", "s3://outage/s", "--endpoint", &direct, "--allow-http"]);
    let out = dir.path().join("out");
    ok(&b, &["export", &format!("ws@{version}"), out.to_str().unwrap()]);
    assert!(std::fs::read(out.join("before")).unwrap() == content(99));
    for i in 0..FILES {
        let got = std::fs::read(out.join(format!("f{i}"))).unwrap();
        assert!(got == content(i), "f{i} differs on the second host");
    }
    let log = json(&b, &["log", "ws"]);
    assert!(log.to_string().contains(&version), "the head's version is in the history: {log}");
}

/// The bucket out of reach when a mount stops and after (issues 23, 25):
/// the mount ends cleanly, its last version committed locally (the lease
/// it kept since its open compared the heads, unexpired, means no other
/// host can have advanced the volume, so the bucket need not be asked); commands on the store with no holder
/// open it and work on what this host has, and `status` says how old its
/// view is; once the bucket answers, a sync publishes the last version.
/// Negative controls (by hand): registration with GC failing the open
/// (as before): `forkfs log` fails; the head always refreshed from the
/// bucket on open (as before): the mount ends with an error and no last
/// version.
#[test]
fn a_mount_stops_cleanly_and_commands_work_while_the_bucket_is_out_of_reach() {
    let s3 = S3::start("outage-stop");
    let down = Arc::new(AtomicBool::new(false));
    let via = crate::common::proxy::switchable(s3.port, down.clone());
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let endpoint = format!("http://127.0.0.1:{via}");
    let init = ["init", "--remote", "s3://outage-stop/s", "--endpoint", &endpoint, "--allow-http"];
    ok(&a, &init);
    // The mount cannot release its lease with the bucket down: the sync
    // after waits for it to expire. (It stops well within the term: past
    // it, its last version would need the bucket.)
    crate::common::store_env(&a, "FORKFS_LEASE_TTL", "15s");
    let m = Mounted::new(&a, "ws", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("before"), content(1)).unwrap();
    ok(&a, &["sync"]);
    let synced = json(&a, &["log", "ws"]).as_array().map(Vec::len).unwrap_or(0);

    down.store(true, Ordering::SeqCst);
    let _up = crate::common::proxy::Up(down.clone());
    std::fs::write(m.path("during"), content(2)).unwrap();
    m.unmount();
    // The log holds warnings and errors: the bucket's, never the mount's end.
    let text = std::fs::read_to_string(a.join("logs/mount-ws.log")).unwrap();
    assert!(!text.contains("mount ended with an error"), "{text}");
    // No holder now: each command opens the store with the bucket down.
    let versions = json(&a, &["log", "ws"]);
    let n = versions.as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(n, synced + 1, "no last version at the mount's end: {versions}");
    let st = json(&a, &["status"]);
    assert!(st["view"]["checked_ms"].as_u64() > Some(0), "{st}");
    assert_eq!(st["upload"]["heads_pending"], serde_json::json!(["ws"]), "{st}");

    down.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    loop {
        let out = crate::common::forkfs(&a, &["sync"]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(t0.elapsed() < Duration::from_secs(45), "sync: {err}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let st = json(&a, &["status"]);
    assert_eq!(st["upload"]["heads_pending"], serde_json::json!([]), "{st}");
    let b = dir.path().join("b");
    let direct = format!("http://127.0.0.1:{}", s3.port);
    ok(&b, &["init", "--remote", "s3://outage-stop/s", "--endpoint", &direct, "--allow-http"]);
    let out = dir.path().join("out");
    ok(&b, &["export", "ws", out.to_str().unwrap()]);
    assert!(std::fs::read(out.join("during")).unwrap() == content(2), "during lost");
}

struct Defer<F: FnMut()>(F);
impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}
