//! Remote stores against a real S3 API on loopback (moto's server, started
//! here): a store created with `--remote s3://...` keeps its objects in the
//! bucket, and a second store directory joined to the same bucket (a second
//! host) sees every volume and version and reads identical bytes.

use crate::common::random;
use crate::common::s3::S3;
use crate::common::{forkfs, json, ok};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_volume_round_trips_through_the_bucket_to_a_second_host() {
    let s3 = S3::start("forkfs-test");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("host-a"), dir.path().join("host-b"));
    let remote = ["--remote", "s3://forkfs-test/stores/one", "--endpoint", &s3.endpoint];
    let init = |store: &Path| {
        let mut args = vec!["--json", "init", "--allow-http"];
        args.extend_from_slice(&remote);
        serde_json::from_str::<serde_json::Value>(&ok(store, &args)).unwrap()
    };
    let first = init(&a);
    assert_eq!(first["volumes"], 0, "{first}");
    assert!(!a.join("objects").exists(), "objects must live in the bucket, not locally");

    // Host A: a disk with two versions and a fork.
    let img = dir.path().join("disk.img");
    let mut data = random(6 << 20, 7);
    std::fs::write(&img, &data).unwrap();
    ok(&a, &["import", "disk", img.to_str().unwrap()]);
    ok(&a, &["tag", "disk@~0", "first"]);
    data[1 << 20..(1 << 20) + 100_000].copy_from_slice(&random(100_000, 9));
    std::fs::write(&img, &data).unwrap();
    ok(&a, &["import", "disk", img.to_str().unwrap()]);
    ok(&a, &["fork", "disk@~1", "old"]);
    let versions_a = json(&a, &["log", "disk"]);

    // Host B joins the same bucket with an empty directory.
    let joined = init(&b);
    assert_eq!(joined["volumes"], 2, "{joined}");
    let versions_b = json(&b, &["log", "disk"]);
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap_or("").to_string()).collect()
    };
    assert_eq!(ids(&versions_b), ids(&versions_a), "host B sees other versions");
    for (spec, want) in [("disk", &data), ("disk@~0", &data)] {
        let out = dir.path().join("out.img");
        let _ = std::fs::remove_file(&out);
        ok(&b, &["export", spec, out.to_str().unwrap()]);
        assert!(std::fs::read(&out).unwrap() == *want, "{spec} differs on host B");
    }
    let out = dir.path().join("old.img");
    ok(&b, &["export", "old", out.to_str().unwrap()]);
    assert_eq!(&std::fs::read(&out).unwrap()[..1 << 20], &data[..1 << 20]);
    assert!(std::fs::read(&out).unwrap() != data, "the fork must be the older version");
    // Every chunk host B indexed from pack footers reads back verified.
    let check = json(&b, &["fsck", "--deep"]);
    assert_eq!(check["problems"].as_array().map(|p| p.len()), Some(0), "{check}");
}

