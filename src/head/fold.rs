//! The fold: a head's overlay applied to its base root, giving the root of
//! a new version. Cost: O(dirty entries), never O(volume size).

use super::fs::inode::Inode;
use super::overlay::{Dirty, RawEntry, Space};
use super::{Head, block, is_zero};
use crate::error::{Error, Result};
use crate::map::{MapRoot, Update};
use crate::records::VolumeKind;
use bytes::Bytes;
use std::collections::BTreeMap;

impl Head {
    /// Folds the overlay into a new root and returns it with the entries it
    /// folded. Cost: O(dirty entries).
    ///
    /// fs volumes: call with the gate held exclusively; the caller clears
    /// the whole overlay in its commit batch. Block volumes may be folded
    /// while writers go on (the overlay is read through one consistent
    /// iterator and the base root does not move); the commit then deletes
    /// only the folded entries that are still unchanged.
    ///
    /// Also returns the generation of the last seal the fold includes
    /// (deferred heads).
    pub(crate) fn fold(&self) -> Result<Folded> {
        let base = self.state.read().root;
        match self.record.kind {
            VolumeKind::Block => {
                let mut ups = BTreeMap::new();
                let mut ranges = Vec::new();
                let mut folded = Vec::new();
                // A cut between seals, and the generation of the last one.
                let db = self.db().raw();
                let state = self
                    .block()
                    .ok_or_else(|| Error::corrupt("a block volume without block state"))?;
                let (snap, generation) = state.with_sealed(|g| (db.snapshot(), g));
                self.overlay().for_each_in(Some(&snap), &mut |e| {
                    match (e.space, e.owner, &e.dirty) {
                        (Space::Root, 0, _) => {
                            if let Some(u) = self.resolve(e.dirty, e.key, Some(base))? {
                                ups.insert(e.key, u);
                            }
                        }
                        (Space::Zeroed, 0, Dirty::Value(v)) => ranges.push(block::range_of(v)?),
                        _ => {
                            return Err(Error::corrupt(
                                "block volume overlay holds a non-block entry",
                            ));
                        }
                    }
                    folded.push(e.raw);
                    Ok(())
                })?;
                // Blocks written after a range was zeroed have entries and win.
                for k in block::base_keys(self.map(), base, &ranges)? {
                    ups.entry(k).or_insert(None);
                }
                let ups: Vec<Update> = ups.into_iter().collect();
                let (root, count) = (self.map().apply(base, &ups)?, folded.len());
                Ok(Folded { root, entries: folded, count, generation })
            }
            VolumeKind::Fs => {
                let (root, count) = self.fold_fs(base)?;
                Ok(Folded { root, entries: Vec::new(), count, generation: None })
            }
        }
    }

    /// Turns a dirty entry into a map update (`None`: no update), storing
    /// data as a chunk. All-zero data becomes a delete: absent blocks read as zeros.
    /// `base` is the map a patch's spans lie over (a block volume's root
    /// map, a file's blocks); no other map has patches.
    fn resolve(&self, d: Dirty, key: u64, base: Option<MapRoot>) -> Result<Option<Option<Bytes>>> {
        Ok(match d {
            Dirty::Patch(_) if base.is_none() => {
                return Err(Error::corrupt("a patch entry outside a map of blocks"));
            }
            Dirty::Patch(p) => match self.read_patch(&p, key, base.expect("checked"), None)? {
                super::Part::Found(Some(super::Found::Data(data))) => {
                    Some(self.store_block(&data)?)
                }
                _ => return Err(Error::corrupt("a patch read as no data")),
            },
            Dirty::Delete => Some(None),
            Dirty::Value(v) => Some(Some(v)),
            Dirty::Logged(r) => match self.read_logged(&r)? {
                None => None,
                Some(data) => Some(self.store_block(&data)?),
            },
            Dirty::Over(r, prior) => match self.read_over(&r, &prior)? {
                super::Logged::Data(data) => Some(self.store_block(&data)?),
                super::Logged::Hole => Some(None),
                super::Logged::Value(v) => Some(Some(v)),
                super::Logged::Base => None,
            },
        })
    }

    /// A block's map value: a chunk id, or none for zeros.
    fn store_block(&self, data: &[u8]) -> Result<Option<Bytes>> {
        if is_zero(data) {
            return Ok(None);
        }
        let id = self.storage.chunks.put(data)?;
        Ok(Some(Bytes::copy_from_slice(&id.0)))
    }

    /// The new root, and how many entries went into it.
    fn fold_fs(&self, base: MapRoot) -> Result<(MapRoot, usize)> {
        // Sub-maps (directories, file blocks) first, then the inode records
        // that point at their new roots.
        let mut inode_ups: BTreeMap<u64, Option<Bytes>> = BTreeMap::new();
        let mut groups: BTreeMap<(Space, u64), Vec<(u64, Dirty)>> = BTreeMap::new();
        let mut count = 0;
        self.overlay().for_each(&mut |e| {
            count += 1;
            match e.space {
                Space::Root => {
                    if let Some(u) = self.resolve(e.dirty, e.key, None)? {
                        inode_ups.insert(e.key, u);
                    }
                }
                // Root entries come first: entries of an inode deleted
                // since the last checkpoint are skipped, not stored.
                _ if matches!(inode_ups.get(&e.owner), Some(None)) => {}
                s => groups.entry((s, e.owner)).or_default().push((e.key, e.dirty)),
            }
            Ok(())
        })?;
        for ((space, ino), entries) in groups {
            let current = match inode_ups.get(&ino) {
                Some(Some(v)) => v.clone(),
                Some(None) => continue, // skipped above; kept for safety
                None => match self.map().get(base, ino)? {
                    Some(v) => v,
                    None => continue,
                },
            };
            let mut inode = Inode::decode(&current)?;
            let sub = inode.content_root(space)?;
            // A file's patches lay their spans over its blocks as this
            // root has them (the root its writers read).
            let patched = (space == Space::File).then_some(sub);
            let mut ups = Vec::with_capacity(entries.len());
            for (key, d) in entries {
                if let Some(u) = self.resolve(d, key, patched)? {
                    ups.push((key, u));
                }
            }
            let new_sub = self.map().apply(sub, &ups)?;
            inode.set_content_root(space, new_sub)?;
            inode_ups.insert(ino, Some(Bytes::from(inode.encode())));
        }
        let ups: Vec<Update> = inode_ups.into_iter().collect();
        Ok((self.map().apply(base, &ups)?, count))
    }
}

/// What a fold made ([`Head::fold`]).
pub(crate) struct Folded {
    pub root: MapRoot,
    /// The entries folded, for the commit to delete (block volumes; an fs
    /// volume's commit clears its whole overlay).
    pub entries: Vec<RawEntry>,
    /// How many entries were folded.
    pub count: usize,
    /// The generation of the last seal the fold includes (deferred heads).
    pub generation: Option<u64>,
}
