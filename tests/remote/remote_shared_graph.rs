//! Every host of a bucket sees one graph (issue 23): what one host makes
//! and syncs (a volume, versions, a head) or deletes reaches the others
//! without a new `init`, and a GC after a deletion never leaves another
//! host listing a version it can no longer read, even a host that was
//! stopped during the deletion and the GC. Each test runs on moto's S3 API
//! and on a `file://` bucket shared by the store directories.
//!
//! Negative controls (by hand): in `sync/view.rs`, `forget_deleted`
//! returning at once: the first test fails, B still listing the deleted
//! version; in `sync/names.rs`, `claim` putting the name unconditionally:
//! the naming race ends with two winners (3 runs of 3); `forget_volumes`
//! returning at once: B still lists the deleted volume; the import not
//! counting deleted volumes' ids: C's new `v` takes the deleted one's id,
//! and A forgets it; no remote side for `file://` buckets (as before):
//! all four `file://` tests fail; no `flock` in the local conditional
//! put: the naming race on `file://` ends with two winners (2 runs of 3);
//! imports that take no names (build the binaries: `forkfs prune` runs
//! `forkfs-fsck`): A prunes the version B named.
//!
//! Names too: a name set on one host means that version on every host,
//! two hosts naming two versions alike at once get one winner, and a
//! name removed on one host is gone on the others. A GC deleting at once,
//! without waiting for B, strands B: `negative_control_*` shows it.
//! And a version B has open (an NBD export) reads exact to the end while
//! A deletes it and collects (by hand: absorbing without the open
//! readers' roots, `graph::reach::roots_with_readers` returning
//! `roots` alone, fails it, the client's read failing).

use crate::common::s3::S3;
use crate::common::{forkfs, json, ok, random, store_env};
use crate::remote::serve;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BLOCK: usize = 64 << 10;

/// The ids in `forkfs log VOL --json`, newest first.
fn ids(store: &Path, vol: &str) -> Vec<String> {
    let log = json(store, &["log", vol]);
    let events = log.as_array().expect("log --json is a list");
    events.iter().filter_map(|e| e["id"].as_str().map(str::to_string)).collect()
}

/// The volumes `store` lists, by name.
fn names(store: &Path) -> Vec<String> {
    let list = json(store, &["volume", "list"]);
    let vols = list.as_array().expect("volume list --json is a list");
    vols.iter().filter_map(|v| v["name"].as_str().map(str::to_string)).collect()
}

/// `forkfs export SPEC` on `store`: the bytes, or stderr.
fn export(store: &Path, spec: &str, out: &Path) -> Result<Vec<u8>, String> {
    let _ = std::fs::remove_file(out);
    let o = forkfs(store, &["export", spec, out.to_str().unwrap()]);
    match o.status.success() {
        true => Ok(std::fs::read(out).unwrap()),
        false => Err(String::from_utf8_lossy(&o.stderr).to_string()),
    }
}

/// `forkfs gc` with a 2 s grace (S3 times are whole seconds).
fn gc(store: &Path) -> serde_json::Value {
    let out = ok(store, &["--json", "gc", "--grace", "2s", "--compact-below", "0.9"]);
    serde_json::from_str(&out).expect("gc --json")
}

/// Where the hosts' bucket is: moto's S3 API, or a local directory.
#[derive(Clone, Copy, Debug)]
enum Kind {
    S3,
    File,
}

/// A bucket of `kind` (moto's named `bucket`), and `n` hosts that joined
/// it empty. The server (if any) and the directory live as long as the
/// first two values.
fn hosts(kind: Kind, bucket: &str, n: usize) -> (Option<S3>, tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let (s3, init): (Option<S3>, Vec<String>) = match kind {
        Kind::S3 => {
            let s3 = S3::start(bucket);
            let url = format!("s3://{bucket}/store");
            let args = ["--allow-http", "--remote", &url, "--endpoint", &s3.endpoint];
            let args = args.iter().map(|a| a.to_string()).collect();
            (Some(s3), args)
        }
        Kind::File => {
            let url = format!("file://{}", dir.path().join("bucket").display());
            (None, vec!["--remote".to_string(), url])
        }
    };
    let all: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("host-{i}"))).collect();
    for h in &all {
        let mut args = vec!["init"];
        args.extend(init.iter().map(String::as_str));
        ok(h, &args);
    }
    (s3, dir, all)
}

