//! The state behind one mount: what it shows (a live head or a version),
//! open handles (for files unlinked while open), and the names the kernel
//! may have cached (dropped after a restore).

use forkfs::volume::fs::{FsReader, reader_for_version};
use forkfs::volume::inode::{FileKind, Inode};
use forkfs::{Error, Head, Store, VersionRecord};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub enum Source {
    Live(Arc<Head>),
    Version(VersionRecord),
}

pub struct Workspace {
    pub store: Store,
    pub source: Source,
    pub block_size: u32,
    read_only: bool,
    /// Open file handles per inode.
    opens: Mutex<HashMap<u64, u32>>,
    next_fh: AtomicU64,
    /// (parent, name) pairs given to the kernel, and the inodes they named.
    known: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    entries: HashSet<(u64, Vec<u8>)>,
    inodes: HashSet<u64>,
}

impl Workspace {
    pub fn new(store: Store, source: Source, read_only: bool) -> Workspace {
        let block_size = match &source {
            Source::Live(h) => h.record().block_size,
            Source::Version(v) => v.block_size,
        };
        Workspace {
            store,
            source,
            block_size,
            read_only,
            opens: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            known: Mutex::new(Known::default()),
        }
    }

    pub fn reader(&self) -> FsReader<'_> {
        match &self.source {
            Source::Live(h) => h.fs(),
            Source::Version(v) => reader_for_version(&self.store, v.root, v.block_size),
        }
    }

    /// The head to change; EROFS for a mount of a version.
    pub fn head(&self) -> Result<&Head, Error> {
        match &self.source {
            Source::Live(h) if !self.read_only => Ok(h),
            _ => Err(Error::read_only("this mount is read-only")),
        }
    }

    pub fn inode(&self, ino: u64) -> Result<Inode, Error> {
        self.reader().inode(ino)
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Inode, Error> {
        let r = self.reader();
        let dir = r.inode(parent)?;
        let e = r.lookup(&dir, name)?.ok_or_else(|| {
            Error::posix(forkfs::error::Posix::NoEntry, "no such file or directory")
        })?;
        r.inode(e.ino)
    }

    /// Records that the kernel now knows `name` in `parent` as `ino`.
    pub fn remember(&self, parent: u64, name: &[u8], ino: u64) {
        let mut k = self.known.lock();
        k.entries.insert((parent, name.to_vec()));
        k.inodes.insert(ino);
    }

    /// Everything the kernel may have cached, forgotten here.
    pub fn take_known(&self) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
        let mut k = self.known.lock();
        let k = std::mem::take(&mut *k);
        (k.entries.into_iter().collect(), k.inodes.into_iter().collect())
    }

    pub fn open(&self, ino: u64) -> u64 {
        *self.opens.lock().entry(ino).or_insert(0) += 1;
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Drops one handle; the last one of an unlinked file deletes it.
    pub fn release(&self, ino: u64) -> Result<(), Error> {
        let last = {
            let mut o = self.opens.lock();
            let n = o.entry(ino).or_insert(1);
            *n -= 1;
            if *n == 0 {
                o.remove(&ino);
                true
            } else {
                false
            }
        };
        match (&self.source, last) {
            (Source::Live(h), true) => h.release(ino),
            _ => Ok(()),
        }
    }

    pub fn is_open(&self, ino: u64) -> bool {
        self.opens.lock().contains_key(&ino)
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
