//! Writes smaller than a block: a block's overlay entry as what it was
//! written over (the entry *under* it) plus the *spans* written since,
//! each its own data log append. A 4 KiB write into a 64 KiB block
//! appends 4 KiB, not the whole block read, patched and logged again;
//! reads and the checkpoint's fold lay the spans over the block in order.
//!
//! Power loss. Each span is checked on its own: one whose data is gone
//! though its segment's durable mark covers it is damage (an error); one
//! gone before any flush acknowledged it is skipped (the bytes it covered
//! read as what was under it: a legal state for writes never flushed, as
//! a disk's volatile cache may lose any of them). The entry under a patch
//! keeps its own fallbacks (`prior.rs`).
//!
//! Pruning, when a span is added ([`Patch::prune`]), keeps the entry
//! small without losing a fallback: a span covered by a newer one goes
//! when the newer one is durable, or when it was never acknowledged (not
//! even by a flush under way, whose marks are not written yet: losing
//! both is then a legal state) and is of the newer one's segment (one of
//! an older segment may be in the version a checkpoint is folding); a
//! durable span covering the whole block becomes the entry under
//! everything newer; a span that continues the one before it, in the
//! block and in the log, joins it when both are durable or neither may
//! be acknowledged (its CRC the two combined: losing either loses both,
//! legal for writes never flushed). Before pruning, a writer drops what
//! a checkpoint folded ([`Patch::rebase`]): the commit deletes the
//! durable marks of folded segments, and a folded span must never look
//! like one never acknowledged. Past [`MAX_SPANS`] the
//! writer logs the whole block instead (a span covering all of it), which
//! lets everything unacknowledged under it go.
//!
//! A checkpoint folds a patch into the base and moves the log floor past
//! its data. A writer may add a span to a folded patch before the commit
//! deletes it: that entry stays, and its spans below the floor (with the
//! entry under them) were folded, so they read as the base.

use super::datalog::LogRef;
use super::overlay::Dirty;
use crate::error::{Error, Result};

/// The most spans a patch takes before a write logs its whole block.
pub const MAX_SPANS: usize = 16;

/// The most spans a stored patch may name: a bound for decoding, well
/// above what writers leave ([`MAX_SPANS`], the acknowledged spans a
/// whole block logged over them keeps, and that block).
const MAX_STORED: usize = 4 * MAX_SPANS;

/// Bytes written at `at` within a block, in the data log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub at: u32,
    pub r: LogRef,
}

impl Span {
    /// Where the span starts within its block.
    pub fn start(&self) -> u64 {
        u64::from(self.at)
    }

    /// Where the span ends within its block.
    pub fn end(&self) -> u64 {
        u64::from(self.at) + u64::from(self.r.len)
    }

    fn covers(&self, other: &Span) -> bool {
        self.at <= other.at && other.end() <= self.end()
    }
}

/// How far a reference's data is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ack {
    /// Below its segment's durable mark: it survives any power cut.
    pub durable: bool,
    /// Durable, or below what a sync under way covers: a flush may
    /// acknowledge it before its mark is written. Never less than `durable`.
    pub maybe: bool,
}

/// A block written in spans over an earlier entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// The entry the spans were written over (never a patch); `None`: the
    /// base map's value.
    pub under: Option<Dirty>,
    /// Oldest first.
    pub spans: Vec<Span>,
}

impl Patch {
    /// A patch over `cur`, the block's current entry (`None`: the base).
    pub fn over(cur: Option<Dirty>) -> Patch {
        match cur {
            Some(Dirty::Patch(p)) => *p,
            under => Patch { under, spans: Vec::new() },
        }
    }

