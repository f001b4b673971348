//! Retiring packs on a shared store (S3, GCS, Azure: several hosts, each
//! with its own index): tombstones and acknowledgements.
//!
//! A host's GC never deletes a pack object another host may still read or
//! deduplicate against. It drops the pack from its own index and leaves a
//! tombstone `gc/<pack>.json` naming, for a compaction, the pack the live
//! chunks moved to. Every host absorbs tombstones (`store/absorb.rs`):
//! it re-points chunks to the replacement, rewrites into a pack of its own
//! whatever else of a tombstoned pack it still needs, drops the pack from
//! its index, and then acknowledges in `gc-acks/<host>.json` the
//! tombstones it has absorbed. A later GC deletes a pack object (then its
//! tombstone) only once every host that counts has acknowledged it
//! (`maint/gc.rs`). This module owns the two records and the one repair a
//! reader can do alone: follow a tombstone's replacement.

use super::chunks::ChunkStore;
use super::index::Location;
use super::pack::read_footer;
use crate::clock::now_ms;
use crate::error::{Error, ErrorKind, Result};
use crate::id::PackId;
use crate::objects::{Backend, keys};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

const FORMAT: u8 = 1;

/// A pack retired by a GC: gone from that host's index, its object kept
/// until every host has acknowledged this record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Tombstone {
    pub format: u8,
    /// The retired pack (32 hex).
    pub pack: String,
    /// When the GC wrote it (ms since the epoch, the GC host's clock).
    pub at_ms: u64,
    /// The host id of the host whose GC retired it.
    pub by: String,
    /// For a compaction: the pack its live chunks (as that GC saw them)
    /// were copied into, uploaded before this record was written.
    pub replacement: Option<String>,
}

impl Tombstone {
    pub fn new(pack: PackId, by: &str, replacement: Option<PackId>) -> Tombstone {
        Tombstone {
            format: FORMAT,
            pack: pack.to_string(),
            at_ms: now_ms(),
            by: by.to_string(),
            replacement: replacement.map(|r| r.to_string()),
        }
    }

    pub fn pack_id(&self) -> Result<PackId> {
        PackId::parse(&self.pack)
            .ok_or_else(|| Error::corrupt(format!("tombstone names a bad pack id {:?}", self.pack)))
    }

    /// The replacement pack; a malformed one reads as none (the chunks are
    /// then rewritten by whoever needs them, never lost).
    pub fn replacement_id(&self) -> Option<PackId> {
        self.replacement.as_deref().and_then(PackId::parse)
    }
}

/// What one host has absorbed: every tombstone it lists was processed
/// (its chunks re-pointed or rewritten, the pack gone from the index).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub format: u8,
    /// The host id (32 hex): one per index (`records::keys::HOST_ID`).
    pub host: String,
    pub hostname: String,
    pub pid: u32,
    /// When it was written (ms since the epoch, the host's clock): a host
    /// that has not acknowledged for the host timeout is taken for gone.
    pub at_ms: u64,
    /// Packs (32 hex) whose tombstones it absorbed.
    pub packs: Vec<String>,
}

impl Ack {
    /// This process's acknowledgement as host `host` of `packs`, now.
    pub fn now(host: &str, packs: Vec<String>) -> Ack {
        let hostname = crate::clock::hostname();
        let at_ms = crate::clock::now_ms();
        Ack { format: 1, host: host.to_string(), hostname, pid: std::process::id(), at_ms, packs }
    }
}

/// Writes the tombstone of `t.pack` unless one exists (the first GC's
/// record, with its replacement, stays).
pub fn put_tombstone(backend: &Backend, t: &Tombstone) -> Result<()> {
    let key = keys::gc_tombstone(&t.pack_id()?);
    match backend.put_conditional(&key, Bytes::from(serde_json::to_vec_pretty(t)?), None) {
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
        r => r.map(|_| ()),
    }
}

/// The tombstone of `pack`, if it has one.
pub fn get_tombstone(backend: &Backend, pack: &PackId) -> Result<Option<Tombstone>> {
    let Some((raw, _)) = backend.get_versioned(&keys::gc_tombstone(pack))? else {
        return Ok(None);
    };
    Ok(Some(decode_tombstone(*pack, &raw, now_ms())))
}

