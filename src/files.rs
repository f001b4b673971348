//! The store's files are its owner's: directories 0700 and files 0600,
//! whatever the process's umask (a store holds every volume's data).
//! Files other components create inside (RocksDB's) are out of reach all
//! the same, behind the store directory's 0700.

use std::fs::{OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const FILE_MODE: u32 = 0o600;
pub const DIR_MODE: u32 = 0o700;

/// Makes every file and directory this process creates from now on its
/// owner's only (umask 077). The forkfs binaries call it first, so that
/// what other components (RocksDB) create in a store is private too.
pub fn restrict_umask() {
    // SAFETY: umask(2) only changes the process's file mode creation mask.
    unsafe { libc::umask(0o077) };
}

/// Creates `dir` (and its parents) and makes it 0700.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
}

/// Options that create a file 0600.
pub fn private_file() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Writes `data` to a new or truncated 0600 file at `path` and syncs it.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = private_file().write(true).create(true).truncate(true).open(path)?;
    // An existing file keeps its mode through open: set it.
    f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    f.write_all(data)?;
    f.sync_all()
}
