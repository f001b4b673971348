//! What a block held before an unflushed write: the fallback when power
//! loss takes that write's data but RocksDB kept its overlay entry.
//!
//! An overlay entry becomes durable with the RocksDB write that follows it
//! (a WAL sync, or a memtable flush RocksDB starts on its own), not only
//! with a flush of the head, which syncs the data log first. So after
//! power loss an entry can outlive its data. Such a write was never
//! acknowledged (its data is past the segment's durable mark) and may be
//! dropped, but the entry it replaced may hold an acknowledged write: the
//! block must read as that, not as the last version. Each logged entry
//! written over another therefore carries the chain of what it replaced,
//! newest first, up to the newest entry known durable when it was written
//! (a hole, a literal value, or logged data below a durable mark), at most
//! [`MAX_CHAIN`] long.
//!
//! Reading a lost, unacknowledged entry walks the chain: the first element
//! whose data is there is the block's content; logged data below the log
//! floor went into the last version (the base). A chain cut at
//! [`MAX_CHAIN`] whose every element is lost is an error: the older
//! content is unknown, and older content is never guessed.

use super::datalog::LogRef;
use crate::error::{Error, Result};
use bytes::Bytes;

/// The most earlier entries one entry keeps (each one an unflushed
/// rewrite of the block since its last durable state).
pub const MAX_CHAIN: usize = 8;

/// One earlier state of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Earlier {
    /// A hole (an overlay delete).
    Hole,
    /// A literal map value.
    Value(Bytes),
    /// Dirty data in the data log.
    Logged(LogRef),
}

/// The earlier states of a block, newest first; past them, the base
/// (unless `cut`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prior {
    pub chain: Vec<Earlier>,
    /// The chain was cut at [`MAX_CHAIN`]: what came before is unknown.
    pub cut: bool,
}

impl Prior {
    /// `first`, then what it replaced (`rest`), cut at [`MAX_CHAIN`].
    pub fn chained(first: Earlier, rest: Option<&Prior>) -> Prior {
        let mut chain = vec![first];
        let mut cut = false;
        if let Some(r) = rest {
            chain.extend(r.chain.iter().cloned());
            cut = r.cut;
        }
        if chain.len() > MAX_CHAIN {
            chain.truncate(MAX_CHAIN);
            cut = true;
        }
        Prior { chain, cut }
    }

    /// `cut u8 | count u8 | per element: tag u8 (0 hole, 1 value, 2
    /// logged) | value: len u16 LE + bytes; logged: a LogRef`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.cut as u8);
        out.push(self.chain.len() as u8);
        for e in &self.chain {
            match e {
                Earlier::Hole => out.push(0),
                Earlier::Value(v) => {
                    out.push(1);
                    out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                    out.extend_from_slice(v);
                }
                Earlier::Logged(r) => {
                    out.push(2);
                    out.extend_from_slice(&r.encode());
                }
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<Prior> {
        let bad = || Error::corrupt("overlay entry: its earlier states do not parse");
        let (&cut, rest) = b.split_first().ok_or_else(bad)?;
        let (&count, mut rest) = rest.split_first().ok_or_else(bad)?;
        if cut > 1 || count as usize > MAX_CHAIN {
            return Err(bad());
        }
        let mut chain = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let (&tag, r) = rest.split_first().ok_or_else(bad)?;
            rest = r;
            chain.push(match tag {
                0 => Earlier::Hole,
                1 => {
                    let (len, r) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
                    let len = u16::from_le_bytes(*len) as usize;
                    let (v, r) = (r.get(..len).ok_or_else(bad)?, &r[len.min(r.len())..]);
                    rest = r;
                    Earlier::Value(Bytes::copy_from_slice(v))
                }
                2 => {
                    let r = rest.get(..LogRef::LEN).ok_or_else(bad)?;
                    rest = &rest[LogRef::LEN..];
                    Earlier::Logged(LogRef::decode(r)?)
                }
                _ => return Err(bad()),
            });
        }
        if !rest.is_empty() {
            return Err(bad());
        }
        Ok(Prior { chain, cut: cut == 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prior_round_trips_and_rejects_damage() {
        let r = LogRef { seq: 3, offset: 8192, len: 4096, crc: 7 };
        let p = Prior::chained(
            Earlier::Logged(r),
            Some(&Prior {
                chain: vec![Earlier::Value(Bytes::from_static(b"id")), Earlier::Hole],
                cut: false,
            }),
        );
        let mut b = Vec::new();
        p.encode(&mut b);
        assert_eq!(Prior::decode(&b).unwrap(), p);
        for n in 0..b.len() {
            assert!(Prior::decode(&b[..n]).is_err(), "a {n}-byte prefix parsed");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(Prior::decode(&longer).is_err());
    }

    #[test]
    fn a_chain_is_cut_at_its_limit() {
        let r = |n| Earlier::Logged(LogRef { seq: 1, offset: n, len: 1, crc: 0 });
        let mut p: Option<Prior> = None;
        for n in 0..MAX_CHAIN as u64 + 3 {
            p = Some(Prior::chained(r(n), p.as_ref()));
        }
        let p = p.unwrap();
        assert_eq!(p.chain.len(), MAX_CHAIN);
        assert!(p.cut);
        assert_eq!(p.chain[0], r(MAX_CHAIN as u64 + 2), "newest first");
    }
}
