//! A host's part in GC of a shared store: absorbing the tombstones GC left
//! (`cas/tombstone.rs` has the records, `maint/gc.rs` the GC side).
//!
//! For every tombstoned pack this host still indexes:
//! 1. chunks the tombstone's replacement pack holds are re-pointed to it
//!    (its footer says where);
//! 2. the rest are marked from this host's own roots (every version, head
//!    and dirty inode it knows, unpublished ones included, and every
//!    version a reader has open, deleted or not), with writers
//!    tracked as a GC tracks them; the chunks reached are copied, verified,
//!    into a new pack of this host's, uploaded before anything is
//!    acknowledged;
//! 3. in one batch, under the lock writers report under, the pack leaves
//!    the index; a chunk a writer deduplicated against since the mark keeps
//!    the pack for the next round (not acknowledged);
//! 4. the acknowledgement `gc-acks/<host id>.json` lists every tombstone
//!    whose pack this host no longer indexes.
//!
//! Runs at every tick of the remote side (a third of the lease term) and
//! at the start of every GC.

use crate::cas::pack::{self, PackWriter};
use crate::cas::tombstone::{self, Ack, Tombstone};
use crate::cas::{ChunkStore, Location};
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::graph::reach::{self, Walk};
use crate::head::Storage;
use crate::id::{ChunkId, PackId};
use crate::map::node::Node;
use crate::objects::keys;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// What one absorption did.
#[derive(Serialize, serde::Deserialize, Debug, Default, Clone)]
pub struct Absorbed {
    /// Tombstones in the object store.
    pub tombstones: u64,
    /// Tombstoned packs this host still indexed.
    pub packs: u64,
    /// Chunks re-pointed to a replacement pack.
    pub repointed: u64,
    /// Chunks this host needs that were only in tombstoned packs: copied
    /// into a pack of its own.
    pub rewritten: u64,
    /// Tombstoned packs kept for now (a writer reached them meanwhile, or
    /// they failed to read): not acknowledged.
    pub held: u64,
}

/// Absorbs tombstones and acknowledges them; see the module documentation.
/// Waits for a GC running in this process.
pub(crate) fn absorb(storage: &Storage, host: &str, stall: Duration) -> Result<Absorbed> {
    let _one = storage.chunks.gc_lock().lock();
    absorb_locked(storage, host, stall)
}

/// [`absorb`] for a caller that holds the chunk store's GC lock.
pub(crate) fn absorb_locked(storage: &Storage, host: &str, stall: Duration) -> Result<Absorbed> {
    let chunks = &storage.chunks;
    let backend = chunks.backend();
    let index = chunks.index();
    let tombs = tombstone::list_tombstones(backend)?;
    let mut out = Absorbed { tombstones: tombs.len() as u64, ..Default::default() };
    let mut relevant: Vec<(PackId, Option<PackId>)> = Vec::new();
    for t in &tombs {
        let p = t.pack_id()?;
        if index.pack_info(&p)?.is_some() {
            relevant.push((p, t.replacement_id()));
        }
    }
    let mut held: HashSet<PackId> = HashSet::new();
    if !relevant.is_empty() {
        out.packs = relevant.len() as u64;
        rewrite(storage, &relevant, &mut held, &mut out, stall)?;
    }
    let mut packs = Vec::new();
    for t in &tombs {
        let p = t.pack_id()?;
        if !held.contains(&p) && index.pack_info(&p)?.is_none() {
            packs.push(t.pack.clone());
        }
    }
    let ack = Ack::now(host, packs);
    tombstone::put_ack(backend, &ack)?;
    if out.packs > 0 {
        tracing::info!(?out, "absorbed gc tombstones");
    }
    Ok(out)
}

