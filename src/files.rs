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

/// Golden files of the on-disk formats (docs/FORMAT.md): checks that
/// `encoded`, what the real encoder made of a fixed input, is byte for byte
/// `tests/golden/NAME`, and returns the checked-in bytes for the decoding
/// half of the test. `FORKFS_BLESS=1` rewrites the file instead: only for
/// a deliberate format change, which must come with a new format version
/// or a reader of the old bytes, and a FORMAT.md update.
#[cfg(test)]
pub(crate) fn golden(name: &str, encoded: &[u8]) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("FORKFS_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("golden dir");
        std::fs::write(&path, encoded).expect("golden file written");
    }
    let want = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (FORKFS_BLESS=1 writes it)", path.display()));
    if want != encoded {
        let at = want.iter().zip(encoded).position(|(a, b)| a != b);
        panic!(
            "the encoding of {name} differs from tests/golden/{name} (first at byte {}, {} vs {} \
             bytes): the on-disk format changed; see docs/FORMAT.md and files::golden",
            at.unwrap_or(want.len().min(encoded.len())),
            encoded.len(),
            want.len()
        );
    }
    want
}

/// Renames `from` to `to`, failing with `AlreadyExists` instead of
/// replacing a file already at `to` (renameat2's RENAME_NOREPLACE).
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    renameat2(from, to, libc::RENAME_NOREPLACE)
}

/// Swaps the names of `a` and `b` in one step; both must exist
/// (renameat2's RENAME_EXCHANGE: `ENOENT` when one does not).
pub fn rename_exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    renameat2(a, b, libc::RENAME_EXCHANGE)
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags)
    };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}
