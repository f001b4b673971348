//! fsck and gc time against store size (a benchmark, not a timed test).
//!
//! One store with heavy sharing: a 1 GiB block volume of random data
//! (64 KiB blocks), snapshotted, then forks of that version, each writing
//! 4 MiB of its own random data and snapshotted. Every fork adds a version
//! of 1 GiB logical that shares all but 4 MiB. Two series: the forks write
//! 64 blocks at random ("scattered", the main figure), which copies about
//! 41 of the 64 leaves of the block map per fork; or one 4 MiB run at a
//! random offset ("contiguous", the control), which copies one or two, so
//! the two series differ in unique metadata, not in logical size. Forks
//! are added to the same store to reach each size (1, 10, 100 and
//! 1000 GiB logical by default), and at each size this measures `fsck`,
//! `fsck --deep`, `gc` with nothing to reclaim, and `gc` after deleting
//! half the forks (which are replaced on the way to the next size).
//!
//! Each operation runs on a freshly opened store, as a CLI run would: the
//! chunk cache starts empty, the OS page cache is warm (the packs fit in
//! memory), opening the store is not timed. Stage times come from the
//! operations' own progress reports.
//!
//! Run with `scripts/bench-maint [scattered|contiguous] [FORKS...]` (default:
//! both series, `0 9 99 999` forks); results are recorded in
//! docs/BENCHMARKS.md.

use forkfs::Progress;
use forkfs::{CheckOptions, CheckReport};
use forkfs::{GcOptions, GcReport};
use forkfs::{SnapshotOptions, Store, StoreConfig, VersionRecord, VolumeKind};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const BLOCK: u64 = 64 * 1024;
/// Bytes each fork writes of its own.
const FORK_WRITE: u64 = 4 * MIB;
/// Runs of each operation that changes nothing; the median is reported.
const RUNS: usize = 3;

/// xorshift: fast incompressible bytes, reproducible by seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn fill_random(buf: &mut [u8], seed: &mut u64) {
    for c in buf.chunks_mut(8) {
        let b = next(seed).to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// Where each fork writes its 4 MiB.
#[derive(Clone, Copy, PartialEq)]
enum Writes {
    /// 64 blocks at random.
    Scattered,
    /// One run of 64 blocks at a random block.
    Contiguous,
}

impl Writes {
    fn name(self) -> &'static str {
        match self {
            Writes::Scattered => "scattered",
            Writes::Contiguous => "contiguous",
        }
    }

    /// The block index of each of a fork's writes.
    fn blocks(self, seed: &mut u64) -> Vec<u64> {
        let (total, n) = (GIB / BLOCK, FORK_WRITE / BLOCK);
        match self {
            Writes::Scattered => (0..n).map(|_| next(seed) % total).collect(),
            Writes::Contiguous => {
                let first = next(seed) % (total - n + 1);
                (first..first + n).collect()
            }
        }
    }
}

/// Records when each stage of an operation begins.
struct Stages {
    start: Instant,
    marks: Mutex<Vec<(String, Duration)>>,
}

impl Stages {
    fn new() -> Stages {
        Stages { start: Instant::now(), marks: Mutex::new(Vec::new()) }
    }

    /// Each stage with its duration, the time before the first as "setup".
    fn split(&self, total: Duration) -> Vec<(String, Duration)> {
        let marks = self.marks.lock().expect("no panics while holding the lock");
        let mut out = Vec::new();
        let mut prev = ("setup".to_string(), Duration::ZERO);
        for (name, at) in marks.iter() {
            out.push((prev.0, *at - prev.1));
            prev = (name.clone(), *at);
        }
        out.push((prev.0, total - prev.1));
        out
    }
}

impl Progress for Stages {
    fn stage(&self, name: &str, _: u64) {
        let at = self.start.elapsed();
        self.marks.lock().expect("no panics while holding the lock").push((name.to_string(), at));
    }
    fn advance(&self, _: u64) {}
}

/// One timed run: total time and its stages.
struct Run<R> {
    time: Duration,
    stages: Vec<(String, Duration)>,
    report: R,
}

/// Opens the store, times `op` on it, closes it.
fn timed<R>(dir: &Path, op: impl Fn(&Store, &Stages) -> R) -> Run<R> {
    let store = Store::open(dir).expect("open store");
    let stages = Stages::new();
    let report = op(&store, &stages);
    let time = stages.start.elapsed();
    let stages = stages.split(time);
    drop(store);
    Run { time, stages, report }
}

/// The run with the median time of `RUNS`.
fn median<R>(dir: &Path, op: impl Fn(&Store, &Stages) -> R) -> Run<R> {
    let mut runs: Vec<Run<R>> = (0..RUNS).map(|_| timed(dir, &op)).collect();
    runs.sort_by_key(|r| r.time);
    runs.swap_remove(RUNS / 2)
}