/// [`hosts`] for two: A and B.
fn two_hosts(kind: Kind, bucket: &str) -> (Option<S3>, tempfile::TempDir, PathBuf, PathBuf) {
    let (s3, dir, mut all) = hosts(kind, bucket, 2);
    let b = all.pop().unwrap();
    (s3, dir, all.pop().unwrap(), b)
}

/// `#[test]`s running `body` on S3 (`NAME_on_s3`) and on a `file://`
/// bucket (`NAME_on_file`).
macro_rules! on_both {
    ($name:ident, $s3:ident, $file:ident) => {
        #[test]
        fn $s3() {
            $name(Kind::S3);
        }
        #[test]
        fn $file() {
            $name(Kind::File);
        }
    };
}

on_both!(deletions_and_gc, deletions_and_gc_on_s3, deletions_and_gc_on_file);

/// Volumes, versions, heads and deletions reach the other host, and a GC
/// never strands it.
fn deletions_and_gc(kind: Kind) {
    // The server and the directories live to the end of the test.
    let (_s3, dir, a, b) = two_hosts(kind, "shared-graph");
    let out = dir.path().join("out.img");
    let img = dir.path().join("in.img");
    // B joined an empty store. A creates a volume and commits two
    // versions of it (each command syncs as it closes).
    let first = random(16 * BLOCK, 3);
    let second = [random(8 * BLOCK, 5), first[8 * BLOCK..].to_vec()].concat();
    std::fs::write(&img, &first).unwrap();
    ok(&a, &["import", "d", img.to_str().unwrap()]);
    assert_eq!(names(&b), ["d"], "B does not list A's new volume");
    assert!(export(&b, "d", &out).unwrap() == first, "B read other bytes for d's head");
    std::fs::write(&img, &second).unwrap();
    ok(&a, &["import", "d", img.to_str().unwrap()]);
    // A's new version and head reach B: not the head B saw before.
    assert_eq!(ids(&b, "d"), ids(&a, "d"), "B's log of d is not A's");
    assert!(export(&b, "d", &out).unwrap() == second, "B read a stale head of d");
    let [newer, older] = <[String; 2]>::try_from(ids(&a, "d")).expect("two versions");
    assert!(export(&b, &format!("d@{older}"), &out).unwrap() == first);

    // B stops (no process of it runs), its cache emptied: what it reads
    // next comes from the bucket. A deletes the older version and
    // collects. B has not acknowledged, so the GC keeps what B indexes.
    std::fs::remove_dir_all(b.join("cache")).unwrap();
    ok(&a, &["delete-version", &format!("d@{older}")]);
    std::thread::sleep(Duration::from_secs(3));
    gc(&a);
    std::thread::sleep(Duration::from_secs(3));
    gc(&a);
    // B is back: the deletion reached it, and it says so.
    assert_eq!(ids(&b, "d"), vec![newer.clone()], "B still lists the deleted version");
    let err = export(&b, &format!("d@{older}"), &out).unwrap_err();
    assert!(err.contains("was deleted on another host"), "{err}");
    // B absorbed A's GC without keeping the deleted data: the GC after it
    // reaps, and everything B lists still reads exact.
    std::thread::sleep(Duration::from_secs(3));
    let last = gc(&a);
    for (spec, want) in [("d".to_string(), &second), (format!("d@{newer}"), &second)] {
        let got = export(&b, &spec, &out).unwrap_or_else(|e| panic!("B reads {spec}: {e}"));
        assert!(got == *want, "B read other bytes for {spec}");
    }
    assert!(last["tombstones_reaped"].as_u64() > Some(0), "B never acknowledged: {last}");
    let err = export(&b, &format!("d@{older}"), &out).unwrap_err();
    assert!(err.contains("was deleted on another host"), "after the reap: {err}");
    assert!(!err.contains("missing"), "{err}");
    // fsck on B finds nothing wrong.
    let fsck = forkfs(&b, &["--json", "fsck"]);
    let fsck: serde_json::Value = serde_json::from_slice(&fsck.stdout).expect("fsck --json");
    assert_eq!(fsck["problems"].as_array().map(Vec::len), Some(0), "{fsck}");
}