/// Steps 1-3 of the module documentation for the `relevant` packs.
fn rewrite(
    storage: &Storage,
    relevant: &[(PackId, Option<PackId>)],
    held: &mut HashSet<PackId>,
    out: &mut Absorbed,
    stall: Duration,
) -> Result<()> {
    let chunks = &storage.chunks;
    let index = chunks.index();
    for (p, r) in relevant {
        if let Some(r) = r {
            match chunks.repoint(p, r) {
                Ok(n) => out.repointed += n as u64,
                // Rewritten below from the old pack instead.
                Err(e) => {
                    tracing::warn!(pack = %p, replacement = %r, error = %e, "replacement pack unreadable")
                }
            }
        }
    }
    // Mark from everything this host knows, writers tracked from here on.
    let scope = chunks.gc_begin();
    let found = {
        let snap = storage.db.raw().snapshot();
        reach::roots_with_readers(storage, &snap)?
    };
    let load = |id: &ChunkId| Node::decode(&chunks.get(id)?);
    let mut walk = Walk::new(&load);
    for (map, root) in found.roots {
        walk.root(map, root, &mut |_| Ok(()));
    }
    if let Some((id, why)) = walk.bad.iter().next() {
        return Err(Error::corrupt(format!(
            "gc tombstones not absorbed: {} referenced chunks are unreadable (e.g. {id}: {why}); \
             run `forkfs fsck`",
            walk.bad.len()
        )));
    }
    let live = walk.reached;
    // The chunks each relevant pack still holds for this host.
    let wanted: HashSet<PackId> = relevant.iter().map(|(p, _)| *p).collect();
    let mut left: HashMap<PackId, Vec<(ChunkId, Location)>> = HashMap::new();
    index.for_each_chunk(&mut |c, loc| {
        let loc = loc?;
        if wanted.contains(&loc.pack) {
            left.entry(loc.pack).or_default().push((c, loc));
        }
        Ok(())
    })?;
    let mut writer = PackWriter::new();
    for (p, entries) in &left {
        if entries.iter().any(|(c, _)| live.contains(c)) {
            if let Err(e) = copy_needed(chunks, p, entries, &live, &mut writer) {
                tracing::error!(pack = %p, error = %e, "a tombstoned pack this host needs does not read; not acknowledged");
                held.insert(*p);
            }
        }
    }
    let new = (!writer.is_empty()).then(|| writer.seal());
    if let Some((id, bytes, _)) = &new {
        chunks.backend().put(&keys::pack(id), bytes.clone())?;
    }
    let copied: HashSet<ChunkId> =
        new.as_ref().map(|(_, _, e)| e.iter().map(|e| e.id).collect()).unwrap_or_default();
    scope.with_reached(|reached| -> Result<()> {
        let mut b = Batch::default();
        if let Some((id, bytes, entries)) = &new {
            index.put_pack(&mut b, *id, bytes.len() as u64, entries);
            out.rewritten += entries.len() as u64;
        }
        for (p, _) in relevant {
            if held.contains(p) {
                continue;
            }
            let entries = left.get(p).map(Vec::as_slice).unwrap_or_default();
            // Deduplicated against since the mark and not copied: keep it.
            if entries.iter().any(|(c, _)| reached.contains(c) && !copied.contains(c)) {
                held.insert(*p);
                continue;
            }
            for (c, _) in entries.iter().filter(|(c, _)| !copied.contains(c)) {
                // Only if still here (a read-repair may have moved it).
                if index.get_chunk(c)?.is_some_and(|l| l.pack == *p) {
                    index.delete_chunk(&mut b, c);
                }
            }
            index.delete_pack(&mut b, p);
        }
        index.write(b)
    })?;
    drop(scope);
    out.held = held.len() as u64;
    // Other hosts may need what was copied once the old packs go.
    if new.is_some()
        && let Some(o) = chunks.backend().outbox()
    {
        o.drain(stall)?;
    }
    Ok(())
}

/// Copies the chunks of `p` that this host needs into `writer`, verified.
fn copy_needed(
    chunks: &ChunkStore,
    p: &PackId,
    entries: &[(ChunkId, Location)],
    live: &HashSet<ChunkId>,
    writer: &mut PackWriter,
) -> Result<()> {
    let bytes = chunks.backend().get(&keys::pack(p))?;
    for (c, loc) in entries.iter().filter(|(c, _)| live.contains(c)) {
        let start = usize::try_from(loc.offset).map_err(|_| Error::corrupt("offset"))?;
        let end = start.saturating_add(loc.stored_len as usize);
        let stored = bytes
            .get(start..end)
            .ok_or_else(|| Error::corrupt(format!("chunk {c} lies beyond the end of pack {p}")))?;
        pack::decompress(&loc.entry(*c), stored)?;
        if !writer.contains(c) {
            writer.add(*c, loc.plain_len, loc.codec, stored);
        }
    }
    Ok(())
}

/// Writes this host's first acknowledgement (none absorbed yet) if it has
/// none, before it indexes anything: from then on every GC waits for it.
///
/// A host whose last acknowledgement is older than the GC host `timeout`
/// was taken for gone: a GC meanwhile may have deleted packs it still
/// indexes. It says so loudly, naming them, when it finds any.
pub(crate) fn register(storage: &Storage, host: &str, timeout: Duration) -> Result<()> {
    let backend = storage.chunks.backend();
    let Some((raw, _)) = backend.get_versioned(&keys::gc_ack(host))? else {
        return tombstone::put_ack(backend, &Ack::now(host, Vec::new()));
    };
    let last: Option<Ack> = serde_json::from_slice(&raw).ok();
    let silent = last.map(|a| crate::clock::now_ms().saturating_sub(a.at_ms));
    if silent.is_some_and(|ms| u128::from(ms) > timeout.as_millis()) {
        let gone = reaped_while_away(storage)?;
        if !gone.is_empty() {
            tracing::error!(
                packs = gone.len(),
                example = %gone[0],
                silent_s = silent.unwrap_or_default() / 1000,
                "this host was silent for longer than the gc host timeout and a gc took it for \
                 gone: packs its index names are no longer in the object store; run `forkfs \
                 fsck` (and `forkfs fsck --repair` to rebuild what can be rebuilt)"
            );
        }
    }
    Ok(())
}

/// Packs this host indexes that are not in the object store (nor queued in
/// its outbox, which listings include).
fn reaped_while_away(storage: &Storage) -> Result<Vec<PackId>> {
    let backend = storage.chunks.backend();
    let present: HashSet<String> =
        backend.list(keys::PACKS)?.into_iter().map(|m| m.location.to_string()).collect();
    let mut gone = Vec::new();
    for (p, _) in storage.chunks.index().packs()? {
        if !present.contains(keys::pack(&p).as_ref()) {
            gone.push(p);
        }
    }
    Ok(gone)
}

/// Whether `t` is absorbed by `ack`.
pub(crate) fn acked(ack: &Ack, t: &Tombstone) -> bool {
    ack.packs.contains(&t.pack)
}
