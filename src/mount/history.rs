//! `DIR/.forkfs/versions/<name-or-id>/...`: every version of the mounted
//! volume, read-only, inside the mount (hidden from the root's readdir,
//! like ZFS's `.zfs`).
//!
//! FUSE inode numbers: the volume's own below 2^48; `.forkfs` and
//! `.forkfs/versions` at 2^62 and 2^62 + 1; inode `i` of the version in
//! slot `s` at 2^63 | s << 48 | i (slots are handed out as versions are
//! looked up, up to 2^15 per mount).

use forkfs::fs::{Content, FileKind, Inode, ROOT_INO, Time};
use forkfs::{Error, Store, VersionRecord};
use parking_lot::Mutex;
use std::collections::HashMap;

pub const NAME: &[u8] = b".forkfs";
pub const CTL_DIR: u64 = 1 << 62;
pub const VERSIONS_DIR: u64 = CTL_DIR + 1;
const SLOT_BIT: u64 = 1 << 63;
const INO_BITS: u32 = 48;
const MAX_SLOTS: usize = 1 << 15;

/// Where a FUSE inode number points.
pub enum Place {
    /// The mounted tree's own inode.
    Own(u64),
    /// `.forkfs` or `.forkfs/versions`.
    Virtual(u64),
    /// Inode `ino` of a version, whose numbers carry `base`.
    Version { version: VersionRecord, ino: u64, base: u64 },
}

#[derive(Default)]
pub struct Slots {
    versions: Mutex<(Vec<VersionRecord>, HashMap<forkfs::VersionId, usize>)>,
}

impl Slots {
    pub fn place(&self, fuse_ino: u64) -> Result<Place, Error> {
        if fuse_ino & SLOT_BIT == 0 {
            return Ok(if fuse_ino >= CTL_DIR {
                Place::Virtual(fuse_ino)
            } else {
                Place::Own(fuse_ino)
            });
        }
        let slot = ((fuse_ino & !SLOT_BIT) >> INO_BITS) as usize;
        let ino = fuse_ino & ((1 << INO_BITS) - 1);
        let g = self.versions.lock();
        let version =
            g.0.get(slot).cloned().ok_or_else(|| Error::not_found("stale version inode"))?;
        Ok(Place::Version { version, ino, base: fuse_ino & !((1 << INO_BITS) - 1) })
    }

    /// The FUSE inode number of the root of `v`.
    pub fn root_of(&self, v: VersionRecord) -> Result<u64, Error> {
        let mut g = self.versions.lock();
        let slot = match g.1.get(&v.id) {
            Some(s) => *s,
            None => {
                if g.0.len() >= MAX_SLOTS {
                    return Err(Error::new(
                        forkfs::ErrorKind::NoSpace,
                        "too many versions browsed by this mount",
                    ));
                }
                if g.0.is_empty() {
                    g.0.push(v.clone()); // slot 0 stays unused: 2^63 alone is not a version inode
                }
                g.0.push(v.clone());
                let s = g.0.len() - 1;
                g.1.insert(v.id, s);
                s
            }
        };
        Ok(SLOT_BIT | (slot as u64) << INO_BITS | ROOT_INO)
    }
}

/// A read-only directory record for `.forkfs` and `.forkfs/versions`.
pub fn virtual_dir(ino: u64) -> Inode {
    let t = Time { secs: 0, nanos: 0 };
    Inode {
        ino,
        kind: FileKind::Dir,
        perm: 0o555,
        uid: 0,
        gid: 0,
        nlink: 2,
        size: 0,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        parent: if ino == VERSIONS_DIR { CTL_DIR } else { ROOT_INO },
        name: bytes::Bytes::new(),
        content: Content::Entries(None),
        xattrs: Vec::new(),
        links: Vec::new(),
        flags: 0,
    }
}

/// Names under `.forkfs/versions`: each version's tags, and its short id.
pub fn version_names(store: &Store, volume: &str) -> Result<Vec<String>, Error> {
    let vol = store.volumes().get(volume)?;
    let mut names: Vec<String> = store.graph().tags(&vol)?.into_iter().map(|(n, _)| n).collect();
    names.extend(store.graph().log(&vol)?.iter().map(|v| v.id.short()));
    Ok(names)
}

/// The version a name under `.forkfs/versions` stands for.
pub fn resolve(store: &Store, volume: &str, name: &[u8]) -> Result<VersionRecord, Error> {
    let name = std::str::from_utf8(name).map_err(|_| Error::not_found("no such version"))?;
    if name.contains('@') || name.contains('/') || name.starts_with('~') {
        return Err(Error::posix(forkfs::Posix::NoEntry, "no such version"));
    }
    match store.graph().resolve(&format!("{volume}@{name}")) {
        Ok(forkfs::Target::Version(v)) => Ok(v),
        _ => Err(Error::posix(forkfs::Posix::NoEntry, format!("no version {name}"))),
    }
}