    /// Drops what no read can need any more (see the module comment);
    /// `ack` tells how far a reference's data is acknowledged.
    pub fn prune(
        &mut self,
        block_size: u64,
        ack: &mut dyn FnMut(&LogRef) -> Result<Ack>,
    ) -> Result<()> {
        let acks = self.spans.iter().map(|s| ack(&s.r)).collect::<Result<Vec<Ack>>>()?;
        let whole = |s: &Span| s.at == 0 && u64::from(s.r.len) == block_size;
        if let Some(i) =
            (0..self.spans.len()).rev().find(|&i| acks[i].durable && whole(&self.spans[i]))
        {
            self.under = Some(Dirty::Logged(self.spans[i].r));
            self.spans.drain(..=i);
            return self.prune(block_size, ack);
        }
        // A covered span goes when the newer one is durable, or when it
        // was never acknowledged, not even by a flush still under way,
        // and is of the newer one's segment (one of an older segment may
        // be in a version a checkpoint is folding now: under its base).
        let keep: Vec<bool> = (0..self.spans.len())
            .map(|i| {
                let (old, a) = (&self.spans[i], acks[i]);
                !(i + 1..self.spans.len()).any(|j| {
                    let new = &self.spans[j];
                    new.covers(old) && (acks[j].durable || (!a.maybe && old.r.seq == new.r.seq))
                })
            })
            .collect();
        let mut k = keep.iter();
        self.spans.retain(|_| *k.next().expect("one flag per span"));
        let mut k = keep.iter();
        let mut acks = acks;
        acks.retain(|_| *k.next().expect("one flag per span"));
        // The newest span continuing the one before it, in the block and
        // in the log, both durable or neither maybe acknowledged: one
        // span (sequential small writes stay one span, not a patch full
        // after a few).
        if let [.., a, b] = &self.spans[..]
            && let [.., ack_a, ack_b] = acks[..]
            && ((ack_a.durable && ack_b.durable) || (!ack_a.maybe && !ack_b.maybe))
            && a.r.seq == b.r.seq
            && a.end() == b.start()
            && a.r.offset + u64::from(a.r.len) == b.r.offset
        {
            let mut crc = crc32fast::Hasher::new_with_initial_len(a.r.crc, u64::from(a.r.len));
            crc.combine(&crc32fast::Hasher::new_with_initial_len(b.r.crc, u64::from(b.r.len)));
            let r = LogRef { len: a.r.len + b.r.len, crc: crc.finalize(), ..a.r };
            let at = a.at;
            self.spans.truncate(self.spans.len() - 2);
            self.spans.push(Span { at, r });
        }
        if let Some(Dirty::Over(r, _)) = &self.under
            && ack(r)?.durable
        {
            self.under = Some(Dirty::Logged(*r));
        }
        Ok(())
    }

    /// The spans a checkpoint folded (below the log `floor`) and the
    /// entry under them are the base now: drops them, so no later pruning
    /// can mistake a folded span for one never acknowledged.
    pub fn rebase(&mut self, floor: u64) {
        let folded = self.spans.iter().take_while(|s| s.r.seq < floor).count();
        let under_folded =
            self.under.as_ref().and_then(Dirty::log_ref).is_some_and(|r| r.seq < floor);
        if folded > 0 || under_folded {
            self.under = None;
            self.spans.drain(..folded);
        }
    }

