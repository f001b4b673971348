//! The kernel FUSE requests, answered from a [`Workspace`]. Every request
//! is one core call; errors become errnos in `convert::errno` only.

mod caches;
mod flags;

use super::convert::{attr, errno, file_type, kernel_time, kind_of_mode, no_entry};
use super::workspace::Workspace;
use caches::{NO_FLUSH, TTL};
use forkfs::Error;
use forkfs::Posix;
use forkfs::fs::{Content, FileKind, Inode, NewNode, ROOT_INO, RenameMode, SetAttr, XattrMode};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

pub struct Fuse {
    pub ws: Arc<Workspace>,
    /// The session's notifier, set once the session exists: what drops a
    /// cached listing (see `caches.rs`).
    pub kernel: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// The kernel sends no OPENDIR or RELEASEDIR (see `caches.rs`): set
    /// at INIT when the kernel offers it and access times allow it.
    pub no_opendir: bool,
}

/// Answers `reply` with `$ok` applied to the value, or the error's errno.
macro_rules! answer {
    ($reply:expr, $result:expr, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => $reply.error(errno(&e)),
        }
    };
}

impl Fuse {
    fn attr_of(&self, i: &Inode) -> fuser::FileAttr {
        self.attr_at(i, i.ino)
    }

    /// Attributes of `i`, under FUSE inode number `fuse_ino`.
    fn attr_at(&self, i: &Inode, fuse_ino: u64) -> fuser::FileAttr {
        attr(i, fuse_ino, self.ws.block_size, self.ws.allocated(fuse_ino, i))
    }

    /// Replies with an entry the kernel counts as a lookup of the inode
    /// (until its FORGET): directories are counted here too (see
    /// `Workspace::looked_up`).
    fn entry(&self, r: Result<(Inode, u64), Error>, reply: ReplyEntry) {
        answer!(reply, r, |(i, fuse_ino)| {
            if i.kind == FileKind::Dir {
                self.ws.looked_up(fuse_ino);
            }
            reply.entry(&TTL, &self.attr_at(&i, fuse_ino), Generation(0))
        })
    }

    /// Creates `name` as `node` (mode bits from `mode`; owner from the
    /// request and the directory).
    fn make(
        &self,
        req: &Request,
        (parent, name): (u64, &OsStr),
        (mode, umask): (u32, u32),
        mut node: NewNode<'_>,
    ) -> Result<(Inode, u64), Error> {
        let head = self.ws.head()?;
        let parent = self.ws.own(parent)?;
        reserved(parent, name)?;
        let dir = self.ws.inode(parent)?;
        let perm = (mode & 0o7777) as u16;
        (node.uid, node.gid, node.perm) =
            self.ws.owner_in(&dir, req.uid(), req.gid(), node.kind, perm);
        node.umask = (umask & 0o777) as u16;
        head.make(parent, name.as_bytes(), &node).map(own)
    }

