//! What a running GC needs from writers: write sessions it can wait out,
//! and every chunk id put or deduplicated against while it runs (see
//! `maint/gc.rs` for how the sweep uses them).

use super::chunks::ChunkStore;
use crate::id::ChunkId;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a running GC needs from writers (see `gc.rs`).
#[derive(Default)]
pub(super) struct GcTrack {
    pub(super) active: AtomicBool,
    /// Every chunk id put (stored or deduplicated) since the GC began.
    pub(super) reached: Mutex<HashSet<ChunkId>>,
    /// One GC, or one absorption of another host's tombstones, at a time.
    pub(super) lock: Mutex<()>,
    /// Held shared by each write session; GC takes it exclusively for an
    /// instant to wait out the sessions that began before it.
    sessions: RwLock<()>,
}

/// Proof of a running write session: see [`ChunkStore::write_session`].
pub struct WriteSession<'a>(#[allow(dead_code)] RwLockReadGuard<'a, ()>);

/// A GC's view of writers while it runs; ends tracking when dropped.
pub struct GcScope<'a> {
    chunks: &'a ChunkStore,
    tracked: bool,
}

impl GcScope<'_> {
    /// Runs `f` with the set of ids writers reached so far, while no writer
    /// can reach another (so a decision made in `f` cannot race a dedup hit).
    pub fn with_reached<R>(&self, f: impl FnOnce(&HashSet<ChunkId>) -> R) -> R {
        if !self.tracked {
            return f(&HashSet::new());
        }
        f(&self.chunks.gc.reached.lock())
    }
}

impl Drop for GcScope<'_> {
    fn drop(&mut self) {
        if !self.tracked {
            return;
        }
        let mut reached = self.chunks.gc.reached.lock();
        self.chunks.gc.active.store(false, Ordering::SeqCst);
        reached.clear();
        reached.shrink_to_fit();
    }
}

impl ChunkStore {
    /// Held by a GC, or an absorption of tombstones, for its whole run:
    /// they share the tracking of writers.
    pub fn gc_lock(&self) -> &Mutex<()> {
        &self.gc.lock
    }

    /// Marks the span from the first chunk an operation puts to the commit
    /// of the record that names it. A GC waits for the sessions open when it
    /// starts, and tracks every put of the later ones, so nothing a session
    /// writes or deduplicates against can be swept before it is referenced.
    /// Every caller of [`ChunkStore::put`] must hold one.
    pub fn write_session(&self) -> WriteSession<'_> {
        // Recursive: a session may nest (a snapshot inside a fork), and must
        // not block on a GC that waits for the outer one.
        WriteSession(self.gc.sessions.read_recursive())
    }

    /// Starts tracking writers for a GC and waits out the sessions already
    /// open. Everything committed before this returns is visible to a
    /// RocksDB snapshot taken after it; everything put later is in the
    /// reached set.
    pub(crate) fn gc_begin(&self) -> GcScope<'_> {
        {
            let mut reached = self.gc.reached.lock();
            reached.clear();
            self.gc.active.store(true, Ordering::SeqCst);
        }
        drop(self.gc.sessions.write());
        GcScope { chunks: self, tracked: true }
    }

    /// A scope that tracks nothing (the concurrency test's negative control).
    pub(crate) fn gc_untracked(&self) -> GcScope<'_> {
        GcScope { chunks: self, tracked: false }
    }
}
