//! Reachability: everything a version or head references, walked once per
//! node however many versions share it. GC marks with it; fsck verifies with
//! it and then locates each problem in every version it affects.
//!
//! A node's references depend on which map it belongs to: inner nodes name
//! children; leaves of block maps and of file block maps name data chunks;
//! leaves of an fs volume's inode map hold inode records whose content maps
//! (file blocks, directory entries) are roots of their own.

use crate::db::{CF_META, CF_OVERLAY, Db};
use crate::error::{Error, ErrorKind, Result};
use crate::head::fs::inode::{Content, Inode, META_KEY, decode_entries};
use crate::head::overlay::{self, Dirty, Space};
use crate::id::ChunkId;
use crate::id::VolumeId;
use crate::map::MapRoot;
use crate::map::node::{Node, span_mask};
use crate::records::{HeadRecord, VersionRecord, VolumeKind, VolumeRecord, keys};
use rocksdb::{DB, Direction, IteratorMode, SnapshotWithThreadMode};
use std::collections::{HashMap, HashSet};

/// Called with each (key, value) of a scan.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// Visits, in `snap`, every entry of column family `cf` under `prefix`.
pub fn scan(
    db: &Db,
    snap: &SnapshotWithThreadMode<'_, DB>,
    cf: &str,
    prefix: &[u8],
    f: &mut Visit<'_>,
) -> Result<()> {
    let mode = IteratorMode::From(prefix, Direction::Forward);
    for item in snap.iterator_cf(db.cf(cf), mode) {
        let (k, v) = item?;
        if !k.starts_with(prefix) {
            break;
        }
        f(&k, &v)?;
    }
    Ok(())
}

/// Everything to mark from, read in one snapshot of the index.
#[derive(Default)]
pub struct Roots {
    /// Each root with how to read its nodes.
    pub roots: Vec<(MapKind, MapRoot)>,
    pub versions: u64,
    pub heads: u64,
}

