//! Deferred persistence for block volumes: writes since the last *seal*
//! are kept out of the overlay, so they can be discarded as a whole.
//!
//! The NBD server's `--consistency btrfs` uses it: a block device served
//! over a network must persist only states its filesystem can mount, so
//! writes go to a volatile *pending layer* and reach the overlay only when
//! the server has seen a filesystem commit (a safe point) and calls
//! [`Head::seal`]. A client lost mid-transaction has its writes dropped:
//! all of them ([`Head::discard_pending`]: the head is exactly the last
//! sealed state) or, when the server can tell one client's blocks from the
//! others', only those blocks ([`BlockHead::discard_pending_blocks`]); a
//! process that dies loses the layer with its memory.
//!
//! The pending layer holds, per block, the same [`Dirty`] entries the
//! overlay would (block data is appended to the data log as usual; only the
//! ~50-byte entries live in memory), plus the block ranges zeroed since the
//! seal. Reads look at it first. A seal writes it to the overlay in one
//! RocksDB batch, after syncing the data log, and syncs the WAL: the sealed
//! state is durable on local disk when it returns. Checkpoints fold the
//! overlay only, so every version of a deferred head is a sealed state.
//!
//! While the layer holds anything, a meta key `unsealed/<volume>` exists
//! (written unsynced with the first pending write, removed by the seal or
//! discard). Finding it when the store opens means a process died with
//! unsealed writes; the store records that rollback (see
//! `graph/rollback.rs`).

use super::{BlockHead, State, zeroed};
use crate::cas::ChunkStore;
use crate::clock::now_ms;
use crate::error::Result;
use crate::head::overlay::{Dirty, Space};
use crate::map::{Map, MapRoot};
use crate::records::keys;
use rocksdb::WriteBatch;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// Writes since the last seal.
#[derive(Default)]
pub(crate) struct Pending {
    blocks: BTreeMap<u64, Dirty>,
    /// Union of the block ranges zeroed since the seal: start -> end.
    zeroed: BTreeMap<u64, u64>,
    /// Those ranges in the order they were zeroed, for the seal.
    ranges: Vec<(u64, u64)>,
    /// Bytes written, zeroed or trimmed since the seal.
    bytes: u64,
    /// The lowest data log segment a pending entry names.
    min_segment: Option<u64>,
    /// When the first pending write arrived (ms since the epoch).
    since_ms: Option<u64>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.ranges.is_empty()
    }

    fn in_zeroed(&self, idx: u64) -> bool {
        self.zeroed.range(..=idx).next_back().is_some_and(|(_, end)| idx < *end)
    }
}

/// The deferred state of a block head (`None` in [`State`]: writes go
/// straight to the overlay).
#[derive(Default)]
pub(crate) struct Deferred {
    pending: Pending,
    /// The generation the last seal was labelled with (btrfs's).
    generation: Option<u64>,
}

/// What a seal made durable, or a discard dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Blocks with pending entries.
    pub blocks: u64,
    /// Bytes written, zeroed or trimmed.
    pub bytes: u64,
    /// When the oldest of those writes arrived (ms since the epoch).
    pub since_ms: Option<u64>,
}

/// A pending entry found for a block.
pub(crate) enum PendingLookup {
    /// The layer has nothing to say: look in the overlay and base.
    Absent,
    /// The block was zeroed (or trimmed) since the seal.
    Zero,
    Entry(Dirty),
}

impl State {
    pub(crate) fn is_deferred(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Bytes written since the last seal (0 when not deferred).
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.deferred.lock().as_ref().map_or(0, |d| d.pending.bytes)
    }

    /// The generation of the last seal, if it named one.
    pub(crate) fn sealed_generation(&self) -> Option<u64> {
        self.deferred.lock().as_ref().and_then(|d| d.generation)
    }

