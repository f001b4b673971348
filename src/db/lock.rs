//! The store's directory lock: one process opens a store at a time. Taken
//! with `flock` on `<store>/lock` before anything else is opened, so "in
//! use" is known from the lock itself, never from another component's
//! error message, and it goes with the process however it ends.

use crate::error::{Error, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

pub const LOCK_FILE: &str = "lock";

/// Held while the store is open; released when dropped (or the process ends).
pub struct DirLock {
    _file: File,
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
                return Err(Error::store_in_use(format!(
                    "the store at {} is in use by another forkfs process",
                    dir.display()
                )));
            }
            return Err(Error::from(e).context(format!("locking {}", path.display())));
        }
        Ok(DirLock { _file: file })
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
        drop(first);
        DirLock::take(dir.path()).expect("free again once the holder is gone");
    }
}
