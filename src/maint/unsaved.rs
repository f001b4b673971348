//! Unsaved writes: the data log entries of every volume's overlay, checked
//! against the data log. A write whose data is gone though it was
//! acknowledged as durable (below its segment's durable mark) is damage,
//! reported by `fsck` and dropped, on request, by `fsck --repair` (its
//! block goes back to the last version; of a block written in parts, only
//! the parts whose data is gone go); a write lost before any flush
//! acknowledged it is not (it reads as the older content by design).

use crate::db::Batch;
use crate::error::Result;
use crate::head::datalog::LogRef;
use crate::head::datalog::Read;
use crate::head::overlay::{Dirty, Entry, Space};
use crate::records::VolumeRecord;
use crate::store::Store;

/// One unsaved write, described for a report.
fn describe(vol: &VolumeRecord, e: &Entry) -> String {
    match e.space {
        Space::Root if vol.kind == crate::records::VolumeKind::Block => {
            let bs = vol.block_size as u64;
            format!("{} head: bytes {}..{}", vol.name, e.key * bs, (e.key + 1) * bs)
        }
        Space::File => format!("{} head: inode {} block {}", vol.name, e.owner, e.key),
        _ => format!("{} head: entry {:?} {} {}", vol.name, e.space, e.owner, e.key),
    }
}

/// An overlay entry with acknowledged writes whose data is gone.
pub(crate) struct Lost {
    /// The entry's stored key.
    key: Box<[u8]>,
    /// What stays of the entry once they are dropped (`None`: nothing).
    kept: Option<Dirty>,
    /// The entry, for a report.
    pub what: String,
}

/// What the data log holds of the unsaved writes of every volume.
#[derive(Default)]
pub(crate) struct Unsaved {
    /// Writes acknowledged as durable whose data is gone.
    pub lost: Vec<Lost>,
    /// Writes that cannot be read (I/O errors).
    pub unreadable: Vec<String>,
    /// Writes lost before any flush (not damage).
    pub unflushed: usize,
}

impl Store {
    pub(crate) fn unsaved_writes(&self) -> Result<Unsaved> {
        let mut out = Unsaved::default();
        let storage = self.storage();
        for vol in self.volumes().list()? {
            let floor = storage.log_floor(vol.id)?;
            storage.overlay(vol.id).for_each(&mut |e| {
                let mut lost = Vec::new();
                // A patch's data below the floor went into the last version.
                for r in e.dirty.log_refs().iter().filter(|r| r.seq >= floor) {
                    match storage.log.read(vol.id, r) {
                        Ok(Read::Data(_)) => {}
                        Ok(Read::Lost(why)) if storage.was_durable(vol.id, r)? => {
                            lost.push((*r, why));
                        }
                        Ok(Read::Lost(_)) => out.unflushed += 1,
                        Err(err) => out
                            .unreadable
                            .push(format!("{}: unreadable: {err}", describe(&vol, &e))),
                    }
                }
                if let Some((_, why)) = lost.first() {
                    let what = format!("{}: acknowledged write lost ({why})", describe(&vol, &e));
                    let refs: Vec<LogRef> = lost.iter().map(|(r, _)| *r).collect();
                    let kept = without(&e.dirty, &refs);
                    out.lost.push(Lost { key: e.raw.0.clone(), kept, what });
                }
                Ok(())
            })?;
        }
        Ok(out)
    }

    /// Drops the acknowledged writes whose data is gone (a whole entry, or
    /// the lost parts of a patch); returns what they were.
    pub(crate) fn drop_lost_writes(&self) -> Result<Vec<String>> {
        let unsaved = self.unsaved_writes()?;
        let mut b = Batch::default();
        let cf = self.db().cf(crate::db::CF_OVERLAY);
        for lost in &unsaved.lost {
            match &lost.kept {
                Some(d) => b.put_cf(cf, &lost.key, d.encode()),
                None => b.delete_cf(cf, &lost.key),
            }
        }
        self.db().write(b, true)?;
        Ok(unsaved.lost.into_iter().map(|l| l.what).collect())
    }
}

/// What stays of entry `d` once the data of `lost` is dropped: a patch
/// keeps its other spans (each an acknowledged write of its own), over the
/// base if the entry under them lost its data; any other entry goes, and
/// its block reads as the last version.
fn without(d: &Dirty, lost: &[LogRef]) -> Option<Dirty> {
    let Dirty::Patch(p) = d else { return None };
    let mut p = p.clone();
    if p.under.as_ref().and_then(Dirty::log_ref).is_some_and(|r| lost.contains(r)) {
        p.under = None;
    }
    p.spans.retain(|s| !lost.contains(&s.r));
    (p.under.is_some() || !p.spans.is_empty()).then_some(Dirty::Patch(p))
}
