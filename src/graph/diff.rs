//! Diffs between two states of a volume (versions or the live head), in
//! O(changes): the Merkle diff of the roots, plus the head's overlay.

use super::{Graph, Target};
use crate::cas::ChunkStore;
use crate::error::{Error, ErrorKind, Result};
use crate::head::fs::FsReader;
use crate::head::fs::inode::{Content, FileKind, Inode, META_KEY};
use crate::head::overlay::Space;
use crate::head::{Found, Head, View, is_zero};
use crate::id::ChunkId;
use crate::records::{VersionRecord, VolumeKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A run of changed blocks of a block volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRange {
    pub offset: u64,
    pub len: u64,
    /// True when the range now reads as zeros (trimmed or zeroed).
    pub zeroed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathChange {
    Added,
    Deleted,
    Modified,
    Renamed,
}

/// One changed path of an fs volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathDiff {
    pub change: PathChange,
    pub path: String,
    /// The old path of a rename or move.
    pub from: Option<String>,
    pub kind: String,
    pub old_size: Option<u64>,
    pub new_size: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Diff {
    Block { block_size: u32, ranges: Vec<BlockRange> },
    Fs { paths: Vec<PathDiff> },
}

/// One side of a diff, opened.
enum Side {
    Version(VersionRecord),
    Head(Arc<Head>),
}

impl Side {
    fn root(&self) -> crate::map::MapRoot {
        match self {
            Side::Version(v) => v.root,
            Side::Head(h) => h.state().root,
        }
    }
    fn view<'a>(&'a self, chunks: &'a ChunkStore) -> View<'a> {
        match self {
            Side::Version(_) => View::Frozen(chunks),
            Side::Head(h) => View::Live(h),
        }
    }

    fn fs_reader<'a>(&'a self, chunks: &'a ChunkStore, bs: u32) -> FsReader<'a> {
        match self {
            Side::Version(v) => FsReader::frozen(chunks, v.root, bs),
            Side::Head(h) => FsReader::live(h),
        }
    }
}

impl Graph {
    fn open_side(&self, t: &Target) -> Result<Side> {
        Ok(match t {
            Target::Version(v) => Side::Version(v.clone()),
            Target::Head(v) => Side::Head(self.volumes.open(v.name.as_str())?),
        })
    }

    /// What changed from `a` to `b`. Both must be of the same kind.
    pub fn diff(&self, a: &Target, b: &Target) -> Result<Diff> {
        let (sa, sb) = (self.open_side(a)?, self.open_side(b)?);
        let kind_of = |t: &Target| match t {
            Target::Version(v) => (v.kind, v.block_size),
            Target::Head(v) => (v.kind, v.block_size),
        };
        let ((ka, bs), (kb, bs2)) = (kind_of(a), kind_of(b));
        if ka != kb || bs != bs2 {
            return Err(Error::invalid("cannot diff volumes of different kinds or block sizes"));
        }
        // Heads are read under their gates so a checkpoint cannot move them
        // mid-diff; taken in volume id order, as a group snapshot takes them.
        let mut heads: Vec<&Arc<crate::head::Head>> = [&sa, &sb]
            .into_iter()
            .filter_map(|s| if let Side::Head(h) = s { Some(h) } else { None })
            .collect();
        heads.sort_by_key(|h| h.record().id);
        heads.dedup_by(|x, y| Arc::ptr_eq(x, y));
        let _gates: Vec<_> = heads.iter().map(|h| h.gate.read()).collect();
        let mut keys = BTreeSet::new();
        for c in self.storage.map().diff(sa.root(), sb.root())? {
            keys.insert((Space::Root, c.key));
        }
        for side in [&sa, &sb] {
            if let Side::Head(h) = side {
                h.overlay().for_each(&mut |e| {
                    match e.space {
                        Space::Root => keys.insert((Space::Root, e.key)),
                        Space::Zeroed => false,
                        s => keys.insert((s, e.owner)),
                    };
                    Ok(())
                })?;
                if let Some(b) = h.block() {
                    let root = h.state().root;
                    for k in b.zeroed_base_keys(h.map(), root)? {
                        keys.insert((Space::Root, k));
                    }
                    for k in b.pending_changed(h.map(), root)? {
                        keys.insert((Space::Root, k));
                    }
                }
            }
        }
        match ka {
            VolumeKind::Block => self.diff_blocks(&sa, &sb, bs, &keys),
            VolumeKind::Fs => self.diff_fs(&sa, &sb, bs, &keys),
        }
    }

    fn diff_blocks(
        &self,
        a: &Side,
        b: &Side,
        bs: u32,
        keys: &BTreeSet<(Space, u64)>,
    ) -> Result<Diff> {
        let content = |s: &Side, k: u64| -> Result<Option<ChunkId>> {
            Ok(match s.view(&self.storage.chunks).lookup(Space::Root, 0, k, s.root())? {
                None => None,
                Some(Found::Value(v)) => Some(ChunkId::from_slice(&v)?),
                Some(Found::Data(d)) if is_zero(&d) => None,
                Some(Found::Data(d)) => Some(ChunkId::of(&d)),
            })
        };
        let mut ranges: Vec<BlockRange> = Vec::new();
        for &(_, k) in keys {
            let (x, y) = (content(a, k)?, content(b, k)?);
            if x == y {
                continue;
            }
            let (offset, zeroed) = (k * bs as u64, y.is_none());
            match ranges.last_mut() {
                Some(r) if r.offset + r.len == offset && r.zeroed == zeroed => r.len += bs as u64,
                _ => ranges.push(BlockRange { offset, len: bs as u64, zeroed }),
            }
        }
        Ok(Diff::Block { block_size: bs, ranges })
    }

    fn diff_fs(&self, a: &Side, b: &Side, bs: u32, keys: &BTreeSet<(Space, u64)>) -> Result<Diff> {
        let chunks = &self.storage.chunks;
        let (ra, rb) = (a.fs_reader(chunks, bs), b.fs_reader(chunks, bs));
        let get = |r: &FsReader, ino: u64| -> Result<Option<Inode>> {
            match r.inode(ino) {
                // Unlinked but still open (an orphan): no path of the tree.
                Ok(i) if i.nlink == 0 => Ok(None),
                Ok(i) => Ok(Some(i)),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        };
        let dirty_data: BTreeSet<u64> =
            keys.iter().filter(|(s, _)| *s == Space::File).map(|(_, o)| *o).collect();
        let inos: BTreeSet<u64> = keys.iter().map(|(_, k)| *k).filter(|k| *k != META_KEY).collect();
        let mut paths = Vec::new();
        for ino in inos {
            let (x, y) = (get(&ra, ino)?, get(&rb, ino)?);
            let entry = match (x, y) {
                (None, None) => continue,
                (None, Some(n)) => PathDiff {
                    change: PathChange::Added,
                    path: rb.path_of(&n)?,
                    from: None,
                    kind: kind_name(n.kind).into(),
                    old_size: None,
                    new_size: Some(n.size),
                },
                (Some(o), None) => PathDiff {
                    change: PathChange::Deleted,
                    path: ra.path_of(&o)?,
                    from: None,
                    kind: kind_name(o.kind).into(),
                    old_size: Some(o.size),
                    new_size: None,
                },
                (Some(o), Some(n)) => {
                    let (po, pn) = (ra.path_of(&o)?, rb.path_of(&n)?);
                    let changed = o.kind != FileKind::Dir
                        && (content_differs(&o, &n)
                            || dirty_data.contains(&ino)
                            || o.perm != n.perm
                            || o.uid != n.uid
                            || o.gid != n.gid
                            || o.mtime != n.mtime);
                    let change = if po != pn {
                        PathChange::Renamed
                    } else if changed {
                        PathChange::Modified
                    } else {
                        continue;
                    };
                    PathDiff {
                        change,
                        from: (po != pn).then_some(po),
                        path: pn,
                        kind: kind_name(n.kind).into(),
                        old_size: Some(o.size),
                        new_size: Some(n.size),
                    }
                }
            };
            paths.push(entry);
        }
        let mut paths = replaced_is_modified(paths);
        paths.sort_by(|x, y| x.path.cmp(&y.path));
        Ok(Diff::Fs { paths })
    }
}

/// A file replaced under its own name (as editors and `sed -i` save: a
/// new file renamed over the old one) is one modification of that path,
/// not a deletion and an addition.
fn replaced_is_modified(paths: Vec<PathDiff>) -> Vec<PathDiff> {
    let mut deleted: std::collections::HashMap<(String, String), PathDiff> = Default::default();
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        match p.change {
            PathChange::Deleted if p.kind != "dir" => {
                deleted.insert((p.path.clone(), p.kind.clone()), p);
            }
            _ => out.push(p),
        }
    }
    for p in &mut out {
        if p.change == PathChange::Added
            && let Some(old) = deleted.remove(&(p.path.clone(), p.kind.clone()))
        {
            p.change = PathChange::Modified;
            p.old_size = old.old_size;
        }
    }
    out.extend(deleted.into_values());
    out
}

fn content_differs(o: &Inode, n: &Inode) -> bool {
    o.size != n.size
        || match (&o.content, &n.content) {
            (Content::Blocks(x), Content::Blocks(y))
            | (Content::Entries(x), Content::Entries(y)) => x != y,
            (x, y) => x != y,
        }
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "chardev",
        FileKind::BlockDev => "blockdev",
    }
}
