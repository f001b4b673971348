//! Diff of two maps in O(changes): equal subtrees (equal ids) are skipped
//! without being read.

use super::node::{Node, byte_at};
use super::{Map, MapRoot, NodeStore};
use crate::error::Result;
use crate::id::ChunkId;
use bytes::Bytes;

/// One key that differs: its value in the old map and in the new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: u64,
    pub old: Option<Bytes>,
    pub new: Option<Bytes>,
}

impl<S: NodeStore + ?Sized> Map<'_, S> {
    /// The keys whose values differ between `old` and `new`, in key order.
    pub fn diff(&self, old: MapRoot, new: MapRoot) -> Result<Vec<Change>> {
        let mut out = Vec::new();
        self.diff_ids(old, new, &mut out)?;
        out.sort_by_key(|c| c.key);
        Ok(out)
    }

    fn diff_ids(&self, old: MapRoot, new: MapRoot, out: &mut Vec<Change>) -> Result<()> {
        match (old, new) {
            (a, b) if a == b => Ok(()),
            (Some(a), None) => self.all(Some(a), true, out),
            (None, Some(b)) => self.all(Some(b), false, out),
            (Some(a), Some(b)) => {
                let na = Node::decode(&self.store.get_node(&a)?)?;
                let nb = Node::decode(&self.store.get_node(&b)?)?;
                self.diff_nodes((a, na), (b, nb), out)
            }
            (None, None) => Ok(()),
        }
    }

    fn diff_nodes(
        &self,
        (ia, a): (ChunkId, Node),
        (ib, b): (ChunkId, Node),
        out: &mut Vec<Change>,
    ) -> Result<()> {
        if a.level() == b.level() && a.base() == b.base() {
            return match (a, b) {
                (Node::Leaf { base, entries: ea }, Node::Leaf { entries: eb, .. }) => {
                    diff_leaves(base, &ea, &eb, out);
                    Ok(())
                }
                (Node::Inner { children: ca, .. }, Node::Inner { children: cb, .. }) => {
                    let (mut i, mut j) = (0, 0);
                    while i < ca.len() || j < cb.len() {
                        let sa = ca.get(i).map(|c| c.0);
                        let sb = cb.get(j).map(|c| c.0);
                        let (x, y) = match (sa, sb) {
                            (Some(p), Some(q)) if p == q => (Some(ca[i].1), Some(cb[j].1)),
                            (Some(p), Some(q)) if p < q => (Some(ca[i].1), None),
                            (Some(_), None) => (Some(ca[i].1), None),
                            _ => (None, Some(cb[j].1)),
                        };
                        i += x.is_some() as usize;
                        j += y.is_some() as usize;
                        self.diff_ids(x, y, out)?;
                    }
                    Ok(())
                }
                _ => {
                    let e = crate::error::Error::corrupt("map nodes of one range differ in kind");
                    Err(e)
                }
            };
        }
        if a.level() > b.level() && a.covers(b.base()) {
            return self.diff_contained(a, ib, true, out);
        }
        if b.level() > a.level() && b.covers(a.base()) {
            return self.diff_contained(b, ia, false, out);
        }
        self.all(Some(ia), true, out)?;
        self.all(Some(ib), false, out)
    }

    /// `big` spans `small`: diff `small` against the one child of `big` that
    /// spans it, and report every other child of `big` as one-sided.
    fn diff_contained(
        &self,
        big: Node,
        small: ChunkId,
        big_is_old: bool,
        out: &mut Vec<Change>,
    ) -> Result<()> {
        let Node::Inner { level, children, .. } = big else {
            return Err(crate::error::Error::corrupt("a leaf cannot span another node"));
        };
        let small_base = Node::decode(&self.store.get_node(&small)?)?.base();
        let slot = byte_at(small_base, level);
        let mut matched = false;
        for (s, c) in children {
            if s == slot {
                matched = true;
                if big_is_old {
                    self.diff_ids(Some(c), Some(small), out)?;
                } else {
                    self.diff_ids(Some(small), Some(c), out)?;
                }
            } else {
                self.all(Some(c), big_is_old, out)?;
            }
        }
        if !matched {
            self.all(Some(small), !big_is_old, out)?;
        }
        Ok(())
    }

    /// Reports every entry under `root` as removed (`old`) or added.
    fn all(&self, root: MapRoot, old: bool, out: &mut Vec<Change>) -> Result<()> {
        self.range(root, 0, u64::MAX, &mut |key, v| {
            let v = Some(v.clone());
            let (o, n) = if old { (v, None) } else { (None, v) };
            out.push(Change { key, old: o, new: n });
            true
        })?;
        Ok(())
    }
}

fn diff_leaves(base: u64, a: &[(u8, Bytes)], b: &[(u8, Bytes)], out: &mut Vec<Change>) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let change = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                i += 1;
                j += 1;
                (x.1 != y.1).then(|| (x.0, Some(x.1.clone()), Some(y.1.clone())))
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                i += 1;
                Some((x.0, Some(x.1.clone()), None))
            }
            (Some(x), None) => {
                i += 1;
                Some((x.0, Some(x.1.clone()), None))
            }
            (_, Some(y)) => {
                j += 1;
                Some((y.0, None, Some(y.1.clone())))
            }
            (None, None) => None,
        };
        if let Some((b, old, new)) = change {
            out.push(Change { key: base | b as u64, old, new });
        }
    }
}
