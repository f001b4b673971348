//! The btrfs safe-point detector (`--consistency btrfs`): pure logic, no I/O.
//!
//! A *safe point* is the moment a valid primary btrfs superblock (the 4 KiB
//! at byte 65536: magic, `bytenr` 65536, checksum correct, generation not
//! older than the last safe point's) is durable: every byte of it was
//! written either with FUA or before a FLUSH that has since completed. Both
//! a transaction commit and a tree-log sync (fsync) end that way; a tree-log
//! sync keeps the generation of the commit before it, so equal generations
//! are safe points too. Writes to the mirror copies (64 MiB, 256 GiB) are
//! plain data.
//!
//! The detector keeps its own image of the primary superblock, seeded from
//! the disk at attach, and applies the overlapping part of every write, so a
//! superblock torn into several writes (or written as part of a larger one)
//! is judged whole; any write that leaves the image invalid cancels a
//! pending safe point. The caller feeds it every acknowledged write, zeroing
//! and flush, in the order it acknowledges them.
//!
//! What kernel btrfs sends through nbdfuse + a loop device (the fixtures in
//! nbd/tests/fixtures, recorded by scripts/record-btrfs-trace): never FUA;
//! FLUSH, primary superblock (one 4 KiB write), the two mirrors on a commit
//! only, FLUSH.
//!
//! Generations are compared within one filesystem (same fsid): a new
//! mkfs.btrfs over an old filesystem starts again at a low generation and is
//! still recognised.

#[cfg(test)]
mod replay;
mod super_block;
#[cfg(test)]
mod tests;

use std::ops::Range;
pub use super_block::Invalid;
use super_block::{MAGIC, MAGIC_AT, SUPER_OFFSET, SUPER_SIZE, Super};

/// A superblock made durable: the disk holds a consistent btrfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SafePoint {
    pub generation: u64,
    /// Written by a tree-log sync (fsync) rather than a transaction commit.
    pub tree_log: bool,
}

/// Watches the write stream of one disk for btrfs safe points.
pub struct Detector {
    /// The primary superblock as the disk now reads.
    image: Box<[u8; SUPER_SIZE]>,
    /// Bytes of `image` whose content is known (all of them once written).
    known: Mask,
    /// Bytes written since the last FLUSH, not with FUA: not yet durable.
    dirty: Mask,
    /// What `image` is: a valid superblock or why not.
    state: Result<Super, Invalid>,
    /// `state` is valid and was not yet reported as a safe point.
    pending: bool,
    /// The last safe point's superblock (or the valid one at attach).
    last: Option<Super>,
    seen_magic: bool,
}

impl Detector {
    /// `current_super`: the 4 KiB at 65536 as on disk at attach (None if the
    /// disk is smaller or unreadable; a shorter slice is a known prefix).
    pub fn new(current_super: Option<&[u8]>) -> Detector {
        let mut image = Box::new([0u8; SUPER_SIZE]);
        let mut known = Mask::EMPTY;
        if let Some(s) = current_super {
            let n = s.len().min(SUPER_SIZE);
            image[..n].copy_from_slice(&s[..n]);
            known.set(0..n, true);
        }
        let mut d = Detector {
            image,
            known,
            dirty: Mask::EMPTY,
            state: Err(Invalid::Incomplete { known: 0 }),
            pending: false,
            last: None,
            seen_magic: false,
        };
        d.evaluate();
        d.last = d.state.as_ref().ok().copied();
        d.pending = false;
        d
    }

    /// An acknowledged write of `data` at `offset`; `fua` if it carried FUA.
    /// Returns a safe point if this write completes one.
    pub fn on_write(&mut self, offset: u64, data: &[u8], fua: bool) -> Option<SafePoint> {
        let r = overlap(offset, data.len() as u64)?;
        // `overlap` starts at or after `offset` and ends within the data.
        let src = usize::try_from(SUPER_OFFSET + r.start as u64 - offset).ok()?;
        let piece = data.get(src..src.checked_add(r.len())?)?;
        self.image[r.clone()].copy_from_slice(piece);
        self.touched(r, fua)
    }

