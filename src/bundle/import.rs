//! `forkfs bundle import` and `forkfs bundle verify`.
//!
//! Import streams: chunks go into the store as they arrive (each verified
//! against its id); versions are committed only after the end frame
//! matched and every chunk the versions name was found here. A bundle cut
//! short or damaged thus adds no volume, version or name; the chunks it
//! stored are unreferenced and the next `forkfs gc` reclaims them.

use super::Report;
use super::format::{Item, Reader};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::reach::{MapKind, Walk};
use crate::id::{VersionId, VolumeName};
use crate::map::node::Node;
use crate::progress::Progress;
use crate::records::{VersionRecord, VolumeRecord};
use crate::store::Store;
use std::io::Read;

/// What a bundle carries, read and checked to its end.
struct Contents {
    versions: Vec<VersionRecord>,
    names: Vec<(String, VersionId)>,
}

/// Reads every item after the header; `chunk` takes each chunk.
fn read_all<R: Read>(
    r: &mut Reader<R>,
    progress: &dyn Progress,
    chunk: &mut dyn FnMut(crate::id::ChunkId, bytes::Bytes) -> Result<()>,
) -> Result<Contents> {
    let mut c = Contents { versions: Vec::new(), names: Vec::new() };
    progress.stage("read chunks", r.header.chunks);
    loop {
        match r.next_item()? {
            Item::Version(v) => c.versions.push(v),
            Item::Name(n, id) => c.names.push((n, id)),
            Item::Chunk(id, plain) => {
                chunk(id, plain)?;
                progress.advance(1);
            }
            Item::End => return Ok(c),
        }
    }
}

/// Reads a whole bundle and checks everything it can check alone.
pub fn verify(input: &mut dyn Read, progress: &dyn Progress) -> Result<Report> {
    let mut r = Reader::new(input)?;
    let c = read_all(&mut r, progress, &mut |_, _| Ok(()))?;
    Ok(report(&r, &c))
}

fn report<R: Read>(r: &Reader<R>, c: &Contents) -> Report {
    Report {
        volume: r.header.volume.name.clone(),
        base: r.header.base.clone(),
        versions: c.versions.iter().map(|v| v.id).collect(),
        names: c.names.iter().map(|(n, _)| n.clone()).collect(),
        chunks: r.chunks,
        plain_bytes: r.plain_bytes,
        bundle_bytes: r.bytes_read,
        ..Default::default()
    }
}

