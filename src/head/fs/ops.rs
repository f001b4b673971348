//! Changes to a live fs volume: create, write, set attributes, remove,
//! rename, link, orphans. Each change is one [`Txn`]: one RocksDB batch,
//! under the head's gate (shared) and namespace lock, so a checkpoint sees
//! it whole or not at all. Errors name POSIX conditions (see [`Posix`]).

use super::FsHead;
use super::acl;
use super::inode::{Content, FL_APPEND, FL_SETTABLE, FileKind, INLINE_MAX, Inode, Time};
use super::reader::check_name;
use super::txn::{Txn, name_of};
use crate::error::{Error, Posix, Result};
use crate::head::blockmap::BlockMap;
use bytes::Bytes;

/// Links a file may have (ext4's limit).
pub const LINK_MAX: u32 = 65_000;
/// Largest file offset (2^63 - 1 would overflow block arithmetic).
pub const FILE_MAX: u64 = 1 << 60;

/// Attributes a caller may set.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
    /// The times given are "now" (utimensat's UTIME_NOW, `touch`), not
    /// chosen by the caller.
    pub times_now: bool,
    /// A regular file loses set-user-ID and set-group-ID (see
    /// [`Inode::kill_privs`]), as by a truncation or write by a caller
    /// without CAP_FSETID. A change of owner without a mode takes them
    /// regardless, as on Linux.
    pub kill_suidgid: bool,
}

/// A new inode's type and attributes.
#[derive(Clone, Debug)]
pub struct NewNode<'a> {
    pub kind: FileKind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// A symlink's target.
    pub target: Option<&'a [u8]>,
    /// A device node's number.
    pub rdev: u32,
    /// Permission bits to clear, unless the directory has a default ACL
    /// (which applies instead).
    pub umask: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace an existing target (rename(2)).
    Replace,
    /// Fail with EEXIST if the target exists (RENAME_NOREPLACE).
    NoReplace,
    /// Swap two existing names (RENAME_EXCHANGE).
    Exchange,
}

/// "No process has this inode open": unlinked inodes are deleted at once.
pub fn never_open(_: u64) -> bool {
    false
}

