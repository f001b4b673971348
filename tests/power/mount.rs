//! The FUSE workspace under power cuts: files written and fsynced, named
//! snapshots and GCs through the control socket, automatic checkpoints;
//! the power goes at a random moment.

use crate::common::mount::{is_fuse_mount, lazy_unmount, mount_pid};
use crate::{Machine, kill, rounds, seed, tree};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Files = BTreeMap<String, Vec<u8>>;
/// A tree by content hash (what a snapshot must hold, kept small).
type Sums = BTreeMap<String, u64>;

fn sums<'a>(files: impl IntoIterator<Item = (&'a String, &'a Vec<u8>)>) -> Sums {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let h = BuildHasherDefault::<DefaultHasher>::default();
    files.into_iter().map(|(k, v)| (k.clone(), h.hash_one(v))).collect()
}

/// What the workload was told was durable, and what it wrote at all.
#[derive(Default)]
struct Acked {
    /// Files whose fsync returned.
    synced: Files,
    /// Files whose writes returned (durable or not).
    written: Files,
    /// Snapshots that returned: name -> the files they must hold.
    snapshots: Vec<(String, Sums)>,
}

/// One round's writer: files, fsyncs, snapshots and gcs until the mount
/// dies under it.
fn workload(m: &Attached, dir: &Path, round: usize, base: &Files, seed: u64, acked: &Mutex<Acked>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Paths go through a descriptor of the mount's root: once the mount
    // dies they fail, even after the directory under it shows again.
    let Ok(root) = std::fs::File::open(dir) else { return };
    let dir = Path::new("/proc/self/fd").join(root.as_raw_fd().to_string());
    for i in 0.. {
        let name = format!("r{round}/f{i}");
        let data = crate::common::random(rng.random_range(0..200_000), seed ^ i as u64);
        let path = dir.join(&name);
        // Recorded first: a file may exist after the cut once its write began.
        acked.lock().unwrap().written.insert(name.clone(), data.clone());
        let wrote = (|| -> std::io::Result<std::fs::File> {
            std::fs::create_dir_all(path.parent().unwrap())?;
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&data)?;
            Ok(f)
        })();
        let Ok(f) = wrote else { return };
        if rng.random_bool(0.6) {
            if f.sync_all().is_err() {
                return;
            }
            acked.lock().unwrap().synced.insert(name.clone(), data);
        }
        drop(f);
        if i % 7 == 6 {
            let snap = format!("r{round}-s{i}");
            let mut want = sums(base);
            want.extend(sums(&acked.lock().unwrap().written));
            match m.forkfs(&["snapshot", "ws", "--name", &snap]).output() {
                // Taken by the mount: its file handles still work.
                Ok(o) if o.status.success() && root.metadata().is_ok() => {
                    acked.lock().unwrap().snapshots.push((snap, want))
                }
                _ => return,
            }
        }
        if i % 17 == 16 && m.forkfs(&["gc", "--grace", "0s"]).output().is_err() {
            return;
        }
    }
}

/// Checks the recovered store against what was acknowledged; returns the
/// head's files (the next round's base), or what is wrong.
fn verify(m: &Machine, round: usize, base: &Files, acked: &Acked) -> Result<Files, String> {
    let (ok, problems) = m.fsck();
    if !ok {
        return Err(format!("fsck after the cut: {problems:?}"));
    }
    let out = tempfile::tempdir().unwrap();
    let export = |spec: &str, to: &Path| -> Result<Files, String> {
        let o = m.forkfs(&["export", spec, to.to_str().unwrap()]).output().unwrap();
        if !o.status.success() {
            return Err(format!("export {spec}: {}", String::from_utf8_lossy(&o.stderr)));
        }
        Ok(tree(to))
    };
    let head = export("ws", &out.path().join("head"))?;
    for (name, data) in base.iter().chain(&acked.synced) {
        match head.get(name) {
            Some(d) if d == data => {}
            Some(d) => {
                return Err(format!("{name}: acknowledged content lost ({} bytes now)", d.len()));
            }
            None => return Err(format!("{name}: acknowledged file missing")),
        }
    }
    for name in head.keys() {
        if !base.contains_key(name) && !acked.written.contains_key(name) {
            return Err(format!("{name}: a file nobody wrote"));
        }
    }
    for (i, (snap, want)) in acked.snapshots.iter().enumerate() {
        let got = export(&format!("ws@{snap}"), &out.path().join(format!("s{i}")))?;
        let got = sums(&got);
        if got != *want {
            let missing: Vec<_> = want.keys().filter(|k| got.get(*k) != want.get(*k)).collect();
            return Err(format!("snapshot {snap} differs from what it acknowledged: {missing:?}"));
        }
    }
    let _ = round;
    Ok(head)
}

