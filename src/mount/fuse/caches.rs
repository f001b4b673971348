//! What the kernel may cache of the mount, and for how long: attributes
//! and names (TTL; missing names too, `Workspace::misses_cacheable`),
//! file pages, and directory listings, which it keeps across opens: the
//! mount answers OPENDIR with ENOSYS once (FUSE_NO_OPENDIR_SUPPORT), so
//! the kernel sends neither OPENDIR nor RELEASEDIR again and treats every
//! directory as opened with FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR; and the
//! requests it need not send (`NO_FLUSH`). This mount is the volume's only
//! writer, so a cached listing goes stale only where it changes without
//! the kernel, and each such place drops it:
//! - a restore (or another host's head taken) drops what it changed, see
//!   `mount::invalidate`;
//! - a rename changes a directory's ctime, and a move to another parent
//!   its listing's "..": [`Fuse::moved`];
//! - `.forkfs/versions` changes with versions and tags: the names hook
//!   of `mount::host`;
//! - a directory whose attributes are set must record its next listing's
//!   access (relatime): [`Fuse::attrs_set`], after SETATTR, SETXATTR,
//!   REMOVEXATTR and the inode-flag ioctl.
//!
//! A listing the kernel serves from its cache does not reach the mount,
//! so it records no access time: with relatime a directory's access is
//! recorded at the first listing after a change of it or of its
//! attributes (which dropped the cached listing), but not once a day
//! while it stays unchanged and cached. strictatime keeps every listing
//! uncached (see `init`).

use super::Fuse;
use forkfs::fs::FileKind;
use fuser::{FopenFlags, INodeNo};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// How long the kernel may cache attributes and names.
pub(super) const TTL: Duration = Duration::from_secs(60);

/// A close of a file sends no FLUSH: writes are in the store when they
/// are acknowledged, and POSIX locks are the kernel's (none are kept
/// here), so a FLUSH had nothing to do but cost a round trip per close.
pub(super) const NO_FLUSH: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

impl Fuse {
    /// The directory `name` in `dir`, if it is one (before a move).
    pub(super) fn dir_named(&self, dir: u64, name: &OsStr) -> Option<u64> {
        let (i, ino) = self.ws.lookup(dir, name.as_bytes()).ok()?;
        (i.kind == FileKind::Dir).then_some(ino)
    }

    /// Directory `ino` was renamed: if it moved to another parent, the
    /// ".." of its cached listing is stale, and its ctime moved either way
    /// (its next listing must record its access). Dropped before the
    /// rename's reply: for a move to another parent the kernel holds the
    /// directory's lock until then, so no listing of it can be read or
    /// cached in between.
    pub(super) fn moved(&self, ino: u64) {
        self.drop_listing(ino);
    }

    /// The attributes (mode, owner, times, extended attributes, inode
    /// flags) of `ino` were set: if it is a directory, its access is due
    /// now (its ctime moved; its atime may have been set back), so its
    /// cached listing goes and the next listing reaches the mount, which
    /// records it. Before the reply, under the kernel's lock of the inode.
    /// `kind`, when the caller knows it, spares looking it up.
    pub(super) fn attrs_set(&self, ino: u64, kind: Option<FileKind>) {
        let kind = kind.or_else(|| self.ws.stat(ino).ok().map(|(i, _)| i.kind));
        if kind == Some(FileKind::Dir) {
            self.drop_listing(ino);
        }
    }

    fn drop_listing(&self, ino: u64) {
        if let Some(n) = self.kernel.get() {
            // ENOENT: the kernel does not hold the inode, nothing cached.
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }
}
