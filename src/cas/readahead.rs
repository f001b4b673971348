//! Read-ahead for remote packs: when a chunk read continues where an
//! earlier fetch from the same pack ended (a sequential reader: an image
//! copy, a boot, a scan), one ranged GET takes the chunk and the chunks
//! that follow it in the pack, up to a window, and the followers go to the
//! on-disk cache. Random reads fetch their chunk alone, so a workload that
//! touches 1% of a volume fetches about that 1%.
//!
//! One GET at a time is one object-store round trip per window, and a
//! single stream from an S3 server is slow (about 57 MiB/s from s3s-fs on
//! loopback, where eight at once reach 460 MiB/s). So a sequential fetch
//! also starts the [`AHEAD`] windows after it, each a GET on a thread of
//! its own whose chunks go to the disk cache. And a chunk is fetched about
//! once: a read of a chunk whose window is on its way waits for that GET
//! instead of starting its own (a reader with many requests in flight, as
//! nbdcopy is, used to start an overlapping window per request: 4.7 times
//! the bytes it read).
//!
//! The window is a setting of the process (`FORKFS_READAHEAD`, default
//! 2 MiB; 0 turns it off).
//! A pack's layout (its footer: every chunk's offset and length) is read
//! once per process, with the two ranged GETs an attach uses.

use super::diskcache::DiskCache;
use super::pack::{self, Entry, read_footer};
use crate::error::{Error, Result};
use crate::id::PackId;
use crate::objects::Backend;
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Sequential streams remembered at once.
const STREAMS: usize = 16;

/// Windows a sequential fetch starts in the background after its own.
pub const AHEAD: usize = 3;

/// Background windows in flight at most, over all streams of a store.
const MAX_BACKGROUND: usize = 8;

pub struct ReadAhead {
    window: u64,
    /// Where recent fetches ended: (pack, end offset).
    streams: Mutex<VecDeque<(PackId, u64)>>,
    layouts: quick_cache::sync::Cache<PackId, Arc<Vec<Entry>>>,
    shared: Arc<Shared>,
}

struct Shared {
    /// Chunks a GET is bringing now, by (pack, offset): its flight.
    flying: Mutex<HashMap<(PackId, u64), Arc<Flight>>>,
    /// Background windows in flight; `idle` is told when it falls.
    background: Mutex<usize>,
    idle: Condvar,
    /// Where background windows put their chunks.
    disk: Option<Arc<DiskCache>>,
    /// Bytes fetched from packs by this read-ahead.
    fetched: AtomicU64,
}

/// One ranged GET of a window, from `start`.
struct Flight {
    start: u64,
    done: Mutex<Option<std::result::Result<Bytes, String>>>,
    landed: Condvar,
}

impl Flight {
    fn new(start: u64) -> Arc<Flight> {
        Arc::new(Flight { start, done: Mutex::new(None), landed: Condvar::new() })
    }

    /// Gives the flight its answer; the first one given stays.
    fn land(&self, r: std::result::Result<Bytes, String>) {
        let mut d = self.done.lock();
        if d.is_none() {
            *d = Some(r);
            self.landed.notify_all();
        }
    }

    /// The stored bytes of the chunk at `offset` (`len` bytes) once the
    /// GET has landed; `None` if it failed.
    fn wait(&self, offset: u64, len: usize) -> Option<Bytes> {
        let mut d = self.done.lock();
        while d.is_none() {
            self.landed.wait(&mut d);
        }
        let from = (offset - self.start) as usize;
        match d.as_ref()? {
            Ok(b) if from + len <= b.len() => Some(b.slice(from..from + len)),
            _ => None,
        }
    }
}

/// A window: chunks back to back in a pack, fetched by one GET.
#[derive(Clone)]
struct Window {
    chunks: Vec<Entry>,
    flight: Arc<Flight>,
}

impl Window {
    fn range(&self) -> std::ops::Range<u64> {
        let last = self.chunks.last().expect("a window has a chunk");
        self.flight.start..last.offset + last.stored_len as u64
    }