    pub(crate) fn pending_lookup(&self, idx: u64) -> PendingLookup {
        // Reads of heads that never defer (fs volumes, flush mode) skip the lock.
        if !self.on.load(Ordering::Acquire) {
            return PendingLookup::Absent;
        }
        let d = self.deferred.lock();
        let Some(d) = d.as_ref() else { return PendingLookup::Absent };
        match d.pending.blocks.get(&idx) {
            Some(e) => PendingLookup::Entry(e.clone()),
            None if d.pending.in_zeroed(idx) => PendingLookup::Zero,
            None => PendingLookup::Absent,
        }
    }

    /// Whether writes wait for a seal (a head with them is not clean).
    pub(crate) fn has_pending(&self) -> bool {
        self.deferred.lock().as_ref().is_some_and(|d| !d.pending.is_empty())
    }

    /// The lowest data log segment pending entries name: a checkpoint must
    /// not drop it.
    pub(crate) fn pending_min_segment(&self) -> Option<u64> {
        self.deferred.lock().as_ref().and_then(|d| d.pending.min_segment)
    }

    /// Applies the pending layer to a set of allocated block indexes in
    /// `first..=last`.
    pub(crate) fn pending_allocated(
        &self,
        set: &mut std::collections::BTreeSet<u64>,
        first: u64,
        last: u64,
    ) {
        let d = self.deferred.lock();
        let Some(d) = d.as_ref() else { return };
        set.retain(|k| !d.pending.in_zeroed(*k));
        for (k, e) in d.pending.blocks.range(first..=last) {
            match e {
                Dirty::Delete => set.remove(k),
                _ => set.insert(*k),
            };
        }
    }

    /// Block indexes the pending layer changes relative to `base`: its
    /// entries and the base blocks inside its zeroed ranges.
    pub(crate) fn pending_changed(
        &self,
        map: Map<'_, ChunkStore>,
        base: MapRoot,
    ) -> Result<Vec<u64>> {
        let (mut keys, ranges) = {
            let d = self.deferred.lock();
            let Some(d) = d.as_ref() else { return Ok(Vec::new()) };
            let keys: Vec<u64> = d.pending.blocks.keys().copied().collect();
            let ranges: Vec<(u64, u64)> = d.pending.zeroed.iter().map(|(a, b)| (*a, *b)).collect();
            (keys, ranges)
        };
        keys.extend(zeroed::base_keys(map, base, &ranges)?);
        Ok(keys)
    }

    /// Runs `f` while no seal can move entries into the overlay, with the
    /// generation of the last seal (a consistent cut for a checkpoint).
    pub(crate) fn with_sealed<T>(&self, f: impl FnOnce(Option<u64>) -> T) -> T {
        let d = self.deferred.lock();
        f(d.as_ref().and_then(|d| d.generation))
    }
}

impl BlockHead {
    /// Turns deferred persistence on or off. Turning it off seals what is
    /// pending (flush semantics from then on).
    pub fn set_deferred(&self, on: bool) -> Result<()> {
        self.seal_and(None, |d| {
            if on && d.is_none() {
                *d = Some(Deferred::default());
            } else if !on {
                // Sealed in the same critical section: no write can slip
                // into a layer that is about to go.
                *d = None;
            }
        })
        .map(|_| ())
    }

    /// Adds block entries to the pending layer; `Ok(false)` when the head
    /// is not deferred (the caller writes them to the overlay). The caller
    /// holds the blocks' stripes.
    pub(crate) fn defer_blocks(&self, entries: &[(u64, Dirty)], bytes: u64) -> Result<bool> {
        let mut d = self.state().deferred.lock();
        let Some(d) = d.as_mut() else { return Ok(false) };
        self.note_unsealed(&mut d.pending)?;
        let p = &mut d.pending;
        for (k, e) in entries {
            for r in e.log_refs() {
                p.min_segment = Some(p.min_segment.map_or(r.seq, |m| m.min(r.seq)));
            }
            p.blocks.insert(*k, e.clone());
        }
        p.bytes += bytes;
        Ok(true)
    }

