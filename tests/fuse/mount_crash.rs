//! Crash safety of the FUSE mount: a workload creates, overwrites, patches,
//! atomically replaces and deletes files, fsyncing some of them, while the
//! mount checkpoints every second; the mount process is SIGKILLed at a
//! random moment, its dead mount detached, and the volume mounted again.
//! What an fsync (or fsync of the directory, for names) acknowledged must be
//! there: exactly, if nothing touched the file after; otherwise every 4 KiB
//! page must come from one of the states the file was given since (or be
//! zeros: a torn, unsynced write). Files replaced by rename are never torn.
//! Every listed file must read; `forkfs fsck` must pass after unmounting.
//! FORKFS_CRASH_SEED reruns one seed.

use crate::common::mount::{Mounted, new_store, require_tool, run};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const VOL: &str = "crash";
const DIRS: [&str; 2] = ["a", "b"];
const PAGE: usize = 4096;

/// What the workload knows about one path.
#[derive(Clone, Default, Debug)]
struct FileModel {
    /// The state it last acknowledged (None: absent).
    current: Option<Vec<u8>>,
    /// The state an fsync made durable: None if none is promised.
    durable: Option<Option<Vec<u8>>>,
    /// States given since (including one whose call may not have returned).
    since: Vec<Option<Vec<u8>>>,
    /// Only ever replaced by rename, so never torn.
    atomic: bool,
}

impl FileModel {
    fn give(&mut self, state: Option<Vec<u8>>) {
        self.since.push(state);
    }
    fn acked(&mut self, state: Option<Vec<u8>>) {
        self.current = state;
    }
    fn synced(&mut self) {
        self.durable = Some(self.current.clone());
        self.since.clear();
    }
}

type Model = BTreeMap<String, FileModel>;

fn names() -> Vec<String> {
    let mut v: Vec<String> =
        DIRS.iter().flat_map(|d| (0..8).map(move |i| format!("{d}/f{i}"))).collect();
    v.extend(DIRS.iter().map(|d| format!("{d}/atomic")));
    v
}

fn sync_dir(root: &Path, rel: &str) -> std::io::Result<()> {
    let parent = Path::new(rel).parent().unwrap();
    std::fs::File::open(root.join(parent))?.sync_all()
}

/// One random operation; Err once the mount is gone.
fn op(root: &Path, model: &mut Model, rng: &mut StdRng, seq: &mut u64) -> std::io::Result<()> {
    // Files unlinked while open: the mount keeps them until closed (or,
    // after a crash, deletes them when mounting again).
    thread_local!(static HELD: std::cell::RefCell<Vec<std::fs::File>> = Default::default());
    if rng.random_range(0..20) == 0 {
        let p = root.join(DIRS[rng.random_range(0..2)]).join(format!("orphan-{seq}"));
        *seq += 1;
        let mut f = std::fs::File::create(&p)?;
        f.write_all(&crate::common::random(rng.random_range(0..100_000), *seq))?;
        std::fs::remove_file(&p)?;
        f.write_all(b"after unlink")?;
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.push(f);
            if h.len() > 10 {
                h.remove(0);
            }
        });
        return Ok(());
    }
    let all = names();
    let name = all[rng.random_range(0..all.len())].clone();
    let p = root.join(&name);
    let m = model.get_mut(&name).unwrap();
    *seq += 1;
    let content = crate::common::random(rng.random_range(0..200_000), *seq);
    let sync = rng.random_bool(0.4);
    if m.atomic {
        // Write a temporary file, fsync it, rename it over, fsync the dir.
        let tmp = p.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&content)?;
        f.sync_all()?;
        m.give(Some(content.clone()));
        std::fs::rename(&tmp, &p)?;
        m.acked(Some(content));
        if sync {
            sync_dir(root, &name)?;
            m.synced();
        }
        return Ok(());
    }
    match rng.random_range(0..10) {
        0..5 => {
            // Overwrite whole (truncate, then write).
            let created = m.current.is_none();
            m.give(Some(Vec::new()));
            m.give(Some(content.clone()));
            let mut f = std::fs::File::create(&p)?;
            f.write_all(&content)?;
            m.acked(Some(content));
            if sync {
                f.sync_all()?;
                if created {
                    sync_dir(root, &name)?;
                }
                m.synced();
            }
        }
        5..8 if m.current.is_some() => {
            // Patch in place, possibly growing the file.
            let mut next = m.current.clone().unwrap();
            let off = rng.random_range(0..next.len() + 5000);
            let patch = &content[..content.len().min(20_000)];
            if next.len() < off + patch.len() {
                next.resize(off + patch.len(), 0);
            }
            next[off..off + patch.len()].copy_from_slice(patch);
            m.give(Some(next.clone()));
            let f = std::fs::OpenOptions::new().write(true).open(&p)?;
            f.write_all_at(patch, off as u64)?;
            m.acked(Some(next));
            if sync {
                f.sync_all()?;
                m.synced();
            }
        }
        8 if m.current.is_some() => {
            m.give(None);
            std::fs::remove_file(&p)?;
            m.acked(None);
            if sync {
                sync_dir(root, &name)?;
                m.synced();
            }
        }
        _ => {
            if m.current.is_some() {
                std::fs::File::open(&p)?.sync_all()?;
                m.synced();
            }
        }
    }
    Ok(())
}