fn run_fsck(deep: bool) -> impl Fn(&Store, &Stages) -> CheckReport {
    move |store, p| {
        let r = store.check_with(&CheckOptions { deep }, p).expect("fsck runs");
        assert!(r.ok(), "fsck found problems: {:?}", r.problems);
        r
    }
}

fn run_gc(store: &Store, p: &Stages) -> GcReport {
    let opts = GcOptions { grace: Duration::ZERO, ..Default::default() };
    store.gc(&opts, p).expect("gc runs")
}

/// Everything measured at one size.
struct Step {
    forks: usize,
    logical: u64,
    build: Duration,
    fsck: Run<CheckReport>,
    deep: Run<CheckReport>,
    gc_idle: Run<GcReport>,
    deleted: usize,
    gc_half: Run<GcReport>,
}

/// The shared store and the forks alive in it.
struct Bench {
    dir: std::path::PathBuf,
    writes: Writes,
    base: VersionRecord,
    live: VecDeque<String>,
    made: u64,
}

impl Bench {
    /// A store holding the snapshotted 1 GiB base volume.
    fn new(dir: std::path::PathBuf, writes: Writes) -> (Bench, Duration) {
        let _ = std::fs::remove_dir_all(&dir);
        let t = Instant::now();
        let store = Store::init(&dir, StoreConfig::default()).expect("init store");
        store.volumes().create("base", VolumeKind::Block, Some(GIB), None).expect("create base");
        let head = store.volumes().open_block("base").expect("open base");
        let mut seed = 0x5eed_0001u64;
        let mut buf = vec![0u8; MIB as usize];
        for i in 0..(GIB / MIB) {
            fill_random(&mut buf, &mut seed);
            head.write_at(i * MIB, &buf).expect("write base");
        }
        drop(head);
        let base =
            store.graph().snapshot("base", &SnapshotOptions::default()).expect("snapshot base");
        drop(store);
        (Bench { dir, writes, base, live: VecDeque::new(), made: 0 }, t.elapsed())
    }

    /// Adds forks until `n` are alive.
    fn grow(&mut self, n: usize) -> Duration {
        let t = Instant::now();
        let store = Store::open(&self.dir).expect("open store");
        let mut buf = vec![0u8; BLOCK as usize];
        while self.live.len() < n {
            let name = format!("fork{:04}", self.made);
            let mut seed = 0x9e37_79b9_7f4a_7c15 ^ self.made;
            self.made += 1;
            store.graph().fork(&self.base, &name).expect("fork");
            let head = store.volumes().open_block(&name).expect("open fork");
            for block in self.writes.blocks(&mut seed) {
                fill_random(&mut buf, &mut seed);
                head.write_at(block * BLOCK, &buf).expect("write fork");
            }
            drop(head);
            store.graph().snapshot(&name, &SnapshotOptions::default()).expect("snapshot fork");
            self.live.push_back(name);
        }
        t.elapsed()
    }

    /// Deletes the oldest half of the live forks; returns how many.
    fn delete_half(&mut self) -> usize {
        let store = Store::open(&self.dir).expect("open store");
        let n = self.live.len() / 2;
        for name in self.live.drain(..n) {
            store.volumes().delete(&name).expect("delete fork");
        }
        n
    }

