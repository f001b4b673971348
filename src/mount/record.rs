//! `<store>/mounts/<id>.json`: which process mounts what where, so
//! `forkfs umount` can wait for a mount's end and its process's; and
//! `<id>.failed`, left by a mount whose end did not save everything (its
//! last checkpoint failed), so `forkfs umount` can say so and fail.
//! Informational: the store's own lock is what excludes.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a mount's end did not save everything.
#[derive(Serialize, Deserialize)]
pub struct Failure {
    pub kind: forkfs::ErrorKind,
    pub message: String,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    pid: u32,
    dir: PathBuf,
    volume: String,
    /// The process serves more than mounts (forkfs-nbd) and does not end
    /// with its last one.
    #[serde(default)]
    stays: bool,
}

/// The live process serving a mount.
#[derive(Clone, Copy, Debug)]
pub struct Holder {
    pub pid: u32,
    /// It does not end with its last mount (forkfs-nbd).
    pub stays: bool,
}

/// The bytes `<id>.failed` holds for a failure (taken when the mount starts).
const FAILURE_ROOM: usize = 2048;

/// Removes its file when dropped.
pub struct Record {
    path: PathBuf,
}

fn path_for(store: &Path, dir: &Path) -> PathBuf {
    let h = blake3::hash(dir.as_os_str().as_encoded_bytes());
    store.join("mounts").join(format!("{}.json", &h.to_hex()[..16]))
}

impl Record {
    pub fn write(store: &Path, dir: &Path, volume: &str, stays: bool) -> Result<Record> {
        let path = path_for(store, dir);
        std::fs::create_dir_all(path.parent().expect("has a parent"))?;
        // The room for a failure is taken now: a mount whose last
        // checkpoint fails for want of space must still be able to say so.
        std::fs::write(path.with_extension("failed"), [b' '; FAILURE_ROOM])?;
        let e =
            Entry { pid: std::process::id(), dir: dir.to_path_buf(), volume: volume.into(), stays };
        std::fs::write(&path, serde_json::to_vec(&e)?)?;
        Ok(Record { path })
    }

    /// Ends the record; a failed end leaves why, for `forkfs umount`.
    pub fn end(self, failure: Option<&forkfs::Error>) {
        let failed = self.path.with_extension("failed");
        let Some(e) = failure else {
            let _ = std::fs::remove_file(failed);
            return;
        };
        let mut message = forkfs::one_line(e);
        let raw = loop {
            let f = Failure { kind: e.kind(), message: message.clone() };
            match serde_json::to_vec(&f) {
                Ok(raw) if raw.len() <= FAILURE_ROOM || message.is_empty() => break raw,
                Ok(_) => {
                    let mut keep = message.len() * 3 / 4;
                    while !message.is_char_boundary(keep) {
                        keep -= 1;
                    }
                    message.truncate(keep);
                }
                Err(_) => return,
            }
        };
        // Written over the room taken at the start: no new space needed.
        let written = std::fs::OpenOptions::new().write(true).open(&failed).and_then(|mut f| {
            use std::io::Write;
            f.write_all(&raw)?;
            f.write_all(&vec![b' '; FAILURE_ROOM.saturating_sub(raw.len())])
        });
        if let Err(err) = written {
            tracing::error!(error = %err, "cannot record the mount's failed end");
        }
    }

    /// Takes what the last mount on `dir` left of a failed end.
    pub fn take_failure(store: &Path, dir: &Path) -> Option<Failure> {
        let path = path_for(store, dir).with_extension("failed");
        let raw = std::fs::read(&path).ok()?;
        let _ = std::fs::remove_file(&path);
        // Only the room taken at the start (a clean end removes it, a
        // killed process leaves it): nothing to report.
        if raw.trim_ascii().is_empty() {
            return None;
        }
        serde_json::from_slice(raw.trim_ascii()).ok()
    }

    /// The pid of the live process mounted on `dir`, if any.
    pub fn find(store: &Path, dir: &Path) -> Option<u32> {
        Self::holder(store, dir).map(|h| h.pid)
    }

    /// The live process mounted on `dir`, if any.
    pub fn holder(store: &Path, dir: &Path) -> Option<Holder> {
        let e: Entry = serde_json::from_slice(&std::fs::read(path_for(store, dir)).ok()?).ok()?;
        alive(e.pid).then_some(Holder { pid: e.pid, stays: e.stays })
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn alive(pid: u32) -> bool {
    // Signal 0 checks existence; a zombie child of ours does not count.
    // Nor does a process whose first thread is a zombie while others are
    // still being torn down: those hold its files (the store's lock) a
    // moment longer, so it is alive until every thread is gone.
    let exists = unsafe { libc::kill(pid as i32, 0) } == 0;
    let live_task = |stat: &str| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !(state.starts_with('Z') || state.starts_with('X'))
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    exists
        && tasks
            .flatten()
            .any(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| live_task(&s)))
}

/// Live mounts recorded in `store`.
fn live(store: &Path) -> Vec<Entry> {
    let Ok(rd) = std::fs::read_dir(store.join("mounts")) else { return Vec::new() };
    let read = |p: PathBuf| serde_json::from_slice::<Entry>(&std::fs::read(p).ok()?).ok();
    rd.flatten().filter_map(|e| read(e.path())).filter(|m| alive(m.pid)).collect()
}

/// True when process `pid` serves a mount of `store` other than `dir`.
pub fn serves_other(store: &Path, pid: u32, dir: &Path) -> bool {
    live(store).iter().any(|m| m.pid == pid && m.dir != dir)
}

/// True when process `pid` still serves a mount of `store`.
pub fn serves_any(store: &Path, pid: u32) -> bool {
    live(store).iter().any(|m| m.pid == pid)
}