    /// Each chunk's stored bytes in `bytes`, the window's GET.
    fn parts(&self, bytes: &Bytes) -> Vec<(Entry, Bytes)> {
        let at = |x: &Entry| (x.offset - self.flight.start) as usize;
        self.chunks
            .iter()
            .map(|x| (*x, bytes.slice(at(x)..at(x) + x.stored_len as usize)))
            .collect()
    }
}

impl ReadAhead {
    /// Read-ahead of up to `window` bytes (0: off); background windows put
    /// their chunks in `disk`.
    pub fn new(window: u64, disk: Option<Arc<DiskCache>>) -> ReadAhead {
        ReadAhead {
            window,
            streams: Mutex::new(VecDeque::new()),
            layouts: quick_cache::sync::Cache::new(1024),
            shared: Arc::new(Shared {
                flying: Mutex::default(),
                background: Mutex::new(0),
                idle: Condvar::new(),
                disk,
                fetched: AtomicU64::new(0),
            }),
        }
    }

    /// Bytes fetched from packs so far.
    #[cfg(test)]
    pub fn fetched_bytes(&self) -> u64 {
        self.shared.fetched.load(Ordering::Relaxed)
    }

    /// Waits until no background window is in flight.
    pub fn quiesce(&self) {
        let mut n = self.shared.background.lock();
        while *n > 0 {
            self.shared.idle.wait(&mut n);
        }
    }

    /// True (and the stream advanced to `end`) when `start` is where a
    /// recent fetch from `pack` ended; otherwise a new stream starts,
    /// ending at `end`.
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

    fn advance(&self, pack: PackId, from: u64, to: u64) {
        let mut s = self.streams.lock();
        if let Some(at) = s.iter_mut().find(|(p, at)| *p == pack && *at == from) {
            at.1 = to;
        }
    }

    /// Fetches chunk `e` of `pack` (whose object is `key`): its stored
    /// bytes. When the access is sequential the chunks after it come in
    /// the same GET and go to the disk cache, verified, and the windows
    /// after that start in the background. `pack_len` (the object's length,
    /// if known) is asked only to read a layout not yet cached.
    pub fn fetch(
        &self,
        backend: &Arc<Backend>,
        pack: PackId,
        key: &object_store::path::Path,
        pack_len: impl FnOnce() -> Result<Option<u64>>,
        e: &Entry,
    ) -> Result<Bytes> {
        let end = e.offset + e.stored_len as u64;
        let flying = self.shared.flying.lock().get(&(pack, e.offset)).cloned();
        if let Some(f) = flying
            && let Some(stored) = f.wait(e.offset, e.stored_len as usize)
        {
            return Ok(stored);
        }
        let alone = || {
            let stored = backend.get_range(key, e.offset..end)?;
            self.shared.fetched.fetch_add(stored.len() as u64, Ordering::Relaxed);
            Ok(stored)
        };
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
        let mut windows = match self.claim(pack, &layout, e) {
            Claim::Windows(w) => w,
            // Another fetch took it meanwhile: its bytes, else alone.
            Claim::Flying(f) => {
                return f.wait(e.offset, e.stored_len as usize).map_or_else(alone, Ok);
            }
            // The index and the footer disagree: the chunk alone.
            Claim::NotInLayout => return alone(),
        };
        let first = windows.remove(0);
        let _unclaim = Landing { shared: &self.shared, pack, w: &first, background: false };
        self.advance(pack, end, windows.last().unwrap_or(&first).range().end);
        for w in windows {
            self.start_background(backend, key, pack, w);
        }
        let mut parts = first.parts(&self.shared.get_window(backend, key, pack, &first)?);
        let (_, stored) = parts.remove(0);
        // On disk before they stop flying (`_unclaim`): a reader that finds
        // no flight finds them there.
        self.shared.keep(&parts);
        Ok(stored)
    }