on_both!(
    open_version,
    a_version_open_on_b_outlives_its_deletion_on_s3,
    a_version_open_on_b_outlives_its_deletion_on_file
);

/// A version B's NBD server has open reads exact to the end while A
/// deletes it and collects: B forgets the version but, before it
/// acknowledges the GC, copies what its open readers need; the GC reaps
/// only then. A new connection to the version is refused.
fn open_version(kind: Kind) {
    let r = read_while_deleted(kind, "shared-open", &[]);
    assert!(r.client.status.success(), "the open version failed to read: {}", {
        String::from_utf8_lossy(&r.client.stderr)
    });
    assert!(r.got == Some(r.want), "B served other bytes for the version");
    assert!(!r.reopened.status.success(), "B served a version deleted on A to a new client");
}

on_both!(
    open_version_unsafe_gc,
    negative_control_a_gc_that_does_not_wait_strands_b_on_s3,
    negative_control_a_gc_that_does_not_wait_strands_b_on_file
);

/// Negative control of [`open_version`]: the same steps with a GC on A
/// that deletes retired packs at once instead of waiting for every host
/// (the unsafe test switch): B's open version no longer reads. The test
/// catches the loss.
fn open_version_unsafe_gc(kind: Kind) {
    let unsafe_gc = [("FORKFS_TEST_UNSAFE", "1"), ("FORKFS_TEST_GC_UNSAFE_IMMEDIATE_DELETE", "1")];
    let r = read_while_deleted(kind, "shared-open-unsafe", &unsafe_gc);
    let err = String::from_utf8_lossy(&r.client.stderr);
    assert!(!r.client.status.success(), "B read its open version after an unsafe GC");
    assert!(err.contains("Input/output error"), "the client failed otherwise: {err}");
}

/// A child killed (and reaped) when dropped: a failed assertion leaves
/// no server behind.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What [`read_while_deleted`]'s client got.
struct Read {
    /// The client that had the version open (stderr: why it failed).
    client: std::process::Output,
    /// What it read (if it did), and what the version holds.
    got: Option<Vec<u8>>,
    want: Vec<u8>,
    /// `nbdinfo` on the version after the GC.
    reopened: std::process::Output,
}

/// A commits two versions of `d`; B serves the older one over NBD (no
/// read-ahead: only what is asked is fetched) and a client opens it; A
/// (with `a_env`) deletes it and collects until the retired pack is gone;
/// then the client reads the whole version.
fn read_while_deleted(kind: Kind, bucket: &str, a_env: &[(&str, &str)]) -> Read {
    let (_s3, dir, a, b) = two_hosts(kind, bucket);
    for (k, v) in a_env {
        store_env(&a, k, v);
    }
    let img = dir.path().join("in.img");
    let first = random(16 * BLOCK, 21);
    let second = [random(8 * BLOCK, 23), first[8 * BLOCK..].to_vec()].concat();
    for data in [&first, &second] {
        std::fs::write(&img, data).unwrap();
        ok(&a, &["import", "d", img.to_str().unwrap()]);
    }
    let [_, older] = <[String; 2]>::try_from(ids(&b, "d")).expect("B lists two versions");
    let sock = dir.path().join("b.sock");
    let spec = format!("d@{older}");
    let server = Reaped(serve(&b, &sock, "3s", &spec, &[("FORKFS_READAHEAD", "0")]));
    let uri = format!("nbd+unix:///d%40{older}?socket={}", sock.display());
    let (ready, go, got) =
        (dir.path().join("ready"), dir.path().join("go"), dir.path().join("got.img"));
    let script = format!(
        "import os, time\n\
         n = h.get_size()\n\
         open('{ready}', 'w').close()\n\
         t = time.time() + 120\n\
         while not os.path.exists('{go}') and time.time() < t: time.sleep(0.05)\n\
         open('{got}', 'wb').write(h.pread(n, 0))\n",
        ready = ready.display(),
        go = go.display(),
        got = got.display(),
    );
    // Debian's python3, which has libnbd's module (not a pyenv's).
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let mut client = Command::new("nbdsh")
        .args(["-u", &uri, "-c", &script])
        .env("PATH", &path)
        .stderr(Stdio::piped())
        .spawn()
        .expect("nbdsh (apt install python3-libnbd)");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the client never opened {spec}");
        if client.try_wait().unwrap().is_some() {
            let out = client.wait_with_output().unwrap();
            panic!("the client failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A deletes the version and collects until the pack holding its own
    // blocks is gone: at once with the unsafe switch, else once B has
    // acknowledged (B ticks every second).
    ok(&a, &["delete-version", &spec]);
    std::thread::sleep(Duration::from_secs(3));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = gc(&a);
        let at_once = r["tombstones_written"] == 0 && r["packs_compacted"].as_u64() > Some(0);
        if at_once || r["tombstones_reaped"].as_u64() > Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "B never acknowledged: {r}");
        std::thread::sleep(Duration::from_secs(2));
    }
    std::fs::write(&go, b"").unwrap();
    let client = client.wait_with_output().unwrap();
    let reopened = Command::new("nbdinfo").arg(&uri).output().expect("nbdinfo (libnbd-bin)");
    drop(server);
    let got = std::fs::read(&got).ok();
    Read { client, got, want: first, reopened }
}

