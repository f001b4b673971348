//! One change to an fs volume, staged and then written in one RocksDB
//! batch: inode records, directory entry groups and the volume record are
//! read once, changed in memory, and land together or not at all.
//!
//! Callers hold the head's gate (shared) and its namespace lock, so nothing
//! else changes the records a transaction read.

use super::inode::{DirEntry, FileKind, Inode, META_KEY, Meta, Time, charged, name_key};
use super::reader::FsReader;
use crate::error::{Error, Posix, Result};
use crate::head::Head;
use crate::head::overlay::{Dirty, Space};
use bytes::Bytes;
use rocksdb::WriteBatch;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

pub(super) struct Txn<'a> {
    head: &'a Head,
    pub r: FsReader<'a>,
    /// Staged inode records; `None` deletes the inode and its content.
    inodes: BTreeMap<u64, Option<Inode>>,
    /// Inodes read and not (yet) changed: each record is read once.
    read: BTreeMap<u64, Inode>,
    /// Staged entry groups: (directory, name key) -> entries.
    groups: BTreeMap<(u64, u64), Vec<DirEntry>>,
    /// The fs record as read, and as changed.
    meta: Option<(Meta, Meta)>,
    pub b: WriteBatch,
    pub now: Time,
    /// This transaction records an access time and nothing else.
    pub access_only: bool,
    /// The data log is synced before the batch is written (`moved_inline`).
    sync_log_first: bool,
}

