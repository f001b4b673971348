//! The inode-level API of fs volumes: inode records in the volume's root
//! map, a map of entries per directory, a block map per large file. Reads
//! go through a [`View`] (a live head or a frozen version); changes go
//! through a live head's overlay.

use super::inode::{
    Content, DirEntry, FileKind, INLINE_MAX, Inode, META_KEY, ROOT_INO, Time, decode_entries,
    decode_meta, encode_entries, encode_meta, name_key,
};
use super::{BlockMap, Found, Head, View};
use crate::error::{Error, ErrorKind, Result};
use crate::map::{Map, MapRoot, NodeStore};
use crate::overlay::{Dirty, Space};
use crate::version::VolumeKind;
use bytes::Bytes;
use rocksdb::WriteBatch;
use std::collections::BTreeMap;

pub const NAME_MAX: usize = 255;

/// The root map of a new, empty fs volume: its record and the root directory.
pub fn initial_root(nodes: &dyn NodeStore) -> Result<MapRoot> {
    let now = Time::now();
    let root = Inode {
        ino: ROOT_INO,
        kind: FileKind::Dir,
        perm: 0o755,
        uid: 0,
        gid: 0,
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
    };
    Map::new(nodes).apply(
        None,
        &[
            (META_KEY, Some(Bytes::from(encode_meta(ROOT_INO + 1)))),
            (ROOT_INO, Some(Bytes::from(root.encode()))),
        ],
    )
}

fn enoent(what: impl std::fmt::Display) -> Error {
    Error::not_found(format!("{what}: no such file or directory"))
}

/// Read access to one state of an fs volume.
#[derive(Clone, Copy)]
pub struct FsReader<'a> {
    pub view: View<'a>,
    pub root: MapRoot,
    pub block_size: u64,
}

impl<'a> FsReader<'a> {
    pub fn inode(&self, ino: u64) -> Result<Inode> {
        match self.view.lookup(Space::Root, 0, ino, self.root)? {
            Some(Found::Value(v)) => Inode::decode(&v),
            Some(Found::Data(_)) => Err(Error::corrupt("inode map holds raw data")),
            None => Err(enoent(format!("inode {ino}"))),
        }
    }

    fn entries_at(&self, dir: &Inode, key: u64) -> Result<Vec<DirEntry>> {
        let base = dir.content_root(Space::Dir)?;
        match self.view.lookup(Space::Dir, dir.ino, key, base)? {
            Some(Found::Value(v)) => decode_entries(&v),
            Some(Found::Data(_)) => Err(Error::corrupt("directory map holds raw data")),
            None => Ok(Vec::new()),
        }
    }

    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<DirEntry>> {
        if dir.kind != FileKind::Dir {
            return Err(Error::invalid(format!("inode {} is not a directory", dir.ino)));
        }
        Ok(self.entries_at(dir, name_key(name))?.into_iter().find(|e| e.name == name))
    }

    /// Entries of a directory with map key > `after` (0 = from the start),
    /// in stable key order, each with its key as a readdir cookie.
    pub fn list(&self, dir: &Inode, after: u64) -> Result<Vec<(u64, DirEntry)>> {
        let base = dir.content_root(Space::Dir)?;
        let mut groups: BTreeMap<u64, Bytes> = BTreeMap::new();
        if after < u64::MAX {
            Map::new(self.view.store().chunks().as_ref()).range(
                base,
                after + 1,
                u64::MAX,
                &mut |k, v| {
                    groups.insert(k, v.clone());
                    true
                },
            )?;
            if let View::Live(head) = self.view {
                for (k, d) in head.overlay().scan(Space::Dir, dir.ino, after + 1, u64::MAX)? {
                    match d {
                        Dirty::Value(v) => groups.insert(k, v),
                        _ => groups.remove(&k),
                    };
                }
            }
        }
        let mut out = Vec::new();
        for (k, v) in groups {
            for e in decode_entries(&v)? {
                out.push((k, e));
            }
        }
        Ok(out)
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

    fn blocks(&self, ino: u64, base: MapRoot) -> BlockMap<'a> {
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

/// Attributes a caller may set.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
}

impl Head {
    fn check_fs(&self) -> Result<()> {
        if self.kind() != VolumeKind::Fs {
            return Err(Error::invalid(format!(
                "volume {} is not an fs volume",
                self.record().name
            )));
        }
        self.check_live()
    }

    /// A reader of the live state of this fs volume.
    pub fn fs(&self) -> FsReader<'_> {
        let block_size = self.record().block_size as u64;
        FsReader { view: View::Live(self), root: self.state().root, block_size }
    }

