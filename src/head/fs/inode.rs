//! Inode records and directory entry lists of fs volumes, as stored in the
//! Merkle maps. Binary, with a version byte; see docs/FORMAT.md.

use crate::error::{Error, Posix, Result};
use crate::head::overlay::Space;
use crate::id::ChunkId;
use crate::map::MapRoot;
use bytes::Bytes;

pub const INODE_VERSION: u8 = 1;
/// Key of the fs volume's own record (next inode number) in the inode map.
/// Tags the optional tail of an inode record that lists further hard links.
const LINKS_TAG: u8 = 1;
/// Tags the optional tail of an inode record that holds its flags.
const FLAGS_TAG: u8 = 2;
pub const META_KEY: u64 = 0;
pub const ROOT_INO: u64 = 1;
/// Files up to this size live inside their inode record.
pub const INLINE_MAX: usize = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FileKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl FileKind {
    pub fn from_u8(b: u8) -> Result<FileKind> {
        Ok(match b {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return Err(Error::corrupt(format!("file kind {b} is unknown"))),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    pub fn now() -> Time {
        Time::of(std::time::SystemTime::now())
    }

    /// A `SystemTime`, either side of 1970.
    pub fn of(t: std::time::SystemTime) -> Time {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Time { secs: d.as_secs() as i64, nanos: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Time { secs, nanos }
            }
        }
    }

    /// As a `SystemTime`; a time it cannot hold (a record from disk may
    /// say anything) is the epoch rather than a panic.
    pub fn to_system(self) -> std::time::SystemTime {
        use std::time::{Duration, UNIX_EPOCH};
        let nanos = Duration::from_nanos(self.nanos.min(999_999_999) as u64);
        let t = if self.secs >= 0 {
            UNIX_EPOCH.checked_add(Duration::from_secs(self.secs as u64))
        } else {
            UNIX_EPOCH.checked_sub(Duration::from_secs(self.secs.unsigned_abs()))
        };
        t.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Device nodes, fifos, sockets.
    None,
    /// A small file's bytes.
    Inline(Bytes),
    /// A file's block map.
    Blocks(MapRoot),
    /// A directory's entry map (name hash -> entries).
    Entries(MapRoot),
    /// A symlink's target.
    Target(Bytes),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub kind: FileKind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub crtime: Time,
    /// Directory holding the first link, and that link's name (for paths in diffs).
    pub parent: u64,
    pub name: Bytes,
    pub content: Content,
    pub xattrs: Vec<(Bytes, Bytes)>,
    /// The other names of a file with several hard links (the first is
    /// `parent`/`name`), so its paths stay right whichever name goes.
    pub links: Vec<(u64, Bytes)>,
    /// Inode flags (`chattr`), numbered as Linux's FS_IOC_GETFLAGS: see
    /// [`FL_SETTABLE`].
    pub flags: u32,
}

/// `chattr +i`: no change at all, to the inode or (for a directory) its names.
pub const FL_IMMUTABLE: u32 = 0x10;
/// `chattr +a`: data only appended; a directory only gains names.
pub const FL_APPEND: u32 = 0x20;
/// `chattr +d`: kept for backup tools (no effect here).
pub const FL_NODUMP: u32 = 0x40;
/// `chattr +A`: reads record no access time.
pub const FL_NOATIME: u32 = 0x80;
/// The flags an inode may carry (tmpfs's set); others are refused.
pub const FL_SETTABLE: u32 = FL_IMMUTABLE | FL_APPEND | FL_NODUMP | FL_NOATIME;

impl Inode {
    /// Whether a read at `now` records the access (the atime): every
    /// read under `strict`, else (relatime) only when the last recorded
    /// access is not after the last change or is a day old; never with
    /// `chattr +A`.
    pub fn access_due(&self, now: Time, strict: bool) -> bool {
        const DAY: i64 = 24 * 60 * 60;
        if self.flags & FL_NOATIME != 0 || self.atime == now {
            return false;
        }
        strict
            || self.atime <= self.mtime
            || self.atime <= self.ctime
            || now.secs.saturating_sub(self.atime.secs) >= DAY
    }

    /// What a write, a truncation or a change of owner takes from a
    /// regular file, as Linux takes it: its file capabilities
    /// (`security.capability`) always; with `suidgid` (the caller lacks
    /// CAP_FSETID, or the owner changes) set-user-ID, and set-group-ID
    /// when group execute is set (without it the bit marks mandatory
    /// locking, which stays).
    pub fn kill_privs(&mut self, suidgid: bool) {
        if self.kind != FileKind::File {
            return;
        }
        self.xattrs.retain(|(k, _)| &k[..] != b"security.capability");
        if suidgid {
            self.perm &= !0o4000;
            if self.perm & 0o010 != 0 {
                self.perm &= !0o2000;
            }
        }
    }

    /// EPERM if the inode is immutable or append-only (what may not
    /// happen to either: removing or renaming it, changing its attributes,
    /// rewriting its data or, for a directory, removing its names).
    pub fn check_mutable(&self) -> Result<()> {
        if self.flags & (FL_IMMUTABLE | FL_APPEND) != 0 {
            let why = format!("inode {} is immutable or append-only", self.ino);
            return Err(Error::posix(Posix::NotPermitted, why));
        }
        Ok(())
    }

    /// EPERM if the inode is immutable (an append-only file may grow and
    /// an append-only directory gain names).
    pub fn check_not_immutable(&self) -> Result<()> {
        if self.flags & FL_IMMUTABLE != 0 {
            let why = format!("inode {} is immutable", self.ino);
            return Err(Error::posix(Posix::NotPermitted, why));
        }
        Ok(())
    }

    pub fn content_root(&self, space: Space) -> Result<MapRoot> {
        match (space, &self.content) {
            (Space::File, Content::Blocks(r)) | (Space::Dir, Content::Entries(r)) => Ok(*r),
            _ => Err(Error::corrupt(format!("inode {} has no {space:?} map", self.ino))),
        }
    }

    pub fn set_content_root(&mut self, space: Space, root: MapRoot) -> Result<()> {
        match (space, &mut self.content) {
            (Space::File, Content::Blocks(r)) | (Space::Dir, Content::Entries(r)) => {
                *r = root;
                Ok(())
            }
            _ => Err(Error::corrupt(format!("inode {} has no {space:?} map", self.ino))),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(96 + self.name.len());
        w.push(INODE_VERSION);
        w.push(self.kind as u8);
        w.extend_from_slice(&self.perm.to_le_bytes());
        for v in [self.uid, self.gid, self.nlink] {
            w.extend_from_slice(&v.to_le_bytes());
        }
        w.extend_from_slice(&self.size.to_le_bytes());
        w.extend_from_slice(&self.rdev.to_le_bytes());
        for t in [self.atime, self.mtime, self.ctime, self.crtime] {
            w.extend_from_slice(&t.secs.to_le_bytes());
            w.extend_from_slice(&t.nanos.to_le_bytes());
        }
        w.extend_from_slice(&self.ino.to_le_bytes());
        w.extend_from_slice(&self.parent.to_le_bytes());
        put_bytes16(&mut w, &self.name);
        match &self.content {
            Content::None => w.push(0),
            Content::Inline(b) => {
                w.push(1);
                put_bytes32(&mut w, b);
            }
            Content::Blocks(r) => {
                w.push(2);
                put_root(&mut w, r);
            }
            Content::Entries(r) => {
                w.push(3);
                put_root(&mut w, r);
            }
            Content::Target(t) => {
                w.push(4);
                put_bytes16(&mut w, t);
            }
        }
        w.extend_from_slice(&(self.xattrs.len() as u16).to_le_bytes());
        for (k, v) in &self.xattrs {
            put_bytes16(&mut w, k);
            put_bytes32(&mut w, v);
        }
        // Optional tail (absent for files with one name: their records
        // are what they were before hard links had one).
        if !self.links.is_empty() {
            w.push(LINKS_TAG);
            w.extend_from_slice(&(self.links.len() as u32).to_le_bytes());
            for (dir, name) in &self.links {
                w.extend_from_slice(&dir.to_le_bytes());
                put_bytes16(&mut w, name);
            }
        }
        if self.flags != 0 {
            w.push(FLAGS_TAG);
            w.extend_from_slice(&self.flags.to_le_bytes());
        }
        w
    }

    /// Forgets the link `dir`/`name` (being removed): the next name, if
    /// any, becomes the first.
    pub fn drop_link(&mut self, dir: u64, name: &[u8]) {
        if self.parent == dir && self.name == name {
            if !self.links.is_empty() {
                (self.parent, self.name) = self.links.remove(0);
            }
        } else if let Some(i) = self.links.iter().position(|(d, n)| *d == dir && n == name) {
            self.links.remove(i);
        }
    }

    /// The link `from` is now called `to`.
    pub fn move_link(&mut self, from: (u64, &[u8]), to: (u64, &[u8])) {
        let to_name = Bytes::copy_from_slice(to.1);
        if self.kind == FileKind::Dir || (self.parent == from.0 && self.name == from.1) {
            (self.parent, self.name) = (to.0, to_name);
        } else if let Some(l) = self.links.iter_mut().find(|(d, n)| *d == from.0 && n == from.1) {
            *l = (to.0, to_name);
        }
    }

    pub fn decode(b: &Bytes) -> Result<Inode> {
        let mut r = Reader { b, pos: 0 };
        if r.u8()? != INODE_VERSION {
            return Err(Error::corrupt("inode record version is unknown"));
        }
        let kind = FileKind::from_u8(r.u8()?)?;
        let perm = r.u16()?;
        let (uid, gid, nlink) = (r.u32()?, r.u32()?, r.u32()?);
        let size = r.u64()?;
        let rdev = r.u32()?;
        let mut times = [Time::default(); 4];
        for t in &mut times {
            *t = Time { secs: r.u64()? as i64, nanos: r.u32()? };
        }
        let ino = r.u64()?;
        let parent = r.u64()?;
        let name = r.bytes16()?;
        let content = match r.u8()? {
            0 => Content::None,
            1 => Content::Inline(r.bytes32()?),
            2 => Content::Blocks(r.root()?),
            3 => Content::Entries(r.root()?),
            4 => Content::Target(r.bytes16()?),
            t => return Err(Error::corrupt(format!("inode content tag {t} is unknown"))),
        };
        let n = r.u16()?;
        let mut xattrs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            xattrs.push((r.bytes16()?, r.bytes32()?));
        }
        let mut links = Vec::new();
        let mut flags = 0;
        // Tail sections, each optional, in tag order.
        let mut last_tag = 0;
        while r.pos < r.b.len() {
            let tag = r.u8()?;
            if tag <= last_tag {
                return Err(Error::corrupt("inode record tail is out of order"));
            }
            last_tag = tag;
            match tag {
                LINKS_TAG => {
                    let n = r.u32()?;
                    if n as usize > r.b.len() {
                        return Err(Error::corrupt("inode link count is impossible"));
                    }
                    for _ in 0..n {
                        links.push((r.u64()?, r.bytes16()?));
                    }
                }
                FLAGS_TAG => flags = r.u32()?,
                _ => return Err(Error::corrupt("inode record tail is unknown")),
            }
        }
        r.finish()?;
        let [atime, mtime, ctime, crtime] = times;
        Ok(Inode {
            ino,
            kind,
            perm,
            uid,
            gid,
            nlink,
            size,
            rdev,
            atime,
            mtime,
            ctime,
            crtime,
            parent,
            name,
            content,
            xattrs,
            links,
            flags,
        })
    }
}

/// One name in a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Bytes,
    pub ino: u64,
    pub kind: FileKind,
}

/// The map key of a name: a 63-bit hash, never 0 (0 starts a readdir).
pub fn name_key(name: &[u8]) -> u64 {
    let h = blake3::hash(name);
    let k = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes")) >> 1;
    k.max(1)
}

/// Encodes the entries sharing one name hash (almost always one).
pub fn encode_entries(entries: &[DirEntry]) -> Vec<u8> {
    let mut w = Vec::new();
    w.push(INODE_VERSION);
    w.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for e in entries {
        put_bytes16(&mut w, &e.name);
        w.extend_from_slice(&e.ino.to_le_bytes());
        w.push(e.kind as u8);
    }
    w
}

pub fn decode_entries(b: &Bytes) -> Result<Vec<DirEntry>> {
    let mut r = Reader { b, pos: 0 };
    if r.u8()? != INODE_VERSION {
        return Err(Error::corrupt("directory entry version is unknown"));
    }
    let n = r.u16()?;
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let name = r.bytes16()?;
        let ino = r.u64()?;
        let kind = FileKind::from_u8(r.u8()?)?;
        out.push(DirEntry { name, ino, kind });
    }
    r.finish()?;
    Ok(out)
}

/// The fs volume's own record, at [`META_KEY`] of the inode map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub next_ino: u64,
    /// Inodes whose last name went while a process still had them open:
    /// kept (nlink 0) until released, reclaimed at the next mount if the
    /// holder died.
    pub orphans: Vec<u64>,
    /// Bytes the volume's files take, as a quota counts them (see
    /// [`charged`]); `None` in volumes made before it was kept, until a
    /// quota is set on them (then counted once).
    pub used: Option<u64>,
}