on_both!(quiet, quiet_view_on_s3, quiet_view_on_file);

/// A host imports only when another host changed the graph.
fn quiet(kind: Kind) {
    let (_s3, dir, a, b) = two_hosts(kind, "shared-graph-quiet");
    let img = dir.path().join("in.img");
    std::fs::write(&img, random(4 * BLOCK, 9)).unwrap();
    ok(&a, &["import", "d", img.to_str().unwrap()]);
    ok(&b, &["volume", "list"]);
    // Nothing changed since B's last look: B's view keeps the same
    // generation, and is newer.
    let before = json(&b, &["status"])["view"].clone();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let after = json(&b, &["status"])["view"].clone();
    assert_eq!(before["generation"], after["generation"], "{before} {after}");
    assert!(after["checked_ms"].as_u64() > before["checked_ms"].as_u64(), "{before} {after}");
    // A change on A moves it.
    ok(&a, &["import", "e", img.to_str().unwrap()]);
    let moved = json(&b, &["status"])["view"].clone();
    assert_ne!(moved["generation"], after["generation"], "A's new volume left the generation");
    assert_eq!(names(&b), ["d", "e"]);
}

on_both!(names_are_shared, one_name_one_version_on_s3, one_name_one_version_on_file);

/// A name means one version on every host.
fn names_are_shared(kind: Kind) {
    let (_s3, dir, a, b) = two_hosts(kind, "shared-names");
    let (out, img) = (dir.path().join("out.img"), dir.path().join("in.img"));
    let (first, second) = (random(4 * BLOCK, 21), random(4 * BLOCK, 23));
    for data in [&first, &second] {
        std::fs::write(&img, data).unwrap();
        ok(&a, &["import", "d", img.to_str().unwrap()]);
    }
    let [newer, older] = <[String; 2]>::try_from(ids(&a, "d")).expect("two versions");
    let (at_newer, at_older) = (format!("d@{newer}"), format!("d@{older}"));
    // A name set on A resolves on B, and B cannot give it to another version.
    ok(&a, &["tag", &at_older, "rel"]);
    assert!(export(&b, "d@rel", &out).unwrap() == first, "B reads another d@rel");
    let taken = forkfs(&b, &["tag", &at_newer, "rel"]);
    assert!(!taken.status.success(), "B gave A's name to another version");
    // Two hosts naming two versions alike at once: one wins, the other is
    // told, and both hosts then read the winner's version by that name.
    for round in 0..3 {
        let name = format!("race{round}");
        let run = |store: &Path, spec: &str| {
            let (store, spec, name) = (store.to_path_buf(), spec.to_string(), name.clone());
            std::thread::spawn(move || forkfs(&store, &["tag", &spec, &name]).status.success())
        };
        let (on_a, on_b) = (run(&a, &at_older), run(&b, &at_newer));
        let (won_a, won_b) = (on_a.join().unwrap(), on_b.join().unwrap());
        assert!(won_a != won_b, "round {round}: A {won_a}, B {won_b}: not one winner");
        let want = if won_a { &first } else { &second };
        for h in [&a, &b] {
            let got = export(h, &format!("d@{name}"), &out).unwrap();
            assert!(got == *want, "round {round}: {} reads the loser's version", h.display());
        }
    }
    // Removed on A: gone on B. Set on B: seen on A.
    ok(&a, &["untag", "d", "rel"]);
    let err = export(&b, "d@rel", &out).unwrap_err();
    assert!(err.contains("no version named \"rel\""), "{err}");
    ok(&b, &["tag", &at_newer, "from-b"]);
    assert!(export(&a, "d@from-b", &out).unwrap() == second, "A reads another d@from-b");
}