/// Whether `got` can be what `m` left after a crash.
fn allowed(m: &FileModel, got: &Option<Vec<u8>>) -> Result<(), String> {
    let Some(durable) = &m.durable else { return Ok(()) };
    if got == durable || m.since.iter().any(|s| s == got) {
        return Ok(());
    }
    let Some(bytes) = got else {
        return Err("missing".into());
    };
    if m.atomic || m.since.is_empty() {
        return Err(format!("{} bytes, not the fsynced state", bytes.len()));
    }
    // A torn write: each page from some state given, or zeros.
    let states: Vec<&Vec<u8>> = m.since.iter().chain([durable]).flatten().collect();
    for (i, page) in bytes.chunks(PAGE).enumerate() {
        let from = |s: &&Vec<u8>| s.get(i * PAGE..i * PAGE + page.len()) == Some(page);
        if !states.iter().any(from) && page.iter().any(|b| *b != 0) {
            return Err(format!("{} bytes; page {i} is from no state it was given", bytes.len()));
        }
    }
    Ok(())
}

/// Problems found on the mounted volume; updates `model` to what is there.
fn verify(root: &Path, model: &mut Model) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, m) in model.iter_mut() {
        let got = match std::fs::read(root.join(name)) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                problems.push(format!("{name}: unreadable: {e}"));
                continue;
            }
        };
        if let Err(why) = allowed(m, &got) {
            problems.push(format!("{name}: {why} (acknowledged since: {})", m.since.len()));
        }
        *m = FileModel { current: got, atomic: m.atomic, ..Default::default() };
    }
    for d in DIRS {
        for e in std::fs::read_dir(root.join(d)).unwrap() {
            let p = e.unwrap().path();
            let rel = format!("{d}/{}", p.file_name().unwrap().to_string_lossy());
            // (Temporaries, and orphans whose unlink was not made durable.)
            let transient = rel.ends_with(".tmp") || rel.contains("/orphan-");
            if !model.contains_key(&rel) && !transient {
                problems.push(format!("{rel}: listed, but never named by the workload"));
            }
            if let Err(e) = std::fs::read(&p) {
                problems.push(format!("{}: listed but unreadable: {e}", p.display()));
            }
        }
    }
    problems
}

