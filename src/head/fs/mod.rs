//! fs volumes: a directory tree of inodes. Inode records live in the
//! volume's root map, a map of entries per directory, a block map per
//! large file (see docs/FORMAT.md). What the FUSE workspace serves.
//!
//! - [`reader`]: reads of any state (live or frozen) through a [`FsReader`];
//! - [`ops`], [`rename`], [`xattr`]: changes, each one [`txn`] (one batch);
//! - [`acl`]: what POSIX ACLs ask of the filesystem (the kernel checks them);
//! - [`copy`]: copy_file_range by sharing blocks (no data copied);
//! - [`inode`]: the record formats;
//! - [`changes`]: what changed between two states, as a kernel cache sees it.

pub mod acl;
pub mod changes;
mod copy;
pub mod inode;
pub mod ops;
pub mod reader;
mod rename;
mod txn;
pub mod xattr;

pub use changes::{FsChanges, fs_changes};
pub use inode::{Content, FileKind, Inode, ROOT_INO, Time};
pub use ops::{NewNode, RenameMode, SetAttr, never_open};
pub use reader::{FsReader, NAME_MAX};

use super::Head;
use crate::error::Result;
use crate::map::{Map, MapRoot, NodeStore};
use crate::records::{VolumeKind, VolumeRecord};
use bytes::Bytes;
use inode::{META_KEY, Meta};
use std::sync::Arc;

/// A live fs volume, shared by everything in this process that uses it.
#[derive(Clone)]
pub struct FsHead(Arc<Head>);

impl FsHead {
    /// The fs API of `head`; fails for a block volume.
    pub(crate) fn new(head: Arc<Head>) -> Result<FsHead> {
        head.expect_kind(VolumeKind::Fs)?;
        Ok(FsHead(head))
    }

    /// The shared core (record, state, checkpoint locks).
    pub fn head(&self) -> &Arc<Head> {
        &self.0
    }

    pub fn record(&self) -> &VolumeRecord {
        self.0.record()
    }

    /// A reader of the live state as it is now. Its reads see one state
    /// only while no checkpoint or restore of this head commits: beside
    /// them (a mount's automatic versions), read through [`FsHead::read`].
    pub fn reader(&self) -> FsReader<'_> {
        FsReader::live(&self.0)
    }

    /// Runs `read` on a reader of the live state and returns what it read
    /// from one state, even when a checkpoint or restore commits
    /// meanwhile (it is then run again: keep it free of side effects).
    pub fn read<T>(&self, mut read: impl FnMut(FsReader<'_>) -> Result<T>) -> Result<T> {
        self.0.read_consistent(|| read(FsReader::live(&self.0)))
    }

    /// fsync: makes every acknowledged change durable on local disk.
    pub fn flush(&self) -> Result<()> {
        {
            // Every change acknowledged before this point is promised.
            // The gate and the namespace lock in a transaction's order:
            // no commit is being published under them.
            let _gate = self.0.gate.read();
            let _ns = self.0.ns.lock();
            self.0.promised();
        }
        self.0.flush()
    }

    /// True when nothing changed since the last checkpoint.
    pub fn is_clean(&self) -> Result<bool> {
        self.0.is_clean()
    }

    /// Bytes the volume's files count against a quota (see
    /// [`inode::charged`]): kept with every change, or counted now by a
    /// walk of the tree in a volume made before the count was kept.
    pub fn used(&self) -> Result<u64> {
        self.read(|r| r.used())
    }

    /// Counts the used bytes by walking the tree and, where the kept
    /// count differs, keeps the walk's (`fsck --repair`): returns the
    /// count it replaced and the new one, or `None` when it was right (or
    /// none is kept).
    pub(crate) fn recount(&self) -> Result<Option<(u64, u64)>> {
        self.txn(|t| {
            let Some(was) = t.meta()?.used else { return Ok(None) };
            let now = t.r.count_used()?;
            if now == was {
                return Ok(None);
            }
            t.meta()?.used = Some(now);
            Ok(Some((was, now)))
        })
    }

    /// Sets the kept count as it is in a volume made before the count was
    /// kept (`None`) or after it went wrong: for tests of what copes.
    #[cfg(test)]
    pub(crate) fn force_used(&self, used: Option<u64>) -> Result<()> {
        self.txn(|t| {
            t.meta()?.used = used;
            Ok(())
        })
    }
}

/// Whether the overlay of fs head `head` holds access times and nothing
/// else: inode records that differ from the stored ones in their atime
/// alone (see `Head::accessed_only`). Stops at the first other change.
pub(crate) fn only_accesses(head: &Head) -> Result<bool> {
    use super::overlay::{Dirty, Space};
    let state = head.state();
    let stored = FsReader::frozen(&head.storage.chunks, state.root, head.record().block_size);
    let mut any = false;
    let mut other = false;
    let r = head.overlay().for_each(&mut |e| {
        any = true;
        let same = match (&e.space, &e.dirty) {
            (Space::Root, Dirty::Value(v)) if e.key != META_KEY => {
                match (Inode::decode(v), stored.inode(e.key)) {
                    (Ok(new), Ok(old)) => Inode { atime: old.atime, ..new } == old,
                    // A new inode, or one that cannot be read: a change.
                    _ => false,
                }
            }
            // The inode counter alone (kept by a restore) is bookkeeping.
            (Space::Root, Dirty::Value(_)) => true,
            _ => false,
        };
        if !same {
            // The walk stops at an error; this one means "found another change".
            other = true;
            return Err(crate::error::Error::invalid("not only access times"));
        }
        Ok(())
    });
    match r {
        Err(_) if other => Ok(false),
        Err(e) => Err(e),
        Ok(()) => Ok(any),
    }
}

/// The root map of a new, empty fs volume: its record and the root directory.
pub fn initial_root(nodes: &dyn NodeStore) -> Result<MapRoot> {
    let now = Time::now();
    let root = Inode {
        ino: ROOT_INO,
        kind: FileKind::Dir,
        perm: 0o755,
        // Whoever creates the volume owns its top directory, as mkdir's.
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        nlink: 2,
        size: 0,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        parent: ROOT_INO,
        name: Bytes::new(),
        content: Content::Entries(None),
        xattrs: Vec::new(),
        links: Vec::new(),
        flags: 0,
    };
    Map::new(nodes).apply(
        None,
        &[
            (
                META_KEY,
                Some(Bytes::from(
                    Meta { next_ino: ROOT_INO + 1, orphans: vec![], used: Some(0) }.encode(),
                )),
            ),
            (ROOT_INO, Some(Bytes::from(root.encode()))),
        ],
    )
}

pub(crate) use reader::restored_meta;
