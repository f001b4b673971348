//! Rollbacks: the record a deferred head leaves when writes it had
//! acknowledged are thrown away because no safe point sealed them (a
//! connection lost mid-transaction, a server that died). A client that
//! was attached still holds a cache that assumes those writes, so a
//! rollback is never silent: it is logged, kept in the version graph under
//! `rollback/<volume>/...` and shown by `forkfs log`.

use super::Graph;
use crate::clock::now_ms;
use crate::db::Batch;
use crate::error::{Error, Result};
use crate::head::{BlockHead, LayerStats};
use crate::records::{RollbackRecord, VolumeRecord, keys};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes rollbacks recorded in the same millisecond.
static SEQ: AtomicU64 = AtomicU64::new(0);

impl Graph {
    /// Discards the unsealed writes of `head` and records the rollback if
    /// there were any. Returns what was discarded.
    pub fn roll_back(&self, head: &BlockHead, reason: &str) -> Result<LayerStats> {
        let stats = head.discard_pending()?;
        self.record_rollback(head, stats, reason, true)?;
        Ok(stats)
    }

    /// Discards the unsealed writes of `head` in the block ranges `ranges`
    /// only (one group of writers' blocks, see
    /// [`BlockHead::discard_pending_blocks`], which says what `bytes` is),
    /// keeping the others, and records the rollback if anything was
    /// discarded. Returns what was discarded.
    pub fn roll_back_blocks(
        &self,
        head: &BlockHead,
        ranges: &[(u64, u64)],
        bytes: u64,
        reason: &str,
    ) -> Result<LayerStats> {
        let stats = head.discard_pending_blocks(ranges, bytes)?;
        // The layer keeps its `unsealed/` mark while it holds other writes.
        self.record_rollback(head, stats, reason, false)?;
        Ok(stats)
    }

    /// Records and logs a discard that dropped anything; `clear_mark` with
    /// the layer emptied.
    fn record_rollback(
        &self,
        head: &BlockHead,
        stats: LayerStats,
        reason: &str,
        clear_mark: bool,
    ) -> Result<()> {
        if stats.since_ms.is_none() {
            return Ok(());
        }
        let rec = RollbackRecord {
            volume: head.record().id,
            volume_name: head.record().name.clone(),
            at_ms: now_ms(),
            reason: reason.to_string(),
            discarded_bytes: Some(stats.bytes),
            discarded_blocks: Some(stats.blocks),
            unsealed_since_ms: stats.since_ms,
            head_base: head.head().state().base,
            sealed_generation: head.sealed_generation(),
        };
        self.put_rollback(&rec, clear_mark)?;
        tracing::warn!(
            volume = %rec.volume_name,
            discarded_bytes = stats.bytes,
            discarded_blocks = stats.blocks,
            generation = ?rec.sealed_generation,
            reason,
            "rolled back to the last safe point; a client that was attached must re-attach and mount afresh"
        );
        Ok(())
    }

    fn put_rollback(&self, rec: &RollbackRecord, clear_mark: bool) -> Result<()> {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let db = self.db();
        let mut b = Batch::default();
        db.put_json(&mut b, &keys::rollback(rec.volume, rec.at_ms, seq), rec)?;
        if clear_mark {
            db.delete_meta(&mut b, &keys::unsealed(rec.volume));
        }
        db.write(b, true)
    }

    /// The rollbacks of a volume, oldest first.
    pub fn rollbacks(&self, volume: &VolumeRecord) -> Result<Vec<RollbackRecord>> {
        self.storage.records.rollbacks(volume)
    }

    /// At open: a volume still marked as holding unsealed writes lost them
    /// when the process that held it died. Records each such rollback.
    pub(crate) fn recover_unsealed(&self) -> Result<()> {
        let db = self.db();
        let marks = db.scan_meta(keys::UNSEALED_PREFIX)?;
        if marks.is_empty() {
            return Ok(());
        }
        let volumes = self.volumes.list()?;
        for (k, v) in marks {
            let id = u64::from_str_radix(&k[keys::UNSEALED_PREFIX.len()..], 16)
                .map_err(|_| Error::corrupt(format!("meta key {k} is malformed")))?;
            let Some(vol) = volumes.iter().find(|r| r.id.0 == id) else {
                let mut b = Batch::default();
                db.delete_meta(&mut b, &k);
                db.write(b, true)?;
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
                head_base: self.storage.records.head(vol.id)?.base,
                sealed_generation: None,
            };
            tracing::warn!(
                volume = %vol.name,
                "writes after the last safe point were lost with the process that held them; the volume is at its last safe point"
            );
            self.put_rollback(&rec, true)?;
        }
        Ok(())
    }
}
