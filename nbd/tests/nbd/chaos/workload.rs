//! The mixed workload on the mounted btrfs, run on its own thread until the
//! cut (or the first I/O error): new files of 1 KiB–2 MiB, in-place
//! overwrites, fsyncs, renames, deletes, full syncs, read-only snapshots
//! (created and rotated). The model records each change before its syscall
//! and promotes states to durable only when a sync returned before the cut.

use super::model::{Model, St};
use crate::common::attach::run_timeout;
use rand::rngs::StdRng;
use rand::{Rng, RngCore};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// File names are drawn from this many, so names get reused.
const NAMES: u32 = 48;
const MAX_SNAPS: usize = 4;

#[derive(Default, Debug)]
pub struct Stats {
    pub ops: u64,
    pub writes: u64,
    pub overwrites: u64,
    /// fsyncs that returned before the cut (and made a file durable).
    pub fsyncs: u64,
    pub syncs: u64,
    pub renames: u64,
    pub deletes: u64,
    pub snapshots: u64,
    pub bytes: u64,
    /// The error that stopped the workload.
    pub stopped_by: Option<String>,
    /// Failures with no cut yet: these are bugs, not the fault we injected.
    pub unexpected: Vec<String>,
}

pub struct Workload {
    pub mnt: PathBuf,
    pub model: Model,
    pub stats: Stats,
    pub rng: StdRng,
    pub cut: Arc<AtomicBool>,
}

impl Workload {
    fn live(&self) -> PathBuf {
        self.mnt.join("live")
    }

    fn cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Runs until the cut or the first error; returns itself (the model).
    pub fn run(mut self) -> Workload {
        while !self.cut() {
            self.stats.ops += 1;
            if let Err(e) = self.step() {
                if !self.cut() {
                    self.stats.unexpected.push(format!("I/O error before the cut: {e}"));
                }
                self.stats.stopped_by = Some(e);
                break;
            }
        }
        self
    }

    fn pick_existing(&mut self) -> Option<String> {
        let names = self.model.existing();
        (!names.is_empty()).then(|| names[self.rng.random_range(0..names.len())].clone())
    }

    fn step(&mut self) -> Result<(), String> {
        let roll = self.rng.random_range(0..100);
        let existing = self.pick_existing();
        match (roll, existing) {
            (0..30, _) | (_, None) => self.write_new(),
            (30..50, Some(n)) if !self.is_empty(&n) => self.overwrite(&n),
            (30..50, Some(_)) => self.write_new(),
            (50..72, Some(n)) => self.fsync(&n),
            (72..78, Some(n)) => self.rename(&n),
            (78..84, Some(n)) => self.delete(&n),
            (84..89, _) => self.syncfs(),
            (89..92, _) => self.snapshot(),
            (_, Some(n)) => self.read_back(&n),
        }
    }

    fn is_empty(&self, name: &str) -> bool {
        matches!(self.model.current(name), St::Data(_, b) if b.is_empty())
    }

    fn random_bytes(&mut self) -> Vec<u8> {
        // Log-uniform 1 KiB..2 MiB: many small files, some large ones.
        let len = (1024.0 * 2048f64.powf(self.rng.random::<f64>())) as usize;
        let mut data = vec![0u8; len];
        self.rng.fill_bytes(&mut data);
        data
    }

    fn write_new(&mut self) -> Result<(), String> {
        let name = format!("f{}", self.rng.random_range(0..NAMES));
        let data = self.random_bytes();
        // Creating or truncating passes through an empty file.
        self.model.push(&name, St::data(Vec::new()));
        self.model.push(&name, St::data(data.clone()));
        self.model.note(&name, format!("write {}", data.len()));
        self.stats.writes += 1;
        self.stats.bytes += data.len() as u64;
        std::fs::write(self.live().join(&name), &data).map_err(|e| format!("write {name}: {e}"))
    }