/// What a file of `size` bytes counts against a quota: its size rounded
/// up to 4 KiB (holes included, so a sparse file counts as if written);
/// directories, symlinks and special files count nothing.
pub fn charged(kind: FileKind, size: u64) -> u64 {
    match kind {
        FileKind::File => size.div_ceil(QUOTA_UNIT).saturating_mul(QUOTA_UNIT),
        _ => 0,
    }
}

/// The unit a quota counts files in.
pub const QUOTA_UNIT: u64 = 4096;

impl Meta {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = vec![INODE_VERSION];
        w.extend_from_slice(&self.next_ino.to_le_bytes());
        if !self.orphans.is_empty() || self.used.is_some() {
            w.extend_from_slice(&(self.orphans.len() as u32).to_le_bytes());
            for o in &self.orphans {
                w.extend_from_slice(&o.to_le_bytes());
            }
        }
        if let Some(used) = self.used {
            w.extend_from_slice(&used.to_le_bytes());
        }
        w
    }

    pub fn decode(b: &Bytes) -> Result<Meta> {
        let mut r = Reader { b, pos: 0 };
        if r.u8()? != INODE_VERSION {
            return Err(Error::corrupt("fs record version is unknown"));
        }
        let next_ino = r.u64()?;
        let mut orphans = Vec::new();
        if r.pos < b.len() {
            let n = r.u32()?;
            for _ in 0..n {
                orphans.push(r.u64()?);
            }
        }
        let used = if r.pos < b.len() { Some(r.u64()?) } else { None };
        r.finish()?;
        Ok(Meta { next_ino, orphans, used })
    }
}

