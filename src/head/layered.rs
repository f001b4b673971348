//! Layered reads of a live head: the pending layer (block volumes in
//! btrfs mode), then the overlay, then the base map; data in the data
//! log checked against power loss (`prior.rs` chains, `patch.rs` spans),
//! and the entries a write puts over the ones it replaces.

use super::datalog::{LogRef, Read};
use super::overlay::{Dirty, Space};
use super::patch::{self, Patch};
use super::{Found, Head, Part, block, blockmap, prior};
use crate::error::{Error, Result};
use crate::id::VolumeName;
use crate::map::MapRoot;
use bytes::Bytes;

impl Head {
    /// Looks a key up in the overlay (for block volumes, after the pending
    /// layer), then in `base`.
    pub(crate) fn lookup(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
    ) -> Result<Option<Found>> {
        match self.lookup_part(space, owner, key, base, None)? {
            Part::Found(f) => Ok(f),
            Part::Filled => Err(Error::corrupt("a whole-block lookup was answered in part")),
        }
    }

    /// [`Head::lookup`], except that with `part` (an offset in the block
    /// and a buffer) data this process logged is read straight into the
    /// buffer ([`DataLog::read_part`]): a small read of a large block
    /// reads and copies only its own bytes, once (unchecked: no crash came
    /// between that write and now; everything else is read as before).
    pub(crate) fn lookup_part(
        &self,
        space: Space,
        owner: u64,
        key: u64,
        base: MapRoot,
        mut part: Option<(u64, &mut [u8])>,
    ) -> Result<Part> {
        let found = |f: Option<Found>| Ok(Part::Found(f));
        let block = self.block.as_ref().filter(|_| space == Space::Root);
        if let Some(b) = block {
            match b.pending_lookup(key) {
                block::PendingLookup::Absent => {}
                block::PendingLookup::Zero => return found(None),
                // Written by this process since the seal: lost data is damage.
                block::PendingLookup::Entry(Dirty::Logged(r) | Dirty::Over(r, _)) => {
                    if self.read_part(&r, &mut part)? {
                        return Ok(Part::Filled);
                    }
                    return match self.storage.log.read(self.record.id, &r)? {
                        Read::Data(d) => found(Some(Found::Data(d))),
                        Read::Lost(why) => Err(Error::corrupt(format!(
                            "volume {}: a write of this process is lost: {why}",
                            self.record.name
                        ))),
                    };
                }
                block::PendingLookup::Entry(Dirty::Patch(p)) => {
                    return self.read_patch(&p, key, base, part);
                }
                block::PendingLookup::Entry(d) => return found(self.entry_found(&d, key, base)?),
            }
        }
        match self.overlay().get(space, owner, key)? {
            // Logged by this process: there, whatever came before it.
            Some(Dirty::Logged(r) | Dirty::Over(r, _)) if self.read_part(&r, &mut part)? => {
                Ok(Part::Filled)
            }
            Some(Dirty::Patch(p)) => self.read_patch(&p, key, base, part),
            Some(d) => found(self.entry_found(&d, key, base)?),
            None if block.is_some_and(|b| b.in_zeroed(key)) => found(None),
            None => found(self.map().get(base, key)?.map(Found::Value)),
        }
    }

    /// Reads the bytes `part` asks for of logged block data `r` straight
    /// into its buffer, if this process logged it ([`DataLog::read_part`]).
    fn read_part(&self, r: &LogRef, part: &mut Option<(u64, &mut [u8])>) -> Result<bool> {
        match part.as_mut() {
            Some((within, out)) => self.storage.log.read_part(self.record.id, r, *within, out),
            None => Ok(false),
        }
    }

    /// What an entry other than a patch reads as (`None`: a hole), with
    /// the base map's value at `key` under it.
    fn entry_found(&self, d: &Dirty, key: u64, base: MapRoot) -> Result<Option<Found>> {
        let from_base = || Ok::<_, Error>(self.map().get(base, key)?.map(Found::Value));
        match d {
            Dirty::Delete => Ok(None),
            Dirty::Value(v) => Ok(Some(Found::Value(v.clone()))),
            Dirty::Logged(r) => match self.read_logged(r)? {
                Some(d) => Ok(Some(Found::Data(d))),
                None => from_base(),
            },
            Dirty::Over(r, prior) => match self.read_over(r, prior)? {
                Logged::Data(d) => Ok(Some(Found::Data(d))),
                Logged::Hole => Ok(None),
                Logged::Value(v) => Ok(Some(Found::Value(v))),
                Logged::Base => from_base(),
            },
            Dirty::Patch(_) => Err(Error::corrupt("a patch under a patch")),
        }
    }

