//! GC on a store shared by two hosts (two `forkfs` store directories on one
//! real S3 API server, moto, on loopback): host A compacts and retires
//! packs that host B still reads through its own index and deduplicates
//! against, while B writes. With tombstones (the default) every version on
//! both hosts reads back byte-exact after every round and fsck is clean;
//! the negative control makes A's GC delete at once, as before tombstones
//! (`FORKFS_TEST_GC_UNSAFE_IMMEDIATE_DELETE`, honoured only with
//! `FORKFS_TEST_UNSAFE`), and B loses data.

use crate::common::random;
use crate::common::s3::S3;
use crate::common::{forkfs, ok, store_env};
use std::path::{Path, PathBuf};

const BLOCK: usize = 64 << 10;
/// GC's grace period: S3's Last-Modified has whole seconds, so a pack
/// uploaded just now may look up to a second older than it is.
const GRACE: &str = "2s";
/// Blocks of A's image that stay live in A's own volume (`k`).
const KEPT: usize = 8;
/// Blocks of A's image only its deleted volume (`t`) references.
const DROPPED: usize = 24;
/// Of those, blocks B deduplicates against in its own volume (`b`).
const SHARED: usize = 16;

fn blocks(n: usize, seed: u64) -> Vec<u8> {
    random(n * BLOCK, seed)
}

/// What the rounds saw.
#[derive(Default, Debug)]
struct Figures {
    rounds: u32,
    gc_runs: u32,
    /// Bytes of live versions that failed to read back byte-exact, summed
    /// over both hosts and every check.
    live_bytes_lost: u64,
    /// Exports that failed outright (counted in full in the bytes lost).
    failed_reads: u32,
    fsck_problems: u64,
    /// GC runs that refused (a damaged store: only the negative control).
    gc_refused: u32,
    packs_deleted: u64,
    tombstones_written: u64,
    tombstones_reaped: u64,
    packs_compacted: u64,
    rewritten_by_absorb: u64,
}

/// Reads `spec` on `store` and returns the bytes that differ from `want`
/// (all of them when the read fails).
fn lost_bytes(store: &Path, spec: &str, want: &[u8], out: &Path, f: &mut Figures) -> u64 {
    let _ = std::fs::remove_file(out);
    let res = forkfs(store, &["export", spec, out.to_str().unwrap()]);
    if !res.status.success() {
        eprintln!(
            "read of {spec} on {} failed: {}",
            store.display(),
            String::from_utf8_lossy(&res.stderr).trim()
        );
        f.failed_reads += 1;
        return want.len() as u64;
    }
    let got = std::fs::read(out).unwrap_or_default();
    let mut lost = 0;
    for (i, w) in want.chunks(BLOCK).enumerate() {
        if got.get(i * BLOCK..i * BLOCK + w.len()) != Some(w) {
            lost += w.len() as u64;
        }
    }
    lost
}