    fn overwrite(&mut self, name: &str) -> Result<(), String> {
        // One pending overwrite per file at a time: an in-place write is one
        // extent, and two pending ones could reach the disk torn between
        // them without any fault (the legitimate mix the check would flag).
        if self.model.names[name].states.len() > 1 {
            self.fsync(name)?;
        }
        let St::Data(_, old) = self.model.current(name) else { unreachable!() };
        let mut data = (*old).clone();
        let off = self.rng.random_range(0..data.len());
        let len = self.rng.random_range(1..=(data.len() - off).min(256 << 10));
        self.rng.fill_bytes(&mut data[off..off + len]);
        let region = data[off..off + len].to_vec();
        self.model.push(name, St::data(data));
        self.model.note(name, format!("overwrite {off}+{len}"));
        self.stats.overwrites += 1;
        self.stats.bytes += len as u64;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.live().join(name))
            .map_err(|e| format!("open {name}: {e}"))?;
        f.write_all_at(&region, off as u64).map_err(|e| format!("overwrite {name}: {e}"))
    }

    fn fsync(&mut self, name: &str) -> Result<(), String> {
        let f =
            std::fs::File::open(self.live().join(name)).map_err(|e| format!("open {name}: {e}"))?;
        self.model.note(name, "fsync".into());
        f.sync_all().map_err(|e| format!("fsync {name}: {e}"))?;
        let durable = !self.cut() && self.model.fsynced(name);
        self.model.note(name, format!("fsync ok{}", if durable { " (durable)" } else { "" }));
        self.stats.fsyncs += durable as u64;
        Ok(())
    }

    fn rename(&mut self, from: &str) -> Result<(), String> {
        let to = format!("f{}", self.rng.random_range(0..NAMES));
        if to == from {
            return Ok(());
        }
        // The name moves with the inode, and the inode's content may still
        // be any of its states since the last durable point.
        let contents: Vec<St> = self.model.names[from].states.clone();
        if self.model.current(&to) != St::Absent {
            self.model.renamed_over(&to);
        }
        for c in contents.into_iter().filter(|c| matches!(c, St::Data(..))) {
            self.model.push(&to, c);
        }
        self.model.push(from, St::Absent);
        self.model.taint(from);
        self.model.taint(&to);
        self.model.note(from, format!("renamed to {to}"));
        self.model.note(&to, format!("renamed from {from}"));
        self.stats.renames += 1;
        std::fs::rename(self.live().join(from), self.live().join(&to))
            .map_err(|e| format!("rename {from} {to}: {e}"))
    }

    fn delete(&mut self, name: &str) -> Result<(), String> {
        self.model.push(name, St::Absent);
        self.model.taint(name);
        self.model.note(name, "delete".into());
        self.stats.deletes += 1;
        std::fs::remove_file(self.live().join(name)).map_err(|e| format!("delete {name}: {e}"))
    }

    fn syncfs(&mut self) -> Result<(), String> {
        let d = std::fs::File::open(&self.mnt).map_err(|e| format!("open mount: {e}"))?;
        // SAFETY: syncfs(2) on a descriptor we own.
        if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
            return Err(format!("syncfs: {}", std::io::Error::last_os_error()));
        }
        if !self.cut() {
            self.model.synced();
            for n in self.model.names.keys().cloned().collect::<Vec<_>>() {
                self.model.note(&n, "synced".into());
            }
            self.stats.syncs += 1;
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<(), String> {
        let kept: Vec<String> =
            self.model.snaps.iter().filter(|(_, s)| !s.deleted).map(|(k, _)| k.clone()).collect();
        if kept.len() >= MAX_SNAPS {
            // Rotate: the deletion may or may not survive until a full sync.
            let old = &kept[0];
            let s = self.model.snaps.get_mut(old).unwrap();
            (s.deleted, s.absent_ok) = (true, true);
            let path = self.mnt.join("snaps").join(old);
            return btrfs(&["subvolume", "delete", path.to_str().unwrap()]);
        }
        let name = format!("s{}", self.model.next_snap);
        self.model.next_snap += 1;
        let files = self
            .model
            .existing()
            .into_iter()
            .map(|n| match self.model.current(&n) {
                St::Data(h, _) => (n, h),
                St::Absent => unreachable!(),
            })
            .collect();
        let snap = super::model::Snap { files, absent_ok: true, present_ok: true, deleted: false };
        self.model.snaps.insert(name.clone(), snap);
        let to = self.mnt.join("snaps").join(&name);
        let live = self.live();
        btrfs(&["subvolume", "snapshot", "-r", live.to_str().unwrap(), to.to_str().unwrap()])?;
        // The snapshot ioctl flushes the source and commits: durable now.
        if !self.cut() {
            self.model.snaps.get_mut(&name).unwrap().absent_ok = false;
            self.stats.snapshots += 1;
        }
        Ok(())
    }

    fn read_back(&mut self, name: &str) -> Result<(), String> {
        let got = std::fs::read(self.live().join(name)).map_err(|e| format!("read {name}: {e}"))?;
        if St::data(got) != self.model.current(name) && !self.cut() {
            self.stats
                .unexpected
                .push(format!("live read of {name} differs from what was written"));
        }
        Ok(())
    }
}

fn btrfs(args: &[&str]) -> Result<(), String> {
    let out = run_timeout("btrfs", args, Duration::from_secs(60))?;
    if !out.status.success() {
        return Err(format!("btrfs {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}
