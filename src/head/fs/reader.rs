//! Reads of an fs volume's tree, live or frozen: inodes, directory
//! listings (in stable cookie order), file bytes, path resolution. Reads go
//! through a [`View`] (a live head or a frozen version).

use super::inode::{
    Content, DirEntry, FileKind, Inode, META_KEY, Meta, ROOT_INO, charged, decode_entries, name_key,
};
use crate::cas::ChunkStore;
use crate::error::{Error, Posix, Result};
use crate::head::blockmap::BlockMap;
use crate::head::overlay::{Dirty, Space};
use crate::head::{Found, Head, View};
use crate::map::{Map, MapRoot};
use bytes::Bytes;
use std::collections::BTreeMap;

pub const NAME_MAX: usize = 255;

fn enoent(what: impl std::fmt::Display) -> Error {
    Error::posix(Posix::NoEntry, format!("{what}: no such file or directory"))
}

/// Entries with their name keys, and the key to continue after.
pub type Page = (Vec<(u64, DirEntry)>, Option<u64>);

/// Read access to one state of an fs volume.
#[derive(Clone, Copy)]
pub struct FsReader<'a> {
    pub view: View<'a>,
    pub root: MapRoot,
    pub block_size: u64,
}

/// The most blocks holding data that [`FsReader::allocated_in`] counts
/// (64 GiB of 64 KiB blocks).
pub const COUNTED_BLOCKS: u64 = 1 << 20;

impl<'a> FsReader<'a> {
    /// The fs record (next inode number, orphans).
    pub(crate) fn meta(&self) -> Result<Meta> {
        match self.view.lookup(Space::Root, 0, META_KEY, self.root)? {
            Some(Found::Value(v)) => Meta::decode(&v),
            _ => Err(Error::corrupt("fs volume has no record")),
        }
    }

    pub fn inode(&self, ino: u64) -> Result<Inode> {
        match self.view.lookup(Space::Root, 0, ino, self.root)? {
            Some(Found::Value(v)) => Inode::decode(&v),
            Some(Found::Data(_)) => Err(Error::corrupt("inode map holds raw data")),
            None => Err(enoent(format!("inode {ino}"))),
        }
    }