#[test]
fn bad_remotes_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s");
    for (url, code) in [("ftp://x/y", 64), ("s3://", 64)] {
        let out = forkfs(&s, &["init", "--remote", url]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    // Nothing listens here: a clear error, and no half-made store left behind.
    let out = forkfs(
        &s,
        &["init", "--remote", "s3://b/p", "--endpoint", "http://127.0.0.1:9", "--allow-http"],
    );
    assert!(!out.status.success());
    assert!(!s.join(forkfs::CONFIG_FILE).exists(), "a failed init left a store");
    assert!(forkfs(&s, &["volume", "list"]).status.code() != Some(0));
}

/// `forkfs-nbd serve --export EXPORT` on a store directory, with the
/// test's credentials and `env`.
pub(crate) fn serve(
    store: &Path,
    sock: &Path,
    ttl: &str,
    export: &str,
    env: &[(&str, &str)],
) -> Child {
    let exe = crate::common::forkfs_bin().with_file_name("forkfs-nbd");
    let child = Command::new(exe)
        .arg("--store")
        .arg(store)
        .args(["serve", "--export", export, "--checkpoint-after-flush", "0s", "--socket"])
        .arg(sock)
        .envs(env.iter().copied())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("FORKFS_LEASE_TTL", ttl)
        .stderr(Stdio::null())
        .spawn()
        .expect("start forkfs-nbd");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(Instant::now() < deadline, "forkfs-nbd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[test]
fn one_writer_per_volume_across_hosts_and_takeover_after_expiry() {
    let s3 = S3::start("forkfs-lease");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("host-a"), dir.path().join("host-b"));
    for h in [&a, &b] {
        let args = ["init", "--remote", "s3://forkfs-lease/s", "--endpoint", &s3.endpoint];
        let mut args = args.to_vec();
        args.push("--allow-http");
        ok(h, &args);
    }
    let img = dir.path().join("disk.img");
    let first = random(2 << 20, 3);
    std::fs::write(&img, &first).unwrap();
    // Created by host A after host B joined: B finds it in the bucket.
    ok(&a, &["import", "disk", img.to_str().unwrap()]);

    // Host A serves the disk (and so holds its lease) and commits a write.
    let sock = dir.path().join("a.sock");
    let mut server = serve(&a, &sock, "2s", "disk", &[]);
    let uri = format!("nbd+unix:///disk?socket={}", sock.display());
    let out = Command::new("nbdsh")
        .args([
            "-u",
            &uri,
            "-c",
            "h.pwrite(b'\\x07' * 65536, 0)\nh.flush()\nimport time\ntime.sleep(1)",
        ])
        .env("PATH", format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default()))
        .output()
        .expect("nbdsh (apt install python3-libnbd)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Host B may read versions, but not write the volume.
    let out = forkfs(&b, &["import", "disk", img.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(75), "a second writer was let in");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is being written by") && err.contains("pid"), "{err}");
    let v = dir.path().join("v.img");
    ok(&b, &["export", "disk@~1", v.to_str().unwrap()]);
    assert!(std::fs::read(&v).unwrap() == first);
    // And sees it in its status, without taking (or needing) the lease.
    let st = json(&b, &["status"]);
    let names: Vec<&str> =
        st["volumes"].as_array().unwrap().iter().filter_map(|v| v["name"].as_str()).collect();
    assert_eq!(names, ["disk"], "{st}");

    // Host A dies without releasing: B takes over once the lease expires,
    // from A's last committed head.
    server.kill().unwrap();
    server.wait().unwrap();
    let t0 = Instant::now();
    let out = loop {
        let out = dir.path().join("after.img");
        let _ = std::fs::remove_file(&out);
        let r = forkfs(&b, &["export", "disk", out.to_str().unwrap()]);
        if r.status.success() {
            break out;
        }
        assert_eq!(r.status.code(), Some(75), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(t0.elapsed() < Duration::from_secs(20), "the expired lease was never taken over");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(t0.elapsed() >= Duration::from_millis(500), "taken over before the lease expired");
    let got = std::fs::read(&out).unwrap();
    assert_eq!(&got[..65536], &[7u8; 65536][..], "host A's committed write is missing on host B");
    assert!(got[65536..] == first[65536..]);
    // And B now writes it.
    let second = random(2 << 20, 11);
    std::fs::write(&img, &second).unwrap();
    ok(&b, &["import", "disk", img.to_str().unwrap()]);

    // A GC on host A, whose index knows nothing of B's new packs and head,
    // must keep them (with no grace period to hide behind).
    ok(&a, &["gc", "--grace", "0s"]);
    let out = dir.path().join("final.img");
    ok(&b, &["export", "disk", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == second, "a GC on another host lost data");
    let check = json(&b, &["fsck", "--deep"]);
    assert_eq!(check["problems"].as_array().map(|p| p.len()), Some(0), "{check}");
}

/// A scratch directory holding an empty `file://` bucket, and its URL.
fn file_bucket() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    let url = format!("file://{}", bucket.display());
    (dir, bucket, url)
}

/// Files under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(files_under(&p)) } else { out.push(p) }
    }
    out
}

/// Flips one byte in every 256 of `p` (no chunk in it stays intact).
fn damage(p: &Path) {
    let mut b = std::fs::read(p).unwrap();
    for i in (0..b.len()).step_by(256) {
        b[i] ^= 0x5a;
    }
    std::fs::write(p, b).unwrap();
}

/// Chunks read from the remote are kept on local disk (`init --cache-size`)
/// and served from there, verified: with every pack in the bucket damaged a
/// repeat read still succeeds from the cache; a damaged cache entry is
/// refetched, and never served when the bucket cannot supply it either.
#[test]
fn the_disk_cache_serves_repeat_reads_and_never_a_damaged_entry() {
    let (dir, bucket, url) = file_bucket();
    let store = dir.path().join("host");
    ok(&store, &["init", "--remote", &url, "--cache-size", "64MiB"]);
    let img = dir.path().join("disk.img");
    let data = random(6 << 20, 21);
    std::fs::write(&img, &data).unwrap();
    ok(&store, &["import", "disk", img.to_str().unwrap()]);
    let export = |n: u32| {
        let out = dir.path().join(format!("out{n}.img"));
        (forkfs(&store, &["export", "disk@~0", out.to_str().unwrap()]), out)
    };
    let cache = store.join("cache");
    assert!(files_under(&cache).is_empty(), "writes do not fill the read cache");
    let packs: Vec<_> = files_under(&bucket)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "pack"))
        .collect();
    assert!(!packs.is_empty());
    let pristine: Vec<Vec<u8>> = packs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    // A damaged pack trailer (read-ahead reads it to find the following
    // chunks) does not fail intact chunks: they are read alone.
    for (p, b) in packs.iter().zip(&pristine) {
        let mut b = b.clone();
        let n = b.len();
        b[n - 8..].fill(0);
        std::fs::write(p, b).unwrap();
    }
    let (o, out) = export(1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "a damaged trailer failed a sequential read: {err}");
    assert!(std::fs::read(&out).unwrap() == data, "first read");
    assert!(err.contains("read-ahead failed"), "the fallback was not exercised: {err}");
    let cached = files_under(&cache);
    assert!(!cached.is_empty(), "the first read fills the cache");

    for p in &packs {
        damage(p);
    }
    let (o, out) = export(2);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "served from the cache despite a damaged bucket: {err}");
    assert!(std::fs::read(&out).unwrap() == data, "the cache served the right bytes");

    // A damaged cache entry with a damaged bucket: an error, not garbage.
    damage(&cached[0]);
    let damaged = std::fs::read(&cached[0]).unwrap();
    let (o, _) = export(3);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a damaged entry must not be served");
    assert!(err.contains("checksum"), "{err}");
    assert!(!cached[0].exists(), "the damaged entry was kept");
    // With the bucket intact again, the chunk is fetched and cached afresh.
    for (p, b) in packs.iter().zip(&pristine) {
        std::fs::write(p, b).unwrap();
    }
    let (o, out) = export(4);
    assert!(o.status.success() && std::fs::read(&out).unwrap() == data, "refetched");
    assert_eq!(files_under(&cache).len(), cached.len(), "the entry is cached again");
    let again = std::fs::read(&cached[0]).expect("the refetched entry is cached");
    assert!(again != damaged, "the cached entry is still the damaged one");
}