fn put_bytes16(w: &mut Vec<u8>, b: &[u8]) {
    w.extend_from_slice(&(b.len() as u16).to_le_bytes());
    w.extend_from_slice(b);
}

fn put_bytes32(w: &mut Vec<u8>, b: &[u8]) {
    w.extend_from_slice(&(b.len() as u32).to_le_bytes());
    w.extend_from_slice(b);
}

fn put_root(w: &mut Vec<u8>, r: &MapRoot) {
    match r {
        None => w.push(0),
        Some(id) => {
            w.push(1);
            w.extend_from_slice(&id.0);
        }
    }
}

/// Bounds-checked decoding: truncated or malformed records are `Corrupt`.
struct Reader<'a> {
    b: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.b.len());
        let end = end.ok_or_else(|| Error::corrupt("record is truncated"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes16(&mut self) -> Result<Bytes> {
        let n = self.u16()? as usize;
        let start = self.pos;
        self.take(n)?;
        Ok(self.b.slice(start..start + n))
    }
    fn bytes32(&mut self) -> Result<Bytes> {
        let n = self.u32()? as usize;
        let start = self.pos;
        self.take(n)?;
        Ok(self.b.slice(start..start + n))
    }
    fn root(&mut self) -> Result<MapRoot> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(ChunkId::from_slice(self.take(32)?)?)),
            _ => Err(Error::corrupt("map root flag is invalid")),
        }
    }
    fn finish(&self) -> Result<()> {
        if self.pos != self.b.len() {
            return Err(Error::corrupt("record has trailing bytes"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for t in [
            Time { secs: 0, nanos: 0 },
            Time { secs: 1_700_000_000, nanos: 123 },
            Time { secs: -1, nanos: 5 },
            Time { secs: -86_400, nanos: 999_999_999 },
        ] {
            assert_eq!(Time::of(t.to_system()), t);
        }
        // Records from disk may hold anything: extremes convert without a
        // panic (nanoseconds beyond a second are clamped).
        for secs in [i64::MIN, i64::MAX] {
            let t = Time { secs, nanos: u32::MAX };
            assert_eq!(Time::of(t.to_system()), Time { secs, nanos: 999_999_999 });
        }
    }

    #[test]
    fn inodes_and_entries_round_trip() {
        let i = Inode {
            ino: 42,
            kind: FileKind::Dir,
            perm: 0o755,
            uid: 1000,
            gid: 1000,
            nlink: 2,
            size: 0,
            rdev: 0,
            atime: Time { secs: -5, nanos: 7 },
            mtime: Time::now(),
            ctime: Time::now(),
            crtime: Time::default(),
            parent: 1,
            name: Bytes::from_static(b"src"),
            content: Content::Entries(Some(ChunkId([3; 32]))),
            xattrs: vec![(Bytes::from_static(b"user.a"), Bytes::from_static(b"1"))],
            links: Vec::new(),
            flags: 0,
        };
        let enc = Bytes::from(i.encode());
        assert_eq!(Inode::decode(&enc).unwrap(), i);
        for n in 0..enc.len() {
            assert!(Inode::decode(&enc.slice(..n)).is_err());
        }
        let linked = Inode {
            kind: FileKind::File,
            content: Content::Inline(Bytes::from_static(b"data")),
            links: vec![(7, Bytes::from_static(b"second")), (1, Bytes::from_static(b"third"))],
            ..i.clone()
        };
        let enc = Bytes::from(linked.encode());
        assert_eq!(Inode::decode(&enc).unwrap(), linked);
        let plain = Inode { links: Vec::new(), ..linked.clone() }.encode().len();
        for n in (0..enc.len()).filter(|n| *n != plain) {
            assert!(Inode::decode(&enc.slice(..n)).is_err(), "truncated at {n}");
        }
        // Flags follow the links; a record with only flags, or both, round-trips.
        for links in [Vec::new(), linked.links.clone()] {
            let flagged = Inode { flags: FL_IMMUTABLE | FL_NODUMP, links, ..linked.clone() };
            let enc = Bytes::from(flagged.encode());
            assert_eq!(Inode::decode(&enc).unwrap(), flagged);
            let mut swapped = enc.to_vec();
            if !flagged.links.is_empty() {
                // Sections out of order are refused.
                let at = plain;
                let tail = swapped.split_off(at);
                let (links, flags) = tail.split_at(tail.len() - 5);
                swapped.extend_from_slice(flags);
                swapped.extend_from_slice(links);
                assert!(Inode::decode(&Bytes::from(swapped)).is_err());
            }
        }
        let mut moved = linked.clone();
        moved.drop_link(1, b"src");
        assert_eq!((moved.parent, &moved.name[..], moved.links.len()), (7, &b"second"[..], 1));
        moved.move_link((1, b"third"), (9, b"fourth"));
        assert_eq!(moved.links, vec![(9, Bytes::from_static(b"fourth"))]);
        let es = vec![DirEntry { name: Bytes::from_static(b"a"), ino: 9, kind: FileKind::File }];
        assert_eq!(decode_entries(&Bytes::from(encode_entries(&es))).unwrap(), es);
        assert_ne!(name_key(b"a"), 0);
        let metas = [
            Meta { next_ino: 7, orphans: vec![], used: None },
            Meta { next_ino: 9, orphans: vec![3, 5], used: None },
            Meta { next_ino: 9, orphans: vec![], used: Some(8192) },
            Meta { next_ino: 9, orphans: vec![4], used: Some(0) },
        ];
        for m in metas {
            let enc = Bytes::from(m.encode());
            assert_eq!(Meta::decode(&enc).unwrap(), m);
            for n in 0..enc.len() {
                assert_ne!(Meta::decode(&enc.slice(..n)).ok(), Some(m.clone()), "{n}");
            }
        }
    }
}