    /// Reads a patched block (see `patch.rs`): the entry under it, then
    /// its spans in order. With `part`, bytes that the newest span
    /// touching them holds whole, and that this process logged, are read
    /// straight into the buffer; bytes no span touches are read from the
    /// entry under the spans alone.
    pub(crate) fn read_patch(
        &self,
        p: &Patch,
        key: u64,
        base: MapRoot,
        mut part: Option<(u64, &mut [u8])>,
    ) -> Result<Part> {
        let bs = u64::from(self.record.block_size);
        let floor = self.log_floor();
        // Spans below the floor, and the entry under them, went into the
        // base (a checkpoint folded them; this entry was written after).
        let folded = p.spans.iter().take_while(|s| s.r.seq < floor).count();
        let under_folded = p.under.as_ref().and_then(Dirty::log_ref).is_some_and(|r| r.seq < floor);
        let under = p.under.as_ref().filter(|_| folded == 0 && !under_folded);
        if let Some((lo, out)) = part.as_ref() {
            let (lo, hi) = (*lo, *lo + out.len() as u64);
            let newest = p.spans[folded..].iter().rev().find(|s| s.start() < hi && lo < s.end());
            match newest {
                Some(s) if s.start() <= lo && hi <= s.end() => {
                    let mut inner = part.take().map(|(_, out)| (lo - s.start(), out));
                    if self.read_part(&s.r, &mut inner)? {
                        return Ok(Part::Filled);
                    }
                }
                // No span touches the bytes asked for: they are the entry
                // under the spans' (read only in part if this process
                // logged it), or the base's.
                None => {
                    return match under {
                        Some(Dirty::Logged(r) | Dirty::Over(r, _))
                            if self.read_part(r, &mut part)? =>
                        {
                            Ok(Part::Filled)
                        }
                        Some(d) => Ok(Part::Found(self.entry_found(d, key, base)?)),
                        None => Ok(Part::Found(self.map().get(base, key)?.map(Found::Value))),
                    };
                }
                Some(_) => {}
            }
        }
        let under = match under {
            Some(d) => self.entry_found(d, key, base)?,
            None => self.map().get(base, key)?.map(Found::Value),
        };
        let mut block = match under {
            None => vec![0u8; bs as usize],
            Some(Found::Data(d)) => d.to_vec(),
            Some(Found::Value(v)) => {
                blockmap::stored_block(&self.storage.chunks, &v, key, bs)?.to_vec()
            }
        };
        if block.len() as u64 != bs {
            return Err(Error::corrupt(format!(
                "block {key} is {} bytes, expected {bs}",
                block.len()
            )));
        }
        for s in &p.spans[folded..] {
            if s.end() > bs {
                return Err(Error::corrupt(format!("block {key}: a span ends past the block")));
            }
            // A span lost before any flush acknowledged it is skipped.
            if let Some(d) = self.read_logged(&s.r)? {
                block[s.start() as usize..s.end() as usize].copy_from_slice(&d);
            }
        }
        Ok(Part::Found(Some(Found::Data(Bytes::from(block)))))
    }

    /// Drops what no read of `p` can need any more ([`Patch::rebase`],
    /// [`Patch::prune`]). The caller holds the gate (the floor cannot
    /// move) and the block's stripe.
    pub(crate) fn prune_patch(&self, p: &mut Patch) -> Result<()> {
        p.rebase(self.log_floor());
        let mut marks = std::collections::HashMap::new();
        let id = self.record.id;
        p.prune(u64::from(self.record.block_size), &mut |r| {
            let (mark, started) = match marks.get(&r.seq) {
                Some(m) => *m,
                None => {
                    let m = self.storage.durable_mark(id, r.seq)?.unwrap_or(0);
                    // Read after the mark: a sync that wrote it started before.
                    let started = self.storage.log.sync_started(id, r.seq);
                    *marks.entry(r.seq).or_insert((m, started))
                }
            };
            let end = r.offset + u64::from(r.len);
            Ok(patch::Ack { durable: end <= mark, maybe: end <= mark.max(started) })
        })
    }

