//! What the kernel may cache of the mount, and for how long: attributes
//! and names (TTL; missing names too, `Workspace::misses_cacheable`),
//! file pages and directory listings across opens
//! (`dir_cache`), and the requests it need not send (`NO_FLUSH`). This
//! mount is the volume's only writer, so caches go stale only by a
//! restore (which drops what it changed, see `mount::invalidate`) or, for
//! a listing's "..", by a move ([`Moved`]).

use super::Fuse;
use forkfs::fs::{FileKind, Inode};
use fuser::FopenFlags;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// How long the kernel may cache attributes and names.
pub(super) const TTL: Duration = Duration::from_secs(60);

/// A close of a file sends no FLUSH: writes are in the store when they
/// are acknowledged, and POSIX locks are the kernel's (none are kept
/// here), so a FLUSH had nothing to do but cost a round trip per close.
pub(super) const NO_FLUSH: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

/// The most moved directories remembered (see [`Moved`]).
const MAX_MOVED: usize = 1 << 16;

/// Directories moved to another parent since their listing was last
/// sent: their cached listings name the old "..". `None` once more than
/// [`MAX_MOVED`] wait: no listing is cached from then on, so the set
/// stays bounded.
pub struct Moved(parking_lot::Mutex<Option<HashSet<u64>>>);

impl Default for Moved {
    fn default() -> Moved {
        Moved(parking_lot::Mutex::new(Some(HashSet::new())))
    }
}

impl Fuse {
    /// Notes that `name` in `dir`, if a directory, is moving to another
    /// parent.
    pub(super) fn moving(&self, dir: u64, name: &OsStr) {
        let Ok((i, ino)) = self.ws.lookup(dir, name.as_bytes()) else { return };
        if i.kind != FileKind::Dir {
            return;
        }
        let mut moved = self.moved.0.lock();
        if let Some(m) = moved.as_mut() {
            m.insert(ino);
            if m.len() > MAX_MOVED {
                *moved = None;
            }
        }
    }

    /// How the kernel may cache the listing of directory `i`: across
    /// opens (FOPEN_CACHE_DIR with FOPEN_KEEP_CACHE) for the workspace's
    /// own directories, whose listings change only through this mount
    /// (the kernel drops the cache when it changes one) or by a restore
    /// (which drops the inodes it changed, see `invalidate`); not while
    /// the listing must record an access time (it has to reach the
    /// mount), not at the first open after a move to another parent
    /// (the listing's ".." changes, and the kernel only watches the
    /// mtime, which a move leaves), and not for `.forkfs`, whose listings
    /// change with versions.
    pub(super) fn dir_cache(&self, ino: u64, i: &Inode) -> FopenFlags {
        let moved = self.moved.0.lock().as_mut().is_none_or(|m| m.remove(&ino));
        match !moved && self.ws.own(ino).is_ok() && !self.ws.access_due(ino, i) {
            true => FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            false => FopenFlags::empty(),
        }
    }
}