    /// `under length u16 LE | under (an entry's encoding; none: the base)
    /// | count u16 LE | per span, oldest first: at u32 LE | LogRef`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let under = self.under.as_ref().map(Dirty::encode).unwrap_or_default();
        out.extend_from_slice(&(under.len() as u16).to_le_bytes());
        out.extend_from_slice(&under);
        out.extend_from_slice(&(self.spans.len() as u16).to_le_bytes());
        for s in &self.spans {
            out.extend_from_slice(&s.at.to_le_bytes());
            out.extend_from_slice(&s.r.encode());
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Patch> {
        let bad = |what: &str| Error::corrupt(format!("overlay patch entry: {what}"));
        let (len, rest) = b.split_first_chunk::<2>().ok_or_else(|| bad("cut short"))?;
        let len = u16::from_le_bytes(*len) as usize;
        let under = rest.get(..len).ok_or_else(|| bad("cut short"))?;
        let under = match under {
            [] => None,
            // Checked before decoding: nested patches would recurse.
            [4, ..] => return Err(bad("a patch under a patch")),
            u => match Dirty::decode(u)? {
                Dirty::Patch(_) => return Err(bad("a patch under a patch")),
                d => Some(d),
            },
        };
        let (count, mut rest) =
            rest[len..].split_first_chunk::<2>().ok_or_else(|| bad("cut short"))?;
        let count = u16::from_le_bytes(*count) as usize;
        if count > MAX_STORED || rest.len() != count * (4 + LogRef::LEN) {
            return Err(bad("its spans do not parse"));
        }
        let mut spans = Vec::with_capacity(count);
        while let Some((at, r)) = rest.split_first_chunk::<4>() {
            spans.push(Span { at: u32::from_le_bytes(*at), r: LogRef::decode(&r[..LogRef::LEN])? });
            rest = &r[LogRef::LEN..];
        }
        Ok(Patch { under, spans })
    }

    /// True when one more span may be added (else the block is logged whole).
    pub fn has_room(&self) -> bool {
        self.spans.len() < MAX_SPANS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn span(at: u32, len: u32, seq: u64) -> Span {
        Span {
            at,
            r: LogRef { seq, offset: u64::from(at) * 7 + seq + u64::from(len), len, crc: at },
        }
    }

    #[test]
    fn a_patch_round_trips_and_damage_is_refused() {
        for under in [
            None,
            Some(Dirty::Delete),
            Some(Dirty::Value(Bytes::from_static(b"chunk id"))),
            Some(Dirty::Logged(span(0, 65536, 2).r)),
        ] {
            let p = Patch { under, spans: vec![span(4096, 4096, 3), span(0, 512, 3)] };
            let mut b = Vec::new();
            p.encode(&mut b);
            assert_eq!(Patch::decode(&b).unwrap(), p);
            for n in 0..b.len() {
                assert!(Patch::decode(&b[..n]).is_err(), "a {n}-byte prefix parsed");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert!(Patch::decode(&longer).is_err());
        }
        let inner = Dirty::Patch(Box::new(Patch { under: None, spans: vec![] })).encode();
        let mut b = (inner.len() as u16).to_le_bytes().to_vec();
        b.extend_from_slice(&inner);
        b.extend_from_slice(&0u16.to_le_bytes());
        assert!(Patch::decode(&b).is_err(), "a patch under a patch parsed");
        // Nested deeply, refused before any recursion.
        let mut deep = vec![4u8];
        for _ in 0..20_000 {
            deep.extend_from_slice(&[4, 0]);
        }
        assert!(Patch::decode(&deep[1..]).is_err());
    }

    /// Which spans a write's pruning keeps, for spans durable or not.
    #[test]
    fn pruning_keeps_every_fallback_a_read_may_need() {
        const BS: u64 = 65536;
        // `durable` and `maybe` list the offsets of acknowledged references.
        let prune_with = |spans: Vec<Span>, durable: &[u64], maybe: &[u64]| {
            let mut p = Patch { under: None, spans };
            p.prune(BS, &mut |r| {
                let durable = durable.contains(&r.offset);
                Ok(Ack { durable, maybe: durable || maybe.contains(&r.offset) })
            })
            .unwrap();
            p
        };
        let prune = |spans: Vec<Span>, acked: &[u64]| prune_with(spans, acked, &[]);
        let (a, b, c) = (span(0, 4096, 1), span(0, 8192, 1), span(4096, 4096, 1));
        // Unacknowledged and covered: goes.
        assert_eq!(prune(vec![a, b], &[]).spans, vec![b]);
        // Acknowledged, covered by one that is not: stays (its fallback).
        assert_eq!(prune(vec![a, b], &[a.r.offset]).spans, vec![a, b]);
        // Maybe acknowledged (a flush under way covers it): stays too.
        assert_eq!(prune_with(vec![a, b], &[], &[a.r.offset]).spans, vec![a, b]);
        // Unacknowledged in an older segment (a checkpoint may be folding
        // it into the base): stays.
        let newer = span(0, 8192, 2);
        assert_eq!(prune(vec![a, newer], &[]).spans, vec![a, newer]);
        // Acknowledged and covered by an acknowledged one: goes.
        assert_eq!(prune(vec![a, b], &[a.r.offset, b.r.offset]).spans, vec![b]);
        // Overlapping but not covered: stays.
        assert_eq!(prune(vec![b, c], &[]).spans, vec![b, c]);
        // A durable whole block becomes the entry under the rest.
        let w = span(0, BS as u32, 1);
        let p = prune(vec![a, c, w, b], &[w.r.offset]);
        assert_eq!((p.under, p.spans), (Some(Dirty::Logged(w.r)), vec![b]));
        // Contiguous in the block and in the log, neither acknowledged: one span.
        let data = [7u8; 1536];
        let crc = |b: &[u8]| crc32fast::hash(b);
        let r = |offset, len: u32, b: &[u8]| LogRef { seq: 9, offset, len, crc: crc(b) };
        let (x, y) = (
            Span { at: 512, r: r(100, 1024, &data[..1024]) },
            Span { at: 1536, r: r(1124, 512, &data[1024..]) },
        );
        let p = prune(vec![x, y], &[]);
        assert_eq!(p.spans, vec![Span { at: 512, r: r(100, 1536, &data) }], "joined, CRC combined");
        // One acknowledged or maybe so, or not contiguous in the log: two spans.
        assert_eq!(prune(vec![x, y], &[100]).spans, vec![x, y]);
        assert_eq!(prune_with(vec![x, y], &[], &[100]).spans, vec![x, y]);
        let apart = Span { r: LogRef { offset: 2000, ..y.r }, ..y };
        assert_eq!(prune(vec![x, apart], &[]).spans, vec![x, apart]);
        // A whole block not yet durable keeps the acknowledged spans under it.
        let p = prune(vec![a, c, w], &[a.r.offset]);
        assert_eq!((p.under, p.spans), (None, vec![a, w]));
    }

    /// After a checkpoint, spans below the floor and the entry under them
    /// are the base: a rebase drops them, and only then.
    #[test]
    fn a_rebase_drops_what_a_checkpoint_folded() {
        let (old, new) = (span(0, 4096, 3), span(8192, 4096, 4));
        let mut p = Patch { under: Some(Dirty::Delete), spans: vec![old, new] };
        p.rebase(3);
        assert_eq!(p.spans.len(), 2, "nothing below floor 3");
        p.rebase(4);
        assert_eq!((p.under, p.spans), (None, vec![new]));
        let mut p = Patch { under: Some(Dirty::Logged(span(0, 65536, 2).r)), spans: vec![new] };
        p.rebase(4);
        assert_eq!((p.under, p.spans), (None, vec![new]), "a folded entry under the spans");
    }
}
