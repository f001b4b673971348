//! `forkfs bundle create`: the versions of a range, and the chunks they
//! name that the range's base does not.

use super::Report;
use super::format::{Header, VolumeShape, Writer};
use crate::error::{Error, Result};
use crate::graph::reach::{MapKind, Walk};
use crate::graph::{Foreign, Target};
use crate::id::{ChunkId, VersionId};
use crate::map::node::Node;
use crate::progress::Progress;
use crate::records::VersionRecord;
use crate::store::Store;
use std::collections::HashSet;
use std::io::Write;

/// `VOL`, `VOL@B` (every version up to B), `VOL@A..B` and `VOL@A..`
/// (the versions after A, up to B or the newest).
#[derive(Debug, PartialEq, Eq)]
pub struct Range<'a> {
    pub volume: &'a str,
    pub base: Option<&'a str>,
    pub tip: Option<&'a str>,
}

impl<'a> Range<'a> {
    pub fn parse(spec: &'a str) -> Result<Range<'a>> {
        let bad =
            || Error::invalid(format!("bad range {spec:?}: use VOL, VOL@B, VOL@A..B or VOL@A.."));
        let Some((volume, r)) = spec.split_once('@') else {
            return Ok(Range { volume: spec, base: None, tip: None });
        };
        let (base, tip) = match r.split_once("..") {
            Some((a, b)) => (Some(a), (!b.is_empty()).then_some(b)),
            None => (None, Some(r)),
        };
        if volume.is_empty() || base == Some("") || tip == Some("") {
            return Err(bad());
        }
        Ok(Range { volume, base, tip })
    }
}

impl Store {
    /// Writes a bundle of `range` to `out`.
    pub fn bundle_create(
        &self,
        range: &str,
        out: &mut dyn Write,
        progress: &dyn Progress,
    ) -> Result<Report> {
        let range = Range::parse(range)?;
        let graph = self.graph();
        let volume = self.volumes().get(range.volume)?;
        let version = |r: &str| match graph.resolve(&format!("{}@{r}", range.volume))? {
            Target::Version(v) => Ok(v),
            Target::Head(_) => Err(Error::invalid("not a version")),
        };
        let base = range.base.map(version).transpose()?;
        let log = graph.log(&volume)?;
        let tip = match range.tip {
            Some(t) => version(t)?,
            None => log.last().cloned().ok_or_else(|| {
                Error::not_found(format!(
                    "{} has no versions yet: `forkfs snapshot {}` makes one",
                    range.volume, range.volume
                ))
            })?,
        };
        let from = base.as_ref().map_or(0, |b| b.seq + 1);
        if base.as_ref().is_some_and(|b| b.seq >= tip.seq) {
            return Err(Error::invalid(format!(
                "nothing to bundle: {} is not older than {}",
                range.base.unwrap_or_default(),
                range.tip.unwrap_or("the newest version")
            )));
        }
        let versions: Vec<VersionRecord> =
            log.into_iter().filter(|v| (from..=tip.seq).contains(&v.seq)).collect();
        let tags = graph.tags(&volume)?;
        let names_of = |id: VersionId| -> Vec<String> {
            tags.iter().filter(|(_, t)| *t == id).map(|(n, _)| n.clone()).collect()
        };
        let chunks = self.sendable(base.as_ref(), &versions, progress)?;
        let carried: HashSet<VersionId> = versions.iter().map(|v| v.id).collect();
        let names: Vec<&(String, VersionId)> =
            tags.iter().filter(|(_, id)| carried.contains(id)).collect();
        let header = Header {
            format: super::format::MAGIC[7],
            volume: VolumeShape {
                name: volume.name.to_string(),
                kind: volume.kind,
                size: volume.size,
                block_size: volume.block_size,
                consistency: volume.consistency,
                retention: volume.retention.clone(),
                auto_prune: volume.auto_prune,
            },
            base: base.as_ref().map(|b| Foreign::of(b, names_of(b.id))),
            versions: versions.len() as u64,
            names: names.len() as u64,
            chunks: chunks.len() as u64,
            created_at_ms: crate::clock::now_ms(),
            writer: format!("forkfs {}", env!("CARGO_PKG_VERSION")),
        };
        let mut w = Writer::new(std::io::BufWriter::with_capacity(1 << 20, out), &header)?;
        for v in &versions {
            w.version(v)?;
        }
        for (n, id) in &names {
            w.name(n, *id)?;
        }
        progress.stage("write chunks", chunks.len() as u64);
        let level = self.chunks().config().zstd_level;
        let mut plain_bytes = 0;
        for id in &chunks {
            let plain = self.chunks().get(id)?;
            plain_bytes += plain.len() as u64;
            w.chunk(id, &plain, level)?;
            progress.advance(1);
        }
        let written = w.written;
        w.finish()?;
        Ok(Report {
            volume: volume.name.to_string(),
            base: header.base,
            versions: versions.iter().map(|v| v.id).collect(),
            names: names.iter().map(|(n, _)| n.clone()).collect(),
            chunks: chunks.len() as u64,
            plain_bytes,
            bundle_bytes: written + 5 + 32,
            ..Default::default()
        })
    }

    /// Writes a bundle of `range` to the file `path`: to `path.partial`,
    /// synced, then renamed, so a bundle cut short never takes the name.
    pub fn bundle_create_file(
        &self,
        range: &str,
        path: &std::path::Path,
        progress: &dyn Progress,
    ) -> Result<Report> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp = std::path::PathBuf::from(tmp);
        let mut f = std::fs::File::create(&tmp)
            .map_err(|e| Error::from(e).context(format!("cannot create {}", tmp.display())))?;
        let made = self.bundle_create(range, &mut f, progress).and_then(|r| {
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(r)
        });
        if made.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        made
    }

    /// Every node and data chunk `versions` reach that `base` does not,
    /// in id order (a bundle of the same range is the same bytes).
    fn sendable(
        &self,
        base: Option<&VersionRecord>,
        versions: &[VersionRecord],
        progress: &dyn Progress,
    ) -> Result<Vec<ChunkId>> {
        let chunks = self.chunks();
        let load = |id: &ChunkId| Node::decode(&chunks.get(id)?);
        let mut walk = Walk::new(&load);
        progress.stage("walk versions", versions.len() as u64 + 1);
        let mut have = HashSet::new();
        if let Some(b) = base {
            walk.root(MapKind::top(b.kind), b.root, &mut |_| Ok(()));
            have = walk.reached.clone();
        }
        progress.advance(1);
        for v in versions {
            walk.root(MapKind::top(v.kind), v.root, &mut |_| Ok(()));
            progress.advance(1);
        }
        if let Some((id, why)) = walk.bad.iter().next() {
            return Err(Error::new(
                crate::error::ErrorKind::Corrupt,
                format!(
                    "cannot bundle: {} chunks the versions name are unreadable (first: {id}: \
                     {why}); `forkfs fsck` tells which versions they hurt",
                    walk.bad.len()
                ),
            ));
        }
        let mut out: Vec<ChunkId> = walk.reached.difference(&have).copied().collect();
        out.sort_unstable();
        Ok(out)
    }
}