    /// Zeroes blocks `[first, end)` in the pending layer; `Ok(false)` when
    /// the head is not deferred. The caller holds every stripe.
    pub(crate) fn defer_zero_range(&self, first: u64, end: u64, bytes: u64) -> Result<bool> {
        let mut d = self.state().deferred.lock();
        let Some(d) = d.as_mut() else { return Ok(false) };
        self.note_unsealed(&mut d.pending)?;
        let p = &mut d.pending;
        let inside: Vec<u64> = p.blocks.range(first..end).map(|(k, _)| *k).collect();
        for k in inside {
            p.blocks.remove(&k);
        }
        zeroed::merge_into(&mut p.zeroed, first, end);
        p.ranges.push((first, end));
        p.bytes += bytes;
        Ok(true)
    }

    /// Marks the volume as holding unsealed writes before the first one.
    fn note_unsealed(&self, p: &mut Pending) -> Result<()> {
        if p.since_ms.is_some() {
            return Ok(());
        }
        let now = now_ms();
        let mut b = WriteBatch::default();
        let db = self.head().db();
        db.put_meta(&mut b, &keys::unsealed(self.record().id), now.to_string());
        db.write(b, false)?;
        p.since_ms = Some(now);
        Ok(())
    }

    /// Makes everything written so far part of the head, durably on local
    /// disk, labelled with `generation`. Writers wait only while the
    /// pending entries are moved (a data log sync and one batch); the WAL
    /// sync runs after. Without deferred persistence: a plain flush.
    pub fn seal(&self, generation: Option<u64>) -> Result<LayerStats> {
        self.seal_and(generation, |_| {})
    }

    /// Seals, then runs `then` on the deferred state before any writer can
    /// add to it again.
    fn seal_and(
        &self,
        generation: Option<u64>,
        then: impl FnOnce(&mut Option<Deferred>),
    ) -> Result<LayerStats> {
        // A seal writes the overlay like any writer: under the gate, so a
        // checkpoint's commit (which deletes the entries it folded if they
        // are unchanged) never interleaves with it. Gate before layer, the
        // order writers take them in.
        let gate = self.head().gate.read();
        let mut guard = self.state().deferred.lock();
        let Some(d) = guard.as_mut() else {
            then(&mut guard);
            self.state().on.store(guard.is_some(), Ordering::Release);
            drop(guard);
            drop(gate);
            self.flush()?;
            return Ok(LayerStats::default());
        };
        d.generation = generation;
        let stats = stats_of(&d.pending);
        if !d.pending.is_empty() || d.pending.since_ms.is_some() {
            // The data first: a synced entry never names unsynced data.
            let mut b = WriteBatch::default();
            self.head().storage.sync_log(&mut b)?;
            let p = &d.pending;
            // Ranges first: every pending block entry inside a pending range
            // is newer than the range (zeroing dropped older ones).
            for &(a, e) in &p.ranges {
                self.zero_blocks(&mut b, a, e);
            }
            let overlay = self.head().overlay();
            for (k, e) in &p.blocks {
                overlay.put(&mut b, Space::Root, 0, *k, e);
            }
            self.head().db().delete_meta(&mut b, &keys::unsealed(self.record().id));
            self.head().db().write(b, false)?;
            for &r in &p.ranges {
                self.state().publish_zeroed(r);
            }
            d.pending = Pending::default();
        }
        then(&mut guard);
        self.state().on.store(guard.is_some(), Ordering::Release);
        drop(guard);
        drop(gate);
        self.head().db().sync()?;
        Ok(stats)
    }

