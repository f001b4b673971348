//! Encoding of Merkle map nodes (stored as chunks).
//!
//! ```text
//! version u8 = 1 | kind u8 (0 leaf, 1 inner) | level u8 | base u64 | count u16
//! leaf entries:  count × { key byte u8 | value length u32 | value }
//! inner entries: count × { slot byte u8 | child chunk id [32] }
//! ```
//! A node at level L covers the keys whose bytes above L equal those of
//! `base`; it is indexed by byte L of the key (a leaf is level 0). Entries are
//! sorted by byte, unique, and there is at least one (two for inner nodes).

use crate::error::{Error, Result};
use crate::id::ChunkId;
use bytes::Bytes;

pub const NODE_VERSION: u8 = 1;
const HEADER: usize = 13;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Leaf { base: u64, entries: Vec<(u8, Bytes)> },
    Inner { level: u8, base: u64, children: Vec<(u8, ChunkId)> },
}

/// Where a lookup goes from a node (see [`Node::step`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The key's value, or none: the lookup ends here.
    Value(Option<Bytes>),
    /// The child to go on to.
    Child(ChunkId),
}

/// Bits below and including byte `level`: the part of a key a node at that level spans.
pub fn span_mask(level: u8) -> u64 {
    if level >= 7 { u64::MAX } else { (1u64 << (8 * (level as u32 + 1))) - 1 }
}

pub fn byte_at(key: u64, level: u8) -> u8 {
    (key >> (8 * level as u32)) as u8
}

impl Node {
    pub fn level(&self) -> u8 {
        match self {
            Node::Leaf { .. } => 0,
            Node::Inner { level, .. } => *level,
        }
    }

    pub fn base(&self) -> u64 {
        match self {
            Node::Leaf { base, .. } | Node::Inner { base, .. } => *base,
        }
    }

    pub fn covers(&self, key: u64) -> bool {
        key & !span_mask(self.level()) == self.base()
    }

    /// Lowest and highest key this node's range can hold.
    pub fn bounds(&self) -> (u64, u64) {
        (self.base(), self.base() | span_mask(self.level()))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.push(NODE_VERSION);
        match self {
            Node::Leaf { base, entries } => {
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&base.to_le_bytes());
                out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
                for (b, v) in entries {
                    out.push(*b);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
            }
            Node::Inner { level, base, children } => {
                out.extend_from_slice(&[1, *level]);
                out.extend_from_slice(&base.to_le_bytes());
                out.extend_from_slice(&(children.len() as u16).to_le_bytes());
                for (b, id) in children {
                    out.push(*b);
                    out.extend_from_slice(&id.0);
                }
            }
        }
        out
    }

    /// Where a lookup of `key` goes from the node encoded in `data`, read
    /// from the encoding without decoding the rest: no allocation, no
    /// reference taken per entry (a block read's path). Malformed bytes
    /// give `Corrupt` or, where the step does not look (entries past the
    /// one it looks for, the order of an inner node's slots), a wrong
    /// answer, never a panic; nodes are read only after their hash is
    /// checked, and `decode` (which fsck runs on every node) checks all.
    pub fn step(data: &Bytes, key: u64) -> Result<Step> {
        let bad = |what: &str| Error::corrupt(format!("map node: {what}"));
        let (kind, level, base, count) = header(data)?;
        if !matches!((kind, level), (0, 0) | (1, 1..=7)) || (kind == 1 && count < 2) {
            return Err(bad("invalid kind or level"));
        }
        if key & !span_mask(level) != base {
            return Ok(Step::Value(None));
        }
        let b = byte_at(key, level);
        match (kind, level) {
            (0, 0) => {
                let (mut pos, mut last) = (HEADER, None);
                for _ in 0..count {
                    let head = data.get(pos..pos + 5).ok_or_else(|| bad("truncated leaf entry"))?;
                    if last.is_some_and(|l| head[0] <= l) {
                        return Err(bad("entries out of order"));
                    }
                    last = Some(head[0]);
                    let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
                    let end = (pos + 5).checked_add(len).filter(|e| *e <= data.len());
                    let end = end.ok_or_else(|| bad("truncated leaf value"))?;
                    if head[0] >= b {
                        return Ok(Step::Value((head[0] == b).then(|| data.slice(pos + 5..end))));
                    }
                    pos = end;
                }
                Ok(Step::Value(None))
            }
            (1, 1..=7) if count >= 2 => {
                if data.len() != HEADER + 33 * count {
                    return Err(bad("inner node of the wrong size"));
                }
                let slot = |i: usize| data[HEADER + 33 * i];
                let (mut lo, mut hi) = (0, count);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    match slot(mid).cmp(&b) {
                        std::cmp::Ordering::Less => lo = mid + 1,
                        std::cmp::Ordering::Greater => hi = mid,
                        std::cmp::Ordering::Equal => {
                            let at = HEADER + 33 * mid + 1;
                            return Ok(Step::Child(ChunkId::from_slice(&data[at..at + 32])?));
                        }
                    }
                }
                Ok(Step::Value(None))
            }
            _ => Err(bad("invalid kind or level")),
        }
    }

    /// Decodes and validates a node; malformed bytes give `Corrupt`, never a panic.
    pub fn decode(data: &Bytes) -> Result<Node> {
        let bad = |what: &str| Error::corrupt(format!("map node: {what}"));
        let (kind, level, base, count) = header(data)?;
        let mut pos = HEADER;
        let mut last: Option<u8> = None;
        let mut check_order = |b: u8| {
            let ok = last.is_none_or(|l| b > l);
            last = Some(b);
            if ok { Ok(()) } else { Err(bad("entries out of order")) }
        };
        let node = match (kind, level) {
            (0, 0) => {
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let head = data.get(pos..pos + 5).ok_or_else(|| bad("truncated leaf entry"))?;
                    check_order(head[0])?;
                    let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
                    let end = (pos + 5).checked_add(len).filter(|e| *e <= data.len());
                    let end = end.ok_or_else(|| bad("truncated leaf value"))?;
                    entries.push((head[0], data.slice(pos + 5..end)));
                    pos = end;
                }
                Node::Leaf { base, entries }
            }
            (1, 1..=7) if count >= 2 => {
                let mut children = Vec::with_capacity(count);
                for _ in 0..count {
                    let e = data.get(pos..pos + 33).ok_or_else(|| bad("truncated inner entry"))?;
                    check_order(e[0])?;
                    children.push((e[0], ChunkId::from_slice(&e[1..33])?));
                    pos += 33;
                }
                Node::Inner { level, base, children }
            }
            _ => return Err(bad("invalid kind or level")),
        };
        if pos != data.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(node)
    }
}