on_both!(volumes_come_and_go, volumes_come_and_go_on_s3, volumes_come_and_go_on_file);

/// Volumes made and deleted on one host come and go on two others.
fn volumes_come_and_go(kind: Kind) {
    let (_s3, dir, all) = hosts(kind, "shared-volumes", 3);
    let [a, b, c] = <[PathBuf; 3]>::try_from(all).unwrap();
    let (out, img) = (dir.path().join("out.img"), dir.path().join("in.img"));
    let (v1, w, v2) = (random(4 * BLOCK, 31), random(4 * BLOCK, 33), random(4 * BLOCK, 35));
    // v gets the highest volume id; C runs nothing until v is deleted, so
    // only the bucket tells it that id was taken.
    for (name, data) in [("w", &w), ("v", &v1)] {
        std::fs::write(&img, data).unwrap();
        ok(&a, &["import", name, img.to_str().unwrap()]);
    }
    assert_eq!(names(&b), ["v", "w"]);
    assert!(export(&b, "v", &out).unwrap() == v1, "B reads another v");
    let old = ids(&b, "v");
    ok(&a, &["volume", "delete", "v"]);
    for h in [&b, &c] {
        assert_eq!(names(h), ["w"], "{} still lists the deleted volume", h.display());
        let err = export(h, "v", &out).unwrap_err();
        assert!(err.contains("no volume named"), "{}: {err}", h.display());
        let err = export(h, &format!("v@{}", old[0]), &out).unwrap_err();
        assert!(err.contains("no volume named"), "{}: {err}", h.display());
    }
    // A new volume of the same name, made on C: another volume, read as
    // itself on A and B (its id is not the deleted one's, or they would
    // take the deletion for its).
    std::fs::write(&img, &v2).unwrap();
    ok(&c, &["import", "v", img.to_str().unwrap()]);
    for h in [&a, &b] {
        assert_eq!(names(h), ["v", "w"], "{}", h.display());
        assert!(export(h, "v", &out).unwrap() == v2, "{} reads the old v", h.display());
        assert!(export(h, "w", &out).unwrap() == w, "{} lost w", h.display());
    }
}

on_both!(
    prune_keeps_names,
    prune_keeps_a_name_from_another_host_on_s3,
    prune_keeps_a_name_from_another_host_on_file
);

/// Retention pruning on A keeps a version B named: a dry run first shows
/// the policy would remove it (the test's own negative control), then B
/// names it, and A's prune keeps it.
fn prune_keeps_names(kind: Kind) {
    let (_s3, dir, a, b) = two_hosts(kind, "shared-prune");
    let img = dir.path().join("in.img");
    // Automatic versions on A: writes left unsaved, then `sync`.
    for i in 0..6 {
        std::fs::write(&img, random(2 * BLOCK, 50 + i)).unwrap();
        ok(&a, &["import", "d", img.to_str().unwrap(), "--no-snapshot"]);
        ok(&a, &["sync", "d"]);
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    let policy = ["--keep-recent", "1", "--unit-secs", "1"];
    let plan = |store: &Path, dry: bool| -> Vec<String> {
        let mut args = vec!["--json", "prune", "d"];
        args.extend_from_slice(&policy);
        if dry {
            args.push("--dry-run");
        }
        let out: serde_json::Value = serde_json::from_str(&ok(store, &args)).expect("prune --json");
        let pruned = out["pruned"].as_array().unwrap_or_else(|| panic!("{out}"));
        pruned.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
    };
    // A version the policy removes, named on B.
    let doomed = plan(&a, true);
    let named = doomed.first().unwrap_or_else(|| panic!("the policy prunes nothing")).clone();
    ok(&b, &["tag", &format!("d@{named}"), "keep"]);
    let pruned = plan(&a, false);
    assert!(!pruned.contains(&named), "A pruned the version B named: {pruned:?}");
    assert!(ids(&a, "d").contains(&named), "A's log lost the named version");
    assert!(ids(&b, "d").contains(&named), "B's log lost the named version");
}
