//! Read-ahead for remote packs: when a chunk read continues where an
//! earlier fetch from the same pack ended (a sequential reader: an image
//! copy, a boot, a scan), one ranged GET takes the chunk and the chunks
//! that follow it in the pack, up to a window, and the followers go to the
//! on-disk cache. Random reads fetch their chunk alone, so a workload that
//! touches 1% of a volume fetches about that 1%.
//!
//! The window is a setting of the process (`FORKFS_READAHEAD`, default
//! 2 MiB; 0 turns it off).
//! A pack's layout (its footer: every chunk's offset and length) is read
//! once per process, with the two ranged GETs an attach uses.

use super::pack::{Entry, read_footer};
use crate::error::{Error, Result};
use crate::id::PackId;
use crate::objects::Backend;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

/// Sequential streams remembered at once.
const STREAMS: usize = 16;

pub struct ReadAhead {
    window: u64,
    /// Where recent fetches ended: (pack, end offset).
    streams: Mutex<VecDeque<(PackId, u64)>>,
    layouts: quick_cache::sync::Cache<PackId, Arc<Vec<Entry>>>,
}

/// What a fetch brought: the chunk asked for (stored bytes), and the
/// chunks after it that came in the same GET.
pub struct Fetched {
    pub stored: Bytes,
    pub followers: Vec<(Entry, Bytes)>,
}

impl ReadAhead {
    /// Read-ahead of up to `window` bytes (0: off).
    pub fn new(window: u64) -> ReadAhead {
        ReadAhead {
            window,
            streams: Mutex::new(VecDeque::new()),
            layouts: quick_cache::sync::Cache::new(1024),
        }
    }

    /// True (and the stream advanced) when `e` starts where a recent fetch
    /// from `pack` ended; otherwise the fetch starts a new stream.
    fn sequential(&self, pack: PackId, start: u64, end: u64) -> bool {
        let mut s = self.streams.lock();
        if let Some(i) = s.iter().position(|&(p, at)| p == pack && at == start) {
            s.remove(i);
            s.push_back((pack, end));
            return true;
        }
        if s.len() == STREAMS {
            s.pop_front();
        }
        s.push_back((pack, end));
        false
    }

    /// Fetches chunk `e` of `pack` (whose object is `key`), with read-ahead
    /// when the access is sequential. `pack_len` (the object's length, if
    /// known) is asked only to read a layout not yet cached.
    pub fn fetch(
        &self,
        backend: &Backend,
        pack: PackId,
        key: &object_store::path::Path,
        pack_len: impl FnOnce() -> Result<Option<u64>>,
        e: &Entry,
    ) -> Result<Fetched> {
        let end = e.offset + e.stored_len as u64;
        let alone =
            || Ok(Fetched { stored: backend.get_range(key, e.offset..end)?, followers: vec![] });
        if self.window == 0 || !self.sequential(pack, e.offset, end) {
            return alone();
        }
        let layout = match self.layouts.get(&pack) {
            Some(l) => l,
            None => {
                let Some(len) = pack_len()? else { return alone() };
                let mut entries = read_footer(backend, key, len)?;
                entries.sort_by_key(|x| x.offset);
                let l = Arc::new(entries);
                self.layouts.insert(pack, l.clone());
                l
            }
        };
        let at = layout.partition_point(|x| x.offset < e.offset);
        let mut followers: Vec<Entry> = Vec::new();
        let mut stop = end;
        for x in layout[at..].iter().filter(|x| x.offset >= end) {
            let x_end = x.offset + x.stored_len as u64;
            if x.offset != stop || x_end - e.offset > self.window {
                break;
            }
            followers.push(*x);
            stop = x_end;
        }
        let bytes = backend.get_range(key, e.offset..stop)?;
        if bytes.len() as u64 != stop - e.offset {
            return Err(Error::corrupt(format!("pack {pack}: a ranged read came back short")));
        }
        self.sequential(pack, end, stop);
        let slice = |x: &Entry| {
            let from = (x.offset - e.offset) as usize;
            bytes.slice(from..from + x.stored_len as usize)
        };
        Ok(Fetched {
            stored: slice(e),
            followers: followers.iter().map(|x| (*x, slice(x))).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::pack::{PackWriter, compress, decompress};
    use crate::id::ChunkId;

    #[test]
    fn sequential_reads_bring_the_following_chunks_random_ones_do_not() {
        let d = tempfile::tempdir().unwrap();
        let backend = Backend::local(d.path().to_path_buf()).unwrap();
        let mut w = PackWriter::new();
        let mut plains = Vec::new();
        for i in 0..40u32 {
            let plain: Vec<u8> =
                (0..100_000u32).map(|j| (j.wrapping_mul(i + 7) >> 3) as u8).collect();
            let (codec, stored) = compress(&plain, 1);
            w.add(ChunkId::of(&plain), plain.len() as u32, codec, &stored);
            plains.push(plain);
        }
        let (pack, bytes, mut entries) = w.seal();
        entries.sort_by_key(|e| e.offset);
        let key = crate::objects::keys::pack(&pack);
        backend.put(&key, bytes.clone()).unwrap();
        let ra = ReadAhead::new(300_000);
        let len = bytes.len() as u64;

        let first = ra.fetch(&backend, pack, &key, || Ok(Some(len)), &entries[0]).unwrap();
        assert!(first.followers.is_empty(), "a first read is not yet a stream");
        let second = ra.fetch(&backend, pack, &key, || Ok(Some(len)), &entries[1]).unwrap();
        assert!(!second.followers.is_empty(), "the next chunk continues the stream");
        let span: u64 = second.followers.iter().map(|(e, _)| e.stored_len as u64).sum();
        assert!(span + entries[1].stored_len as u64 <= 300_000, "within the window");
        for (e, stored) in &second.followers {
            let i = entries.iter().position(|x| x.id == e.id).unwrap();
            assert_eq!(&decompress(e, stored).unwrap()[..], &plains_of(&plains, &entries[i])[..]);
        }
        // The read after the window goes on with the stream.
        let next = 2 + second.followers.len();
        assert!(
            !ra.fetch(&backend, pack, &key, || Ok(Some(len)), &entries[next])
                .unwrap()
                .followers
                .is_empty()
        );
        // A jump elsewhere is a random read: its chunk alone.
        let jump = ra.fetch(&backend, pack, &key, || Ok(Some(len)), &entries[30]).unwrap();
        assert!(jump.followers.is_empty());
        assert_eq!(
            &decompress(&entries[30], &jump.stored).unwrap()[..],
            &plains_of(&plains, &entries[30])[..]
        );
        // Off: never any followers.
        let off = ReadAhead::new(0);
        off.fetch(&backend, pack, &key, || Ok(Some(len)), &entries[0]).unwrap();
        assert!(
            off.fetch(&backend, pack, &key, || Ok(Some(len)), &entries[1])
                .unwrap()
                .followers
                .is_empty()
        );
    }

    fn plains_of(plains: &[Vec<u8>], e: &Entry) -> Vec<u8> {
        plains.iter().find(|p| ChunkId::of(p) == e.id).unwrap().clone()
    }
}
