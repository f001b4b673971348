//! The store's directory lock: one process opens a store at a time. Taken
//! with `flock` on `<store>/lock` before anything else is opened, so "in
//! use" is known from the lock itself, never from another component's
//! error message, and it goes with the process however it ends. The lock
//! file names its holder (pid, host, start, command line), so "in use"
//! says who holds the store and how to stop it.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

pub const LOCK_FILE: &str = "lock";

/// Held while the store is open; released when dropped (or the process ends).
pub struct DirLock {
    _file: File,
    /// Where it was taken, and the (device, inode) of the file locked
    /// there, for [`DirLock::check`].
    path: std::path::PathBuf,
    id: (u64, u64),
}

impl DirLock {
    /// Takes the lock of the store at `dir`, or fails as "in use".
    pub fn take(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let file = crate::files::private_file()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        // SAFETY: flock on an fd this function owns; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let by = Holder::of(dir).map(|h| format!(" ({h})")).unwrap_or_default();
                return Err(Error::store_in_use(format!(
                    "the store at {} is in use by another forkfs process{by}",
                    dir.display()
                )));
            }
            return Err(Error::from(e).context(format!("locking {}", path.display())));
        }
        // Who holds it, for whoever finds it held; best effort (the lock
        // itself is the flock).
        let mut file = file;
        let me = serde_json::to_vec(&Holder::me()).unwrap_or_default();
        let _ = file.set_len(0).and_then(|()| file.write_all(&me));
        // Absolute: a daemon changes its working directory.
        let path = std::fs::canonicalize(&path)?;
        let id = file_id(&file.metadata()?);
        Ok(DirLock { _file: file, path, id })
    }

    /// Fails if the store's directory is no longer where this process
    /// opened it: removed, moved away or replaced (its lock file is not
    /// the one this process holds). Then nothing written from here on
    /// reaches the store anyone will open at that path, so no write may
    /// be acknowledged as durable: every synced commit checks, after it
    /// (one `stat`, next to an fsync). Another failure of the `stat`
    /// (EACCES, ESTALE) is reported as itself.
    pub fn check(&self) -> Result<()> {
        let same = match std::fs::metadata(&self.path) {
            Ok(now) => file_id(&now) == self.id,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                return Err(Error::from(e).context(format!("checking {}", self.path.display())));
            }
        };
        if same {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(&self.path);
        Err(Error::new(
            crate::error::ErrorKind::Unavailable,
            format!(
                "the store directory {} was removed, moved or replaced under this process: \
                 what it writes no longer reaches the store; stop it (SIGTERM)",
                dir.display()
            ),
        ))
    }
}

/// A file's (device, inode).
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// The process holding a store, as its lock file says.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    /// When it took the lock (ms since the epoch).
    pub since_ms: u64,
    /// Its command line.
    pub command: String,
}

impl Holder {
    fn me() -> Holder {
        Holder {
            pid: std::process::id(),
            host: crate::clock::hostname(),
            since_ms: crate::clock::now_ms(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }

    /// The holder the lock file of the store at `dir` names, if it names
    /// one (a store last held by an older forkfs has an empty file).
    pub fn of(dir: &Path) -> Option<Holder> {
        serde_json::from_slice(&std::fs::read(dir.join(LOCK_FILE)).ok()?).ok()
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let since = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.since_ms);
        write!(
            f,
            "pid {} on {}, since {}: `{}`; `kill {}` (SIGTERM) stops it",
            self.pid,
            self.host,
            humantime::format_rfc3339_seconds(since),
            self.command,
            self.pid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_told_the_store_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::take(dir.path()).unwrap();
        let e = DirLock::take(dir.path()).err().expect("a second lock must fail");
        assert!(e.is_store_in_use(), "{e}");
        // It names the holder: this process.
        let me = std::process::id();
        assert!(e.to_string().contains(&format!("pid {me} on ")), "{e}");
        assert!(e.to_string().contains(&format!("`kill {me}`")), "{e}");
        assert_eq!(Holder::of(dir.path()).map(|h| h.pid), Some(me));
        drop(first);
        DirLock::take(dir.path()).expect("free again once the holder is gone");
    }
}
