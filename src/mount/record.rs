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
}

/// Removes its file when dropped.
pub struct Record {
    path: PathBuf,
}

fn path_for(store: &Path, dir: &Path) -> PathBuf {
    let h = blake3::hash(dir.as_os_str().as_encoded_bytes());
    store.join("mounts").join(format!("{}.json", &h.to_hex()[..16]))
}

impl Record {
    pub fn write(store: &Path, dir: &Path, volume: &str) -> Result<Record> {
        let path = path_for(store, dir);
        std::fs::create_dir_all(path.parent().expect("has a parent"))?;
        let _ = std::fs::remove_file(path.with_extension("failed"));
        let e = Entry { pid: std::process::id(), dir: dir.to_path_buf(), volume: volume.into() };
        std::fs::write(&path, serde_json::to_vec(&e)?)?;
        Ok(Record { path })
    }

    /// Ends the record; a failed end leaves why, for `forkfs umount`.
    pub fn end(self, failure: Option<&forkfs::Error>) {
        if let Some(e) = failure {
            let f = Failure { kind: e.kind(), message: forkfs::one_line(e) };
            if let Ok(raw) = serde_json::to_vec(&f) {
                let _ = std::fs::write(self.path.with_extension("failed"), raw);
            }
        }
    }

    /// Takes what the last mount on `dir` left of a failed end.
    pub fn take_failure(store: &Path, dir: &Path) -> Option<Failure> {
        let path = path_for(store, dir).with_extension("failed");
        let raw = std::fs::read(&path).ok()?;
        let _ = std::fs::remove_file(&path);
        serde_json::from_slice(&raw).ok()
    }

    /// The pid of the live process mounted on `dir`, if any.
    pub fn find(store: &Path, dir: &Path) -> Option<u32> {
        let e: Entry = serde_json::from_slice(&std::fs::read(path_for(store, dir)).ok()?).ok()?;
        alive(e.pid).then_some(e.pid)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn alive(pid: u32) -> bool {
    // Signal 0 checks existence; a zombie child of ours does not count.
    let exists = unsafe { libc::kill(pid as i32, 0) } == 0;
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(false)
}

/// Live mounts recorded in `store`.
fn live(store: &Path) -> Vec<Entry> {
    let Ok(rd) = std::fs::read_dir(store.join("mounts")) else { return Vec::new() };
    let read = |p: PathBuf| serde_json::from_slice::<Entry>(&std::fs::read(p).ok()?).ok();
    rd.flatten().filter_map(|e| read(e.path())).filter(|m| alive(m.pid)).collect()
}

/// True when process `pid` still serves a mount of `store`.
pub fn serves_any(store: &Path, pid: u32) -> bool {
    live(store).iter().any(|m| m.pid == pid)
}