    /// Moves the lowest pending block (or, when none is left, the pending
    /// zeroed ranges) into the overlay, unsynced; false when nothing is
    /// pending. This BREAKS the guarantee deferred persistence exists for:
    /// it persists states no safe point vouched for. It exists only for the
    /// NBD server's negative-control test mode, which shows that the chaos
    /// test catches exactly that.
    pub fn persist_one_unsealed_block(&self) -> Result<bool> {
        let _gate = self.head().gate.read();
        let mut guard = self.state().deferred.lock();
        let Some(d) = guard.as_mut() else { return Ok(false) };
        let p = &mut d.pending;
        let mut b = WriteBatch::default();
        if let Some((k, e)) = p.blocks.pop_first() {
            self.head().overlay().put(&mut b, Space::Root, 0, k, &e);
            self.head().db().write(b, false)?;
        } else if !p.ranges.is_empty() {
            for &(a, e) in &p.ranges {
                self.zero_blocks(&mut b, a, e);
            }
            self.head().db().write(b, false)?;
            for r in std::mem::take(&mut p.ranges) {
                self.state().publish_zeroed(r);
            }
            p.zeroed.clear();
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// Drops everything written since the last seal and returns what was
    /// dropped. The data stays in the data log until a checkpoint moves
    /// the log floor past it.
    pub fn discard_pending(&self) -> Result<LayerStats> {
        let mut guard = self.state().deferred.lock();
        let Some(d) = guard.as_mut() else { return Ok(LayerStats::default()) };
        let stats = stats_of(&d.pending);
        if d.pending.since_ms.is_some() {
            let mut b = WriteBatch::default();
            self.head().db().delete_meta(&mut b, &keys::unsealed(self.record().id));
            self.head().db().write(b, false)?;
        }
        d.pending = Pending::default();
        Ok(stats)
    }
}

impl BlockHead {
    /// Drops the pending entries of the blocks in `ranges` (block indexes,
    /// `[first, end)`) and keeps the rest of the layer: a partial
    /// [`BlockHead::discard_pending`] for a caller that knows which blocks
    /// one group of writers touched since the seal (the NBD server: one
    /// client's) and that no writer it keeps touched them too (then the
    /// blocks' current entries are the group's own). Pending zeroed ranges
    /// are cut at the edges of `ranges`.
    ///
    /// The layer counts written bytes but does not attribute them to
    /// blocks, so the caller says how many of them the dropped writes were
    /// (`bytes`, subtracted from [`BlockHead::pending_bytes`] and reported
    /// back). The returned `blocks` counts the block entries dropped and
    /// `since_ms` is the layer's oldest write, or `None` if nothing in the
    /// layer was in `ranges`. When the layer ends up empty its `unsealed/`
    /// mark goes, as after a full discard.
    pub fn discard_pending_blocks(&self, ranges: &[(u64, u64)], bytes: u64) -> Result<LayerStats> {
        let mut guard = self.state().deferred.lock();
        let Some(d) = guard.as_mut() else { return Ok(LayerStats::default()) };
        let p = &mut d.pending;
        let mut blocks = 0u64;
        let mut touched = false;
        for &(first, end) in ranges.iter().filter(|(a, e)| a < e) {
            let inside: Vec<u64> = p.blocks.range(first..end).map(|(k, _)| *k).collect();
            blocks += inside.len() as u64;
            touched |= !inside.is_empty();
            for k in inside {
                p.blocks.remove(&k);
            }
            touched |= p.zeroed.range(..end).any(|(_, e)| *e > first);
            zeroed::subtract_from(&mut p.zeroed, first, end);
            let mut kept = Vec::with_capacity(p.ranges.len());
            for &(a, e) in &p.ranges {
                let mut piece = BTreeMap::from([(a, e)]);
                zeroed::subtract_from(&mut piece, first, end);
                kept.extend(piece);
            }
            p.ranges = kept;
        }
        let since_ms = if touched { p.since_ms } else { None };
        p.bytes = p.bytes.saturating_sub(bytes);
        if p.is_empty() && p.since_ms.is_some() {
            let mut b = WriteBatch::default();
            self.head().db().delete_meta(&mut b, &keys::unsealed(self.record().id));
            self.head().db().write(b, false)?;
            *p = Pending::default();
        }
        Ok(LayerStats { blocks, bytes: if touched { bytes } else { 0 }, since_ms })
    }
}

fn stats_of(p: &Pending) -> LayerStats {
    LayerStats { blocks: p.blocks.len() as u64, bytes: p.bytes, since_ms: p.since_ms }
}
