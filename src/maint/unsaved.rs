//! Unsaved writes: the data log entries of every volume's overlay, checked
//! against the data log. A write whose data is gone though it was
//! acknowledged as durable (below its segment's durable mark) is damage,
//! reported by `fsck` and dropped, on request, by `fsck --repair` (its
//! block goes back to the last version); a write lost before any flush
//! acknowledged it is not (it reads as the older content by design).

use crate::db::Batch;
use crate::error::Result;
use crate::head::datalog::Read;
use crate::head::overlay::{Entry, Space};
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

/// What the data log holds of the unsaved writes of every volume.
#[derive(Default)]
pub(crate) struct Unsaved {
    /// Writes acknowledged as durable whose data is gone: (volume, stored
    /// key, description).
    pub lost: Vec<(VolumeRecord, Box<[u8]>, String)>,
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
                // A patch's data below the floor went into the last version.
                for r in e.dirty.log_refs().iter().filter(|r| r.seq >= floor) {
                    match storage.log.read(vol.id, r) {
                        Ok(Read::Data(_)) => {}
                        Ok(Read::Lost(why)) if storage.was_durable(vol.id, r)? => {
                            let what =
                                format!("{}: acknowledged write lost ({why})", describe(&vol, &e));
                            out.lost.push((vol.clone(), e.raw.0.clone(), what));
                            break;
                        }
                        Ok(Read::Lost(_)) => out.unflushed += 1,
                        Err(err) => out
                            .unreadable
                            .push(format!("{}: unreadable: {err}", describe(&vol, &e))),
                    }
                }
                Ok(())
            })?;
        }
        Ok(out)
    }

    /// Drops the overlay entries of acknowledged writes whose data is gone;
    /// returns what they were.
    pub(crate) fn drop_lost_writes(&self) -> Result<Vec<String>> {
        let unsaved = self.unsaved_writes()?;
        let mut b = Batch::default();
        let cf = self.db().cf(crate::db::CF_OVERLAY);
        for (_, key, _) in &unsaved.lost {
            b.delete_cf(cf, key);
        }
        self.db().write(b, true)?;
        Ok(unsaved.lost.into_iter().map(|(_, _, what)| what).collect())
    }
}