impl Store {
    /// Adds a bundle's versions to this store: to the volume named as in
    /// the bundle, or `into`; created when missing.
    pub fn bundle_import(
        &self,
        input: &mut dyn Read,
        into: Option<&str>,
        progress: &dyn Progress,
    ) -> Result<Report> {
        let mut r = Reader::new(input)?;
        let shape = r.header.volume.clone();
        let name = into.unwrap_or(&shape.name).to_string();
        VolumeName::new(&name)?;
        // Fail before reading the chunks when the bundle cannot fit.
        let existing = match self.volumes().get(&name) {
            Ok(v) => Some(v),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        self.check_fits(&name, existing.as_ref(), &r)?;
        let chunks = self.chunks();
        let _session = chunks.write_session();
        let (mut new, mut known) = (0u64, 0u64);
        let c = read_all(&mut r, progress, &mut |id, plain| {
            // Even a chunk the store has: a put is what a running GC tracks,
            // so the chunk cannot be swept before the versions name it.
            match chunks.put_with_id(id, &plain)? {
                true => new += 1,
                false => known += 1,
            }
            Ok(())
        })?;
        chunks.flush()?;
        self.check_complete(&c.versions, progress)?;
        // What could still refuse the import is checked before anything is made.
        if shape.retention.as_ref().is_some_and(|p| !p.is_valid()) {
            return Err(Error::corrupt("the bundle is damaged: its volume's retention is invalid"));
        }
        for (n, _) in &c.names {
            crate::graph::check_name(n)?;
        }
        let created = existing.is_none();
        if created {
            let v = self.volumes().create(
                &name,
                shape.kind,
                Some(shape.size),
                Some(shape.block_size),
            )?;
            if v.kind == crate::records::VolumeKind::Block && shape.consistency != v.consistency {
                self.volumes().set_consistency(&name, shape.consistency)?;
            }
            if shape.retention.is_some() || !shape.auto_prune {
                self.volumes().set_retention(&name, shape.retention.clone(), shape.auto_prune)?;
            }
        }
        let adopted = self.graph().adopt(&name, r.header.base.as_ref(), &c.versions, &c.names)?;
        let mut out = report(&r, &c);
        out.volume = name;
        out.created = created;
        out.versions = adopted.added.iter().map(|v| v.id).collect();
        out.known_versions = adopted.known;
        out.names = adopted.named;
        out.names_taken = adopted.names_taken;
        out.head_moved = adopted.head_moved;
        out.new_chunks = new;
        out.known_chunks = known;
        Ok(out)
    }

    /// [`Store::bundle_import`] of the file `path`.
    pub fn bundle_import_file(
        &self,
        path: &std::path::Path,
        into: Option<&str>,
        progress: &dyn Progress,
    ) -> Result<Report> {
        let f = std::fs::File::open(path)
            .map_err(|e| Error::from(e).context(format!("cannot open {}", path.display())))?;
        self.bundle_import(&mut std::io::BufReader::with_capacity(1 << 20, f), into, progress)
    }

    /// Whether `name` (maybe `existing`) can take the bundle `r` begins.
    fn check_fits<R: Read>(
        &self,
        name: &str,
        existing: Option<&VolumeRecord>,
        r: &Reader<R>,
    ) -> Result<()> {
        let h = &r.header;
        let Some(v) = existing else {
            return match &h.base {
                Some(b) => Err(Error::not_found(format!(
                    "this store has no volume {name}, and the bundle builds on {}: import the \
                     bundle that carries it first",
                    b.describe(&h.volume.name)
                ))),
                None => Ok(()),
            };
        };
        if v.kind != h.volume.kind || v.size != h.volume.size || v.block_size != h.volume.block_size
        {
            return Err(Error::conflict(format!(
                "volume {name} is {} of {} bytes in {}-byte blocks; the bundle's is {} of {} \
                 bytes in {}-byte blocks: import it under another name (--as)",
                v.kind.a_volume(),
                v.size,
                v.block_size,
                h.volume.kind.a_volume(),
                h.volume.size,
                h.volume.block_size
            )));
        }
        if let Some(b) = &h.base
            && self.graph().same_version(v, b)?.is_none()
        {
            return Err(b.missing(name, &h.volume.name));
        }
        Ok(())
    }

    /// Walks the versions a bundle carries in this store: every node must
    /// load and verify, every data chunk be here.
    fn check_complete(&self, versions: &[VersionRecord], progress: &dyn Progress) -> Result<()> {
        let chunks = self.chunks();
        let load = |id: &crate::id::ChunkId| Node::decode(&chunks.get(id)?);
        let mut walk = Walk::new(&load);
        progress.stage("check versions", versions.len() as u64);
        let mut missing = |id: &crate::id::ChunkId| match chunks.contains(id)? {
            true => Ok(()),
            false => Err(Error::corrupt("neither in the bundle nor in this store")),
        };
        for v in versions {
            walk.root(MapKind::top(v.kind), v.root, &mut missing);
            progress.advance(1);
        }
        match walk.bad.iter().next() {
            None => Ok(()),
            Some((id, why)) => Err(Error::corrupt(format!(
                "the bundle is incomplete: {} chunks its versions name cannot be read here \
                 (first: {id}: {why}); nothing was imported",
                walk.bad.len()
            ))),
        }
    }
}
