//! Verification of a store: every version and head must be fully readable,
//! with every node and chunk matching its id. Used by `forkfs-fsck` and by
//! the crash tests, so both hold the store to the same standard.

use crate::error::Result;
use crate::id::ChunkId;
use crate::map::Map;
use crate::map::node::Node;
use crate::pack;
use crate::store::Store;
use crate::version::VolumeKind;
use crate::volume::inode::{Content, Inode, META_KEY};
use serde::Serialize;
use std::collections::HashSet;

#[derive(Serialize, Debug, Default)]
pub struct CheckReport {
    pub packs: usize,
    pub volumes: usize,
    pub versions: usize,
    pub nodes: usize,
    pub chunks: usize,
    /// One line per problem found; empty when the store is sound.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

struct Checker<'a> {
    store: &'a Store,
    seen: HashSet<ChunkId>,
    report: CheckReport,
}

impl Store {
    /// Reads and verifies every version and head of every volume.
    pub fn check(&self) -> Result<CheckReport> {
        let mut c = Checker { store: self, seen: HashSet::new(), report: CheckReport::default() };
        c.packs()?;
        for vol in self.volumes()? {
            c.report.volumes += 1;
            let versions = match self.log(&vol) {
                Ok(v) => v,
                Err(e) => {
                    c.report.problems.push(format!("volume {}: log unreadable: {e}", vol.name));
                    continue;
                }
            };
            for v in versions {
                c.report.versions += 1;
                let what = format!("{}@{}", vol.name, v.id.short());
                c.tree(&what, v.kind, v.root);
            }
            match self.head_record(vol.id) {
                Ok(h) => c.tree(&format!("{} head", vol.name), vol.kind, h.root),
                Err(e) => c.report.problems.push(format!("volume {}: {e}", vol.name)),
            }
        }
        Ok(c.report)
    }
}

impl Checker<'_> {
    /// Every indexed pack exists, has its recorded length, and its footer
    /// verifies and lists as many chunks as the index says.
    fn packs(&mut self) -> Result<()> {
        let backend = self.store.chunks().backend().clone();
        for (id, count, len) in self.store.index().packs()? {
            self.report.packs += 1;
            let key = crate::paths::pack(&id);
            let res = (|| -> Result<()> {
                let meta = backend.head(&key)?;
                if meta.size != len {
                    return Err(crate::Error::corrupt(format!(
                        "is {} bytes, the index says {len}",
                        meta.size
                    )));
                }
                let tail =
                    backend.get_range(&key, len.saturating_sub(pack::TRAILER_LEN as u64)..len)?;
                let trailer = pack::Trailer::decode(&tail, len)?;
                let footer = backend.get_range(&key, trailer.footer_range())?;
                let entries = pack::decode_footer(&trailer, &footer)?;
                if entries.len() != count as usize {
                    return Err(crate::Error::corrupt(format!(
                        "lists {} chunks, the index says {count}",
                        entries.len()
                    )));
                }
                Ok(())
            })();
            if let Err(e) = res {
                self.report.problems.push(format!("pack {id}: {e}"));
            }
        }
        Ok(())
    }

    fn tree(&mut self, what: &str, kind: VolumeKind, root: crate::map::MapRoot) {
        if let Err(e) = self.walk(kind, root, true) {
            self.report.problems.push(format!("{what}: {e}"));
        }
    }

    /// Walks a map; `top` maps of fs volumes hold inodes whose content maps are walked too.
    fn walk(&mut self, kind: VolumeKind, root: crate::map::MapRoot, top: bool) -> Result<()> {
        let Some(id) = root else { return Ok(()) };
        if !self.seen.insert(id) {
            return Ok(());
        }
        let chunks = self.store.chunks().clone();
        let map = Map::new(chunks.as_ref());
        let mut leaves = Vec::new();
        map.visit_nodes(Some(id), &mut |nid, node| {
            self.seen.insert(*nid);
            if let Node::Leaf { base, entries } = node {
                leaves.push((*base, entries.clone()));
            }
        })?;
        self.report.nodes += 1;
        for (base, entries) in leaves {
            for (b, v) in entries {
                let key = base | b as u64;
                match (kind, top) {
                    (VolumeKind::Block, _) | (VolumeKind::Fs, false) if v.len() == 32 => {
                        let cid = ChunkId::from_slice(&v)?;
                        if self.seen.insert(cid) {
                            chunks.get(&cid)?;
                            self.report.chunks += 1;
                        }
                    }
                    (VolumeKind::Fs, true) if key != META_KEY => {
                        let inode = Inode::decode(&v)?;
                        match inode.content {
                            Content::Blocks(r) => self.walk(VolumeKind::Fs, r, false)?,
                            Content::Entries(r) => self.walk_entries(r)?,
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn walk_entries(&mut self, root: crate::map::MapRoot) -> Result<()> {
        let Some(id) = root else { return Ok(()) };
        if !self.seen.insert(id) {
            return Ok(());
        }
        let chunks = self.store.chunks().clone();
        let map = Map::new(chunks.as_ref());
        let mut err = None;
        map.range(
            Some(id),
            0,
            u64::MAX,
            &mut |_, v| match crate::volume::inode::decode_entries(v) {
                Ok(_) => true,
                Err(e) => {
                    err = Some(e);
                    false
                }
            },
        )?;
        err.map_or(Ok(()), Err)
    }
}
