//! Store statistics for `forkfs status`: logical bytes of the heads against
//! the bytes stored in packs.

use crate::error::Result;
use crate::map::Map;
use crate::store::Store;
use crate::version::VolumeKind;
use crate::volume::inode::{FileKind, Inode, META_KEY};
use serde::Serialize;

#[derive(Serialize, Debug)]
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

#[derive(Serialize, Debug)]
pub struct StoreStats {
    pub volumes: Vec<VolumeStats>,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub packs: usize,
    /// Logical bytes of all heads per stored byte (history included in stored).
    pub dedupe_ratio: f64,
    /// The on-disk cache of a remote store: (bytes, chunks, limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_cache: Option<DiskCacheStats>,
}

#[derive(Serialize, Debug)]
pub struct DiskCacheStats {
    pub bytes: u64,
    pub chunks: usize,
    pub limit: u64,
}

impl Store {
    pub fn stats(&self) -> Result<StoreStats> {
        let mut volumes = Vec::new();
        for rec in self.volumes()? {
            let head = self.open_volume(rec.name.as_str())?;
            let logical = match rec.kind {
                VolumeKind::Block => head.allocated_blocks()?.len() as u64 * rec.block_size as u64,
                VolumeKind::Fs => {
                    let mut sum = 0u64;
                    let mut err = None;
                    Map::new(self.chunks().as_ref()).range(
                        head.state().root,
                        META_KEY + 1,
                        u64::MAX,
                        &mut |_, v| {
                            match Inode::decode(v) {
                                Ok(i) if i.kind == FileKind::File => sum += i.size,
                                Ok(_) => {}
                                Err(e) => err = Some(e),
                            }
                            err.is_none()
                        },
                    )?;
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
                versions: self.log(&rec)?.len(),
                dirty: !head.is_clean()?,
            });
        }
        let packs = self.index().packs()?;
        let stored: u64 = packs.iter().map(|p| p.1.len).sum();
        let logical: u64 = volumes.iter().map(|v| v.logical_bytes).sum();
        let disk_cache = self.chunks().disk_cache().map(|d| {
            let (bytes, chunks) = d.usage();
            DiskCacheStats { bytes, chunks, limit: d.limit() }
        });
        Ok(StoreStats {
            disk_cache,
            volumes,
            logical_bytes: logical,
            stored_bytes: stored,
            packs: packs.len(),
            dedupe_ratio: if stored == 0 { 1.0 } else { logical as f64 / stored as f64 },
        })
    }
}
