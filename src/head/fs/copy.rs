//! copy_file_range(2) inside one live fs volume without copying: whole
//! blocks of the destination take the source's chunk ids, so a copy of a
//! stored file costs metadata only and stores no new data.
//!
//! A block the source wrote since the last checkpoint has no chunk id yet:
//! its bytes are logged again for the destination (a copy inside the
//! store, never through the caller). Ranges whose offsets are not equally
//! aligned to the block size, and inline files, are copied as bytes.
//!
//! The shared ids stay reachable for GC: until the next checkpoint they
//! are in the source's blocks of the committed root (or in entries that
//! came from there), and the checkpoint folds the destination's entries
//! into the new root in the same commit.

use super::FsHead;
use super::inode::Content;
use super::ops::{FILE_MAX, check_write, regular};
use crate::error::{Error, Posix, Result};
use crate::head::Found;
use crate::head::is_zero;
use crate::head::overlay::{Dirty, Space};

/// The most one call copies as bytes (the caller asks again for the rest,
/// as copy_file_range's callers do after a short copy).
const BYTES_PER_CALL: u64 = 8 << 20;
/// The most blocks one call shares (one batch of overlay entries).
const BLOCKS_PER_CALL: u64 = 1 << 16;

impl FsHead {
    /// Copies up to `len` bytes of file `src` at `src_off` into file `dst`
    /// at `dst_off`, growing `dst` as a write would. Returns how many bytes
    /// were copied: fewer than asked at the source's end, or when the rest
    /// needs another call. The ranges of one file must not overlap.
    pub fn copy_range(
        &self,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        let size = regular(self.read(|r| r.inode(src))?)?.size;
        let len = len.min(size.saturating_sub(src_off));
        if len == 0 {
            return Ok(0);
        }
        if dst_off.checked_add(len).is_none_or(|end| end > FILE_MAX) {
            return Err(Error::posix(Posix::FileTooBig, "copy beyond the largest file size"));
        }
        if src == dst && src_off < dst_off + len && dst_off < src_off + len {
            return Err(Error::posix(Posix::Invalid, "copy within one file onto itself"));
        }
        let bs = u64::from(self.record().block_size);
        let lead = (bs - src_off % bs) % bs;
        let shareable = src_off % bs == dst_off % bs && len >= lead + bs;
        if !shareable || lead > 0 {
            // Bytes up to the first block boundary (or all of a range that
            // cannot share blocks); a later call shares the whole blocks.
            let n = if shareable { lead } else { len.min(BYTES_PER_CALL) };
            return self.copy_bytes(src, src_off, dst, dst_off, n);
        }
        self.share_blocks(src, src_off / bs, dst, dst_off / bs, (len / bs).min(BLOCKS_PER_CALL))
    }

    fn copy_bytes(&self, src: u64, src_off: u64, dst: u64, dst_off: u64, n: u64) -> Result<u64> {
        let buf = self.read(|r| {
            let mut buf = vec![0u8; n as usize];
            let got = r.read(&r.inode(src)?, src_off, &mut buf)?;
            buf.truncate(got);
            Ok(buf)
        })?;
        let got = buf.len();
        self.write_file(dst, dst_off, &buf)?;
        Ok(got as u64)
    }

    /// Gives `dst`'s blocks from `first_dst` the content of `n` blocks of
    /// `src` from `first_src`, in one transaction.
    fn share_blocks(
        &self,
        src: u64,
        first_src: u64,
        dst: u64,
        first_dst: u64,
        n: u64,
    ) -> Result<u64> {
        let head = self.head();
        let bs = u64::from(self.record().block_size);
        head.wait_for_uploads();
        self.txn(|t| {
            let from = regular(t.inode(src)?)?;
            let mut to = regular(t.inode(dst)?)?;
            check_write(&to, first_dst * bs)?;
            let Content::Blocks(src_base) = from.content else {
                return Err(Error::corrupt(format!("file {src} is inline past a block")));
            };
            let inline = matches!(to.content, Content::Inline(_));
            // One lock call for every stripe touched (they are not
            // reentrant): from block 0 when inline bytes move into blocks.
            let lo = if inline { 0 } else { first_dst };
            let _s = head.lock_block_range(dst, lo, first_dst + n - 1);
            match &to.content {
                Content::Blocks(_) => {}
                // Small and inline: its bytes move into blocks first.
                Content::Inline(old) => {
                    t.r.blocks(dst, None).write(&mut t.b, 0, old)?;
                    t.moved_inline(dst, old);
                    to.content = Content::Blocks(None);
                }
                _ => return Err(Error::corrupt(format!("file {dst} has no data content"))),
            }
            let from_map = t.r.blocks(src, src_base);
            for i in 0..n {
                let entry = match from_map.entry(first_src + i)? {
                    None => Dirty::Delete,
                    Some(Found::Value(id)) => Dirty::Value(id),
                    Some(Found::Data(d)) if is_zero(&d) => Dirty::Delete,
                    Some(Found::Data(d)) => {
                        Dirty::Logged(head.storage.log.append(head.record().id, &d)?)
                    }
                };
                let k = first_dst + i;
                let entry = head.over(Space::File, dst, k, entry)?;
                head.overlay().put(&mut t.b, Space::File, dst, k, &entry);
            }
            to.size = to.size.max((first_dst + n) * bs);
            (to.mtime, to.ctime) = (t.now, t.now);
            t.put(to);
            Ok(n * bs)
        })
    }
}