/// A node's header, checked: (kind, level, base, entry count).
fn header(data: &[u8]) -> Result<(u8, u8, u64, usize)> {
    let bad = |what: &str| Error::corrupt(format!("map node: {what}"));
    if data.len() < HEADER {
        return Err(bad("truncated header"));
    }
    if data[0] != NODE_VERSION {
        return Err(bad("unknown node version"));
    }
    let (kind, level) = (data[1], data[2]);
    let base = u64::from_le_bytes(data[3..11].try_into().expect("8 bytes"));
    let count = u16::from_le_bytes(data[11..13].try_into().expect("2 bytes")) as usize;
    if level > 7 || base & span_mask(level) != 0 || count == 0 || count > 256 {
        return Err(bad("invalid header"));
    }
    Ok((kind, level, base, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_round_trip_and_garbage_is_rejected() {
        let leaf = Node::Leaf {
            base: 0x1200,
            entries: vec![(1, Bytes::from_static(b"a")), (9, Bytes::new())],
        };
        let inner = Node::Inner {
            level: 3,
            base: 0xff00_0000_0000,
            children: vec![(0, ChunkId([1; 32])), (200, ChunkId([2; 32]))],
        };
        for n in [leaf, inner] {
            let enc = Bytes::from(n.encode());
            assert_eq!(Node::decode(&enc).unwrap(), n);
            for len in 0..enc.len() {
                assert!(Node::decode(&enc.slice(..len)).is_err());
            }
            for i in 0..enc.len() {
                let mut b = enc.to_vec();
                b[i] = b[i].wrapping_add(0x81);
                let _ = Node::decode(&Bytes::from(b)); // must not panic
            }
        }
    }

    /// What a lookup of `key` finds in `n`, by decoding it.
    fn decoded_step(n: &Node, key: u64) -> Step {
        if !n.covers(key) {
            return Step::Value(None);
        }
        let b = byte_at(key, n.level());
        match n {
            Node::Leaf { entries, .. } => {
                Step::Value(entries.iter().find(|e| e.0 == b).map(|e| e.1.clone()))
            }
            Node::Inner { children, .. } => match children.iter().find(|e| e.0 == b) {
                Some(c) => Step::Child(c.1),
                None => Step::Value(None),
            },
        }
    }

    #[test]
    fn a_step_finds_what_decoding_finds_and_garbage_never_panics() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..200 {
            let slots: std::collections::BTreeSet<u8> =
                (0..1 + next() % 60).map(|_| next() as u8).collect();
            let node = if round % 2 == 0 {
                let entries = slots
                    .iter()
                    .map(|b| (*b, Bytes::from(vec![*b; (next() % 9) as usize])))
                    .collect();
                Node::Leaf { base: 0x4400, entries }
            } else if slots.len() >= 2 {
                let children = slots.iter().map(|b| (*b, ChunkId([*b; 32]))).collect();
                Node::Inner { level: 2, base: 0x0700_0000, children }
            } else {
                continue;
            };
            let enc = Bytes::from(node.encode());
            let (lo, hi) = node.bounds();
            for key in (lo.saturating_sub(3)..lo + 600).chain([hi, hi + 1, u64::MAX]) {
                assert_eq!(Node::step(&enc, key).unwrap(), decoded_step(&node, key), "{key:#x}");
            }
            for len in 0..enc.len() {
                let _ = Node::step(&enc.slice(..len), lo + (next() % 256));
            }
            for i in 0..enc.len().min(64) {
                let mut b = enc.to_vec();
                b[i] = b[i].wrapping_add(0x81);
                let _ = Node::step(&Bytes::from(b), lo + (next() % 65536)); // must not panic
            }
        }
    }

    #[test]
    fn masks_and_bytes() {
        assert_eq!(span_mask(0), 0xff);
        assert_eq!(span_mask(1), 0xffff);
        assert_eq!(span_mask(7), u64::MAX);
        assert_eq!(byte_at(0x1234, 1), 0x12);
    }
}