pub(super) fn name_of(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl<'a> Txn<'a> {
    pub fn new(head: &'a Head) -> Txn<'a> {
        Txn {
            head,
            r: FsReader::live(head),
            inodes: BTreeMap::new(),
            read: BTreeMap::new(),
            groups: BTreeMap::new(),
            meta: None,
            b: WriteBatch::default(),
            now: Time::now(),
            access_only: false,
            sync_log_first: false,
        }
    }

    pub fn inode(&mut self, ino: u64) -> Result<Inode> {
        match self.inodes.get(&ino) {
            Some(Some(i)) => Ok(i.clone()),
            Some(None) => Err(Error::posix(Posix::NoEntry, format!("inode {ino} was removed"))),
            None => {
                if let Some(i) = self.read.get(&ino) {
                    return Ok(i.clone());
                }
                let i = self.r.inode(ino)?;
                self.read.insert(ino, i.clone());
                Ok(i)
            }
        }
    }

    /// An inode that must be a directory (ENOTDIR otherwise).
    pub fn dir(&mut self, ino: u64) -> Result<Inode> {
        let d = self.inode(ino)?;
        if d.kind != FileKind::Dir {
            return Err(Error::posix(Posix::NotDir, format!("inode {ino} is not a directory")));
        }
        Ok(d)
    }

    pub fn put(&mut self, inode: Inode) {
        self.inodes.insert(inode.ino, Some(inode));
    }

    /// Called once the inline bytes `old` of file `ino` were written into
    /// its blocks (appended to the data log) in this transaction, which
    /// drops them from the inode record. That record may become durable
    /// before the log does (any synced RocksDB write syncs the WAL it is
    /// in), and the blocks' entries have nothing durable under them: power
    /// loss would read acknowledged bytes as zeros. So the commit syncs
    /// the log first, once nothing can fail it any more, and writes its
    /// marks in the same batch. Not needed when nothing was promised
    /// durable: empty inline bytes, or a file made since the last fsync or
    /// checkpoint of the volume (`Head::fresh_from`: an untar, whose files
    /// each cross this line once, syncs nothing). Read under the
    /// namespace lock, which a promise takes to move the mark.
    pub fn moved_inline(&mut self, ino: u64, old: &[u8]) {
        let promised = ino < self.head.fresh_from.load(Ordering::SeqCst);
        self.sync_log_first |= !old.is_empty() && promised;
    }

    /// Deletes an inode (its directory entries or file blocks go with it
    /// at the next checkpoint).
    pub fn delete(&mut self, ino: u64) {
        self.inodes.insert(ino, None);
    }

    fn group(&mut self, dir: u64, key: u64) -> Result<&mut Vec<DirEntry>> {
        if !self.groups.contains_key(&(dir, key)) {
            let d = self.dir(dir)?;
            let loaded = self.r.entries_at(&d, key)?;
            self.groups.insert((dir, key), loaded);
        }
        Ok(self.groups.get_mut(&(dir, key)).expect("loaded above"))
    }

    pub fn find(&mut self, dir: u64, name: &[u8]) -> Result<Option<DirEntry>> {
        let g = self.group(dir, name_key(name))?;
        Ok(g.iter().find(|e| e.name == name).cloned())
    }

    /// The entry `name` in `dir`, or ENOENT.
    pub fn entry(&mut self, dir: u64, name: &[u8]) -> Result<DirEntry> {
        self.find(dir, name)?.ok_or_else(|| {
            Error::posix(Posix::NoEntry, format!("{}: no such file or directory", name_of(name)))
        })
    }

    pub fn add_entry(&mut self, dir: u64, name: &[u8], ino: u64, kind: FileKind) -> Result<()> {
        let e = DirEntry { name: Bytes::copy_from_slice(name), ino, kind };
        let g = self.group(dir, name_key(name))?;
        g.retain(|x| x.name != name);
        g.push(e);
        Ok(())
    }

    pub fn remove_entry(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        self.group(dir, name_key(name))?.retain(|x| x.name != name);
        Ok(())
    }

    pub fn meta(&mut self) -> Result<&mut Meta> {
        if self.meta.is_none() {
            let m = self.r.meta()?;
            self.meta = Some((m.clone(), m));
        }
        Ok(&mut self.meta.as_mut().expect("loaded above").1)
    }

    /// Touches a directory whose entries changed (mtime and ctime).
    pub fn touch_dir(&mut self, dir: u64) -> Result<()> {
        let mut d = self.dir(dir)?;
        (d.mtime, d.ctime) = (self.now, self.now);
        self.put(d);
        Ok(())
    }

    /// Drops the link `name` of `inode` (for a directory also its "."). The
    /// last link deletes it, unless `open` says a process still has it
    /// open: then it is kept as an orphan until [`super::FsHead::release`].
    pub fn unlink_inode(
        &mut self,
        mut inode: Inode,
        name: (u64, &[u8]),
        open: &dyn Fn(u64) -> bool,
    ) -> Result<()> {
        let dir = inode.kind == FileKind::Dir;
        inode.drop_link(name.0, name.1);
        inode.nlink = inode.nlink.saturating_sub(if dir { 2 } else { 1 });
        inode.ctime = self.now;
        if inode.nlink > 0 {
            self.put(inode);
        } else if open(inode.ino) {
            // Unlinked while open (a file someone holds open, or a
            // directory the kernel still holds): it lives on as an orphan
            // until its last close, so the holder's fstat, fchmod and
            // reads keep working, as on ext4.
            self.meta()?.orphans.push(inode.ino);
            self.put(inode);
        } else {
            self.delete(inode.ino);
        }
        Ok(())
    }

    /// How the bytes the staged inodes count against a quota differ from
    /// what they counted as read (see [`charged`]).
    fn charge_delta(&self) -> Result<i128> {
        let mut delta = 0i128;
        for (ino, new) in &self.inodes {
            let old = match (self.read.get(ino), new) {
                (Some(i), _) => charged(i.kind, i.size),
                // Deleted unread (a released orphan): read it now.
                (None, None) => match self.r.inode(*ino) {
                    Ok(i) => charged(i.kind, i.size),
                    Err(e) if e.posix_condition() == Some(Posix::NoEntry) => 0,
                    Err(e) => return Err(e),
                },
                // Put unread: a new inode.
                (None, Some(_)) => 0,
            };
            let new = new.as_ref().map_or(0, |i| charged(i.kind, i.size));
            delta += i128::from(new) - i128::from(old);
        }
        Ok(delta)
    }

    /// Keeps the volume's count of used bytes (when it has one) and
    /// refuses, with ENOSPC, a change that takes it past the quota. A
    /// change that frees space or leaves it as it was always passes, so a
    /// volume over a lowered quota can still be cleaned up.
    fn account(&mut self) -> Result<()> {
        let delta = self.charge_delta()?;
        if delta == 0 {
            return Ok(());
        }
        let quota = self.head.quota();
        // A quota with no count (a volume from before it was kept, or a
        // count lost with an unsynced write): count the tree as it stands
        // before this change, once, so the quota holds from here on.
        if quota.is_some() && self.meta()?.used.is_none() {
            let counted = self.r.count_used()?;
            self.meta()?.used = Some(counted);
        }
        let meta = self.meta()?;
        let Some(used) = meta.used else { return Ok(()) };
        let now = u64::try_from((i128::from(used) + delta).max(0)).unwrap_or(u64::MAX);
        if let Some(q) = quota.filter(|q| delta > 0 && now > *q) {
            let why = format!(
                "the volume's quota of {q} bytes is reached ({used} used, {delta} more asked)"
            );
            return Err(Error::posix(Posix::NoSpace, why));
        }
        meta.used = Some(now);
        Ok(())
    }

    pub fn commit(mut self) -> Result<()> {
        self.account()?;
        let meta_changed = self.meta.as_ref().is_some_and(|(read, now)| read != now);
        // Nothing changed (a release of a file that is no orphan): no write.
        if self.inodes.is_empty() && self.groups.is_empty() && !meta_changed && self.b.is_empty() {
            return Ok(());
        }
        let mut b = self.b;
        let o = self.head.overlay();
        for (ino, i) in &self.inodes {
            match i {
                Some(i) => {
                    o.put(&mut b, Space::Root, 0, *ino, &Dirty::Value(Bytes::from(i.encode())))
                }
                // The inode's own entries (directory names, file blocks)
                // stay until the next checkpoint, which folds around them
                // (their owner is gone) and drops the whole overlay.
                // Inode numbers are never reused, so nothing reads them;
                // clearing them here took two RocksDB range deletions per
                // unlink, and every later read paid for all of them.
                None => o.put(&mut b, Space::Root, 0, *ino, &Dirty::Delete),
            }
        }
        for ((dir, key), entries) in &self.groups {
            if matches!(self.inodes.get(dir), Some(None)) {
                continue;
            }
            let d = if entries.is_empty() {
                Dirty::Delete
            } else {
                Dirty::Value(Bytes::from(super::inode::encode_entries(entries)))
            };
            o.put(&mut b, Space::Dir, *dir, *key, &d);
        }
        if let Some((_, m)) = self.meta.as_ref().filter(|_| meta_changed) {
            o.put(&mut b, Space::Root, 0, META_KEY, &Dirty::Value(Bytes::from(m.encode())));
        }
        // Under the namespace lock: fs changes are ordered, so "only
        // accesses since the last checkpoint" stays exact.
        let only = self.access_only
            && (self.head.accessed_only.load(Ordering::Acquire) || o.is_empty()?);
        if self.sync_log_first {
            self.head.storage.sync_log(&mut b)?;
        }
        self.head.db().write(b, false)?;
        self.head.accessed_only.store(only, Ordering::Release);
        Ok(())
    }
}