    fn put_inode(&self, b: &mut WriteBatch, inode: &Inode) {
        self.overlay().put(
            b,
            Space::Root,
            0,
            inode.ino,
            &Dirty::Value(Bytes::from(inode.encode())),
        );
    }

    fn put_entries(&self, b: &mut WriteBatch, dir: u64, key: u64, entries: &[DirEntry]) {
        let d = if entries.is_empty() {
            Dirty::Delete
        } else {
            Dirty::Value(Bytes::from(encode_entries(entries)))
        };
        self.overlay().put(b, Space::Dir, dir, key, &d);
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
        check_name(name)?;
        let _gate = self.gate.read();
        self.check_fs()?;
        let _ns = self.ns.lock();
        let r = self.fs();
        let mut parent = r.inode(dir)?;
        if parent.kind != FileKind::Dir {
            return Err(Error::invalid(format!("inode {dir} is not a directory")));
        }
        let key = name_key(name);
        let mut entries = r.entries_at(&parent, key)?;
        if entries.iter().any(|e| e.name == name) {
            return Err(Error::conflict(format!("{} exists", String::from_utf8_lossy(name))));
        }
        let meta = match r.view.lookup(Space::Root, 0, META_KEY, r.root)? {
            Some(Found::Value(v)) => decode_meta(&v)?,
            _ => return Err(Error::corrupt("fs volume has no record")),
        };
        let ino = meta;
        let now = Time::now();
        let (content, size, nlink) = match kind {
            FileKind::Dir => (Content::Entries(None), 0, 2),
            FileKind::File => (Content::Inline(Bytes::new()), 0, 1),
            FileKind::Symlink => {
                let t = target.ok_or_else(|| Error::invalid("a symlink needs a target"))?;
                if t.is_empty() || t.len() > 4095 {
                    return Err(Error::invalid("symlink target must be 1-4095 bytes"));
                }
                (Content::Target(Bytes::copy_from_slice(t)), t.len() as u64, 1)
            }
            _ => (Content::None, 0, 1),
        };
        let inode = Inode {
            ino,
            kind,
            perm: perm & 0o7777,
            uid: owner.0,
            gid: owner.1,
            nlink,
            size,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            parent: dir,
            name: Bytes::copy_from_slice(name),
            content,
            xattrs: Vec::new(),
        };
        entries.push(DirEntry { name: Bytes::copy_from_slice(name), ino, kind });
        parent.mtime = now;
        parent.ctime = now;
        if kind == FileKind::Dir {
            parent.nlink += 1;
        }
        let mut b = WriteBatch::default();
        self.overlay().put(
            &mut b,
            Space::Root,
            0,
            META_KEY,
            &Dirty::Value(Bytes::from(encode_meta(ino + 1))),
        );
        self.put_inode(&mut b, &inode);
        self.put_inode(&mut b, &parent);
        self.put_entries(&mut b, dir, key, &entries);
        self.store.index().write(b, false)?;
        Ok(inode)
    }