    /// The window from `e` and the [`AHEAD`] after it (fewer at the end of
    /// the pack, at a chunk another fetch is bringing, or when the
    /// background is full), each marked as flying, the background ones
    /// counted; or the flight already bringing `e`.
    fn claim(&self, pack: PackId, layout: &[Entry], e: &Entry) -> Claim {
        let mut flying = self.shared.flying.lock();
        if let Some(f) = flying.get(&(pack, e.offset)) {
            return Claim::Flying(f.clone());
        }
        let mut at = layout.partition_point(|x| x.offset < e.offset);
        if layout.get(at).is_none_or(|x| x.offset != e.offset || x.stored_len != e.stored_len) {
            return Claim::NotInLayout;
        }
        let mut background = self.shared.background.lock();
        let room = MAX_BACKGROUND.saturating_sub(*background);
        let mut windows: Vec<Window> = Vec::new();
        let mut next = e.offset;
        while windows.len() <= AHEAD.min(room) {
            let mut chunks = Vec::new();
            let mut stop = next;
            while let Some(x) = layout.get(at) {
                let x_end = x.offset + x.stored_len as u64;
                let joins = x.offset == stop && (chunks.is_empty() || x_end - next <= self.window);
                if !joins || flying.contains_key(&(pack, x.offset)) {
                    break;
                }
                chunks.push(*x);
                stop = x_end;
                at += 1;
            }
            if chunks.is_empty() {
                break;
            }
            let flight = Flight::new(next);
            for x in &chunks {
                flying.insert((pack, x.offset), flight.clone());
            }
            windows.push(Window { chunks, flight });
            next = stop;
        }
        *background += windows.len() - 1;
        Claim::Windows(windows)
    }

    /// Fetches `w` (claimed and counted) on a thread of its own.
    fn start_background(
        &self,
        backend: &Arc<Backend>,
        key: &object_store::path::Path,
        pack: PackId,
        w: Window,
    ) {
        let (shared, backend, key, mine) =
            (self.shared.clone(), backend.clone(), key.clone(), w.clone());
        let spawned = std::thread::Builder::new()
            .name("forkfs-readahead".into())
            .spawn(move || shared.background_window(backend, &key, pack, mine));
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "no read-ahead thread");
            drop(Landing { shared: &self.shared, pack, w: &w, background: true });
        }
    }
}

/// What [`ReadAhead::claim`] found.
enum Claim {
    Windows(Vec<Window>),
    Flying(Arc<Flight>),
    NotInLayout,
}

/// Ends a claimed window however its fetch ends (a panic included): lands
/// its flight as failed if nothing landed it, so no reader waits forever,
/// takes its chunks out of `flying` and, for a background window, counts
/// it done.
struct Landing<'a> {
    shared: &'a Shared,
    pack: PackId,
    w: &'a Window,
    background: bool,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.w.flight.land(Err("the read-ahead ended without an answer".into()));
        self.shared.unclaim(self.pack, self.w);
        if self.background {
            self.shared.background_done();
        }
    }
}

impl Shared {
    /// Fetches window `w` and puts its chunks in the disk cache, verified.
    /// The backend goes before the window is counted done: a store that
    /// waits for its read-ahead to close also waits for the lock the
    /// backend may hold.
    fn background_window(
        &self,
        backend: Arc<Backend>,
        key: &object_store::path::Path,
        pack: PackId,
        w: Window,
    ) {
        let _done = Landing { shared: self, pack, w: &w, background: true };
        let got = self.get_window(&backend, key, pack, &w);
        drop(backend);
        match got {
            Ok(bytes) => self.keep(&w.parts(&bytes)),
            Err(e) => tracing::debug!(%pack, error = %e, "background read-ahead failed"),
        }
        // `_done` then unclaims, after the disk cache has the chunks: a
        // reader that finds no flight finds them there.
    }

    /// One ranged GET of window `w`, its flight landed with the answer.
    fn get_window(
        &self,
        backend: &Backend,
        key: &object_store::path::Path,
        pack: PackId,
        w: &Window,
    ) -> Result<Bytes> {
        let range = w.range();
        let got = backend.get_range(key, range.clone()).and_then(|b| match b.len() as u64 {
            n if n == range.end - range.start => Ok(b),
            _ => Err(Error::corrupt(format!("pack {pack}: a ranged read came back short"))),
        });
        if let Ok(b) = &got {
            self.fetched.fetch_add(b.len() as u64, Ordering::Relaxed);
        }
        w.flight.land(got.as_ref().cloned().map_err(|e| e.to_string()));
        got
    }