/// Reads, in `snap`, every root a store holds: each version's, each
/// head's, and the content maps of fs volumes' dirty inode records.
pub fn roots(db: &Db, snap: &SnapshotWithThreadMode<'_, DB>) -> Result<Roots> {
    let scan = |cf: &str, prefix: &[u8], f: &mut Visit<'_>| scan(db, snap, cf, prefix, f);
    let mut kinds: HashMap<VolumeId, VolumeKind> = HashMap::new();
    scan(CF_META, keys::VOLUME_PREFIX.as_bytes(), &mut |_, v| {
        let r: VolumeRecord = serde_json::from_slice(v)?;
        kinds.insert(r.id, r.kind);
        Ok(())
    })?;
    let mut out = Roots::default();
    scan(CF_META, keys::VERSION_PREFIX.as_bytes(), &mut |k, v| {
        let r = VersionRecord::decode(v).map_err(|e| {
            Error::corrupt(format!(
                "version record {} is unreadable ({e}); run `forkfs fsck --repair`",
                String::from_utf8_lossy(k)
            ))
        })?;
        out.versions += 1;
        out.roots.push((MapKind::top(r.kind), r.root));
        Ok(())
    })?;
    scan(CF_META, keys::HEAD_PREFIX.as_bytes(), &mut |k, v| {
        let vol = std::str::from_utf8(&k[keys::HEAD_PREFIX.len()..])
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(VolumeId)
            .ok_or_else(|| Error::corrupt("head key is malformed"))?;
        let kind = *kinds.get(&vol).ok_or_else(|| {
            Error::corrupt(format!("head of volume {} has no volume record", vol.0))
        })?;
        let h: HeadRecord = serde_json::from_slice(v)?;
        out.heads += 1;
        out.roots.push((MapKind::top(kind), h.root));
        Ok(())
    })?;
    // Dirty inode records of fs volumes name content maps of their own.
    scan(CF_OVERLAY, b"", &mut |k, v| {
        let (vol, space, _, ino, dirty) = overlay::decode_raw(k, v)?;
        if kinds.get(&vol) == Some(&VolumeKind::Fs) {
            out.roots.extend(dirty_inode_root(space, ino, &dirty)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// [`roots`], and the root of every version this process has open
/// ([`Readers`](crate::head::Readers)): a version deleted while a reader
/// has it open keeps its data until the reader closes it.
pub fn roots_with_readers(
    storage: &crate::head::Storage,
    snap: &SnapshotWithThreadMode<'_, DB>,
) -> Result<Roots> {
    let mut out = roots(&storage.db, snap)?;
    let open = storage.readers.roots();
    out.roots.extend(open.into_iter().map(|(kind, root)| (MapKind::top(kind), root)));
    Ok(out)
}

/// Which map a node belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// A block volume: block index -> data chunk.
    Blocks,
    /// An fs volume's inode map: inode number -> inode record.
    Inodes,
    /// The block map of file `ino`.
    File(u64),
    /// The entry map of directory `ino`.
    Dir(u64),
}

impl MapKind {
    /// Maps whose leaves mean the same share a class: a node reached as two
    /// classes (identical bytes in different roles) is walked as both.
    fn class(self) -> u8 {
        match self {
            MapKind::Blocks | MapKind::File(_) => 0,
            MapKind::Inodes => 1,
            MapKind::Dir(_) => 2,
        }
    }

    pub fn top(kind: VolumeKind) -> MapKind {
        match kind {
            VolumeKind::Block => MapKind::Blocks,
            VolumeKind::Fs => MapKind::Inodes,
        }
    }
}

/// Where a reference sits: a map and the keys below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub map: MapKind,
    pub lo: u64,
    pub hi: u64,
}

impl Place {
    fn whole(map: MapKind) -> Place {
        Place { map, lo: 0, hi: u64::MAX }
    }

    /// What a user would call this place; `block_size` turns block keys into bytes.
    pub fn describe(&self, block_size: u32) -> String {
        let bytes = |lo: u64, hi: u64| {
            let bs = block_size as u64;
            format!("bytes {}..{}", lo.saturating_mul(bs), hi.saturating_add(1).saturating_mul(bs))
        };
        let all = self.lo == 0 && self.hi == u64::MAX;
        match self.map {
            MapKind::Blocks if all => "the whole device".to_string(),
            MapKind::Blocks => bytes(self.lo, self.hi),
            MapKind::Inodes if all => "every file".to_string(),
            MapKind::Inodes if self.lo == self.hi => format!("inode {}", self.lo),
            MapKind::Inodes => format!("inodes {}..={}", self.lo, self.hi),
            MapKind::File(ino) if all => format!("file inode {ino}, all of its data"),
            MapKind::File(ino) => format!("file inode {ino}, {}", bytes(self.lo, self.hi)),
            MapKind::Dir(ino) => format!("directory inode {ino}"),
        }
    }
}

/// One reference held by a node.
#[derive(Clone, Copy, Debug)]
pub enum Edge {
    Node(ChunkId, Place),
    Data(ChunkId, Place),
}

/// The references of `node`, a node of `map`.
pub fn edges(map: MapKind, node: &Node) -> Result<Vec<Edge>> {
    let mut out = Vec::new();
    match node {
        Node::Inner { level, base, children } => {
            let below = if *level == 0 { 0 } else { span_mask(level - 1) };
            for (slot, id) in children {
                let lo = base | ((*slot as u64) << (8 * *level as u32));
                out.push(Edge::Node(*id, Place { map, lo, hi: lo | below }));
            }
        }
        Node::Leaf { base, entries } => {
            for (b, v) in entries {
                let key = base | *b as u64;
                let here = Place { map, lo: key, hi: key };
                match map {
                    MapKind::Blocks | MapKind::File(_) => {
                        if v.len() == 32 {
                            out.push(Edge::Data(ChunkId::from_slice(v)?, here));
                        }
                    }
                    MapKind::Inodes if key == META_KEY => {}
                    MapKind::Inodes => {
                        let inode = Inode::decode(v)
                            .map_err(|e| Error::corrupt(format!("inode {key}: {e}")))?;
                        match inode.content {
                            Content::Blocks(Some(r)) => {
                                out.push(Edge::Node(r, Place::whole(MapKind::File(key))))
                            }
                            Content::Entries(Some(r)) => {
                                out.push(Edge::Node(r, Place::whole(MapKind::Dir(key))))
                            }
                            _ => {}
                        }
                    }
                    MapKind::Dir(ino) => {
                        decode_entries(v)
                            .map_err(|e| Error::corrupt(format!("directory inode {ino}: {e}")))?;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The content map a dirty inode record (an overlay entry of an fs
/// volume's inode map) names, if any.
pub fn dirty_inode_root(space: Space, ino: u64, d: &Dirty) -> Result<Option<(MapKind, MapRoot)>> {
    let (Space::Root, Dirty::Value(rec)) = (space, d) else { return Ok(None) };
    if ino == META_KEY {
        return Ok(None);
    }
    Ok(match Inode::decode(rec)?.content {
        Content::Blocks(r) => Some((MapKind::File(ino), r)),
        Content::Entries(r) => Some((MapKind::Dir(ino), r)),
        _ => None,
    })
}

/// Loads and decodes a node (verified against its id by the chunk store).
pub type LoadNode<'a> = dyn Fn(&ChunkId) -> Result<Node> + 'a;

/// A walk over many roots that visits each node and data chunk once.
pub struct Walk<'a> {
    load: &'a LoadNode<'a>,
    seen_nodes: HashSet<(ChunkId, u8)>,
    /// Every node and data chunk reached so far.
    pub reached: HashSet<ChunkId>,
    /// Chunks that could not be read or did not verify, with why.
    pub bad: HashMap<ChunkId, String>,
    /// How many of `bad` failed to read (an I/O error: maybe passing)
    /// rather than being damaged.
    pub unreadable: usize,
    pub nodes: u64,
    pub data: u64,
}

impl<'a> Walk<'a> {
    pub fn new(load: &'a LoadNode<'a>) -> Walk<'a> {
        Walk {
            load,
            seen_nodes: HashSet::new(),
            reached: HashSet::new(),
            bad: HashMap::new(),
            unreadable: 0,
            nodes: 0,
            data: 0,
        }
    }

    /// Walks everything below `root` not seen yet. `on_data` is called once
    /// per data chunk (an error marks the chunk bad); an unreadable node is
    /// marked bad and its subtree skipped.
    pub fn root(
        &mut self,
        map: MapKind,
        root: MapRoot,
        on_data: &mut dyn FnMut(&ChunkId) -> Result<()>,
    ) {
        let Some(root) = root else { return };
        let mut stack = vec![(root, map)];
        while let Some((id, map)) = stack.pop() {
            if !self.seen_nodes.insert((id, map.class())) {
                continue;
            }
            self.reached.insert(id);
            self.nodes += 1;
            let edges = (self.load)(&id).and_then(|n| edges(map, &n));
            match edges {
                Ok(edges) => {
                    for e in edges {
                        match e {
                            Edge::Node(c, p) => stack.push((c, p.map)),
                            Edge::Data(c, _) => {
                                if self.reached.insert(c) {
                                    self.data += 1;
                                    if let Err(e) = on_data(&c) {
                                        self.mark_bad(c, &e);
                                    }
                                }
                            }
                        }
                    }
                }
                Err(e) => self.mark_bad(id, &e),
            }
        }
    }

    fn mark_bad(&mut self, id: ChunkId, e: &Error) {
        self.unreadable += usize::from(e.kind() == ErrorKind::Unavailable);
        self.bad.insert(id, e.to_string());
    }

    /// The bad chunks below `root`, each with where it sits. `clean` caches,
    /// across calls, the nodes whose subtrees hold nothing bad, so finding
    /// the damage of many versions sharing nodes costs one walk.
    pub fn damage(
        &self,
        map: MapKind,
        root: MapRoot,
        clean: &mut HashMap<ChunkId, bool>,
    ) -> Vec<(ChunkId, Place, String)> {
        let mut out = Vec::new();
        if let Some(r) = root {
            self.damage_below(r, Place::whole(map), clean, &mut out);
        }
        out
    }

    fn damage_below(
        &self,
        id: ChunkId,
        place: Place,
        clean: &mut HashMap<ChunkId, bool>,
        out: &mut Vec<(ChunkId, Place, String)>,
    ) -> bool {
        if let Some(why) = self.bad.get(&id) {
            out.push((id, place, why.clone()));
            return false;
        }
        if let Some(ok) = clean.get(&id) {
            if *ok {
                return true;
            }
        }
        let edges = match (self.load)(&id).and_then(|n| edges(place.map, &n)) {
            Ok(e) => e,
            Err(e) => {
                out.push((id, place, e.to_string()));
                return false;
            }
        };
        let mut ok = true;
        for e in edges {
            ok &= match e {
                Edge::Node(c, p) => self.damage_below(c, p, clean, out),
                Edge::Data(c, p) => match self.bad.get(&c) {
                    Some(why) => {
                        out.push((c, p, why.clone()));
                        false
                    }
                    None => true,
                },
            };
        }
        clean.insert(id, ok);
        ok
    }
}
