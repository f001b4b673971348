//! Rollbacks: the record a deferred head leaves when writes it had
//! acknowledged are thrown away because no safe point sealed them (a
//! connection lost mid-transaction, a server that died). A client that
//! was attached still holds a cache that assumes those writes, so a
//! rollback is never silent: it is logged, kept in the version graph under
//! `rollback/<volume>/...` and shown by `forkfs log`.

use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId, VolumeName};
use crate::index::CF_META;
use crate::store::Store;
use crate::version::{VolumeRecord, keys, now_ms};
use crate::volume::{Head, LayerStats};
use rocksdb::WriteBatch;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RollbackRecord {
    pub volume: VolumeId,
    pub volume_name: VolumeName,
    pub at_ms: u64,
    pub reason: String,
    /// Bytes written, zeroed or trimmed since the last seal (`None`: not
    /// known, the process that held them died).
    pub discarded_bytes: Option<u64>,
    pub discarded_blocks: Option<u64>,
    /// When the first discarded write arrived.
    pub unsealed_since_ms: Option<u64>,
    /// The head kept: its last version and the generation of its last seal.
    pub head_base: Option<VersionId>,
    pub sealed_generation: Option<u64>,
}

/// Distinguishes rollbacks recorded in the same millisecond.
static SEQ: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Discards the unsealed writes of `head` and records the rollback if
    /// there were any. Returns what was discarded.
    pub fn roll_back(&self, head: &Head, reason: &str) -> Result<LayerStats> {
        let stats = head.discard_pending()?;
        if stats.since_ms.is_none() {
            return Ok(stats);
        }
        let rec = RollbackRecord {
            volume: head.record().id,
            volume_name: head.record().name.clone(),
            at_ms: now_ms(),
            reason: reason.to_string(),
            discarded_bytes: Some(stats.bytes),
            discarded_blocks: Some(stats.blocks),
            unsealed_since_ms: stats.since_ms,
            head_base: head.state().base,
            sealed_generation: head.sealed_generation(),
        };
        self.put_rollback(&rec)?;
        tracing::warn!(
            volume = %rec.volume_name,
            discarded_bytes = stats.bytes,
            discarded_blocks = stats.blocks,
            generation = ?rec.sealed_generation,
            reason,
            "rolled back to the last safe point; a client that was attached must re-attach and mount afresh"
        );
        Ok(stats)
    }

    fn put_rollback(&self, rec: &RollbackRecord) -> Result<()> {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let mut b = WriteBatch::default();
        self.put_json(&mut b, &keys::rollback(rec.volume, rec.at_ms, seq), rec)?;
        b.delete_cf(self.index().cf(CF_META), keys::unsealed(rec.volume));
        self.index().write(b, true)
    }

    /// The rollbacks of a volume, oldest first.
    pub fn rollbacks(&self, volume: &VolumeRecord) -> Result<Vec<RollbackRecord>> {
        let mut out = Vec::new();
        for (k, v) in self.index().scan_meta(&keys::rollback_prefix(volume.id))? {
            out.push(
                serde_json::from_slice(&v)
                    .map_err(|e| Error::corrupt(format!("rollback record {k}: {e}")))?,
            );
        }
        Ok(out)
    }

    /// At open: a volume still marked as holding unsealed writes lost them
    /// when the process that held it died. Records each such rollback.
    pub(crate) fn recover_unsealed(&self) -> Result<()> {
        let marks = self.index().scan_meta(keys::UNSEALED_PREFIX)?;
        if marks.is_empty() {
            return Ok(());
        }
        let volumes = self.volumes()?;
        for (k, v) in marks {
            let id = u64::from_str_radix(&k[keys::UNSEALED_PREFIX.len()..], 16)
                .map_err(|_| Error::corrupt(format!("meta key {k} is malformed")))?;
            let Some(vol) = volumes.iter().find(|r| r.id.0 == id) else {
                let mut b = WriteBatch::default();
                b.delete_cf(self.index().cf(CF_META), k);
                self.index().write(b, true)?;
                continue;
            };
            let since = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok());
            let rec = RollbackRecord {
                volume: vol.id,
                volume_name: vol.name.clone(),
                at_ms: now_ms(),
                reason: "the process serving the volume stopped before a safe point".into(),
                discarded_bytes: None,
                discarded_blocks: None,
                unsealed_since_ms: since,
                head_base: self.head_record(vol.id)?.base,
                sealed_generation: None,
            };
            tracing::warn!(
                volume = %vol.name,
                "writes after the last safe point were lost with the process that held them; the volume is at its last safe point"
            );
            self.put_rollback(&rec)?;
        }
        Ok(())
    }
}
