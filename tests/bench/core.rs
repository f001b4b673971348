//! Core benchmarks (not timed tests): snapshot and fork latency against
//! volume size, block API throughput, and dedupe across forks.
//! Run with `scripts/bench`; results are recorded in docs/BENCHMARKS.md.

use forkfs::{SnapshotOptions, Store, StoreConfig, VolumeKind};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// xorshift: fast incompressible bytes, reproducible by seed.
fn fill_random(buf: &mut [u8], seed: &mut u64) {
    for c in buf.chunks_mut(8) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let b = seed.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn fresh_store(dir: &std::path::Path, name: &str) -> Store {
    let path = dir.join(name);
    let _ = std::fs::remove_dir_all(&path);
    Store::init(&path, StoreConfig::default()).expect("init store")
}

/// Latency of snapshot (clean and after 10 MiB of writes) and fork for a
/// volume of `size` bytes holding 1 GiB of data spread over its whole range.
fn latency(store: &Store, name: &str, size: u64) -> (Duration, Duration, Duration) {
    store.volumes().create(name, VolumeKind::Block, Some(size), None).unwrap();
    let head = store.volumes().open_block(name).unwrap();
    let bs = 64 * 1024u64;
    let blocks = GIB / bs;
    let stride = size / GIB; // spread 1 GiB of data over the whole volume
    let mut seed = 0x1234_5678 ^ size;
    let mut buf = vec![0u8; bs as usize];
    for i in 0..blocks {
        fill_random(&mut buf, &mut seed);
        head.write_at(i * stride * bs, &buf).unwrap();
    }
    store.graph().snapshot(name, &SnapshotOptions::default()).unwrap();
    let (mut clean, mut dirty, mut fork) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..7 {
        let t = Instant::now();
        store.graph().snapshot(name, &SnapshotOptions::default()).unwrap();
        clean.push(t.elapsed());
        for j in 0..(10 * MIB / bs) {
            fill_random(&mut buf, &mut seed);
            let blk = (j * 997 + round * 31) % blocks;
            head.write_at(blk * stride * bs, &buf).unwrap();
        }
        let t = Instant::now();
        let v = store.graph().snapshot(name, &SnapshotOptions::default()).unwrap();
        dirty.push(t.elapsed());
        let t = Instant::now();
        store.graph().fork(&v, &format!("{name}-fork{round}")).unwrap();
        fork.push(t.elapsed());
    }
    (median(clean), median(dirty), median(fork))
}

fn throughput(store: &Store) {
    let size = GIB;
    store.volumes().create("tput", VolumeKind::Block, Some(size), None).unwrap();
    let head = store.volumes().open_block("tput").unwrap();
    let mut seed = 42u64;
    let mut buf = vec![0u8; MIB as usize];
    let mut gen_time = Duration::ZERO;
    let t = Instant::now();
    for i in 0..(size / MIB) {
        let g = Instant::now();
        fill_random(&mut buf, &mut seed);
        gen_time += g.elapsed();
        head.write_at(i * MIB, &buf).unwrap();
    }
    head.flush().unwrap();
    let write = t.elapsed() - gen_time;
    let t = Instant::now();
    let v = store.graph().snapshot("tput", &SnapshotOptions::default()).unwrap();
    let checkpoint = t.elapsed();
    // Read the committed version back (chunk cache is 256 MiB: mostly misses).
    let t = Instant::now();
    for i in 0..(size / MIB) {
        store.graph().frozen(&v).unwrap().read_at(i * MIB, &mut buf).unwrap();
    }
    let read = t.elapsed();
    let t = Instant::now();
    for i in 0..(size / MIB) {
        head.read_at(i * MIB, &mut buf).unwrap();
    }
    let read_head = t.elapsed();
    println!("block API, 1 GiB of incompressible data in 1 MiB requests:");
    println!("  write (to overlay, then WAL sync)  {:>8.0} MB/s", mbps(size, write));
    println!(
        "  checkpoint (hash, pack, commit)    {:>8.0} MB/s  ({:.2} s)",
        mbps(size, checkpoint),
        checkpoint.as_secs_f64()
    );
    println!("  write + checkpoint end to end      {:>8.0} MB/s", mbps(size, write + checkpoint));
    println!("  read committed version             {:>8.0} MB/s", mbps(size, read));
    println!("  read head (same data)              {:>8.0} MB/s", mbps(size, read_head));
}

fn dedupe(store: &Store) {
    let size = GIB;
    store.volumes().create("base", VolumeKind::Block, Some(size), None).unwrap();
    let head = store.volumes().open_block("base").unwrap();
    let mut seed = 7u64;
    let mut buf = vec![0u8; MIB as usize];
    for i in 0..(size / MIB) {
        fill_random(&mut buf, &mut seed);
        head.write_at(i * MIB, &buf).unwrap();
    }
    let v = store.graph().snapshot("base", &SnapshotOptions::default()).unwrap();
    for f in 0..10u64 {
        let name = format!("fork{f}");
        store.graph().fork(&v, &name).unwrap();
        let h = store.volumes().open_block(&name).unwrap();
        for j in 0..10u64 {
            fill_random(&mut buf, &mut seed);
            h.write_at(((f * 97 + j * 13) % (size / MIB)) * MIB, &buf).unwrap();
        }
        store.graph().snapshot(&name, &SnapshotOptions::default()).unwrap();
    }
    let s = store.stats().unwrap();
    println!(
        "dedupe: 1 GiB volume + 10 forks each changing 10 MiB (11 heads, {:.1} GiB logical):",
        s.logical_bytes as f64 / GIB as f64
    );
    println!(
        "  stored {:.3} GiB in {} packs (ideal 1.098 GiB), ratio {:.2}",
        s.stored_bytes as f64 / GIB as f64,
        s.packs,
        s.dedupe_ratio
    );
}

fn main() {
    let dir = std::env::var_os("FORKFS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("forkfs-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let want = |s: &str| only.as_deref().is_none_or(|o| o == s);
    if want("latency") {
        let store = fresh_store(&dir, "latency");
        let small = latency(&store, "v1g", GIB);
        let big = latency(&store, "v64g", 64 * GIB);
        println!("snapshot/fork latency, median of 7 (1 GiB of data in each volume):");
        println!("  {:<34} {:>10} {:>10} {:>7}", "", "1 GiB vol", "64 GiB vol", "ratio");
        for (what, a, b) in [
            ("snapshot, clean", small.0, big.0),
            ("snapshot after 10 MiB of writes", small.1, big.1),
            ("fork", small.2, big.2),
        ] {
            println!("  {what:<34} {:>8.2}ms {:>8.2}ms {:>7.2}", ms(a), ms(b), ms(b) / ms(a));
        }
        drop(store);
        let _ = std::fs::remove_dir_all(dir.join("latency"));
    }
    if want("throughput") {
        let store = fresh_store(&dir, "tput");
        throughput(&store);
        drop(store);
        let _ = std::fs::remove_dir_all(dir.join("tput"));
    }
    if want("dedupe") {
        let store = fresh_store(&dir, "dedupe");
        dedupe(&store);
        drop(store);
        let _ = std::fs::remove_dir_all(dir.join("dedupe"));
    }
}