    /// TRIM or WRITE_ZEROES over `len` bytes at `offset`: the range now reads
    /// as zeros (as forkfs serves trimmed blocks).
    pub fn on_zero(&mut self, offset: u64, len: u64, fua: bool) -> Option<SafePoint> {
        let r = overlap(offset, len)?;
        self.image[r.clone()].fill(0);
        self.touched(r, fua)
    }

    /// A FLUSH completed: the writes fed before this call are durable. NBD
    /// promises that only for writes acknowledged before the FLUSH was
    /// received, so a server running requests concurrently feeds the writes
    /// acknowledged while a FLUSH was in progress after that FLUSH.
    pub fn on_flush(&mut self) -> Option<SafePoint> {
        self.dirty = Mask::EMPTY;
        self.settle()
    }

    /// Whether the btrfs magic was ever seen in the primary superblock (at
    /// attach or in a write); if not, the caller uses flush semantics.
    pub fn is_btrfs(&self) -> bool {
        self.seen_magic
    }

    /// The generation of the last safe point, or of the valid superblock
    /// found at attach.
    pub fn last_generation(&self) -> Option<u64> {
        self.last.map(|s| s.generation)
    }

    /// Why the superblock as it now stands is not a valid one (None if it
    /// is), for logs.
    pub fn invalid_reason(&self) -> Option<&Invalid> {
        self.state.as_ref().err()
    }

    fn touched(&mut self, r: Range<usize>, fua: bool) -> Option<SafePoint> {
        self.known.set(r.clone(), true);
        self.dirty.set(r, !fua);
        self.evaluate();
        self.pending = self.state.is_ok();
        self.settle()
    }

    fn evaluate(&mut self) {
        let magic = MAGIC_AT..MAGIC_AT + MAGIC.len();
        if self.known.all_in(magic.clone()) && &self.image[magic] == MAGIC {
            self.seen_magic = true;
        }
        let known = self.known.count();
        self.state = if known < SUPER_SIZE {
            Err(Invalid::Incomplete { known })
        } else {
            super_block::parse(&self.image).and_then(|s| match self.last {
                Some(last) if last.fsid == s.fsid && s.generation < last.generation => {
                    Err(Invalid::GenerationWentBack {
                        generation: s.generation,
                        last: last.generation,
                    })
                }
                _ => Ok(s),
            })
        };
    }

    /// Reports the pending superblock once all of it is durable.
    fn settle(&mut self) -> Option<SafePoint> {
        if !self.pending || !self.dirty.is_empty() {
            return None;
        }
        let s = *self.state.as_ref().ok()?;
        self.pending = false;
        self.last = Some(s);
        Some(SafePoint { generation: s.generation, tree_log: s.log_root != 0 })
    }
}

/// Where the primary superblock lives: (offset, length).
pub const SUPER_RANGE: (u64, u64) = (SUPER_OFFSET, SUPER_SIZE as u64);

/// Whether `len` bytes at `offset` overlap the primary superblock (only
/// such writes need the detector's lock).
pub fn touches_super(offset: u64, len: u64) -> bool {
    overlap(offset, len).is_some()
}

/// The part of `len` bytes at `offset` that falls in the primary superblock,
/// as a range within it. Never overflows, whatever the input.
fn overlap(offset: u64, len: u64) -> Option<Range<usize>> {
    let end = offset.saturating_add(len);
    let lo = offset.max(SUPER_OFFSET);
    let hi = end.min(SUPER_OFFSET + SUPER_SIZE as u64);
    (lo < hi).then(|| (lo - SUPER_OFFSET) as usize..(hi - SUPER_OFFSET) as usize)
}

/// One bit per byte of the superblock.
#[derive(Clone)]
struct Mask([u64; SUPER_SIZE / 64]);

impl Mask {
    const EMPTY: Mask = Mask([0; SUPER_SIZE / 64]);

    fn set(&mut self, r: Range<usize>, on: bool) {
        for i in r {
            let (w, b) = (i / 64, 1u64 << (i % 64));
            if on {
                self.0[w] |= b;
            } else {
                self.0[w] &= !b;
            }
        }
    }

    fn all_in(&self, r: Range<usize>) -> bool {
        r.into_iter().all(|i| self.0[i / 64] & (1 << (i % 64)) != 0)
    }

    fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
}