/// A tombstone that does not decode still retires the pack its key names
/// (without a replacement): refusing it could keep a dead pack readable
/// for dedup on one host while another deletes it.
fn decode_tombstone(pack: PackId, raw: &[u8], written_ms: u64) -> Tombstone {
    match serde_json::from_slice::<Tombstone>(raw) {
        Ok(t) if t.pack_id().ok() == Some(pack) => t,
        _ => {
            tracing::warn!(%pack, "tombstone does not decode; taken as one without a replacement");
            Tombstone {
                format: FORMAT,
                pack: pack.to_string(),
                at_ms: written_ms,
                by: String::new(),
                replacement: None,
            }
        }
    }
}

/// Every tombstone in the object store.
pub fn list_tombstones(backend: &Backend) -> Result<Vec<Tombstone>> {
    let mut out = Vec::new();
    for meta in backend.list(keys::GC_TOMBSTONES)? {
        let Some(pack) = keys::parse_gc_tombstone(&meta.location) else { continue };
        let raw = match backend.get(&meta.location) {
            Ok(raw) => raw,
            // Reaped between the listing and the read: nothing to absorb.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let written = meta.last_modified.timestamp_millis().max(0) as u64;
        out.push(decode_tombstone(pack, &raw, written));
    }
    Ok(out)
}

/// Writes (replaces) this host's acknowledgement.
pub fn put_ack(backend: &Backend, ack: &Ack) -> Result<()> {
    backend.put(&keys::gc_ack(&ack.host), Bytes::from(serde_json::to_vec_pretty(ack)?))
}

/// Every host's acknowledgement. One that does not decode is an error: a
/// GC must not take an unreadable host for one that needs nothing.
pub fn list_acks(backend: &Backend) -> Result<Vec<Ack>> {
    let mut out = Vec::new();
    for meta in backend.list(keys::GC_ACKS)? {
        let raw = match backend.get(&meta.location) {
            Ok(raw) => raw,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let ack: Ack = serde_json::from_slice(&raw)
            .map_err(|e| Error::corrupt(format!("{}: {e}", meta.location)))?;
        out.push(ack);
    }
    Ok(out)
}

impl ChunkStore {
    /// Points every chunk the index places in `from` that `to`'s footer
    /// lists at `to` (indexing `to` if it is new here); returns how many
    /// moved. Chunks of `from` that `to` lacks keep their entries.
    pub(crate) fn repoint(&self, from: &PackId, to: &PackId) -> Result<usize> {
        let key = keys::pack(to);
        let len = self.backend().head(&key)?.size;
        let entries = read_footer(self.backend(), &key, len)?;
        let index = self.index();
        let mut b = crate::db::Batch::default();
        let mut moved = 0;
        for e in &entries {
            if index.get_chunk(&e.id)?.is_some_and(|l| l.pack == *from) {
                index.put_chunk(&mut b, e.id, &Location::of(*to, e));
                moved += 1;
            }
        }
        if index.pack_info(to)?.is_none() {
            let count = u32::try_from(entries.len()).map_err(|_| Error::corrupt("pack count"))?;
            let info = super::PackInfo { count, len, created_ms: now_ms() };
            index.put_pack_info(&mut b, *to, &info);
        }
        index.write(b)?;
        Ok(moved)
    }

    /// Read-repair of a chunk whose pack object is gone: if the pack has a
    /// tombstone with a replacement, re-point to it. Returns whether
    /// anything moved.
    pub(crate) fn repair_from_tombstone(&self, pack: &PackId) -> bool {
        let repaired = get_tombstone(self.backend(), pack).and_then(|t| {
            match t.and_then(|t| t.replacement_id()) {
                Some(r) => self.repoint(pack, &r),
                None => Ok(0),
            }
        });
        match repaired {
            Ok(n) => {
                tracing::info!(%pack, moved = n, "read-repair after a pack was retired by gc");
                n > 0
            }
            Err(e) => {
                tracing::warn!(%pack, error = %e, "read-repair failed");
                false
            }
        }
    }
}