impl FsHead {
    /// Runs `f` as one transaction under the gate and the namespace lock.
    pub(super) fn txn<T>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<T>) -> Result<T> {
        let head = self.head();
        let _gate = head.gate.read();
        head.check_live()?;
        let _ns = head.ns.lock();
        let mut t = Txn::new(head);
        let out = f(&mut t)?;
        t.commit()?;
        Ok(out)
    }

    /// Changes one inode's record (its ctime follows).
    pub(super) fn inode_txn(
        &self,
        ino: u64,
        f: impl FnOnce(&mut Inode) -> Result<()>,
    ) -> Result<()> {
        self.txn(|t| {
            let mut inode = t.inode(ino)?;
            f(&mut inode)?;
            inode.ctime = t.now;
            t.put(inode);
            Ok(())
        })
    }

    /// Creates a file, directory, symlink or special file in `dir`.
    pub fn create(
        &self,
        dir: u64,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        owner: (u32, u32),
        target: Option<&[u8]>,
    ) -> Result<Inode> {
        let node = NewNode { kind, perm, uid: owner.0, gid: owner.1, target, rdev: 0, umask: 0 };
        self.make(dir, name, &node)
    }

    /// Creates `name` in `dir` as described by `node`.
    pub fn make(&self, dir: u64, name: &[u8], node: &NewNode<'_>) -> Result<Inode> {
        check_name(name)?;
        self.txn(|t| make_in(t, dir, name, node))
    }

    /// Writes file bytes at `offset`, growing the file as needed.
    pub fn write_file(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.write_file_as(ino, offset, data, false)
    }

    /// [`FsHead::write_file`] by a caller that may not keep a file's
    /// set-user-ID and set-group-ID (`kill_suidgid`: it lacks
    /// CAP_FSETID; see [`Inode::kill_privs`]). Any write takes the file's
    /// capabilities.
    pub fn write_file_as(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= FILE_MAX)
            .ok_or_else(|| Error::posix(Posix::FileTooBig, "write beyond the largest file size"))?;
        if data.is_empty() {
            return Ok(());
        }
        self.head().wait_for_uploads();
        self.txn(|t| {
            let mut inode = file(t, ino)?;
            check_write(&inode, offset)?;
            let new_size = inode.size.max(end);
            match &inode.content {
                Content::Inline(old) if new_size as usize <= INLINE_MAX => {
                    let mut buf = old.to_vec();
                    buf.resize(new_size as usize, 0);
                    buf[offset as usize..end as usize].copy_from_slice(data);
                    inode.content = Content::Inline(Bytes::from(buf));
                }
                Content::Inline(old) => {
                    // The inline bytes move into blocks in the same batch.
                    let map = t.r.blocks(ino, None);
                    let _s = self.head().lock_block_range(ino, 0, (end - 1) / map.block_size);
                    write_over_inline(&map, &mut t.b, old, offset, data)?;
                    t.moved_inline(ino, old);
                    inode.content = Content::Blocks(None);
                }
                Content::Blocks(base) => {
                    let map = t.r.blocks(ino, *base);
                    let bs = map.block_size;
                    let _s = self.head().lock_block_range(ino, offset / bs, (end - 1) / bs);
                    map.write(&mut t.b, offset, data)?;
                }
                _ => return Err(Error::corrupt(format!("file {ino} has no data content"))),
            }
            inode.size = new_size;
            inode.kill_privs(kill_suidgid);
            (inode.mtime, inode.ctime) = (t.now, t.now);
            t.put(inode);
            Ok(())
        })
    }

    /// Changes attributes; a size change truncates or extends with zeros.
    pub fn set_attr(&self, ino: u64, attr: &SetAttr) -> Result<Inode> {
        if attr.size.is_some_and(|s| s > FILE_MAX) {
            return Err(Error::posix(Posix::FileTooBig, "size beyond the largest file size"));
        }
        self.txn(|t| {
            let mut inode = if attr.size.is_some() { file(t, ino)? } else { t.inode(ino)? };
            // Setting the times to now (`touch`) is the one change an
            // append-only inode takes, as on Linux.
            let only_touch = attr.times_now
                && (attr.perm, attr.uid, attr.gid, attr.size) == (None, None, None, None);
            match only_touch {
                true => inode.check_not_immutable()?,
                false => inode.check_mutable()?,
            }
            if let Some(size) = attr.size {
                resize(self, t, &mut inode, size)?;
                inode.mtime = t.now;
                inode.kill_privs(attr.kill_suidgid);
            } else if attr.kill_suidgid {
                inode.kill_privs(true);
            }
            let chown = attr.uid.is_some() || attr.gid.is_some();
            if chown && attr.perm.is_none() {
                inode.kill_privs(true);
            }
            if let Some(p) = attr.perm {
                inode.perm = p & 0o7777;
                acl::on_chmod(&mut inode.xattrs, inode.perm);
            }
            if let Some(u) = attr.uid {
                inode.uid = u;
            }
            if let Some(g) = attr.gid {
                inode.gid = g;
            }
            if let Some(a) = attr.atime {
                inode.atime = a;
            }
            if let Some(m) = attr.mtime {
                inode.mtime = m;
            }
            inode.ctime = t.now;
            t.put(inode.clone());
            Ok(inode)
        })
    }

    /// Records a read of `ino` at `at`: its atime only (no ctime change,
    /// as a read changes nothing else).
    pub fn set_atime(&self, ino: u64, at: Time) -> Result<()> {
        self.txn(|t| {
            let mut inode = t.inode(ino)?;
            inode.atime = at;
            t.put(inode);
            t.access_only = true;
            Ok(())
        })
    }

    /// Sets an inode's flags (`chattr`; who may is the kernel's check):
    /// EOPNOTSUPP for a flag outside [`FL_SETTABLE`].
    pub fn set_flags(&self, ino: u64, flags: u32) -> Result<()> {
        if flags & !FL_SETTABLE != 0 {
            let why = format!("inode flags {:#x} are not supported", flags & !FL_SETTABLE);
            return Err(Error::posix(Posix::Unsupported, why));
        }
        self.inode_txn(ino, |inode| {
            inode.flags = flags;
            Ok(())
        })
    }

    /// Zeroes `len` bytes at `offset` of a file, within its size (punching
    /// whole blocks into holes).
    pub fn punch_hole(&self, ino: u64, offset: u64, len: u64) -> Result<()> {
        self.fallocate(ino, offset, len, true, true)
    }

    /// fallocate(2) as one transaction: zeroes `[offset, offset + len)`
    /// within the file when `zero`, then grows the file to `offset + len`
    /// unless `keep_size` (no space is reserved: blocks are written at
    /// checkpoints).
    pub fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        zero: bool,
        keep_size: bool,
    ) -> Result<()> {
        let end = offset.checked_add(len).filter(|e| keep_size || *e <= FILE_MAX);
        let end =
            end.ok_or_else(|| Error::posix(Posix::FileTooBig, "range beyond the largest file"))?;
        self.txn(|t| {
            let mut inode = file(t, ino)?;
            // Zeroing rewrites data; allocating only grows (append-only may).
            match zero {
                true => inode.check_mutable()?,
                false => inode.check_not_immutable()?,
            }
            let zero_end = end.min(inode.size);
            let mut changed = false;
            if zero && zero_end > offset {
                match &inode.content {
                    Content::Inline(old) => {
                        let mut buf = old.to_vec();
                        buf[offset as usize..zero_end as usize].fill(0);
                        inode.content = Content::Inline(Bytes::from(buf));
                    }
                    Content::Blocks(base) => {
                        let map = t.r.blocks(ino, *base);
                        map.zero(&mut t.b, offset, zero_end - offset)?;
                    }
                    _ => return Err(Error::corrupt(format!("file {ino} has no data content"))),
                }
                changed = true;
            }
            if !keep_size && end > inode.size {
                resize(self, t, &mut inode, end)?;
                changed = true;
            }
            if changed {
                (inode.mtime, inode.ctime) = (t.now, t.now);
                t.put(inode);
            }
            Ok(())
        })
    }

    /// Removes a name; a non-directory whose last link goes is deleted
    /// unless `open(ino)` (then it stays, unnamed, until [`FsHead::release`]).
    pub fn unlink(&self, dir: u64, name: &[u8], open: &dyn Fn(u64) -> bool) -> Result<()> {
        self.remove(dir, name, false, open)
    }

    /// Removes an empty directory (`open` as for [`Self::unlink`]: one
    /// still open stays, an orphan, until its last close).
    pub fn rmdir(&self, dir: u64, name: &[u8], open: &dyn Fn(u64) -> bool) -> Result<()> {
        self.remove(dir, name, true, open)
    }

    fn remove(
        &self,
        dir: u64,
        name: &[u8],
        want_dir: bool,
        open: &dyn Fn(u64) -> bool,
    ) -> Result<()> {
        if name == b"." {
            return Err(Error::posix(Posix::Invalid, "cannot remove \".\""));
        }
        if name == b".." {
            return Err(Error::posix(Posix::NotEmpty, "cannot remove \"..\""));
        }
        self.txn(|t| {
            t.dir(dir)?.check_mutable()?;
            let e = t.entry(dir, name)?;
            let target = t.inode(e.ino)?;
            target.check_mutable()?;
            let is_dir = target.kind == FileKind::Dir;
            if want_dir && !is_dir {
                let why = format!("{} is not a directory", name_of(name));
                return Err(Error::posix(Posix::NotDir, why));
            }
            if !want_dir && is_dir {
                return Err(Error::posix(
                    Posix::IsDir,
                    format!("{} is a directory", name_of(name)),
                ));
            }
            if is_dir && !t.r.is_empty(&target)? {
                let why = format!("{} is not empty", name_of(name));
                return Err(Error::posix(Posix::NotEmpty, why));
            }
            t.remove_entry(dir, name)?;
            t.touch_dir(dir)?;
            if is_dir {
                let mut p = t.dir(dir)?;
                p.nlink -= 1;
                t.put(p);
            }
            t.unlink_inode(target, (dir, name), open)
        })
    }

    /// Adds a name for an existing non-directory.
    pub fn link(&self, ino: u64, dir: u64, name: &[u8]) -> Result<Inode> {
        check_name(name)?;
        self.txn(|t| {
            let mut inode = t.inode(ino)?;
            if inode.kind == FileKind::Dir {
                let why = "hard links to directories are not allowed";
                return Err(Error::posix(Posix::NotPermitted, why));
            }
            if inode.nlink == 0 {
                return Err(Error::posix(Posix::NoEntry, format!("inode {ino} was removed")));
            }
            inode.check_mutable()?;
            if inode.nlink >= LINK_MAX {
                return Err(Error::posix(
                    Posix::TooManyLinks,
                    format!("inode {ino}: too many links"),
                ));
            }
            t.dir(dir)?.check_not_immutable()?;
            if t.find(dir, name)?.is_some() {
                return Err(Error::posix(Posix::Exists, format!("{} exists", name_of(name))));
            }
            t.add_entry(dir, name, ino, inode.kind)?;
            t.touch_dir(dir)?;
            inode.nlink += 1;
            inode.links.push((dir, bytes::Bytes::copy_from_slice(name)));
            inode.ctime = t.now;
            t.put(inode.clone());
            Ok(inode)
        })
    }

    /// Renames `name` in `dir` to `new_name` in `new_dir`.
    pub fn rename(
        &self,
        dir: u64,
        name: &[u8],
        new_dir: u64,
        new_name: &[u8],
        mode: RenameMode,
        open: &dyn Fn(u64) -> bool,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        self.txn(|t| super::rename::rename(t, (dir, name), (new_dir, new_name), mode, open))
    }

    /// rename(2) with RENAME_WHITEOUT: the rename (`mode` Replace or
    /// NoReplace) and, at the old name, a whiteout (a character device
    /// 0:0 owned by `owner`, as overlayfs expects of its upper directory),
    /// in one transaction.
    pub fn rename_whiteout(
        &self,
        (dir, name): (u64, &[u8]),
        (new_dir, new_name): (u64, &[u8]),
        mode: RenameMode,
        owner: (u32, u32),
        open: &dyn Fn(u64) -> bool,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        if mode == RenameMode::Exchange {
            return Err(Error::posix(Posix::Invalid, "RENAME_WHITEOUT with RENAME_EXCHANGE"));
        }
        self.txn(|t| {
            super::rename::rename(t, (dir, name), (new_dir, new_name), mode, open)?;
            // Renamed onto another name of itself: nothing moved.
            if t.find(dir, name)?.is_none() {
                let node = NewNode {
                    kind: FileKind::CharDev,
                    perm: 0,
                    uid: owner.0,
                    gid: owner.1,
                    target: None,
                    rdev: 0,
                    umask: 0,
                };
                make_in(t, dir, name, &node)?;
            }
            Ok(())
        })
    }

    /// A process closed its last handle on `ino`: an orphan (unlinked
    /// while open) is deleted now.
    pub fn release(&self, ino: u64) -> Result<()> {
        self.txn(|t| {
            let meta = t.meta()?;
            let Some(pos) = meta.orphans.iter().position(|o| *o == ino) else { return Ok(()) };
            meta.orphans.swap_remove(pos);
            t.delete(ino);
            Ok(())
        })
    }

    /// Deletes every orphan: their holders are gone (a mount starting, or
    /// a mount that died). Returns how many.
    pub fn reap_orphans(&self) -> Result<usize> {
        self.txn(|t| {
            let orphans = std::mem::take(&mut t.meta()?.orphans);
            for o in &orphans {
                t.delete(*o);
            }
            Ok(orphans.len())
        })
    }
}