/// Runs `rounds` power cuts; the first failure found, if any.
fn power_cuts(m: &mut Machine, rounds: usize, seed: u64) -> Result<(), String> {
    m.ok(&["init"]);
    m.ok(&["volume", "create", "ws"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut base = Files::new();
    for round in 0..rounds {
        let mnt = tempfile::Builder::new().prefix("forkfs-power-").tempdir().unwrap();
        let dir = mnt.path().to_str().unwrap();
        let out = m.ok(&["mount", "ws", dir, "--daemon", "--checkpoint-every", "300ms"]);
        let pid = mount_pid(&out);
        let acked = Arc::new(Mutex::new(Acked::default()));
        let done = Arc::new(AtomicBool::new(false));
        let worker = {
            let (acked, done) = (acked.clone(), done.clone());
            let (path, base, s) = (mnt.path().to_path_buf(), base.clone(), rng.random());
            let env = m.env.clone();
            let store = m.store();
            std::thread::spawn(move || {
                let m = Attached { store, env };
                workload(&m, &path, round, &base, s, &acked);
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1500)));
        kill(pid);
        if is_fuse_mount(mnt.path()) {
            lazy_unmount(mnt.path());
        }
        worker.join().unwrap();
        let dropped = m.cut_power();
        let acked = acked.lock().unwrap();
        println!(
            "round {round}: {} files written, {} synced, {} snapshots; {dropped} unsynced bytes lost",
            acked.written.len(),
            acked.synced.len(),
            acked.snapshots.len()
        );
        base = verify(m, round, &base, &acked).map_err(|e| format!("round {round}: {e}"))?;
    }
    Ok(())
}

/// A handle on a machine's store for the workload thread.
pub struct Attached {
    store: std::path::PathBuf,
    env: Vec<(&'static str, &'static str)>,
}

impl Attached {
    fn forkfs(&self, args: &[&str]) -> std::process::Command {
        let mut c = crate::common::command(&self.store, args);
        c.envs(self.env.iter().copied());
        c
    }
}

#[test]
fn power_cuts_under_a_mounted_workspace_lose_no_acknowledged_write() {
    let mut m = Machine::new();
    let rounds = rounds();
    if let Err(e) = power_cuts(&mut m, rounds, seed()) {
        panic!("{e}");
    }
    println!("power cuts (mount): {rounds} rounds, 0 acknowledged writes lost");
}

/// The negative control: without the data log's fdatasync, fsynced file
/// data dies with the power, and the test must say so.
#[test]
fn power_cuts_catch_a_missing_fsync() {
    let mut m = Machine::new();
    m.env.push(("FORKFS_TEST_SKIP_LOG_SYNC", "1"));
    // A round catches the loss only when the cut finds an fsynced file
    // not yet in a checkpoint (taken every 300 ms): most rounds do, but
    // beside other tests on 2 cores, 12 in a row once did not. The first
    // catch ends the test, so the bound costs only a failing run.
    let rounds = rounds().max(40);
    match power_cuts(&mut m, rounds, seed()) {
        Err(e) => println!("negative control caught: {e}"),
        Ok(()) => panic!("{rounds} power cuts without the data log's fsync lost nothing"),
    }
}