    /// Reads a logged entry written over earlier states (see `prior.rs`):
    /// its data, else the newest earlier state still there.
    pub(crate) fn read_over(&self, r: &LogRef, prior: &prior::Prior) -> Result<Logged> {
        if let Some(d) = self.read_logged(r)? {
            return Ok(Logged::Data(d));
        }
        let floor = self.log_floor();
        for e in &prior.chain {
            match e {
                prior::Earlier::Hole => return Ok(Logged::Hole),
                prior::Earlier::Value(v) => return Ok(Logged::Value(v.clone())),
                // Below the floor: folded into the base by a checkpoint.
                prior::Earlier::Logged(q) if q.seq < floor => return Ok(Logged::Base),
                prior::Earlier::Logged(q) => {
                    if let Some(d) = self.read_logged(q)? {
                        return Ok(Logged::Data(d));
                    }
                }
            }
        }
        if prior.cut {
            return Err(Error::corrupt(format!(
                "volume {}: a block's unflushed writes are lost and what it held before \
                 them is unknown (more than {} rewrites since its last durable state); \
                 `forkfs fsck --repair` drops them",
                self.record.name,
                prior::MAX_CHAIN
            )));
        }
        Ok(Logged::Base)
    }

    /// `d` as it goes into the overlay over the entry at (space, owner,
    /// key): logged data carries what it replaces, for power loss.
    /// A whole block logged over a patch is its newest span.
    pub(crate) fn over(&self, space: Space, owner: u64, key: u64, d: Dirty) -> Result<Dirty> {
        let Dirty::Logged(r) = d else { return Ok(d) };
        let id = self.record.id;
        let prior = match self.overlay().get(space, owner, key)? {
            Some(Dirty::Patch(p)) => {
                let mut p = *p;
                p.spans.push(patch::Span { at: 0, r });
                self.prune_patch(&mut p)?;
                return Ok(Dirty::Patch(Box::new(p)));
            }
            None => prior::Prior::default(),
            Some(Dirty::Delete) => prior::Prior::chained(prior::Earlier::Hole, None),
            Some(Dirty::Value(v)) => prior::Prior::chained(prior::Earlier::Value(v), None),
            Some(Dirty::Logged(p)) => prior::Prior::chained(prior::Earlier::Logged(p), None),
            // Known durable: nothing older is needed.
            Some(Dirty::Over(p, _)) if self.storage.was_durable(id, &p)? => {
                prior::Prior::chained(prior::Earlier::Logged(p), None)
            }
            Some(Dirty::Over(p, older)) => {
                prior::Prior::chained(prior::Earlier::Logged(p), Some(&older))
            }
        };
        Ok(Dirty::Over(r, prior))
    }

    /// Reads dirty data from the log. Data whose overlay entry outlived it
    /// (power lost before any flush made it durable) reads as `None`: that
    /// write was never acknowledged as durable, so the older content stands.
    /// Lost data that *was* acknowledged (below its segment's durable mark)
    /// is damage: an error, never older content; an I/O failure is an error.
    pub(crate) fn read_logged(&self, r: &LogRef) -> Result<Option<Bytes>> {
        match self.storage.log.read(self.record.id, r)? {
            Read::Data(d) => Ok(Some(d)),
            Read::Lost(why) if self.storage.was_durable(self.record.id, r)? => {
                Err(lost_acknowledged(&self.record.name, &why))
            }
            Read::Lost(why) => {
                tracing::warn!(volume = %self.record.name, why, "dropping an unflushed write lost in a crash");
                Ok(None)
            }
        }
    }
}

/// What a logged entry reads as (see [`Head::read_over`]).
pub(crate) enum Logged {
    Data(Bytes),
    Hole,
    Value(Bytes),
    /// The base map's value.
    Base,
}

/// The error for acknowledged data that is gone.
fn lost_acknowledged(volume: &VolumeName, why: &str) -> Error {
    Error::corrupt(format!(
        "volume {volume}: a write acknowledged as durable is lost ({why}); `forkfs fsck` \
         lists the damage, `forkfs fsck --repair` drops the lost writes (their blocks go back \
         to the last version)"
    ))
}