/// Mounts, runs the workload for `run_for`, SIGKILLs the mount, remounts
/// and verifies; returns the problems found.
fn crash_round(store: &Path, model: &mut Model, seed: u64, run_for: Duration) -> Vec<String> {
    let m = Mounted::new(store, VOL, &["--checkpoint-every", "1s"]);
    let root = m.dir().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, mut work) = (stop.clone(), std::mem::take(model));
    let worker = std::thread::spawn(move || {
        let (mut rng, mut seq, mut ops) = (StdRng::seed_from_u64(seed), seed << 20, 0u64);
        while !stop2.load(Ordering::Relaxed) && op(&root, &mut work, &mut rng, &mut seq).is_ok() {
            ops += 1;
        }
        (work, ops)
    });
    std::thread::sleep(run_for);
    m.kill();
    stop.store(true, Ordering::Relaxed);
    let (work, ops) = worker.join().unwrap();
    *model = work;
    assert!(ops > 0, "the workload made no progress");
    println!("{ops} operations in {run_for:?} before the kill");
    drop(m);
    let m = Mounted::new(store, VOL, &["--checkpoint-every", "1s"]);
    let problems = verify(m.dir(), model);
    m.unmount();
    problems
}

fn setup(store: &Path) -> Model {
    let m = Mounted::new(store, VOL, &[]);
    let mut model = Model::new();
    for d in DIRS {
        std::fs::create_dir(m.path(d)).unwrap();
    }
    for (i, n) in names().into_iter().enumerate() {
        std::fs::write(m.path(&n), crate::common::random(i * 3000, i as u64)).unwrap();
        let fm = FileModel {
            current: Some(crate::common::random(i * 3000, i as u64)),
            atomic: n.ends_with("atomic"),
            ..Default::default()
        };
        model.insert(n, fm);
    }
    m.unmount();
    // A clean unmount makes everything durable.
    model.values_mut().for_each(FileModel::synced);
    model
}

fn fsck(store: &Path) {
    let out = crate::common::forkfs(store, &["fsck"]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}

fn base_seed() -> u64 {
    std::env::var("FORKFS_CRASH_SEED")
        .map(|s| s.parse().expect("FORKFS_CRASH_SEED is a number"))
        .unwrap_or_else(|_| rand::rng().random())
}

#[test]
fn fsynced_data_survives_sigkill_of_the_mount() {
    let seed = base_seed();
    println!("FORKFS_CRASH_SEED={seed}");
    let (_d, store) = new_store();
    let mut model = setup(&store);
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..10 {
        let run_for = Duration::from_millis(rng.random_range(100..1500));
        let problems = crash_round(&store, &mut model, seed + round, run_for);
        assert!(problems.is_empty(), "seed {seed} round {round}:\n{}", problems.join("\n"));
        // Clean again after the unmount: all of it is durable now.
        model.values_mut().for_each(FileModel::synced);
        fsck(&store);
    }
}

/// The negative control: the same check must notice lost fsyncs. After a
/// round's crash, the store is rolled back to a copy taken before the
/// round (a store whose fsyncs had not reached the disk); remounted, the
/// verifier has to report the files the round fsynced.
#[test]
fn crash_check_detects_lost_fsyncs() {
    require_tool("cp");
    let seed = base_seed();
    println!("FORKFS_CRASH_SEED={seed}");
    let (d, store) = new_store();
    let mut model = setup(&store);
    let before = d.path().join("store-before");
    run(std::process::Command::new("cp").arg("-a").arg(&store).arg(&before));
    let m = Mounted::new(&store, VOL, &["--checkpoint-every", "1s"]);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seq = 1 << 40;
    let mut credited = 0;
    while credited < 5 {
        let snapshot: Vec<_> = model.values().map(|m| m.durable.clone()).collect();
        op(m.dir(), &mut model, &mut rng, &mut seq).unwrap();
        let now: Vec<_> = model.values().map(|m| m.durable.clone()).collect();
        credited += snapshot.iter().zip(&now).filter(|(a, b)| a != b).count();
    }
    m.kill();
    drop(m);
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::rename(&before, &store).unwrap();
    let m = Mounted::new(&store, VOL, &[]);
    let problems = verify(m.dir(), &mut model);
    assert!(!problems.is_empty(), "{credited} fsynced changes were lost unnoticed");
    println!("the verifier found: {problems:?}");
}