    /// Puts `chunks` in the disk cache, verified (a chunk that fails is
    /// left out: its reader fetches it alone).
    fn keep(&self, chunks: &[(Entry, Bytes)]) {
        let Some(disk) = &self.disk else { return };
        for (x, stored) in chunks {
            match pack::decompress(x, stored) {
                Ok(plain) => disk.put(&x.id, &plain),
                Err(err) => tracing::warn!(chunk = %x.id, error = %err, "read-ahead chunk is bad"),
            }
        }
    }

    fn unclaim(&self, pack: PackId, w: &Window) {
        let mut flying = self.flying.lock();
        for x in &w.chunks {
            if flying.get(&(pack, x.offset)).is_some_and(|f| Arc::ptr_eq(f, &w.flight)) {
                flying.remove(&(pack, x.offset));
            }
        }
    }

    fn background_done(&self) {
        let mut n = self.background.lock();
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }
}

impl Drop for ReadAhead {
    /// Background windows hold the backend (and with it the store's lock):
    /// they end before the store does.
    fn drop(&mut self) {
        self.quiesce();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::pack::{PackWriter, compress, decompress};
    use crate::id::ChunkId;

    /// About three of the test pack's chunks.
    const WINDOW: u64 = 25_000;

    /// A pack of 40 chunks in a local store.
    struct TestPack {
        backend: Arc<Backend>,
        id: PackId,
        key: object_store::path::Path,
        len: u64,
        /// By offset.
        entries: Vec<Entry>,
        /// The plain bytes of each entry.
        plains: Vec<Vec<u8>>,
    }

    fn a_pack(d: &std::path::Path) -> TestPack {
        let backend = Arc::new(Backend::local(d.to_path_buf()).unwrap());
        let mut w = PackWriter::new();
        let mut plains = Vec::new();
        for i in 0..40u32 {
            let plain: Vec<u8> =
                (0..100_000u32).map(|j| (j.wrapping_mul(i + 7) >> 3) as u8).collect();
            let (codec, stored) = compress(&plain, 1);
            w.add(ChunkId::of(&plain), plain.len() as u32, codec, &stored);
            plains.push(plain);
        }
        let (id, bytes, mut entries) = w.seal();
        entries.sort_by_key(|e| e.offset);
        let key = crate::objects::keys::pack(&id);
        let len = bytes.len() as u64;
        backend.put(&key, bytes).unwrap();
        let plains = entries.iter().map(|e| plains_of(&plains, e)).collect();
        TestPack { backend, id, key, len, entries, plains }
    }

    /// A test pack, a disk cache and a read-ahead of [`WINDOW`] into it.
    fn setup(d: &std::path::Path) -> (TestPack, Arc<DiskCache>, ReadAhead) {
        let p = a_pack(&d.join("objects"));
        let disk = Arc::new(DiskCache::open(&d.join("cache"), 1 << 30).unwrap());
        let ra = ReadAhead::new(WINDOW, Some(disk.clone()));
        (p, disk, ra)
    }

    impl TestPack {
        fn fetch(&self, ra: &ReadAhead, e: &Entry) -> Bytes {
            ra.fetch(&self.backend, self.id, &self.key, || Ok(Some(self.len)), e).unwrap()
        }
    }

    /// What `ChunkStore::get` does: the disk cache, else a fetch. Returns
    /// the plain bytes.
    fn read(ra: &ReadAhead, disk: &DiskCache, p: &TestPack, e: &Entry) -> Vec<u8> {
        if let Some(b) = disk.get(&e.id) {
            return b.to_vec();
        }
        decompress(e, &p.fetch(ra, e)).unwrap().to_vec()
    }

    #[test]
    fn sequential_reads_bring_the_following_chunks_random_ones_do_not() {
        let d = tempfile::tempdir().unwrap();
        let (p, disk, ra) = setup(d.path());
        let (entries, plains) = (&p.entries, &p.plains);
        let on_disk = |i: usize| disk.get(&entries[i].id).map(|b| b.to_vec());

        p.fetch(&ra, &entries[0]);
        ra.quiesce();
        assert_eq!(on_disk(1), None, "a first read is not yet a stream");
        let second = p.fetch(&ra, &entries[1]);
        assert_eq!(&decompress(&entries[1], &second).unwrap()[..], &plains[1][..]);
        assert_eq!(on_disk(2).as_ref(), Some(&plains[2]), "the next chunk continues the stream");
        ra.quiesce();
        let mut i = 2;
        while let Some(b) = on_disk(i) {
            assert_eq!(b, plains[i]);
            i += 1;
        }
        let stored: u64 = entries[1..i].iter().map(|e| e.stored_len as u64).sum();
        assert!(stored <= WINDOW * (1 + AHEAD as u64), "within the windows: {stored}");
        // A jump elsewhere is a random read: its chunk alone.
        let jump = p.fetch(&ra, &entries[35]);
        assert_eq!(&decompress(&entries[35], &jump).unwrap()[..], &plains[35][..]);
        ra.quiesce();
        assert_eq!(on_disk(36), None);
        // Off: never any followers.
        let d2 = tempfile::tempdir().unwrap();
        let disk2 = Arc::new(DiskCache::open(d2.path(), 1 << 30).unwrap());
        let off = ReadAhead::new(0, Some(disk2.clone()));
        p.fetch(&off, &entries[0]);
        p.fetch(&off, &entries[1]);
        off.quiesce();
        assert_eq!(disk2.usage(), (0, 0));
    }

    #[test]
    fn a_sequential_read_starts_the_windows_after_it_and_fetches_each_chunk_once() {
        let d = tempfile::tempdir().unwrap();
        let (p, disk, ra) = setup(d.path());
        let (entries, plains) = (&p.entries, &p.plains);
        read(&ra, &disk, &p, &entries[0]);
        read(&ra, &disk, &p, &entries[1]);
        ra.quiesce();
        // Beyond the first window's followers, the background windows put
        // chunks nobody asked for yet on disk.
        let first_window = entries[1..]
            .iter()
            .take_while(|e| e.offset + e.stored_len as u64 - entries[1].offset <= WINDOW)
            .count();
        let ahead =
            entries[1 + first_window..].iter().take_while(|e| disk.get(&e.id).is_some()).count();
        assert!(AHEAD >= 1 && ahead >= AHEAD, "{ahead} chunks read ahead in the background");
        for (e, plain) in entries.iter().zip(plains).skip(2) {
            assert_eq!(&read(&ra, &disk, &p, e), plain);
        }
        ra.quiesce();
        let stored: u64 = entries.iter().map(|e| e.stored_len as u64).sum();
        assert!(
            ra.fetched_bytes() <= stored * 12 / 10,
            "{} fetched for {stored}",
            ra.fetched_bytes()
        );
    }

    #[test]
    fn concurrent_sequential_readers_fetch_each_chunk_about_once() {
        let d = tempfile::tempdir().unwrap();
        let (p, disk, ra) = setup(d.path());
        // Four readers take the chunks in order, as a client with four
        // requests in flight asks for a disk's blocks.
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(e) = p.entries.get(i) else { break };
                        assert_eq!(read(&ra, &disk, &p, e), p.plains[i], "chunk {i}");
                    }
                });
            }
        });
        ra.quiesce();
        let stored: u64 = p.entries.iter().map(|e| e.stored_len as u64).sum();
        assert!(
            ra.fetched_bytes() <= stored * 3 / 2,
            "{} fetched for {stored}",
            ra.fetched_bytes()
        );
    }

    fn plains_of(plains: &[Vec<u8>], e: &Entry) -> Vec<u8> {
        plains.iter().find(|p| ChunkId::of(p) == e.id).unwrap().clone()
    }

    #[test]
    fn a_waiter_gets_its_chunk_from_a_flight_that_started_before_it() {
        let f = Flight::new(100);
        let bytes: Bytes = (0..50u8).collect::<Vec<_>>().into();
        let waiter = std::thread::spawn({
            let f = f.clone();
            move || f.wait(120, 10)
        });
        f.land(Ok(bytes.clone()));
        assert_eq!(waiter.join().unwrap(), Some(bytes.slice(20..30)));
        assert_eq!(f.wait(145, 10), None, "past what the flight brought");
        let failed = Flight::new(0);
        failed.land(Err("gone".into()));
        failed.land(Ok(bytes));
        assert_eq!(failed.wait(0, 10), None, "a failed flight stays failed");
    }
}
