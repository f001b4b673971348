//! `<store>/mounts/<id>.json`: which process mounts what where, so
//! `forkfs umount` can wait for it and a refused mount can say who holds
//! the store. Informational: the store's own lock is what excludes.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
        let e = Entry { pid: std::process::id(), dir: dir.to_path_buf(), volume: volume.into() };
        std::fs::write(&path, serde_json::to_vec(&e)?)?;
        Ok(Record { path })
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

/// " (a mount of VOL on DIR, pid N)" for each live mount recorded, or "".
pub fn describe_holder(store: &Path) -> String {
    let Ok(rd) = std::fs::read_dir(store.join("mounts")) else { return String::new() };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Ok(b) = std::fs::read(e.path()) else { continue };
        let Ok(m) = serde_json::from_slice::<Entry>(&b) else { continue };
        if alive(m.pid) {
            out.push(format!("a mount of {} on {}, pid {}", m.volume, m.dir.display(), m.pid));
        }
    }
    if out.is_empty() { String::new() } else { format!(" ({})", out.join("; ")) }
}