/// Creates `name` in `dir` as described by `node`, inside `t`.
fn make_in(t: &mut Txn<'_>, dir: u64, name: &[u8], node: &NewNode<'_>) -> Result<Inode> {
    let (content, size, nlink) = match node.kind {
        FileKind::Dir => (Content::Entries(None), 0, 2),
        FileKind::File => (Content::Inline(Bytes::new()), 0, 1),
        FileKind::Symlink => {
            let t = node.target.ok_or_else(|| Error::invalid("a symlink needs a target"))?;
            if t.is_empty() || t.len() > 4095 {
                let why = "symlink target must be 1-4095 bytes";
                return Err(Error::posix(Posix::NameTooLong, why));
            }
            (Content::Target(Bytes::copy_from_slice(t)), t.len() as u64, 1)
        }
        _ => (Content::None, 0, 1),
    };
    let mut parent = t.dir(dir)?;
    parent.check_not_immutable()?;
    if t.find(dir, name)?.is_some() {
        return Err(Error::posix(Posix::Exists, format!("{} exists", name_of(name))));
    }
    let is_dir = node.kind == FileKind::Dir;
    let (perm, xattrs) = acl::on_create(
        &parent.xattrs,
        is_dir,
        node.kind == FileKind::Symlink,
        node.perm & 0o7777,
        node.umask,
    );
    let meta = t.meta()?;
    let ino = meta.next_ino;
    meta.next_ino += 1;
    let inode = Inode {
        ino,
        kind: node.kind,
        perm,
        uid: node.uid,
        gid: node.gid,
        nlink,
        size,
        rdev: node.rdev,
        atime: t.now,
        mtime: t.now,
        ctime: t.now,
        crtime: t.now,
        parent: dir,
        name: Bytes::copy_from_slice(name),
        content,
        xattrs,
        links: Vec::new(),
        flags: 0,
    };
    t.add_entry(dir, name, ino, node.kind)?;
    (parent.mtime, parent.ctime) = (t.now, t.now);
    if node.kind == FileKind::Dir {
        parent.nlink += 1;
    }
    t.put(parent);
    t.put(inode.clone());
    Ok(inode)
}

