//! What changed between two frozen states of an fs volume, as a cache of
//! names and inodes (a kernel's dentry and inode caches) sees it: the
//! inodes whose record or data changed, and every (directory, name) whose
//! entry was added, removed or changed. Cost O(changes): the Merkle diff of
//! the inode maps, then of the entry maps of the directories that changed.

use super::inode::{Content, DirEntry, FileKind, Inode, META_KEY, decode_entries};
use crate::cas::ChunkStore;
use crate::error::Result;
use crate::map::{Map, MapRoot};
use std::collections::BTreeSet;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct FsChanges {
    /// Inodes present on either side whose record differs.
    pub inodes: Vec<u64>,
    /// (directory inode, name) pairs whose entry differs, including names
    /// that exist on one side only (a cache may hold them as negatives).
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// The changes between `old` and `new`, two roots of one fs volume.
pub fn fs_changes(chunks: &ChunkStore, old: MapRoot, new: MapRoot) -> Result<FsChanges> {
    let map = Map::new(chunks);
    let mut out = FsChanges::default();
    let mut names = BTreeSet::new();
    for c in map.diff(old, new)? {
        if c.key == META_KEY {
            continue;
        }
        out.inodes.push(c.key);
        let entries_of = |v: Option<&bytes::Bytes>| -> Result<MapRoot> {
            Ok(match v.map(Inode::decode).transpose()? {
                Some(Inode { kind: FileKind::Dir, content: Content::Entries(root), .. }) => root,
                _ => None,
            })
        };
        let (eo, en) = (entries_of(c.old.as_ref())?, entries_of(c.new.as_ref())?);
        if eo == en {
            continue;
        }
        for g in map.diff(eo, en)? {
            // A name group changed: every name in either version of it.
            for side in [g.old.as_ref(), g.new.as_ref()].into_iter().flatten() {
                for DirEntry { name, .. } in decode_entries(side)? {
                    names.insert((c.key, name.to_vec()));
                }
            }
        }
    }
    out.entries = names.into_iter().collect();
    Ok(out)
}
