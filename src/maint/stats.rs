//! Store statistics for `forkfs status`: logical bytes of the heads against
//! the bytes stored in packs.

use crate::error::Result;
use crate::head::allocated_in_root;
use crate::head::fs::inode::{FileKind, Inode, META_KEY};
use crate::objects::OutboxStats;
use crate::records::VolumeKind;
use crate::store::Store;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug)]
pub struct VolumeStats {
    pub name: String,
    pub kind: VolumeKind,
    pub size: u64,
    /// Bytes of data in the head: allocated blocks, or file sizes.
    pub logical_bytes: u64,
    pub versions: usize,
    /// Whether the head has writes not yet in a version.
    pub dirty: bool,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct StoreStats {
    pub volumes: Vec<VolumeStats>,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub packs: usize,
    /// Logical bytes of all heads per stored byte (history included in stored).
    pub dedupe_ratio: f64,
    /// The data log's disk space: its segments (writes not yet folded
    /// into packs, and what a reused spare still holds) and the spare
    /// segments kept for reuse (absent from older servers, and when the
    /// log cannot be listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_log: Option<crate::head::datalog::LogUsage>,
    /// The on-disk cache of a remote store: (bytes, chunks, limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_cache: Option<DiskCacheStats>,
    /// A remote store's uploads: what waits on local disk, and volumes
    /// whose head another host advanced before this one could publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadStats>,
    /// A shared store: the other hosts' changes, as of when this host last
    /// reached the bucket (`sync/view.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<crate::sync::view::View>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct UploadStats {
    #[serde(flatten)]
    pub queue: OutboxStats,
    /// Volumes whose local head is not yet in the object store.
    pub heads_pending: Vec<String>,
    pub diverged: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct DiskCacheStats {
    pub bytes: u64,
    pub chunks: usize,
    pub limit: u64,
}

impl Store {
    pub fn stats(&self) -> Result<StoreStats> {
        let mut volumes = Vec::new();
        let remote = self.remote().is_some();
        for rec in self.volumes().list()? {
            // A remote volume is opened (and its lease taken) by writers
            // only: unless this process has it open, its last committed
            // head is what is shown.
            let head = match remote {
                false => Some(self.volumes().open(rec.name.as_str())?),
                true => self.volumes().opened_id(rec.id),
            };
            let root = match &head {
                Some(h) => h.state().root,
                None => self.storage().records.head(rec.id)?.root,
            };
            let logical = match (rec.kind, head.as_ref().and_then(|h| h.as_block())) {
                (VolumeKind::Block, Some(h)) => {
                    h.allocated_blocks()?.len() as u64 * rec.block_size as u64
                }
                (VolumeKind::Block, None) => {
                    let n = allocated_in_root(self.chunks(), root, rec.block_size)?;
                    n.len() as u64 * rec.block_size as u64
                }
                (VolumeKind::Fs, _) => {
                    let mut sum = 0u64;
                    let mut err = None;
                    self.storage().map().range(root, META_KEY + 1, u64::MAX, &mut |_, v| {
                        match Inode::decode(v) {
                            Ok(i) if i.kind == FileKind::File => sum += i.size,
                            Ok(_) => {}
                            Err(e) => err = Some(e),
                        }
                        err.is_none()
                    })?;
                    if let Some(e) = err {
                        return Err(e);
                    }
                    sum
                }
            };
            volumes.push(VolumeStats {
                name: rec.name.to_string(),
                kind: rec.kind,
                size: rec.size,
                logical_bytes: logical,
                versions: self.graph().log(&rec)?.len(),
                dirty: !self.storage().overlay(rec.id).is_empty()?,
            });
        }
        let packs = self.chunks().index().packs()?;
        let stored: u64 = packs.iter().map(|p| p.1.len).sum();
        let logical: u64 = volumes.iter().map(|v| v.logical_bytes).sum();
        let disk_cache = self.disk_cache_stats();
        Ok(StoreStats {
            // Best effort: status still answers when the log cannot be listed.
            data_log: self
                .storage()
                .log
                .usage()
                .inspect_err(|e| tracing::warn!(error = %e, "status: cannot list the data log"))
                .ok(),
            upload: self.upload_stats()?,
            view: self.volumes().view()?,
            disk_cache,
            volumes,
            logical_bytes: logical,
            stored_bytes: stored,
            packs: packs.len(),
            dedupe_ratio: if stored == 0 { 1.0 } else { logical as f64 / stored as f64 },
        })
    }
}

impl Store {
    /// The upload queue of a remote store (cheap: no look at the bucket).
    pub fn upload_queue(&self) -> Option<crate::objects::OutboxStats> {
        self.chunks().backend().outbox().map(|o| o.stats())
    }

    /// The on-disk chunk cache of a remote store.
    pub fn disk_cache_stats(&self) -> Option<DiskCacheStats> {
        self.chunks().disk_cache().map(|d| {
            let (bytes, chunks) = d.usage();
            DiskCacheStats { bytes, chunks, limit: d.limit() }
        })
    }

    fn upload_stats(&self) -> Result<Option<UploadStats>> {
        let (Some(o), Some(r)) = (self.chunks().backend().outbox(), self.remote()) else {
            return Ok(None);
        };
        let diverged = r.diverged();
        let (mut heads_pending, mut names) = (Vec::new(), Vec::new());
        for rec in self.volumes().list()? {
            if diverged.contains(&rec.id) {
                names.push(rec.name.to_string());
            } else if !r.is_published(rec.id, &self.storage().records.head(rec.id)?)? {
                heads_pending.push(rec.name.to_string());
            }
        }
        Ok(Some(UploadStats { queue: o.stats(), heads_pending, diverged: names }))
    }
}
