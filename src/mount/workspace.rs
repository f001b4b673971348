//! The state behind one mount: what it shows (a live head or a version),
//! and open handles (for files unlinked while open).

use super::history::{self, CTL_DIR, Place, Slots, VERSIONS_DIR};
use forkfs::fs::{Content, FileKind, FsReader, Inode, NAME_MAX, ROOT_INO, Time};
use forkfs::{Error, FsHead, Opened, Posix, Store};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// A page of a directory: (cookie key, FUSE inode, kind, name), and the
/// key to continue after.
pub type Listing = (Vec<(u64, u64, FileKind, Vec<u8>)>, Option<u64>);

/// When reads record access times (the `-o` atime options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atime {
    /// `noatime`: never.
    Never,
    /// `relatime` (the default, as on Linux): when the last access is not
    /// after the last change, or is a day old.
    Relative,
    /// `strictatime`: every read that reaches the filesystem.
    Strict,
}

pub struct Workspace {
    pub store: Store,
    pub source: Opened<FsHead>,
    /// The volume shown (for `.forkfs/versions`).
    pub volume: String,
    slots: Slots,
    pub block_size: u32,
    read_only: bool,
    atime: Atime,
    /// Per inode: handles open, and whether its last name went meanwhile
    /// (then the last close deletes it; other closes touch no record).
    opens: Mutex<HashMap<u64, (u32, bool)>>,
    /// Per directory of the tree the kernel holds: its lookup count (the
    /// entries replied for it, less its FORGETs), and whether its name
    /// went meanwhile. The kernel keeps a directory while it is open (or
    /// a working directory), and opens them without telling the mount
    /// (see `fuse/caches.rs`), so a removed directory stays (an orphan)
    /// until its FORGET. As many entries as directories in the kernel's
    /// inode cache.
    dirs: Mutex<HashMap<u64, (u64, bool)>>,
    next_fh: AtomicU64,
    /// Allocated bytes of large files by FUSE inode, valid while their
    /// ctime and size are (any change of data moves the ctime).
    allocated: Mutex<HashMap<u64, (Time, u64, u64)>>,
}

/// Files whose allocated size is remembered; past this the memory starts over.
const ALLOCATED_CACHED: usize = 1 << 16;

impl Workspace {
    pub fn new(
        store: Store,
        source: Opened<FsHead>,
        volume: String,
        read_only: bool,
        atime: Atime,
    ) -> Workspace {
        let block_size = source.block_size();
        Workspace {
            store,
            source,
            volume,
            slots: Slots::default(),
            block_size,
            read_only,
            atime,
            opens: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            allocated: Mutex::new(HashMap::new()),
        }
    }

    /// Shows the live head (not a fixed version).
    pub fn is_live(&self) -> bool {
        matches!(self.source, Opened::Live(_))
    }

    /// The head to change; EROFS for a mount of a version.
    pub fn head(&self) -> Result<&FsHead, Error> {
        match &self.source {
            Opened::Live(h) if !self.read_only => Ok(h),
            _ => Err(Error::read_only("this mount is read-only")),
        }
    }

    /// fsync: a read-only mount has nothing to make durable.
    pub fn sync(&self) -> Result<(), Error> {
        match self.head() {
            Ok(h) => h.flush(),
            Err(_) => Ok(()),
        }
    }

    /// The mounted tree's own inode behind a FUSE inode number; EROFS
    /// for the read-only history under `.forkfs`.
    pub fn own(&self, fuse_ino: u64) -> Result<u64, Error> {
        match self.slots.place(fuse_ino)? {
            Place::Own(i) => Ok(i),
            _ => Err(Error::read_only("versions under .forkfs are read-only")),
        }
    }

    /// The mounted tree's own inode (changes go through [`Workspace::own`]).
    pub fn inode(&self, ino: u64) -> Result<Inode, Error> {
        self.source.read(|r| r.inode(ino))
    }