    /// Writes file bytes at `offset`, growing the file as needed.
    pub fn write_file(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::invalid("offset overflows"))?;
        if data.is_empty() {
            return Ok(());
        }
        let _gate = self.gate.read();
        self.check_fs()?;
        let _ns = self.ns.lock();
        let r = self.fs();
        let mut inode = r.inode(ino)?;
        if inode.kind != FileKind::File {
            return Err(Error::invalid(format!("inode {ino} is not a regular file")));
        }
        let new_size = inode.size.max(end);
        let mut b = WriteBatch::default();
        match &inode.content {
            Content::Inline(old) if new_size as usize <= INLINE_MAX => {
                let mut buf = old.to_vec();
                buf.resize(new_size as usize, 0);
                buf[offset as usize..end as usize].copy_from_slice(data);
                inode.content = Content::Inline(Bytes::from(buf));
            }
            Content::Inline(old) => {
                // Move the inline bytes into blocks first, committed with the
                // inode's switch to a block map: a consistent state on its own.
                let map = r.blocks(ino, None);
                map.write(&mut b, 0, old)?;
                inode.content = Content::Blocks(None);
                self.put_inode(&mut b, &inode);
                self.store.index().write(std::mem::take(&mut b), false)?;
                let _s = self.lock_block_range(
                    ino,
                    offset / map.block_size,
                    (end - 1).max(offset) / map.block_size,
                );
                map.write(&mut b, offset, data)?;
            }
            Content::Blocks(base) => {
                let map = r.blocks(ino, *base);
                let bs = map.block_size;
                let _s = self.lock_block_range(ino, offset / bs, (end - 1).max(offset) / bs);
                map.write(&mut b, offset, data)?;
            }
            _ => return Err(Error::corrupt(format!("file {ino} has no data content"))),
        }
        inode.size = new_size;
        let now = Time::now();
        inode.mtime = now;
        inode.ctime = now;
        self.put_inode(&mut b, &inode);
        self.store.index().write(b, false)
    }

    /// Changes attributes; a size change truncates or extends with zeros.
    pub fn set_attr(&self, ino: u64, attr: &SetAttr) -> Result<Inode> {
        let _gate = self.gate.read();
        self.check_fs()?;
        let _ns = self.ns.lock();
        let r = self.fs();
        let mut inode = r.inode(ino)?;
        let mut b = WriteBatch::default();
        let now = Time::now();
        if let Some(size) = attr.size {
            if inode.kind != FileKind::File {
                return Err(Error::invalid(format!("inode {ino} is not a regular file")));
            }
            match &inode.content {
                Content::Inline(old) if size as usize <= INLINE_MAX => {
                    let mut buf = old.to_vec();
                    buf.resize(size as usize, 0);
                    inode.content = Content::Inline(Bytes::from(buf));
                }
                Content::Inline(old) => {
                    let map = r.blocks(ino, None);
                    map.write(&mut b, 0, old)?;
                    inode.content = Content::Blocks(None);
                }
                Content::Blocks(base) if size < inode.size => {
                    let map = r.blocks(ino, *base);
                    let bs = map.block_size;
                    let first_whole = size.div_ceil(bs);
                    map.drop_from(&mut b, first_whole)?;
                    if size % bs != 0 {
                        map.zero(&mut b, size, first_whole * bs - size)?;
                    }
                }
                _ => {}
            }
            inode.size = size;
            inode.mtime = now;
        }
        if let Some(p) = attr.perm {
            inode.perm = p & 0o7777;
        }
        if let Some(u) = attr.uid {
            inode.uid = u;
        }
        if let Some(g) = attr.gid {
            inode.gid = g;
        }
        if let Some(t) = attr.atime {
            inode.atime = t;
        }
        if let Some(t) = attr.mtime {
            inode.mtime = t;
        }
        inode.ctime = now;
        self.put_inode(&mut b, &inode);
        self.store.index().write(b, false)?;
        Ok(inode)
    }

    /// Removes a name; a non-directory whose last link goes is deleted.
    pub fn unlink(&self, dir: u64, name: &[u8]) -> Result<()> {
        self.remove(dir, name, false)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, dir: u64, name: &[u8]) -> Result<()> {
        self.remove(dir, name, true)
    }

    fn remove(&self, dir: u64, name: &[u8], want_dir: bool) -> Result<()> {
        let _gate = self.gate.read();
        self.check_fs()?;
        let _ns = self.ns.lock();
        let r = self.fs();
        let mut parent = r.inode(dir)?;
        let key = name_key(name);
        let mut entries = r.entries_at(&parent, key)?;
        let pos = entries
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| enoent(String::from_utf8_lossy(name)))?;
        let mut target = r.inode(entries[pos].ino)?;
        let is_dir = target.kind == FileKind::Dir;
        if want_dir && !is_dir {
            return Err(Error::invalid(format!(
                "{} is not a directory",
                String::from_utf8_lossy(name)
            )));
        }
        if !want_dir && is_dir {
            return Err(Error::invalid(format!(
                "{} is a directory",
                String::from_utf8_lossy(name)
            )));
        }
        if is_dir && !r.list(&target, 0)?.is_empty() {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("{} is not empty", String::from_utf8_lossy(name)),
            ));
        }
        entries.remove(pos);
        let mut b = WriteBatch::default();
        self.put_entries(&mut b, dir, key, &entries);
        let now = Time::now();
        parent.mtime = now;
        parent.ctime = now;
        if is_dir {
            parent.nlink -= 1;
        }
        self.put_inode(&mut b, &parent);
        target.nlink = target.nlink.saturating_sub(if is_dir { 2 } else { 1 });
        if target.nlink == 0 {
            let o = self.overlay();
            o.put(&mut b, Space::Root, 0, target.ino, &Dirty::Delete);
            o.clear_group(&mut b, Space::Dir, target.ino);
            o.clear_group(&mut b, Space::File, target.ino);
        } else {
            target.ctime = now;
            self.put_inode(&mut b, &target);
        }
        self.store.index().write(b, false)
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::invalid(format!(
            "invalid file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    if name.len() > NAME_MAX {
        return Err(Error::invalid("file name longer than 255 bytes"));
    }
    Ok(())
}

/// A reader of a frozen version of an fs volume.
pub fn reader_for_version(
    store: &crate::store::Store,
    root: MapRoot,
    block_size: u32,
) -> FsReader<'_> {
    FsReader { view: View::Frozen(store), root, block_size: block_size as u64 }
}
