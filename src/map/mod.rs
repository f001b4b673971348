//! A persistent Merkle map from u64 keys to small values, with nodes stored
//! as content-addressed chunks.
//!
//! The shape is a path-compressed 256-ary radix tree, so it depends only on
//! the set of keys, never on the order of updates: equal maps have equal
//! roots, and two roots diff by skipping equal subtrees in O(changes).
//! A leaf covers 256 consecutive keys; an inner node exists only where keys
//! below it differ in its byte, so sparse keys (hashes, inode numbers) cost
//! no chains of single-child nodes.

mod diff;
#[cfg(test)]
mod golden;
pub mod node;
#[cfg(test)]
mod tests;

use node::{Node, Step, byte_at, span_mask};

use crate::cas::ChunkStore;
use crate::error::Result;
use crate::id::ChunkId;
use bytes::Bytes;

/// The root of a map; `None` is the empty map.
pub type MapRoot = Option<ChunkId>;

/// Where nodes are kept: the chunk store, or memory in tests.
pub trait NodeStore: Send + Sync {
    fn get_node(&self, id: &ChunkId) -> Result<Bytes>;
    fn put_node(&self, data: &[u8]) -> Result<ChunkId>;
}

impl NodeStore for ChunkStore {
    fn get_node(&self, id: &ChunkId) -> Result<Bytes> {
        self.get(id)
    }
    fn put_node(&self, data: &[u8]) -> Result<ChunkId> {
        self.put(data)
    }
}

/// One update: `Some(value)` puts, `None` deletes.
pub type Update = (u64, Option<Bytes>);

/// Operations on maps held in a [`NodeStore`].
pub struct Map<'a, S: NodeStore + ?Sized> {
    store: &'a S,
}

impl<'a, S: NodeStore + ?Sized> Map<'a, S> {
    pub fn new(store: &'a S) -> Self {
        Map { store }
    }

    fn load(&self, id: &ChunkId) -> Result<Node> {
        Node::decode(&self.store.get_node(id)?)
    }

    fn save(&self, node: &Node) -> Result<ChunkId> {
        self.store.put_node(&node.encode())
    }

    pub fn get(&self, root: MapRoot, key: u64) -> Result<Option<Bytes>> {
        let mut cur = root;
        while let Some(id) = cur {
            // Read in place: a lookup decodes no node.
            match Node::step(&self.store.get_node(&id)?, key)? {
                Step::Value(v) => return Ok(v),
                Step::Child(c) => cur = Some(c),
            }
        }
        Ok(None)
    }

    #[cfg(test)]
    pub fn put(&self, root: MapRoot, key: u64, value: Bytes) -> Result<MapRoot> {
        self.apply(root, &[(key, Some(value))])
    }

    #[cfg(test)]
    pub fn delete(&self, root: MapRoot, key: u64) -> Result<MapRoot> {
        self.apply(root, &[(key, None)])
    }

    /// Applies a batch of updates, sorted by key with unique keys, and returns
    /// the new root. Cost: the nodes on the paths of the updated keys.
    pub fn apply(&self, root: MapRoot, updates: &[Update]) -> Result<MapRoot> {
        debug_assert!(updates.windows(2).all(|w| w[0].0 < w[1].0), "updates must be sorted");
        if updates.is_empty() {
            return Ok(root);
        }
        match root {
            None => self.build(updates),
            Some(id) => {
                let node = self.load(&id)?;
                self.apply_node(id, node, updates)
            }
        }
    }

    fn apply_node(&self, id: ChunkId, node: Node, ups: &[Update]) -> Result<MapRoot> {
        let (first, last) = (ups[0].0, ups[ups.len() - 1].0);
        if node.covers(first) && node.covers(last) {
            return match node {
                Node::Leaf { base, entries } => self.apply_leaf(base, entries, ups),
                Node::Inner { level, base, children } => {
                    self.apply_inner(level, base, children, ups)
                }
            };
        }
        // Some updates fall outside this node: apply them to a (virtual)
        // parent at the highest byte where keys differ, holding this node.
        let spread = (node.base() ^ first) | (node.base() ^ last);
        let level = ((63 - spread.leading_zeros()) / 8) as u8;
        let base = node.base() & !span_mask(level);
        self.apply_inner(level, base, vec![(byte_at(node.base(), level), id)], ups)
    }