/// EPERM for a write at `offset` into an immutable file, or into an
/// append-only one before its end.
pub(super) fn check_write(inode: &Inode, offset: u64) -> Result<()> {
    inode.check_not_immutable()?;
    if inode.flags & FL_APPEND != 0 && offset < inode.size {
        let why = format!("inode {} is append-only", inode.ino);
        return Err(Error::posix(Posix::NotPermitted, why));
    }
    Ok(())
}

/// A regular file (EISDIR for a directory, EINVAL for anything else).
fn file(t: &mut Txn<'_>, ino: u64) -> Result<Inode> {
    regular(t.inode(ino)?)
}

/// `inode` if it is a regular file (EISDIR for a directory, EINVAL for
/// anything else).
pub(super) fn regular(inode: Inode) -> Result<Inode> {
    let ino = inode.ino;
    match inode.kind {
        FileKind::File => Ok(inode),
        FileKind::Dir => Err(Error::posix(Posix::IsDir, format!("inode {ino} is a directory"))),
        _ => Err(Error::posix(Posix::Invalid, format!("inode {ino} is not a regular file"))),
    }
}

/// Writes `data` at `offset` into the (still empty) block map of a file
/// whose bytes so far are the inline `old`: the inline bytes and the data
/// go in as their own bytes (spans, see `head/patch.rs`), not as blocks.
fn write_over_inline(
    map: &BlockMap<'_>,
    batch: &mut rocksdb::WriteBatch,
    old: &[u8],
    offset: u64,
    data: &[u8],
) -> Result<()> {
    let head_end = (old.len() as u64).div_ceil(map.block_size) * map.block_size;
    if offset < head_end {
        // One write: two to the same block in one batch would not see
        // each other (each reads the block's entry from the store).
        let mut buf = old.to_vec();
        let end = offset as usize + data.len();
        buf.resize(buf.len().max(end), 0);
        buf[offset as usize..end].copy_from_slice(data);
        return map.write(batch, 0, &buf);
    }
    // The blocks the data starts in and after hold nothing of the inline bytes.
    map.write(batch, 0, old)?;
    map.write(batch, offset, data)
}

/// Sets a file's size, moving inline bytes to blocks or dropping blocks.
fn resize(head: &FsHead, t: &mut Txn<'_>, inode: &mut Inode, size: u64) -> Result<()> {
    let ino = inode.ino;
    match &inode.content {
        Content::Inline(old) if size as usize <= INLINE_MAX => {
            let mut buf = old.to_vec();
            buf.resize(size as usize, 0);
            inode.content = Content::Inline(Bytes::from(buf));
        }
        Content::Inline(old) => {
            let map = t.r.blocks(ino, None);
            map.write(&mut t.b, 0, old)?;
            t.moved_inline(ino, old);
            inode.content = Content::Blocks(None);
        }
        Content::Blocks(base) if size < inode.size => {
            let map = t.r.blocks(ino, *base);
            let bs = map.block_size;
            let first_whole = size.div_ceil(bs);
            let _s =
                head.head().lock_block_range(ino, size / bs, inode.size.saturating_sub(1) / bs);
            map.drop_from(&mut t.b, first_whole)?;
            if size % bs != 0 {
                map.zero(&mut t.b, size, first_whole * bs - size)?;
            }
        }
        _ => {}
    }
    inode.size = size;
    Ok(())
}