    /// A reader of the live state of an fs head.
    pub(crate) fn live(head: &'a Head) -> FsReader<'a> {
        let block_size = head.record().block_size as u64;
        FsReader { view: View::Live(head), root: head.state().root, block_size }
    }

    /// A reader of a frozen state of an fs volume: the tree at `root`,
    /// whose files have blocks of `block_size` bytes.
    pub fn frozen(chunks: &'a ChunkStore, root: MapRoot, block_size: u32) -> FsReader<'a> {
        FsReader { view: View::Frozen(chunks), root, block_size: block_size as u64 }
    }

    pub(super) fn entries_at(&self, dir: &Inode, key: u64) -> Result<Vec<DirEntry>> {
        let base = dir.content_root(Space::Dir)?;
        match self.view.lookup(Space::Dir, dir.ino, key, base)? {
            Some(Found::Value(v)) => decode_entries(&v),
            Some(Found::Data(_)) => Err(Error::corrupt("directory map holds raw data")),
            None => Ok(Vec::new()),
        }
    }

    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<DirEntry>> {
        if dir.kind != FileKind::Dir {
            return Err(Error::posix(
                Posix::NotDir,
                format!("inode {} is not a directory", dir.ino),
            ));
        }
        Ok(self.entries_at(dir, name_key(name))?.into_iter().find(|e| e.name == name))
    }

    /// Entries of a directory with map key > `after` (0 = from the start),
    /// in stable key order, each with its key as a readdir cookie.
    pub fn list(&self, dir: &Inode, after: u64) -> Result<Vec<(u64, DirEntry)>> {
        let mut out = Vec::new();
        let mut at = after;
        loop {
            let (page, next) = self.list_page(dir, at, 4096)?;
            out.extend(page);
            match next {
                Some(n) => at = n,
                None => return Ok(out),
            }
        }
    }

    /// True when a directory has no entries. Cost: O(1) pages, except
    /// right after mass deletions not yet folded.
    pub fn is_empty(&self, dir: &Inode) -> Result<bool> {
        let mut at = 0;
        loop {
            let (page, next) = self.list_page(dir, at, 1)?;
            if !page.is_empty() {
                return Ok(false);
            }
            match next {
                Some(n) => at = n,
                None => return Ok(true),
            }
        }
    }

    /// One page of [`FsReader::list`]: entries of about `limit` name groups
    /// after key `after`, and the key to continue after (`None` at the
    /// end). A page may be empty while more follow. Cost: O(limit).
    pub fn list_page(&self, dir: &Inode, after: u64, limit: usize) -> Result<Page> {
        let base = dir.content_root(Space::Dir)?;
        if after == u64::MAX {
            return Ok((Vec::new(), None));
        }
        let limit = limit.max(1);
        let mut groups: BTreeMap<u64, Bytes> = BTreeMap::new();
        let mut hi = u64::MAX;
        Map::new(self.view.chunks()).range(base, after + 1, u64::MAX, &mut |k, v| {
            groups.insert(k, v.clone());
            if groups.len() >= limit {
                hi = k;
                return false;
            }
            true
        })?;
        if let View::Live(head) = self.view {
            let dirty = head.overlay().scan_limit(Space::Dir, dir.ino, after + 1, hi, limit)?;
            if dirty.len() >= limit {
                hi = hi.min(dirty.last().expect("non-empty").0);
            }
            for (k, d) in dirty {
                match d {
                    Dirty::Value(v) => groups.insert(k, v),
                    _ => groups.remove(&k),
                };
            }
        }
        let mut out = Vec::new();
        for (k, v) in groups.range(..=hi) {
            for e in decode_entries(v)? {
                out.push((*k, e));
            }
        }
        Ok((out, (hi != u64::MAX).then_some(hi)))
    }

    /// Reads file bytes at `offset`; returns how many were read (short at EOF).
    pub fn read(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset >= inode.size {
            return Ok(0);
        }
        let n = (inode.size - offset).min(buf.len() as u64) as usize;
        match &inode.content {
            Content::Inline(data) => {
                buf[..n].fill(0);
                let start = offset as usize;
                if start < data.len() {
                    let m = (data.len() - start).min(n);
                    buf[..m].copy_from_slice(&data[start..start + m]);
                }
            }
            Content::Blocks(base) => self.blocks(inode.ino, *base).read(offset, &mut buf[..n])?,
            _ => return Err(Error::invalid(format!("inode {} is not a regular file", inode.ino))),
        }
        Ok(n)
    }

    /// lseek(2)'s SEEK_DATA (`data`) or SEEK_HOLE from `offset`: the first
    /// offset at or after it in data, or in a hole (found at block
    /// granularity; the end of the file is a hole). ENXIO at or past the
    /// end, and for SEEK_DATA when only holes follow.
    pub fn seek(&self, inode: &Inode, offset: u64, data: bool) -> Result<u64> {
        let nxio =
            || Error::posix(Posix::NoSuchAddress, format!("offset {offset} is past the data"));
        if offset >= inode.size {
            return Err(nxio());
        }
        let base = match &inode.content {
            Content::Inline(_) => return Ok(if data { offset } else { inode.size }),
            Content::Blocks(base) => *base,
            _ => return Err(Error::invalid(format!("inode {} is not a regular file", inode.ino))),
        };
        let bs = self.block_size;
        let last = (inode.size - 1) / bs;
        match self.blocks(inode.ino, base).next(offset / bs, last, data)? {
            Some(b) => Ok((b * bs).max(offset)),
            None if data => Err(nxio()),
            None => Ok(inode.size),
        }
    }

    /// Bytes of a file that hold data, at block granularity (holes left
    /// by sparse writes, punching or truncation up do not count): what
    /// `st_blocks` reports. Small files kept in their record count their
    /// size. Cost: the blocks of the file.
    /// Past [`COUNTED_BLOCKS`] blocks of data, the size.
    pub fn allocated(&self, inode: &Inode) -> Result<u64> {
        Ok(self.allocated_in(inode, 0, inode.size)?.unwrap_or(inode.size))
    }

    /// [`FsReader::allocated`] within `[offset, offset + len)` (whole
    /// blocks; nothing past the end of the file); `None` when more than
    /// [`COUNTED_BLOCKS`] blocks hold data (counting on would cost time in
    /// proportion).
    pub fn allocated_in(&self, inode: &Inode, offset: u64, len: u64) -> Result<Option<u64>> {
        let end = offset.saturating_add(len).min(inode.size);
        if end <= offset {
            return Ok(Some(0));
        }
        match &inode.content {
            Content::Blocks(base) => {
                let (first, last) = (offset / self.block_size, (end - 1) / self.block_size);
                let map = self.blocks(inode.ino, *base);
                let n = map.count_allocated(first, last, COUNTED_BLOCKS)?;
                Ok(n.map(|n| n * self.block_size))
            }
            _ => Ok(Some(end - offset)),
        }
    }

    pub(super) fn blocks(&self, ino: u64, base: MapRoot) -> BlockMap<'a> {
        BlockMap {
            view: self.view,
            space: Space::File,
            owner: ino,
            base,
            block_size: self.block_size,
        }
    }

    /// Resolves an absolute or root-relative path, following no symlinks.
    pub fn resolve(&self, path: &str) -> Result<Inode> {
        let mut cur = self.inode(ROOT_INO)?;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            let e = self.lookup(&cur, part.as_bytes())?.ok_or_else(|| enoent(path))?;
            cur = self.inode(e.ino)?;
        }
        Ok(cur)
    }

