//! A new local store over a remote that already holds one: `forkfs init
//! --remote URL` on a second host. Everything committed lives in the object
//! store (volume, head and version records as objects, packs with their
//! footers), so the local index is rebuilt from it: records from their
//! objects, the chunk index from each pack's footer (two ranged reads per
//! pack, never a pack body). Data is then read on demand.

use crate::error::{Error, Result};
use crate::id::{VersionId, VolumeId};
use crate::index::CF_META;
use crate::paths;
use crate::progress::Progress;
use crate::store::Store;
use crate::version::{HeadRecord, VersionRecord, VolumeRecord, keys};
use rocksdb::WriteBatch;
use serde::Serialize;

/// What an attach found in the remote.
#[derive(Serialize, Debug, Default, Clone)]
pub struct AttachReport {
    pub volumes: usize,
    pub versions: usize,
    pub packs: usize,
    pub chunks: usize,
}

impl Store {
    /// Fills an empty local index from the remote's objects.
    pub(crate) fn attach_remote(&self, progress: &dyn Progress) -> Result<AttachReport> {
        let backend = self.chunks().backend();
        let mut report = AttachReport::default();
        let mut b = WriteBatch::default();
        let meta = self.index().cf(CF_META);
        let mut next_id = 1;
        for o in backend.list(paths::VOLUMES)? {
            let rec: VolumeRecord = serde_json::from_slice(&backend.get(&o.location)?)
                .map_err(|e| Error::corrupt(format!("{}: {e}", o.location)))?;
            next_id = next_id.max(rec.id.0 + 1);
            let head: HeadRecord = serde_json::from_slice(&backend.get(&paths::head(rec.id))?)
                .map_err(|e| Error::corrupt(format!("head of {}: {e}", rec.name)))?;
            self.put_json(&mut b, &keys::volume(rec.name.as_str()), &rec)?;
            self.put_json(&mut b, &keys::head(rec.id), &head)?;
            report.volumes += 1;
        }
        self.put_json(&mut b, keys::NEXT_VOLUME_ID, &next_id)?;
        for o in backend.list(paths::VERSIONS)? {
            let raw = backend.get(&o.location)?;
            let v = VersionRecord::decode(&raw)?;
            let named = o.location.filename().and_then(|f| f.strip_suffix(".json"));
            if named.and_then(VersionId::parse) != Some(v.id) || v.clone().seal()?.id != v.id {
                return Err(Error::corrupt(format!("{} does not match its id", o.location)));
            }
            self.put_json(&mut b, &keys::version(&v.id), &v)?;
            b.put_cf(meta, keys::log(VolumeId(v.volume.0), v.seq), v.id.to_string());
            report.versions += 1;
        }
        let packs = backend.list(paths::PACKS)?;
        progress.stage("pack footers", packs.len() as u64);
        for o in packs {
            progress.advance(1);
            let Some(id) = paths::parse_pack(&o.location) else { continue };
            let entries = crate::check::read_footer(backend, &o.location, o.size)
                .map_err(|e| Error::corrupt(format!("pack {id}: {e}")))?;
            self.index().put_pack(&mut b, id, o.size, &entries);
            report.packs += 1;
            report.chunks += entries.len();
        }
        self.index().write(b, true)?;
        tracing::info!(?report, remote = backend.describe(), "attached to the remote store");
        Ok(report)
    }
}