    fn measure(&mut self, forks: usize, setup: Duration) -> Step {
        let build = setup + self.grow(forks);
        let logical = {
            let store = Store::open(&self.dir).expect("open store");
            store.stats().expect("stats").logical_bytes
        };
        let fsck = median(&self.dir, run_fsck(false));
        let deep = median(&self.dir, run_fsck(true));
        let gc_idle = median(&self.dir, run_gc);
        assert_eq!(gc_idle.report.packs_deleted + gc_idle.report.packs_compacted, 0);
        let deleted = self.delete_half();
        let gc_half = timed(&self.dir, run_gc);
        let after = timed(&self.dir, run_fsck(false));
        assert_eq!(after.report.versions, fsck.report.versions - deleted);
        Step { forks, logical, build, fsck, deep, gc_idle, deleted, gc_half }
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print(writes: Writes, steps: &[Step]) {
    let how = match writes {
        Writes::Scattered => "at 64 random blocks",
        Writes::Contiguous => "in one run at a random offset",
    };
    println!(
        "fsck and gc against store size ({}): a 1 GiB block volume of random data\n\
         (64 KiB blocks), snapshotted, and N forks of it each writing {} MiB {how}, snapshotted",
        writes.name(),
        FORK_WRITE / MIB
    );
    let row = |label: &str, cells: &mut dyn Iterator<Item = String>| {
        print!("  {label:<34}");
        for c in cells {
            print!(" {c:>11}");
        }
        println!();
    };
    row("forks", &mut steps.iter().map(|s| s.forks.to_string()));
    row("logical GiB (all versions)", &mut steps.iter().map(|s| format!("{:.1}", gib(s.logical))));
    row(
        "physical GiB (packs)",
        &mut steps.iter().map(|s| format!("{:.3}", gib(s.fsck.report.pack_bytes))),
    );
    row("packs", &mut steps.iter().map(|s| s.fsck.report.packs.to_string()));
    row("versions", &mut steps.iter().map(|s| s.fsck.report.versions.to_string()));
    row("nodes walked", &mut steps.iter().map(|s| s.fsck.report.nodes.to_string()));
    row("data chunks walked", &mut steps.iter().map(|s| s.fsck.report.chunks.to_string()));
    row(
        "build since the previous size, s",
        &mut steps.iter().map(|s| format!("{:.1}", s.build.as_secs_f64())),
    );
    // Each operation's time, the pack bytes and the nodes it saw.
    type Measure<'a> = &'a dyn Fn(&Step) -> (Duration, u64, u64);
    let op = |label: &str, m: Measure<'_>| {
        let time = |s: &Step| ms(m(s).0);
        row(&format!("{label}, ms"), &mut steps.iter().map(|s| format!("{:.0}", time(s))));
        row(
            "  per logical GiB, ms",
            &mut steps.iter().map(|s| format!("{:.1}", time(s) / gib(s.logical))),
        );
        row(
            "  per physical GiB, ms",
            &mut steps.iter().map(|s| format!("{:.0}", time(s) / gib(m(s).1))),
        );
        row(
            "  per node walked, us",
            &mut steps.iter().map(|s| format!("{:.0}", time(s) * 1e3 / m(s).2 as f64)),
        );
    };
    let check = |r: &Run<CheckReport>| (r.time, r.report.pack_bytes, r.report.nodes);
    let collect = |r: &Run<GcReport>| (r.time, r.report.pack_bytes, r.report.live_nodes);
    op("fsck", &|s| check(&s.fsck));
    op("fsck --deep", &|s| check(&s.deep));
    op("gc, nothing to reclaim", &|s| collect(&s.gc_idle));
    row("forks deleted", &mut steps.iter().map(|s| s.deleted.to_string()));
    op("gc after deleting them", &|s| collect(&s.gc_half));
    row(
        "  reclaimed MiB",
        &mut steps
            .iter()
            .map(|s| format!("{:.1}", s.gc_half.report.bytes_reclaimed as f64 / MIB as f64)),
    );
    row("  packs deleted", &mut steps.iter().map(|s| s.gc_half.report.packs_deleted.to_string()));
    println!("stages, ms (median run; \"setup\" is the time before the first stage):");
    let stages = |label: &str, get: &dyn Fn(&Step) -> &[(String, Duration)]| {
        let names: Vec<String> = get(&steps[0]).iter().map(|(n, _)| n.clone()).collect();
        for name in names {
            let cells = &mut steps.iter().map(|s| {
                let d = get(s).iter().find(|(n, _)| *n == name).map_or(Duration::ZERO, |(_, d)| *d);
                format!("{:.0}", ms(d))
            });
            row(&format!("{label}: {name}"), cells);
        }
    };
    stages("fsck", &|s| &s.fsck.stages);
    stages("fsck --deep", &|s| &s.deep.stages);
    stages("gc, nothing", &|s| &s.gc_idle.stages);
    stages("gc after deleting", &|s| &s.gc_half.stages);
}

fn main() {
    let dir = std::env::var_os("FORKFS_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("forkfs-bench-maint"));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut series: Vec<Writes> = [Writes::Scattered, Writes::Contiguous]
        .into_iter()
        .filter(|w| args.iter().any(|a| a == w.name()))
        .collect();
    if series.is_empty() {
        series = vec![Writes::Scattered, Writes::Contiguous];
    }
    let mut sizes: Vec<usize> = args
        .iter()
        .filter(|a| series.iter().all(|w| w.name() != a.as_str()))
        .map(|a| a.parse().expect("arguments: scattered, contiguous, fork counts (0 9 99 999)"))
        .collect();
    if sizes.is_empty() {
        sizes = vec![0, 9, 99, 999];
    }
    assert!(sizes.windows(2).all(|w| w[0] < w[1]), "fork counts must ascend");
    let started = Instant::now();
    for writes in series {
        let store = dir.join(writes.name());
        let (mut bench, mut setup) = Bench::new(store.clone(), writes);
        let mut steps = Vec::new();
        for &n in &sizes {
            steps.push(bench.measure(n, setup));
            setup = Duration::ZERO;
            eprintln!(
                "{}: measured {n} forks ({:.0} s so far)",
                writes.name(),
                started.elapsed().as_secs_f64()
            );
        }
        print(writes, &steps);
        let _ = std::fs::remove_dir_all(&store);
    }
    println!("total {:.0} s", started.elapsed().as_secs_f64());
}