    /// Runs `read` on a reader of the tree behind `fuse_ino`, with the
    /// inode there and the bits its FUSE inode numbers carry; `None` for
    /// `.forkfs` and `.forkfs/versions`. What it reads is of one state,
    /// even beside a checkpoint (then it may run twice: see
    /// [`FsHead::read`]).
    fn read_at<T>(
        &self,
        fuse_ino: u64,
        mut read: impl FnMut(FsReader<'_>, u64, u64) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        Ok(Some(match self.slots.place(fuse_ino)? {
            Place::Own(i) => self.source.read(|r| read(r, i, 0))?,
            Place::Virtual(_) => return Ok(None),
            Place::Version { version, ino, base } => {
                let r = FsReader::frozen(self.store.chunks(), version.root, version.block_size);
                read(r, ino, base)?
            }
        }))
    }

    /// An inode anywhere in the mount, with its FUSE inode number.
    pub fn stat(&self, fuse_ino: u64) -> Result<(Inode, u64), Error> {
        let found = self.read_at(fuse_ino, |r, ino, base| Ok((r.inode(ino)?, base | ino)))?;
        Ok(found.unwrap_or_else(|| (history::virtual_dir(fuse_ino), fuse_ino)))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<(Inode, u64), Error> {
        let enoent = || Error::posix(Posix::NoEntry, "no such file or directory");
        // Asked only when the kernel turns a file handle back into an inode
        // (export support): the inode itself, and a directory's parent.
        match name {
            b"." => return self.stat(parent),
            b".." => return self.stat(self.parent_of(parent)?),
            _ => {}
        }
        if name.len() > NAME_MAX {
            let why = "file name longer than 255 bytes";
            return Err(Error::posix(Posix::NameTooLong, why));
        }
        match (self.slots.place(parent)?, name) {
            (Place::Own(ROOT_INO), history::NAME) => return self.stat(CTL_DIR),
            (Place::Virtual(CTL_DIR), b"versions") => return self.stat(VERSIONS_DIR),
            (Place::Virtual(VERSIONS_DIR), _) => {
                let v = history::resolve(&self.store, &self.volume, name)?;
                return self.stat(self.slots.root_of(v)?);
            }
            (Place::Virtual(_), _) => return Err(enoent()),
            _ => {}
        }
        let found = self.read_at(parent, |r, ino, base| {
            let dir = r.inode(ino)?;
            let e = r.lookup(&dir, name)?.ok_or_else(enoent)?;
            Ok((r.inode(e.ino)?, base | e.ino))
        })?;
        found.ok_or_else(enoent)
    }

    /// Whether the kernel may keep a name missing from directory `parent`
    /// as missing (a negative entry): in the mounted tree's own
    /// directories, where a name appears only through the kernel or a
    /// restore (which drops the names it changes, both sides:
    /// `mount::invalidate`); not under `.forkfs`, where a new version's
    /// name appears with neither.
    pub fn misses_cacheable(&self, parent: u64) -> bool {
        matches!(self.slots.place(parent), Ok(Place::Own(_)))
    }

    /// The FUSE inode number of the directory holding `fuse_ino` (its
    /// first link's), anywhere in the mount.
    fn parent_of(&self, fuse_ino: u64) -> Result<u64, Error> {
        Ok(match self.slots.place(fuse_ino)? {
            Place::Own(ROOT_INO) | Place::Virtual(CTL_DIR) => ROOT_INO,
            Place::Own(i) => self.inode(i)?.parent,
            Place::Virtual(_) => CTL_DIR,
            Place::Version { ino: ROOT_INO, .. } => VERSIONS_DIR,
            Place::Version { version, ino, base } => {
                let r = FsReader::frozen(self.store.chunks(), version.root, version.block_size);
                base | r.inode(ino)?.parent
            }
        })
    }

    /// The bytes of `i` (FUSE inode `fuse_ino`) that hold data, for
    /// `st_blocks`; its size if they cannot be counted.
    pub fn allocated(&self, fuse_ino: u64, i: &Inode) -> u64 {
        if !matches!(i.content, Content::Blocks(_)) {
            return i.size;
        }
        if let Some(&(ctime, size, n)) = self.allocated.lock().get(&fuse_ino) {
            if (ctime, size) == (i.ctime, i.size) {
                return n;
            }
        }
        // Counted in the inode as read with its blocks: `i` may be of
        // a state before a checkpoint, whose overlay is gone.
        let counted = self.read_at(fuse_ino, |r, ino, _| {
            let now = r.inode(ino)?;
            Ok((now.ctime, now.size, r.allocated(&now)?))
        });
        let (ctime, size, n) = match counted {
            Ok(Some(c)) => c,
            Ok(None) => return i.size,
            Err(e) => {
                tracing::warn!(ino = fuse_ino, error = %e, "cannot count allocated blocks");
                return i.size;
            }
        };
        let mut cache = self.allocated.lock();
        if cache.len() >= ALLOCATED_CACHED {
            cache.clear();
        }
        cache.insert(fuse_ino, (ctime, size, n));
        n
    }

    /// fallocate(2) that allocates `[offset, offset + len)` of file `ino`:
    /// ENOSPC when the disk under the store has less room than the part of
    /// the range that holds no data yet, as a filesystem that reserves the
    /// space would answer (the store writes blocks only when they are).
    /// A quota is the commit's to enforce: a plain fallocate grows the
    /// size it charges, one with KEEP_SIZE charges nothing.
    pub fn check_room(&self, ino: u64, offset: u64, len: u64) -> Result<(), Error> {
        // Past what is counted, count nothing as held (ask for it all).
        let held = self.source.read(|r| r.allocated_in(&r.inode(ino)?, offset, len))?.unwrap_or(0);
        let (_, _, avail, bsize) = super::statfs_of(self.store.dir());
        let room = avail.saturating_mul(u64::from(bsize));
        if len.saturating_sub(held) > room {
            let why = format!("fallocate of {len} bytes: {room} bytes free under the store");
            return Err(Error::posix(Posix::NoSpace, why));
        }
        Ok(())
    }

    /// What statfs reports, in blocks: total, free, free to users, and the
    /// block size. The disk under the store; with a quota, the quota as
    /// the size and what it leaves (or the disk, if less) as free.
    pub fn space(&self) -> (u64, u64, u64, u32) {
        let (blocks, bfree, bavail, bsize) = super::statfs_of(self.store.dir());
        let Opened::Live(head) = &self.source else { return (blocks, bfree, bavail, bsize) };
        let Some(quota) = head.head().quota() else { return (blocks, bfree, bavail, bsize) };
        let used = head.used().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the volume's use; counting it full");
            quota
        });
        let bs = u64::from(bsize);
        let left = quota.saturating_sub(used) / bs;
        (quota / bs, bfree.min(left), bavail.min(left), bsize)
    }

    /// Reads file bytes anywhere in the mount (recording the access when
    /// due).
    pub fn read(&self, fuse_ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Error> {
        let (i, buf) = self
            .read_at(fuse_ino, |r, ino, _| {
                let i = r.inode(ino)?;
                let mut buf = vec![0u8; (size as u64).min(i.size.saturating_sub(offset)) as usize];
                let n = r.read(&i, offset, &mut buf)?;
                buf.truncate(n);
                Ok((i, buf))
            })?
            .ok_or_else(is_dir)?;
        self.accessed(fuse_ino, &i);
        Ok(buf)
    }

    /// Whether a read of `i` (FUSE inode `fuse_ino`) now would record the
    /// access: then its open skips the kernel's page cache, so that the
    /// read reaches [`Workspace::read`].
    pub fn access_due(&self, fuse_ino: u64, i: &Inode) -> bool {
        let strict = match self.atime {
            Atime::Never => return false,
            Atime::Relative => false,
            Atime::Strict => true,
        };
        !self.read_only
            && self.is_live()
            && self.own(fuse_ino).is_ok()
            && i.access_due(Time::now(), strict)
    }

    /// A read of file or directory `i` reached the mount: records the
    /// access when due (versions and read-only mounts record none). A
    /// failure to record it fails no read.
    pub fn accessed(&self, fuse_ino: u64, i: &Inode) {
        if !self.access_due(fuse_ino, i) {
            return;
        }
        if let Ok(h) = self.head() {
            if let Err(e) = h.set_atime(i.ino, Time::now()) {
                tracing::warn!(ino = i.ino, error = %e, "cannot record an access time");
            }
        }
    }

    /// lseek(2)'s SEEK_DATA (`data`) or SEEK_HOLE in a file anywhere in
    /// the mount.
    pub fn seek(&self, fuse_ino: u64, offset: u64, data: bool) -> Result<u64, Error> {
        self.read_at(fuse_ino, |r, ino, _| r.seek(&r.inode(ino)?, offset, data))?.ok_or_else(is_dir)
    }

    /// One page of a directory: (cookie key, FUSE inode, kind, name), and
    /// the key to continue after.
    pub fn list(&self, fuse_ino: u64, after: u64) -> Result<Listing, Error> {
        let page = self.read_at(fuse_ino, |r, ino, base| {
            let dir = r.inode(ino)?;
            let (page, next) = r.list_page(&dir, after, 256)?;
            let page = page.into_iter().map(|(k, e)| (k, base | e.ino, e.kind, e.name.to_vec()));
            Ok((page.collect(), next))
        })?;
        let Some(page) = page else {
            let names: Vec<(u64, FileKind, Vec<u8>)> = match fuse_ino {
                CTL_DIR => vec![(VERSIONS_DIR, FileKind::Dir, b"versions".to_vec())],
                _ => history::version_names(&self.store, &self.volume)?
                    .into_iter()
                    .map(|n| (VERSIONS_DIR, FileKind::Dir, n.into_bytes()))
                    .collect(),
            };
            let page =
                names.into_iter().enumerate().map(|(i, (ino, k, n))| (i as u64 + 1, ino, k, n));
            return Ok((page.filter(|(k, ..)| *k > after).collect(), None));
        };
        Ok(page)
    }

    pub fn xattr(&self, fuse_ino: u64, name: &[u8]) -> Result<bytes::Bytes, Error> {
        let found = self.read_at(fuse_ino, |r, ino, _| r.xattr(ino, name))?;
        found.ok_or_else(|| Error::posix(Posix::NoAttr, "no attribute"))
    }

    pub fn xattr_names(&self, fuse_ino: u64) -> Result<Vec<bytes::Bytes>, Error> {
        Ok(self.read_at(fuse_ino, |r, ino, _| r.xattr_names(ino))?.unwrap_or_default())
    }

    /// copy_file_range into a file of this workspace: by sharing blocks
    /// from another file of the workspace (see `forkfs::fs` copy), as
    /// bytes from a file of a version under `.forkfs`. Returns the bytes
    /// copied (the caller asks again for the rest).
    pub fn copy(
        &self,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> Result<u64, Error> {
        let head = self.head()?;
        let dst = self.own(dst)?;
        // The reply carries a 32-bit count.
        let len = len.min(1 << 30);
        if let Ok(src) = self.own(src) {
            return head.copy_range(src, src_off, dst, dst_off, len);
        }
        let data = self.read(src, src_off, len.min(8 << 20) as u32)?;
        head.write_file(dst, dst_off, &data)?;
        Ok(data.len() as u64)
    }

    pub fn open(&self, ino: u64) -> u64 {
        self.opens.lock().entry(ino).or_insert((0, false)).0 += 1;
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Drops one handle; the last one of an unlinked file deletes it.
    pub fn release(&self, ino: u64) -> Result<(), Error> {
        let orphan_closed = {
            let mut o = self.opens.lock();
            let e = o.entry(ino).or_insert((1, false));
            e.0 -= 1;
            let done = (e.0 == 0).then_some(e.1);
            if done.is_some() {
                o.remove(&ino);
            }
            done == Some(true)
        };
        match (self.head(), self.own(ino)) {
            (Ok(h), Ok(own)) if orphan_closed => h.release(own),
            _ => Ok(()),
        }
    }

    /// Asked by the core when `ino` loses its last name: if open (a
    /// directory: if the kernel holds it), it stays (an orphan) until its
    /// last close (FORGET), which is noted here.
    pub fn is_open(&self, ino: u64) -> bool {
        if let Some(e) = self.dirs.lock().get_mut(&ino) {
            e.1 = true;
            return true;
        }
        match self.opens.lock().get_mut(&ino) {
            Some(e) => {
                e.1 = true;
                true
            }
            None => false,
        }
    }

    /// The kernel was given an entry for directory `fuse_ino` (a lookup it
    /// counts until a FORGET). Only the tree's own directories can be
    /// removed, so only they are counted.
    pub fn looked_up(&self, fuse_ino: u64) {
        if self.own(fuse_ino).is_ok() && !self.read_only {
            self.dirs.lock().entry(fuse_ino).or_insert((0, false)).0 += 1;
        }
    }

    /// The kernel's FORGET: `n` lookups of `fuse_ino` dropped. A removed
    /// directory the kernel no longer holds is deleted now.
    pub fn forget(&self, fuse_ino: u64, n: u64) {
        let orphan_gone = {
            let mut dirs = self.dirs.lock();
            let Some(e) = dirs.get_mut(&fuse_ino) else { return };
            e.0 = e.0.saturating_sub(n);
            if e.0 > 0 {
                return;
            }
            dirs.remove(&fuse_ino).is_some_and(|e| e.1)
        };
        let released = match (orphan_gone, self.head(), self.own(fuse_ino)) {
            (true, Ok(h), Ok(own)) => h.release(own),
            _ => Ok(()),
        };
        if let Err(e) = released {
            // Left to the next start of the mount (`reap_orphans`).
            tracing::warn!(ino = fuse_ino, error = %e, "cannot delete a removed directory");
        }
    }

    /// Whether the kernel may keep listings across opens: not when every
    /// read must record its access (strictatime).
    pub fn listings_cacheable(&self) -> bool {
        !matches!(self.atime, Atime::Strict)
    }

    /// Owner and mode bits of a new inode in `parent`: a set-group-ID
    /// directory passes on its group (and, to directories, the bit).
    pub fn owner_in(
        &self,
        parent: &Inode,
        uid: u32,
        gid: u32,
        kind: FileKind,
        perm: u16,
    ) -> (u32, u32, u16) {
        let sgid = libc::S_ISGID as u16;
        if parent.perm & sgid != 0 {
            let perm = if kind == FileKind::Dir { perm | sgid } else { perm };
            (uid, parent.gid, perm)
        } else {
            (uid, gid, perm)
        }
    }
}

fn is_dir() -> Error {
    Error::posix(Posix::IsDir, "is a directory")
}