    /// The path of an inode's first link, from the parent pointers.
    pub fn path_of(&self, inode: &Inode) -> Result<String> {
        let mut parts = Vec::new();
        let mut cur = inode.clone();
        while cur.ino != ROOT_INO {
            parts.push(String::from_utf8_lossy(&cur.name).into_owned());
            cur = self.inode(cur.parent)?;
            if parts.len() > 4096 {
                return Err(Error::corrupt("parent pointers form a cycle"));
            }
        }
        parts.reverse();
        Ok(format!("/{}", parts.join("/")))
    }
}

impl FsReader<'_> {
    /// Bytes the files of this state count against a quota: the kept
    /// count, or in a state from before it was kept [`FsReader::count_used`].
    pub(crate) fn used(&self) -> Result<u64> {
        match self.meta()?.used {
            Some(u) => Ok(u),
            None => self.count_used(),
        }
    }

    /// Bytes the files of this state count against a quota, counted by
    /// walking the whole tree (hard links once, orphans included). Cost:
    /// every directory and file.
    pub(crate) fn count_used(&self) -> Result<u64> {
        let mut seen = std::collections::HashSet::new();
        let mut used = 0u64;
        let mut count = |i: &Inode, seen: &mut std::collections::HashSet<u64>| {
            if i.nlink <= 1 || seen.insert(i.ino) {
                used = used.saturating_add(charged(i.kind, i.size));
            }
        };
        for o in self.meta()?.orphans {
            count(&self.inode(o)?, &mut seen);
        }
        let mut dirs = vec![self.inode(ROOT_INO)?];
        while let Some(dir) = dirs.pop() {
            for (_, e) in self.list(&dir, 0)? {
                match e.kind {
                    FileKind::Dir => dirs.push(self.inode(e.ino)?),
                    FileKind::File => count(&self.inode(e.ino)?, &mut seen),
                    _ => {}
                }
            }
        }
        Ok(used)
    }
}

/// The fs record to stage when `head` is restored to `root`: the restored
/// one, with the live head's next inode number if that is higher.
pub(crate) fn restored_meta(head: &Head, root: MapRoot) -> Result<Bytes> {
    let live = FsReader::live(head).meta()?;
    let mut restored =
        FsReader::frozen(&head.storage.chunks, root, head.record().block_size).meta()?;
    restored.next_ino = restored.next_ino.max(live.next_ino);
    Ok(Bytes::from(restored.encode()))
}

pub(super) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::posix(
            Posix::Invalid,
            format!("invalid file name {:?}", String::from_utf8_lossy(name)),
        ));
    }
    if name.len() > NAME_MAX {
        return Err(Error::posix(Posix::NameTooLong, "file name longer than 255 bytes"));
    }
    Ok(())
}
