//! Durable puts into a local object directory.
//!
//! An object's bytes go to a staging file, are synced, and only then take
//! the object's name, and the directory is synced: power lost at any
//! point leaves the old object or the new one, never a short one
//! (`LocalFileSystem::put` renames before any sync: a power cut there
//! emptied a head object in the power-cut test).
//!
//! Staging names end in `#<digits>`, which `LocalFileSystem` leaves out of
//! listings. In a directory one process owns (the embedded store, under
//! the store's lock), a record put again (a head, a volume record) keeps
//! its previous file as `<name>#0`, the spare: the next put writes into
//! the spare and swaps it with the object in one step
//! (`renameat2(RENAME_EXCHANGE)`), so no file is made and none deleted.
//! Without that, each checkpoint freed an inode and made one, and ext4
//! without a journal (this project's benchmark machine) scans past every
//! inode freed in the last minutes on each allocation: operations slowed
//! down as they went (docs/BENCHMARKS.md). A directory other processes
//! may write (a `file://` remote) gets a new staging file per put, as
//! before: conditional puts there compare inodes.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The suffix of an object's spare, its previous file.
const SPARE: &str = "#0";

/// Puts of one name never share its spare: one lock per stripe of names.
static STRIPES: [Mutex<()>; 16] = [const { Mutex::new(()) }; 16];

/// The spare of the object at `path`: its file before the last put, kept
/// to be written over by the next one (never read as the object).
pub(super) fn spare_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(SPARE);
    PathBuf::from(s)
}

/// Writes the object at `path` durably. With `reuse` (a directory only
/// this process writes), through the object's spare; see the module's
/// comment.
pub(super) fn put(path: &Path, data: &[u8], reuse: bool) -> Result<()> {
    let dir = path.parent().ok_or_else(|| Error::invalid("an object key names a directory"))?;
    if !dir.is_dir() {
        // The new directories' names must be durable too: sync the parent
        // of each one created.
        let mut missing = vec![dir];
        while let Some(up) = missing.last().and_then(|d| d.parent()).filter(|d| !d.is_dir()) {
            missing.push(up);
        }
        crate::files::private_dir(dir)?;
        for d in missing.iter().rev() {
            if let Some(parent) = d.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
        }
    }
    // Held until the swap is durable: the next put of the name writes
    // over the file the swap set aside, which must not happen while a
    // power cut could still undo the swap.
    let _one = reuse.then(|| STRIPES[stripe(path)].lock());
    if reuse {
        let spare = spare_of(path);
        staged_over(&spare, path, data)?;
        match crate::files::rename_exchange(&spare, path) {
            Ok(()) => {}
            // A new object (no file to swap with), or a filesystem that
            // cannot swap: the staged file takes the name.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS)) =>
            {
                std::fs::rename(&spare, path)?
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut tmp: OsString = path.as_os_str().to_owned();
        tmp.push(format!("#{}{n:010}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        staged(&tmp, data)?;
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// `data`, synced, in the spare at `at` of the object at `object`: written
/// over when it is a file of its own (one link, not the object's: a hard
/// link, from a copy of the store made with `cp -l` or left by a repair,
/// must not carry the write into another name), else in a new file.
fn staged_over(at: &Path, object: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let own = match std::fs::symlink_metadata(at) {
        Ok(m) => {
            let same = std::fs::symlink_metadata(object)
                .is_ok_and(|o| (o.dev(), o.ino()) == (m.dev(), m.ino()));
            m.is_file() && m.nlink() == 1 && !same
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return staged(at, data),
        Err(e) => return Err(e.into()),
    };
    if !own {
        std::fs::remove_file(at)?;
        return staged(at, data);
    }
    write_synced(at, data, || {
        let f = crate::files::private_file().write(true).open(at)?;
        f.set_len(0)?;
        Ok(f)
    })
}

/// `data`, synced, in a new file at `at`.
fn staged(at: &Path, data: &[u8]) -> Result<()> {
    write_synced(at, data, || crate::files::private_file().write(true).create_new(true).open(at))
}

/// `data` written and synced into the file `open` gives for `at`, which
/// is removed if that fails.
fn write_synced(
    at: &Path,
    data: &[u8],
    open: impl FnOnce() -> std::io::Result<std::fs::File>,
) -> Result<()> {
    let written = (|| -> std::io::Result<()> {
        let mut f = open()?;
        f.write_all(data)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(at);
        return Err(e.into());
    }
    Ok(())
}

fn stripe(path: &Path) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    (h.finish() % STRIPES.len() as u64) as usize
}

/// Removes the spare of the object at `path`, if it has one (the object
/// was deleted).
pub(super) fn remove_spare(path: &Path) -> Result<()> {
    let _one = STRIPES[stripe(path)].lock();
    match std::fs::remove_file(spare_of(path)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_put_again_swaps_with_the_spare_and_makes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("heads").join("1.json");
        put(&p, b"one", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        assert!(!spare_of(&p).exists(), "a new object leaves no spare");
        let first = std::fs::metadata(&p).unwrap().ino();
        put(&p, b"two", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read(spare_of(&p)).unwrap(), b"one", "the old file is the spare");
        let second = std::fs::metadata(&p).unwrap().ino();
        put(&p, b"three!", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"three!");
        // The two files take turns: the third put wrote over the first's.
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), first);
        assert_eq!(std::fs::metadata(spare_of(&p)).unwrap().ino(), second);
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        remove_spare(&p).unwrap();
        assert!(!spare_of(&p).exists());
        remove_spare(&p).unwrap();
    }

    #[test]
    fn a_spare_left_longer_by_a_crash_is_cut_to_the_new_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("1.json");
        put(&p, b"old", true).unwrap();
        std::fs::write(spare_of(&p), vec![b'x'; 10_000]).unwrap();
        put(&p, b"new", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
    }

    #[test]
    fn a_spare_with_another_name_is_never_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("1.json");
        put(&p, b"one", true).unwrap();
        put(&p, b"two", true).unwrap();
        // A copy of the store made with hard links shares the spare's file.
        let backup = dir.path().join("backup-of-1.json");
        std::fs::hard_link(spare_of(&p), &backup).unwrap();
        put(&p, b"three", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"three");
        assert_eq!(std::fs::read(&backup).unwrap(), b"one", "the write went into another name");
        // A spare that is the object itself (a second name for its file).
        std::fs::remove_file(spare_of(&p)).unwrap();
        std::fs::hard_link(&p, spare_of(&p)).unwrap();
        put(&p, b"four", true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"four");
        assert_eq!(std::fs::read(spare_of(&p)).unwrap(), b"three");
    }

    #[test]
    fn without_reuse_every_put_is_a_new_file_and_no_spare() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("1.json");
        put(&p, b"one", false).unwrap();
        let first = std::fs::metadata(&p).unwrap().ino();
        put(&p, b"two", false).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_ne!(std::fs::metadata(&p).unwrap().ino(), first);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn spares_are_not_listed_as_objects() {
        use object_store::ObjectStore;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("heads").join("1.json");
        put(&p, b"one", true).unwrap();
        put(&p, b"two", true).unwrap();
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let listed: Vec<String> = rt.block_on(async {
            use futures::TryStreamExt;
            let l: Vec<_> = fs.list(None).try_collect().await.unwrap();
            l.into_iter().map(|m| m.location.to_string()).collect()
        });
        assert_eq!(listed, ["heads/1.json"]);
    }
}