    fn set_attr(&self, ino: u64, a: SetAttr) -> Result<Inode, Error> {
        self.ws.head()?.set_attr(self.ws.own(ino)?, &a)
    }
}

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        // The kernel checks POSIX ACLs (kept as attributes) and leaves the
        // umask to `make`, which applies a default ACL instead when the
        // directory has one (see forkfs::fs::acl).
        let acls = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        if let Err(missing) = config.add_capabilities(acls) {
            tracing::warn!(
                ?missing,
                "the kernel does not offer POSIX ACLs; they will not be checked"
            );
        }
        // File handles (open_by_handle_at, NFS): the kernel may look up "."
        // and ".." (see Workspace::lookup). Inode numbers are never reused,
        // so generation 0 keeps a handle of a removed file stale.
        // Inode flags on directories too (chattr +i DIR).
        let _ = config.add_capabilities(InitFlags::FUSE_HAS_IOCTL_DIR);
        // Set-user-ID, set-group-ID and file capabilities are killed here
        // on write, truncation and chown (see `setattr` and `write`), so
        // the kernel stops asking for security.capability before every
        // write and for the attributes before every chown (two requests
        // of the sixteen an untarred file cost).
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2) {
            tracing::warn!(?missing, "the kernel does not let the mount kill privileges");
        }
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT) {
            tracing::warn!(?missing, "the kernel does not offer export support");
        }
        // Directories opened without a round trip, their listings cached
        // across opens (see `caches.rs`); not with strictatime, where
        // every listing must reach the mount.
        self.no_opendir = config.capabilities().contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            && self.ws.listings_cacheable();
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.ws.lookup(parent.0, name.as_bytes()) {
            // A miss the kernel keeps for the TTL (a negative entry): git
            // asks for a `.gitignore` in every directory on every run.
            Err(e)
                if e.posix_condition() == Some(Posix::NoEntry)
                    && self.ws.misses_cacheable(parent.0) =>
            {
                reply.entry(&TTL, &no_entry(), Generation(0))
            }
            r => self.entry(r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ws.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer!(reply, self.ws.stat(ino.0), |(i, n)| reply.attr(&TTL, &self.attr_at(&i, n)))
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The kernel leaves killing set-user-ID and set-group-ID to us
        // (FUSE_HANDLE_KILLPRIV_V2): it asks on a truncation by a caller
        // without CAP_FSETID, and with a SETATTR of nothing else before
        // a write of another kind (copy_file_range, fallocate). fuser does
        // not pass its flag on: root stands for CAP_FSETID. A change of
        // owner kills them in the core.
        let nothing = (mode, uid, gid, size, atime, mtime) == (None, None, None, None, None, None);
        let a = SetAttr {
            kill_suidgid: req.uid() != 0 && (size.is_some() || nothing),
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            // `touch`: at least one time given as now, none chosen.
            times_now: [atime, mtime].iter().any(|t| matches!(t, Some(TimeOrNow::Now)))
                && [atime, mtime].iter().all(|t| !matches!(t, Some(TimeOrNow::SpecificTime(_)))),
            atime: atime.map(kernel_time),
            mtime: mtime.map(kernel_time),
        };
        answer!(reply, self.set_attr(ino.0, a), |i| {
            self.attrs_set(ino.0, Some(i.kind));
            reply.attr(&TTL, &self.attr_of(&i))
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        answer!(reply, self.ws.stat(ino.0), |(i, _)| match &i.content {
            Content::Target(t) => reply.data(t),
            _ => reply.error(Errno::EINVAL),
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = kind_of_mode(mode) else { return reply.error(Errno::EINVAL) };
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            return reply.error(Errno::EINVAL);
        }
        let r = self.make(req, (parent.0, name), (mode, umask), node(kind, rdev, None));
        self.entry(r, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.make(req, (parent.0, name), (mode, umask), node(FileKind::Dir, 0, None));
        self.entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let ws = &self.ws;
        let r = ws
            .head()
            .and_then(|h| h.unlink(ws.own(parent.0)?, name.as_bytes(), &|i| ws.is_open(i)));
        answer!(reply, r, |()| reply.ok())
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let ws = &self.ws;
        let r =
            ws.head().and_then(|h| h.rmdir(ws.own(parent.0)?, name.as_bytes(), &|i| ws.is_open(i)));
        answer!(reply, r, |()| reply.ok())
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let t = target.as_os_str().as_bytes();
        let r =
            self.make(req, (parent.0, link_name), (0o777, 0), node(FileKind::Symlink, 0, Some(t)));
        self.entry(r, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let whiteout = flags.contains(RenameFlags::RENAME_WHITEOUT);
        let rest = flags - RenameFlags::RENAME_WHITEOUT;
        let mode = if rest == RenameFlags::RENAME_EXCHANGE && !whiteout {
            RenameMode::Exchange
        } else if rest == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if rest.is_empty() {
            RenameMode::Replace
        } else {
            return reply.error(Errno::EINVAL);
        };
        let ws = &self.ws;
        // Directories renamed: their cached listings' ".." (moved to
        // another parent) and access times (their ctime moves).
        let mut moving = Vec::new();
        moving.extend(self.dir_named(parent.0, name));
        if mode == RenameMode::Exchange {
            moving.extend(self.dir_named(newparent.0, newname));
        }
        let r = ws.head().and_then(|h| {
            let (from, to) = (ws.own(parent.0)?, ws.own(newparent.0)?);
            reserved(to, newname)?;
            let (a, b) = ((from, name.as_bytes()), (to, newname.as_bytes()));
            if whiteout {
                // The whiteout is the caller's, as a mknod of it would be.
                let dir = ws.inode(from)?;
                let (uid, gid, _) = ws.owner_in(&dir, req.uid(), req.gid(), FileKind::CharDev, 0);
                h.rename_whiteout(a, b, mode, (uid, gid), &|i| ws.is_open(i))
            } else {
                h.rename(a.0, a.1, b.0, b.1, mode, &|i| ws.is_open(i))
            }
        });
        if r.is_ok() {
            moving.into_iter().for_each(|d| self.moved(d));
        }
        answer!(reply, r, |()| reply.ok())
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let ws = &self.ws;
        let r = ws.head().and_then(|h| {
            let dir = ws.own(newparent.0)?;
            reserved(dir, newname)?;
            h.link(ws.own(ino.0)?, dir, newname.as_bytes()).map(own)
        });
        self.entry(r, reply)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writes = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        let r = self.ws.stat(ino.0).and_then(|(i, _)| {
            if writes {
                self.ws.head()?;
                self.ws.own(ino.0)?;
                // chattr +i: no writing; +a: only appending.
                i.check_not_immutable()?;
                let appends = flags.0 & libc::O_APPEND != 0 && flags.0 & libc::O_TRUNC == 0;
                if !appends {
                    i.check_mutable()?;
                }
            }
            match i.kind {
                FileKind::Dir => Err(Error::posix(Posix::IsDir, "is a directory")),
                _ => Ok(i),
            }
        });
        answer!(reply, r, |i| {
            // A read that records the access must reach the mount: the
            // kernel's cached pages of this file are dropped then.
            let reads = flags.0 & libc::O_ACCMODE != libc::O_WRONLY;
            let cache = match reads && self.ws.access_due(ino.0, &i) {
                true => FopenFlags::empty(),
                false => FopenFlags::FOPEN_KEEP_CACHE,
            };
            reply.opened(FileHandle(self.ws.open(ino.0)), cache | NO_FLUSH)
        })
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        answer!(reply, self.ws.read(ino.0, offset, size), |b| reply.data(&b))
    }

    /// Only SEEK_DATA and SEEK_HOLE reach a filesystem (the kernel does
    /// the rest).
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let r = match (u64::try_from(offset), whence) {
            (Ok(o), libc::SEEK_DATA) => self.ws.seek(ino.0, o, true),
            (Ok(o), libc::SEEK_HOLE) => self.ws.seek(ino.0, o, false),
            _ => Err(Error::posix(Posix::Invalid, "lseek: bad offset or whence")),
        };
        answer!(reply, r, |o| reply.offset(o as i64))
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // FUSE_HANDLE_KILLPRIV_V2: the kernel asks when the writer lacks CAP_FSETID.
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let r =
            self.ws.head().and_then(|h| h.write_file_as(self.ws.own(ino.0)?, offset, data, kill));
        answer!(reply, r, |()| reply.written(data.len() as u32))
    }

    /// Only the inode flags (`chattr`, `lsattr`) reach a filesystem
    /// through the kernel's file-attribute calls; whether the caller may
    /// set them is checked by the kernel first.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        match self.flags_ioctl(req, ino.0, cmd, in_data) {
            Some(r) => answer!(reply, r, |data| reply.ioctl(0, &data)),
            None => reply.error(Errno::ENOTTY),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let r = self.ws.copy(ino_in.0, offset_in, ino_out.0, offset_out, len);
        answer!(reply, r, |n| reply.written(n as u32))
    }

    /// Not sent for files (see [`NO_FLUSH`]): a close has nothing to do here.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        answer!(reply, self.ws.release(ino.0), |()| reply.ok())
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer!(reply, self.ws.sync(), |()| reply.ok())
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync(req, ino, fh, datasync, reply)
    }

    /// ENOSYS once, and the kernel opens directories by itself from then
    /// on (see `caches.rs`); without that, every listing reaches the
    /// mount. A directory removed while open lives on by the kernel's
    /// lookup count, not by its handles (`Workspace::looked_up`).
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        answer!(reply, self.ws.stat(ino.0), |(i, _)| match i.kind {
            FileKind::Dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            _ => reply.error(Errno::ENOTDIR),
        })
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Cookies: 1 ".", 2 "..", then 2 + the entry's name key (stable
        // whatever else is added or removed meanwhile).
        let dir = match self.ws.stat(ino.0) {
            Ok((d, _)) => d,
            Err(e) => return reply.error(errno(&e)),
        };
        if offset == 0 {
            self.ws.accessed(ino.0, &dir);
        }
        if offset < 1 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset < 2 && reply.add(INodeNo(dir.parent), 2, FileType::Directory, "..") {
            return reply.ok();
        }
        let mut after = offset.saturating_sub(2);
        loop {
            let (page, next) = match self.ws.list(ino.0, after) {
                Ok(p) => p,
                Err(e) => return reply.error(errno(&e)),
            };
            for (key, child, kind, name) in page {
                if reply.add(INodeNo(child), key + 2, file_type(kind), OsStr::from_bytes(&name)) {
                    return reply.ok();
                }
            }
            match next {
                Some(n) => after = n,
                None => return reply.ok(),
            }
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (blocks, bfree, bavail, bsize) = self.ws.space();
        reply.statfs(blocks, bfree, bavail, u64::MAX >> 1, u64::MAX >> 2, bsize, 255, bsize)
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let mode = match flags {
            0 => XattrMode::Set,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let r = self
            .ws
            .head()
            .and_then(|h| h.set_xattr(self.ws.own(ino.0)?, name.as_bytes(), value, mode));
        answer!(reply, r, |()| {
            self.attrs_set(ino.0, None);
            reply.ok()
        })
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        answer!(reply, self.ws.xattr(ino.0, name.as_bytes()), |v| xattr_reply(reply, size, &v))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        answer!(reply, self.ws.xattr_names(ino.0), |names| {
            let mut all = Vec::new();
            for n in names {
                all.extend_from_slice(&n);
                all.push(0);
            }
            xattr_reply(reply, size, &all)
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.ws.head().and_then(|h| h.remove_xattr(self.ws.own(ino.0)?, name.as_bytes()));
        answer!(reply, r, |()| {
            self.attrs_set(ino.0, None);
            reply.ok()
        })
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions).
        answer!(reply, self.ws.stat(ino.0), |_| reply.ok())
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.make(req, (parent.0, name), (mode, umask), node(FileKind::File, 0, None));
        answer!(reply, r, |(i, _)| {
            let fh = self.ws.open(i.ino);
            reply.created(
                &TTL,
                &self.attr_of(&i),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_KEEP_CACHE | NO_FLUSH,
            )
        })
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        answer!(reply, self.fallocate(ino.0, offset, length, mode), |()| reply.ok())
    }
}

impl Fuse {
    /// fallocate(2): space is never reserved (blocks are content-addressed
    /// and written at checkpoints), so plain allocation only extends the
    /// size; punching and zeroing ranges are supported.
    fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Result<(), Error> {
        let head = self.ws.head()?;
        let ino = self.ws.own(ino)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => false,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => true,
            libc::FALLOC_FL_ZERO_RANGE => true,
            _ => {
                return Err(Error::posix(Posix::Unsupported, "fallocate mode not supported"));
            }
        };
        if !zero {
            self.ws.check_room(ino, offset, length)?;
        }
        head.fallocate(ino, offset, length, zero, keep_size)
    }
}

/// An inode of the mounted tree with its FUSE inode number (the same).
fn own(i: Inode) -> (Inode, u64) {
    let ino = i.ino;
    (i, ino)
}

fn node(kind: FileKind, rdev: u32, target: Option<&[u8]>) -> NewNode<'_> {
    NewNode { kind, perm: 0, uid: 0, gid: 0, target, rdev, umask: 0 }
}

/// `.forkfs` in the root is the history; nothing else may take its name.
fn reserved(dir: u64, name: &OsStr) -> Result<(), Error> {
    if dir == ROOT_INO && name.as_bytes() == super::history::NAME {
        let why = ".forkfs is reserved for the version history";
        return Err(Error::posix(Posix::NotPermitted, why));
    }
    Ok(())
}

/// getxattr/listxattr: the size when asked (size 0), ERANGE if it does not fit.
fn xattr_reply(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}