/// fsck's problems on `store`, except one known gap outside GC: a volume
/// another host deleted (A's `t` volumes) stays in this host's index, and
/// fsck reports its record objects missing. Its packs are never at stake:
/// they were A's to retire, and are checked like every other.
fn fsck_problems(store: &Path) -> u64 {
    let out = forkfs(store, &["--json", "fsck"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let Some(problems) = v["problems"].as_array() else {
        eprintln!("fsck on {} failed: {}", store.display(), String::from_utf8_lossy(&out.stderr));
        return 1;
    };
    let deleted_elsewhere = |p: &str| {
        let t = p.strip_prefix("volume ").unwrap_or(p);
        t.starts_with('t') && p.contains("is missing") && !p.contains("pack")
    };
    let real: Vec<_> =
        problems.iter().filter_map(|p| p.as_str()).filter(|p| !deleted_elsewhere(p)).collect();
    if !real.is_empty() {
        eprintln!("fsck on {}: {real:?}", store.display());
    }
    real.len() as u64
}

/// `forkfs gc` on `store`; a refusal (a store already damaged) is counted.
fn gc(store: &Path, f: &mut Figures) -> serde_json::Value {
    let out = forkfs(store, &["--json", "gc", "--grace", GRACE, "--compact-below", "0.9"]);
    f.gc_runs += 1;
    if !out.status.success() {
        eprintln!("gc refused: {}", String::from_utf8_lossy(&out.stderr).trim());
        f.gc_refused += 1;
        return serde_json::Value::Null;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc --json");
    f.tombstones_written += v["tombstones_written"].as_u64().unwrap_or(0);
    f.tombstones_reaped += v["tombstones_reaped"].as_u64().unwrap_or(0);
    f.packs_compacted += v["packs_compacted"].as_u64().unwrap_or(0);
    f.packs_deleted +=
        v["packs_deleted"].as_u64().unwrap_or(0) + v["orphans_deleted"].as_u64().unwrap_or(0);
    f.rewritten_by_absorb += v["absorbed"]["rewritten"].as_u64().unwrap_or(0);
    v
}

/// Runs the scenario for `rounds` rounds; `unsafe_delete` is the negative
/// control. Returns the figures.
fn scenario(bucket: &str, rounds: u64, unsafe_delete: bool) -> Figures {
    let s3 = S3::start(bucket);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("host-a"), dir.path().join("host-b"));
    let url = format!("s3://{bucket}/store");
    for h in [&a, &b] {
        // Short leases: each host absorbs tombstones every half second.
        store_env(h, "FORKFS_LEASE_TTL", "1500ms");
        if unsafe_delete {
            store_env(h, "FORKFS_TEST_UNSAFE", "1");
            store_env(h, "FORKFS_TEST_GC_UNSAFE_IMMEDIATE_DELETE", "1");
        }
    }
    let init = |h: &Path| {
        ok(h, &["init", "--allow-http", "--remote", &url, "--endpoint", &s3.endpoint]);
    };
    init(&a);
    init(&b);
    let img = |name: &str, data: &[u8]| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    let out_a = dir.path().join("out-a.img");
    let out_b = dir.path().join("out-b.img");
    // Every live volume and the bytes it must hold.
    let mut live: Vec<(String, Vec<u8>)> = Vec::new();
    let mut f = Figures::default();
    for r in 0..rounds {
        // Odd and distinct: `random` sets the low bit of its seed.
        let seed = 1000 * (r + 1);
        let (kept, dropped) = (blocks(KEPT, seed + 1), blocks(DROPPED, seed + 3));
        // Host A: `t` holds both parts in one pack; `k` shares the kept
        // part (deduplicated) and adds blocks of its own.
        let t = [kept.clone(), dropped.clone()].concat();
        let k = [kept.clone(), blocks(DROPPED, seed + 5)].concat();
        ok(&a, &["import", &format!("t{r}"), img("t.img", &t).to_str().unwrap()]);
        ok(&a, &["import", &format!("k{r}"), img("k.img", &k).to_str().unwrap()]);
        // Host B learns them (and indexes A's packs).
        ok(&b, &["log", &format!("k{r}")]);
        ok(&b, &["log", &format!("t{r}")]);
        // B writes a volume that deduplicates against A's pack while A
        // deletes `t` and collects with compaction.
        let bdata = [dropped[..SHARED * BLOCK].to_vec(), blocks(SHARED, seed + 7)].concat();
        let bimg = img("b.img", &bdata);
        let (bs, bname) = (b.clone(), format!("b{r}"));
        let writer = std::thread::spawn(move || {
            let out = forkfs(&bs, &["import", &bname, bimg.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "B's import of {bname} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        });
        ok(&a, &["volume", "delete", &format!("t{r}")]);
        let report = gc(&a, &mut f);
        eprintln!("round {r}: gc on A: {report}");
        writer.join().unwrap();
        live.push((format!("k{r}"), k));
        live.push((format!("b{r}"), bdata));
        // Every live volume, on B first (its index is the stale one).
        for (vol, want) in &live {
            f.live_bytes_lost += lost_bytes(&b, vol, want, &out_b, &mut f);
        }
        for (vol, want) in &live {
            f.live_bytes_lost += lost_bytes(&a, vol, want, &out_a, &mut f);
        }
        f.fsck_problems += fsck_problems(&a) + fsck_problems(&b);
        f.rounds += 1;
    }
    // A last collection once B has absorbed everything: tombstones go.
    ok(&b, &["volume", "list"]);
    gc(&a, &mut f);
    for (vol, want) in &live {
        f.live_bytes_lost += lost_bytes(&b, vol, want, &out_b, &mut f);
        f.live_bytes_lost += lost_bytes(&a, vol, want, &out_a, &mut f);
    }
    f.fsck_problems += fsck_problems(&a) + fsck_problems(&b);
    f
}

#[test]
fn remote_gc_under_writers_on_two_hosts_loses_no_live_bytes() {
    let f = scenario("forkfs-gc", 4, false);
    eprintln!("FIGURES remote_gc (tombstones): {f:?}");
    assert_eq!(f.live_bytes_lost, 0, "live bytes lost: {f:?}");
    assert_eq!(f.failed_reads, 0, "{f:?}");
    assert_eq!(f.fsck_problems, 0, "{f:?}");
    // The scenario did retire packs, and retired packs did go.
    assert!(f.packs_compacted > 0 && f.tombstones_written > 0, "{f:?}");
    assert!(f.tombstones_reaped > 0, "no tombstoned pack was ever deleted: {f:?}");
}

#[test]
fn remote_gc_negative_control_immediate_delete_loses_data() {
    let f = scenario("forkfs-gc-unsafe", 2, true);
    eprintln!("FIGURES remote_gc (negative control, immediate delete): {f:?}");
    assert_eq!(f.tombstones_written, 0, "the control must not use tombstones: {f:?}");
    // B's index names packs A deleted: fsck finds them gone (and B reads
    // or deduplicates through them); when B's own new pack was taken for
    // an orphan, live versions lose bytes outright.
    assert!(
        f.live_bytes_lost > 0 || f.fsck_problems > 0,
        "deleting packs at once should leave host B with data it indexes gone: {f:?}"
    );
}