/// `forkfs sync` while a workspace on a remote store is mounted: what was
/// written before it is in the bucket (a host joined afterwards reads it),
/// and a second sync has nothing new to record.
#[test]
fn sync_puts_what_a_mount_wrote_in_the_bucket() {
    use crate::common::mount::Mounted;
    let (dir, _bucket, url) = file_bucket();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    ok(&a, &["init", "--remote", &url]);
    let m = Mounted::new(&a, "ws", &["--checkpoint-every", "0"]);
    std::fs::write(m.path("notes.txt"), b"written on host a").unwrap();
    let first = json(&a, &["sync"]);
    assert_eq!(first[0]["volume"], "ws", "{first}");
    assert_eq!(first[0]["recorded"], true, "{first}");
    let again = json(&a, &["sync", "ws"]);
    assert_eq!(again[0]["recorded"], false, "nothing new: {again}");
    assert_eq!(again[0]["version"], first[0]["version"]);

    ok(&b, &["init", "--remote", &url]);
    let out = dir.path().join("out");
    let spec = format!("ws@{}", first[0]["version"].as_str().unwrap());
    ok(&b, &["export", &spec, out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"written on host a");
    m.unmount();
}

/// A host killed between a new volume's record and its head object (the
/// commit point) leaves a record without a head. Hosts still open and join
/// the store; the unfinished volume is not shown, its name is free again
/// and its id is never handed out twice.
#[test]
fn an_interrupted_volume_creation_is_skipped_and_its_id_not_reused() {
    let (dir, bucket, url) = file_bucket();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    ok(&a, &["init", "--remote", &url]);
    ok(&a, &["volume", "create", "d", "--block", "--size", "1M"]);
    let heads = files_under(&bucket.join("heads"));
    assert_eq!(heads.len(), 1, "{heads:?}");
    std::fs::remove_file(&heads[0]).unwrap();

    ok(&b, &["init", "--remote", &url]);
    assert_eq!(json(&b, &["volume", "list"]), serde_json::json!([]));
    ok(&b, &["volume", "create", "d", "--block", "--size", "2M"]);
    let records = files_under(&bucket.join("volumes"));
    assert_eq!(records.len(), 2, "a new id, not the unfinished one's: {records:?}");
    assert_eq!(json(&b, &["volume", "list"]).as_array().map(Vec::len), Some(1));
}