    fn apply_leaf(&self, base: u64, entries: Vec<(u8, Bytes)>, ups: &[Update]) -> Result<MapRoot> {
        let mut out = Vec::with_capacity(entries.len() + ups.len());
        let mut old = entries.into_iter().peekable();
        for (key, value) in ups {
            let b = *key as u8;
            while let Some(e) = old.next_if(|e| e.0 < b) {
                out.push(e);
            }
            old.next_if(|e| e.0 == b);
            if let Some(v) = value {
                out.push((b, v.clone()));
            }
        }
        out.extend(old);
        if out.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.save(&Node::Leaf { base, entries: out })?))
    }

    fn apply_inner(
        &self,
        level: u8,
        base: u64,
        children: Vec<(u8, ChunkId)>,
        ups: &[Update],
    ) -> Result<MapRoot> {
        let mut out: Vec<(u8, ChunkId)> = Vec::with_capacity(children.len() + 1);
        let mut old = children.into_iter().peekable();
        let mut rest = ups;
        while !rest.is_empty() {
            let slot = byte_at(rest[0].0, level);
            let n = rest.iter().take_while(|u| byte_at(u.0, level) == slot).count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            while let Some(c) = old.next_if(|c| c.0 < slot) {
                out.push(c);
            }
            let child = old.next_if(|c| c.0 == slot).map(|c| c.1);
            if let Some(new) = self.apply(child, group)? {
                out.push((slot, new));
            }
        }
        out.extend(old);
        match out.len() {
            0 => Ok(None),
            // Canonical form: an inner node needs two children.
            1 => Ok(Some(out[0].1)),
            _ => Ok(Some(self.save(&Node::Inner { level, base, children: out })?)),
        }
    }

    /// Builds the canonical subtree holding the puts among `ups`.
    fn build(&self, ups: &[Update]) -> Result<MapRoot> {
        let puts: Vec<(u64, Bytes)> =
            ups.iter().filter_map(|(k, v)| v.clone().map(|v| (*k, v))).collect();
        self.build_puts(&puts)
    }

    fn build_puts(&self, puts: &[(u64, Bytes)]) -> Result<MapRoot> {
        let (Some(first), Some(last)) = (puts.first(), puts.last()) else { return Ok(None) };
        let spread = first.0 ^ last.0;
        if spread >> 8 == 0 {
            let entries = puts.iter().map(|(k, v)| (*k as u8, v.clone())).collect();
            return Ok(Some(self.save(&Node::Leaf { base: first.0 & !0xff, entries })?));
        }
        let level = ((63 - spread.leading_zeros()) / 8) as u8;
        let mut children = Vec::new();
        let mut rest = puts;
        while !rest.is_empty() {
            let slot = byte_at(rest[0].0, level);
            let n = rest.iter().take_while(|p| byte_at(p.0, level) == slot).count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            if let Some(c) = self.build_puts(group)? {
                children.push((slot, c));
            }
        }
        let base = first.0 & !span_mask(level);
        Ok(Some(self.save(&Node::Inner { level, base, children })?))
    }

    /// Calls `f` for each entry with `lo <= key <= hi`, in key order, until it returns false.
    pub fn range(
        &self,
        root: MapRoot,
        lo: u64,
        hi: u64,
        f: &mut dyn FnMut(u64, &Bytes) -> bool,
    ) -> Result<bool> {
        let Some(id) = root else { return Ok(true) };
        let node = self.load(&id)?;
        let (nlo, nhi) = node.bounds();
        if nhi < lo || nlo > hi {
            return Ok(true);
        }
        match node {
            Node::Leaf { base, entries } => {
                for (b, v) in &entries {
                    let key = base | *b as u64;
                    if key >= lo && key <= hi && !f(key, v) {
                        return Ok(false);
                    }
                }
            }
            Node::Inner { children, .. } => {
                for (_, c) in children {
                    if !self.range(Some(c), lo, hi, f)? {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Every entry, in key order.
    #[cfg(test)]
    pub fn entries(&self, root: MapRoot) -> Result<Vec<(u64, Bytes)>> {
        let mut out = Vec::new();
        self.range(root, 0, u64::MAX, &mut |k, v| {
            out.push((k, v.clone()));
            true
        })?;
        Ok(out)
    }
}
