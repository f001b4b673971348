//! The data log: dirty block data of volume heads, appended to per-volume
//! segment files until a checkpoint stores it as chunks. The overlay keeps
//! only a small [`LogRef`] per block, so a write costs one append here and
//! a ~40-byte RocksDB entry, and data is written twice in all (log, pack)
//! instead of passing through RocksDB's WAL, memtable and blob files.
//!
//! Layout: `STORE/log/<volume id 016x>/<segment seq 016x>.seg`. A process
//! never appends to a segment it did not create (an older tail may be torn).
//! A checkpoint rotates to a new segment under the head's exclusive gate and
//! records the new segment as the volume's floor in its commit batch;
//! segments below the floor are deleted after the commit and at startup.
//!
//! Durability: [`DataLog::sync`] fdatasyncs every segment written since the
//! last sync (rotated ones too) and returns, per segment, how far its data
//! is now durable: the *durable mark*. The caller records the marks and
//! syncs the RocksDB WAL after, so a synced overlay entry never names
//! unsynced data below a mark. A new segment's directory entry is synced
//! when the segment is created.
//!
//! Recycling: a segment below the floor is not always deleted. Up to
//! [`SPARES`] of them per volume (the largest, cut to [`SPARE_BYTES`])
//! are renamed `<seq 016x>.spare` and become the next new segments, whose
//! appends then write over blocks the file already has. On ext4 an
//! fdatasync of such a write commits no journal transaction (the file's
//! size and extents do not change): 43-62 us on this machine's disk
//! against 89-139 us for an append, which every FLUSH pays (8 KiB writes
//! each fdatasynced; `scripts/bench-fdatasync`). A spare's old bytes are
//! never read as data: a [`LogRef`] names only bytes appended to its
//! segment, and its CRC tells them from the old ones a power cut may
//! leave.
//!
//! Reading tells apart data that is not there ([`Read::Lost`]: the segment
//! missing, cut short, or failing its CRC, as power loss before any flush
//! leaves it) from a failure to read (an I/O error: never taken for lost
//! data). Whether lost data was acknowledged as durable is the caller's
//! question, answered by the marks (see `Head::read_logged`).

use crate::error::{Error, Result};
use crate::id::VolumeId;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where one block's dirty data lives in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRef {
    pub seq: u64,
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
}

impl LogRef {
    pub const LEN: usize = 24;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<LogRef> {
        if b.len() != Self::LEN {
            return Err(Error::corrupt("data log reference has the wrong length"));
        }
        Ok(LogRef {
            seq: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            offset: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            crc: u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")),
        })
    }
}

/// What reading one block's data found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    Data(Bytes),
    /// The data is not there (why): its write never reached the disk.
    Lost(String),
}

/// How far a segment's data is durable: every append below `upto` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub vol: VolumeId,
    pub seq: u64,
    pub upto: u64,
}

struct Segment {
    seq: u64,
    file: File,
    /// Bytes reserved so far, and the offsets of appends not yet written:
    /// everything below the lowest of those (or below `len`) is written.
    appends: Mutex<(u64, BTreeSet<u64>)>,
    dirty: AtomicBool,
    /// Held from taking `dirty` to the end of the fdatasync: a sync that
    /// finds the flag clear must not return while another's fdatasync of
    /// the same appends is still under way (its caller would acknowledge
    /// data not yet on disk).
    syncing: Mutex<()>,
}

impl Segment {
    fn len(&self) -> u64 {
        self.appends.lock().0
    }

    /// The offset below which every append has been written.
    fn written(&self) -> u64 {
        let a = self.appends.lock();
        a.1.first().copied().unwrap_or(a.0)
    }
}

#[derive(Default)]
struct VolumeLog {
    /// The segment new appends go to; `None` until the first append.
    current: Option<Arc<Segment>>,
    /// Segments rotated away with appends not yet synced.
    unsynced: Vec<Arc<Segment>>,
    /// Older segments opened for reading.
    readers: HashMap<u64, Arc<File>>,
    /// The segments this process created: no crash came between their
    /// writes and now, so data missing there is damage, never a write a
    /// crash took.
    ours: BTreeSet<u64>,
    /// Per segment, how far a sync started here covers: data below it
    /// may be acknowledged by a flush whose marks are not written yet.
    syncing: HashMap<u64, u64>,
    /// Per segment, how far a sync here made it durable: the mark it
    /// returned, known before the caller writes it to the index.
    synced: HashMap<u64, u64>,
}

/// An open segment to read from.
enum SegFile {
    Current(Arc<Segment>),
    Reader(Arc<File>),
}

impl std::ops::Deref for SegFile {
    type Target = File;
    fn deref(&self) -> &File {
        match self {
            SegFile::Current(s) => &s.file,
            SegFile::Reader(f) => f,
        }
    }
}

pub struct DataLog {
    dir: PathBuf,
    volumes: Mutex<HashMap<VolumeId, VolumeLog>>,
    /// The power-cut test's negative control: no fdatasync (see
    /// `Settings::test_skip_log_sync`).
    skip_sync: bool,
    /// Held while spares are chosen, cut, renamed or removed: a new segment
    /// never takes a spare [`DataLog::drop_below`] is cutting or removing
    /// (it takes none while the lock is busy, rather than wait).
    spares: Mutex<()>,
}

/// Segment files each volume keeps for reuse once below its floor.
pub const SPARES: usize = 2;
/// A spare keeps at most this many bytes of the segment it was.
pub const SPARE_BYTES: u64 = 64 << 20;

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

fn vol_dir(dir: &Path, vol: VolumeId) -> PathBuf {
    dir.join(format!("{:016x}", vol.0))
}

fn seg_path(dir: &Path, vol: VolumeId, seq: u64) -> PathBuf {
    vol_dir(dir, vol).join(format!("{seq:016x}.seg"))
}

fn spare_path(dir: &Path, vol: VolumeId, seq: u64) -> PathBuf {
    vol_dir(dir, vol).join(format!("{seq:016x}.spare"))
}

/// Segment numbers present on disk for a volume.
fn list_segments(dir: &Path, vol: VolumeId) -> Result<Vec<u64>> {
    list_files(dir, vol, ".seg")
}

/// The numbers of a volume's files named `<seq 016x><suffix>`, in order.
fn list_files(dir: &Path, vol: VolumeId, suffix: &str) -> Result<Vec<u64>> {
    let d = vol_dir(dir, vol);
    let rd = match std::fs::read_dir(&d) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for e in rd {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if let Some(seq) = name.strip_suffix(suffix).and_then(|s| u64::from_str_radix(s, 16).ok()) {
            out.push(seq);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// What the data log holds on local disk (`forkfs status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogUsage {
    /// Segments' file lengths: writes not yet in a version, segments a
    /// checkpoint has not dropped yet, and, for a segment made from a
    /// spare, the spare's old bytes past its appends (disk space, not
    /// pending writes).
    pub bytes: u64,
    pub segments: usize,
    /// Spares: segments below the floor kept to be written over
    /// ([`SPARES`] per volume at most, each cut to [`SPARE_BYTES`]).
    pub spare_bytes: u64,
    pub spares: usize,
}

/// Bytes and number of a volume's files named `<seq 016x><suffix>` (at
/// `path`); a volume deleted meanwhile has none (see [`list_files`]).
fn file_sizes(
    dir: &Path,
    vol: VolumeId,
    suffix: &str,
    path: fn(&Path, VolumeId, u64) -> PathBuf,
) -> Result<(u64, usize)> {
    let (mut bytes, mut n) = (0, 0);
    for seq in list_files(dir, vol, suffix)? {
        // Gone since the listing (dropped or renamed): not counted.
        if let Ok(m) = std::fs::metadata(path(dir, vol, seq)) {
            bytes += m.len();
            n += 1;
        }
    }
    Ok((bytes, n))
}

impl DataLog {
    /// Bytes and files of every volume's segments and spares, as the
    /// directory lists them now.
    pub fn usage(&self) -> Result<LogUsage> {
        let mut u = LogUsage::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let vol = name.to_str().and_then(|n| u64::from_str_radix(n, 16).ok());
            let Some(vol) = vol.filter(|_| entry.file_type().is_ok_and(|t| t.is_dir())) else {
                continue;
            };
            let vol = VolumeId(vol);
            let (bytes, n) = file_sizes(&self.dir, vol, ".seg", seg_path)?;
            (u.bytes, u.segments) = (u.bytes + bytes, u.segments + n);
            let (bytes, n) = file_sizes(&self.dir, vol, ".spare", spare_path)?;
            (u.spare_bytes, u.spares) = (u.spare_bytes + bytes, u.spares + n);
        }
        Ok(u)
    }

    pub fn open(dir: PathBuf) -> Result<DataLog> {
        std::fs::create_dir_all(&dir)?;
        Ok(DataLog {
            dir,
            volumes: Mutex::new(HashMap::new()),
            skip_sync: false,
            spares: Mutex::new(()),
        })
    }

    /// A log that never syncs its data: wrong on purpose, for the power-cut
    /// test's negative control only.
    pub fn without_sync(mut self) -> DataLog {
        tracing::warn!(
            "the data log does not sync: acknowledged writes die with the power (test mode)"
        );
        self.skip_sync = true;
        self
    }

    fn current(&self, vol: VolumeId) -> Result<Arc<Segment>> {
        let mut vols = self.volumes.lock();
        let v = vols.entry(vol).or_default();
        if let Some(s) = &v.current {
            return Ok(s.clone());
        }
        let seq = list_segments(&self.dir, vol)?.last().map_or(1, |s| s + 1);
        let seg = self.create(vol, seq)?;
        v.ours.insert(seq);
        v.current = Some(seg.clone());
        Ok(seg)
    }

    /// A new segment, its directory entry durable (a synced overlay entry
    /// naming it must find it after power loss): the largest spare renamed,
    /// else a new file.
    fn create(&self, vol: VolumeId, seq: u64) -> Result<Arc<Segment>> {
        let dir = vol_dir(&self.dir, vol);
        if !dir.exists() {
            std::fs::create_dir_all(&dir)?;
            sync_dir(&self.dir)?;
        }
        let path = seg_path(&self.dir, vol, seq);
        let mut open = crate::files::private_file();
        open.read(true).write(true);
        // Never over a file already there (`seq` is above them all); a
        // filesystem without RENAME_NOREPLACE gets a new file.
        let spares = self.spares.try_lock();
        let spare = if spares.is_some() { self.largest_spare(vol)? } else { None };
        let recycled = match spare {
            Some(spare) => match crate::files::rename_noreplace(&spare, &path) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(error = %e, "a spare data log segment was not reused");
                    false
                }
            },
            None => false,
        };
        drop(spares);
        let file = if recycled { open.open(&path)? } else { open.create_new(true).open(&path)? };
        sync_dir(&dir)?;
        let appends = Mutex::new((0, BTreeSet::new()));
        Ok(Arc::new(Segment {
            seq,
            file,
            appends,
            dirty: AtomicBool::new(false),
            syncing: Mutex::new(()),
        }))
    }

    /// Appends one block's data; concurrent appends do not serialize (they
    /// reserve their offsets under a short lock, and write outside it).
    pub fn append(&self, vol: VolumeId, data: &[u8]) -> Result<LogRef> {
        let mut refs = self.append_blocks(vol, data, data.len().max(1))?;
        refs.pop().ok_or_else(|| Error::invalid("an append of no bytes"))
    }

    /// Appends consecutive blocks of `block_len` bytes each (`data` is a
    /// whole number of them) in one write; a reference per block.
    pub fn append_blocks(
        &self,
        vol: VolumeId,
        data: &[u8],
        block_len: usize,
    ) -> Result<Vec<LogRef>> {
        let len = u32::try_from(block_len).map_err(|_| Error::invalid("block over 4 GiB"))?;
        if data.is_empty() || block_len == 0 || data.len() % block_len != 0 {
            return Err(Error::invalid("an append is a whole number of blocks"));
        }
        let seg = self.current(vol)?;
        let offset = {
            let mut a = seg.appends.lock();
            let at = a.0;
            a.0 += data.len() as u64;
            a.1.insert(at);
            at
        };
        let written = seg.file.write_all_at(data, offset);
        seg.dirty.store(true, Ordering::Release);
        seg.appends.lock().1.remove(&offset);
        written?;
        let refs = data.chunks(block_len).enumerate().map(|(i, block)| LogRef {
            seq: seg.seq,
            offset: offset + (i * block_len) as u64,
            len,
            crc: crc32fast::hash(block),
        });
        Ok(refs.collect())
    }

    /// Reads and verifies one block's data. An I/O failure (EIO, EMFILE,
    /// ...) is an error, never [`Read::Lost`].
    pub fn read(&self, vol: VolumeId, r: &LogRef) -> Result<Read> {
        let (read, ours) = self.read_inner(vol, r)?;
        match read {
            Read::Lost(why) if ours => Err(Error::corrupt(format!(
                "{why}, in a segment this process wrote: the disk under the store lost data"
            ))),
            read => Ok(read),
        }
    }

    /// The open file of segment `seq`, and whether this process wrote it;
    /// `Err(why)` inside `Ok` when the segment is missing.
    fn segment(
        &self,
        vol: VolumeId,
        seq: u64,
    ) -> Result<(std::result::Result<SegFile, String>, bool)> {
        let mut vols = self.volumes.lock();
        let v = vols.entry(vol).or_default();
        let ours = v.ours.contains(&seq);
        // The segment appended to is read through its own descriptor (its
        // directory entry may be gone: the store directory removed).
        if let Some(c) = v.current.as_ref().filter(|c| c.seq == seq) {
            return Ok((Ok(SegFile::Current(c.clone())), ours));
        }
        if let Some(f) = v.readers.get(&seq) {
            return Ok((Ok(SegFile::Reader(f.clone())), ours));
        }
        let file = match File::open(seg_path(&self.dir, vol, seq)) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Err(format!("data log segment {seq} is missing")), ours));
            }
            Err(e) => {
                return Err(Error::from(e).context(format!("opening data log segment {seq}")));
            }
        };
        v.readers.insert(seq, file.clone());
        Ok((Ok(SegFile::Reader(file)), ours))
    }

    /// Reads `out.len()` bytes at `within` of one block's logged data
    /// straight into `out`, unverified, if this process wrote its segment
    /// (so no crash came between the write and now): `Ok(false)` otherwise,
    /// or when the bytes are not all there, and the caller reads the whole
    /// block with [`DataLog::read`], which verifies its CRC. So a read of
    /// data this process wrote copies only its own bytes once, and data a
    /// crash may have lost is always checked; the checkpoint that stores a
    /// block still reads it whole and checks it.
    pub fn read_part(
        &self,
        vol: VolumeId,
        r: &LogRef,
        within: u64,
        out: &mut [u8],
    ) -> Result<bool> {
        if within + out.len() as u64 > u64::from(r.len) {
            return Ok(false);
        }
        let (Ok(file), true) = self.segment(vol, r.seq)? else { return Ok(false) };
        match file.read_exact_at(out, r.offset + within) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(Error::from(e).context(format!("reading data log segment {}", r.seq))),
        }
    }

    fn read_inner(&self, vol: VolumeId, r: &LogRef) -> Result<(Read, bool)> {
        let (file, ours) = match self.segment(vol, r.seq)? {
            (Ok(f), ours) => (f, ours),
            (Err(why), ours) => return Ok((Read::Lost(why), ours)),
        };
        let mut buf = vec![0u8; r.len as usize];
        match file.read_exact_at(&mut buf, r.offset) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                let why = format!(
                    "data log segment {} ends before offset {}",
                    r.seq,
                    r.offset + r.len as u64
                );
                return Ok((Read::Lost(why), ours));
            }
            Err(e) => {
                let what = format!("reading data log segment {}", r.seq);
                return Err(Error::from(e).context(what));
            }
        }
        if crc32fast::hash(&buf) != r.crc {
            let why =
                format!("data at log segment {} offset {} fails its checksum", r.seq, r.offset);
            return Ok((Read::Lost(why), ours));
        }
        Ok((Read::Data(Bytes::from(buf)), ours))
    }

    /// Makes every append written so far durable, and returns how far each
    /// segment synced now is durable.
    pub fn sync(&self) -> Result<Vec<Mark>> {
        // Rotated segments stay listed until a sync leaves them clean: one
        // taken off the list while another thread's fdatasync of it is
        // under way would let this sync return before that one ends.
        let segs: Vec<(VolumeId, Arc<Segment>, bool)> = {
            let vols = self.volumes.lock();
            let mut out = Vec::new();
            for (vol, v) in vols.iter() {
                out.extend(v.unsynced.iter().map(|s| (*vol, s.clone(), true)));
                out.extend(v.current.clone().map(|s| (*vol, s, false)));
            }
            out
        };
        let mut marks = Vec::new();
        for (vol, s, rotated) in segs {
            let _one = s.syncing.lock();
            if s.dirty.swap(false, Ordering::AcqRel) {
                // Read before the sync: what was written by then it covers.
                let upto = s.written();
                {
                    let mut vols = self.volumes.lock();
                    let at = vols.entry(vol).or_default().syncing.entry(s.seq).or_default();
                    *at = (*at).max(upto);
                }
                let synced = if self.skip_sync { Ok(()) } else { s.file.sync_data() };
                if let Err(e) = synced {
                    s.dirty.store(true, Ordering::Release);
                    return Err(e.into());
                }
                // Not for a segment dropped meanwhile (below a new floor):
                // its mark is the index's question again.
                if let Some(v) =
                    self.volumes.lock().get_mut(&vol).filter(|v| v.ours.contains(&s.seq))
                {
                    let at = v.synced.entry(s.seq).or_default();
                    *at = (*at).max(upto);
                }
                marks.push(Mark { vol, seq: s.seq, upto });
            }
            // Durable now, by this sync or one this waited for; a rotated
            // segment takes no more appends.
            if rotated && !s.dirty.load(Ordering::Acquire) {
                let mut vols = self.volumes.lock();
                if let Some(v) = vols.get_mut(&vol) {
                    v.unsynced.retain(|u| !Arc::ptr_eq(u, &s));
                }
            }
        }
        Ok(marks)
    }

    /// How far a sync this process started covers segment `seq` of `vol`
    /// (0: none): appends below it may be acknowledged as durable once
    /// that sync's marks are written, whether or not they are yet.
    pub fn sync_started(&self, vol: VolumeId, seq: u64) -> u64 {
        let vols = self.volumes.lock();
        vols.get(&vol).and_then(|v| v.syncing.get(&seq).copied()).unwrap_or(0)
    }

    /// How far segment `seq` of `vol` is durable, if this process created
    /// it: `Some(None)` when no sync here covered any of it. Only this
    /// process writes the marks of its segments, after its syncs, so the
    /// index's mark is never ahead of this (a read of it cost a RocksDB
    /// lookup per write over logged data). `None`: an earlier process's
    /// segment, whose mark only the index knows.
    pub fn durable_here(&self, vol: VolumeId, seq: u64) -> Option<Option<u64>> {
        let vols = self.volumes.lock();
        let v = vols.get(&vol).filter(|v| v.ours.contains(&seq))?;
        Some(v.synced.get(&seq).copied())
    }

    /// Starts a new segment for `vol` and returns its number: the floor
    /// that a checkpoint records. Call with the head's gate held exclusively.
    pub fn rotate(&self, vol: VolumeId) -> Result<u64> {
        let mut vols = self.volumes.lock();
        let v = vols.entry(vol).or_default();
        let next = match &v.current {
            Some(s) if s.len() == 0 => return Ok(s.seq),
            Some(s) => s.seq + 1,
            None => list_segments(&self.dir, vol)?.last().map_or(1, |s| s + 1),
        };
        let old = v.current.replace(self.create(vol, next)?);
        v.ours.insert(next);
        // Its appends are synced by the next sync, like the current ones;
        // listed even if clean, as a sync of it may still be under way.
        v.unsynced.extend(old);
        Ok(next)
    }

    /// The spare of `vol` with the most bytes, if any.
    fn largest_spare(&self, vol: VolumeId) -> Result<Option<PathBuf>> {
        let mut best: Option<(u64, PathBuf)> = None;
        for seq in list_files(&self.dir, vol, ".spare")? {
            let p = spare_path(&self.dir, vol, seq);
            let len = std::fs::metadata(&p)?.len();
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, p));
            }
        }
        Ok(best.map(|(_, p)| p))
    }

    /// Deletes the segments of `vol` below `floor` (all of them, and the
    /// spares, with `u64::MAX`), but for the largest [`SPARES`] of them and
    /// the spares already there, which become (or stay) spares, cut to
    /// [`SPARE_BYTES`]. Call once nothing reads below the floor: a spare's
    /// bytes are written over.
    pub fn drop_below(&self, vol: VolumeId, floor: u64) -> Result<()> {
        {
            let mut vols = self.volumes.lock();
            if let Some(v) = vols.get_mut(&vol) {
                v.readers.retain(|seq, _| *seq >= floor);
                v.ours.retain(|seq| *seq >= floor);
                v.syncing.retain(|seq, _| *seq >= floor);
                v.synced.retain(|seq, _| *seq >= floor);
                v.unsynced.retain(|s| s.seq >= floor);
                if v.current.as_ref().is_some_and(|s| s.seq < floor) {
                    v.current = None;
                }
            }
        }
        let _spares = self.spares.lock();
        // (bytes on disk, path, the spare path if it is a segment now)
        let mut files: Vec<(u64, PathBuf, Option<PathBuf>)> = Vec::new();
        for seq in list_files(&self.dir, vol, ".spare")? {
            files.push((0, spare_path(&self.dir, vol, seq), None));
        }
        for seq in list_segments(&self.dir, vol)?.into_iter().filter(|s| *s < floor) {
            files.push((0, seg_path(&self.dir, vol, seq), Some(spare_path(&self.dir, vol, seq))));
        }
        let keep = if floor == u64::MAX { 0 } else { SPARES };
        for f in &mut files {
            f.0 = std::fs::metadata(&f.1)?.len();
        }
        // The largest, as they will be once cut.
        files.sort_by_key(|f| std::cmp::Reverse(f.0.min(SPARE_BYTES)));
        for (i, (len, path, spare)) in files.into_iter().enumerate() {
            if i >= keep || len == 0 {
                std::fs::remove_file(&path)?;
                continue;
            }
            if len > SPARE_BYTES {
                std::fs::OpenOptions::new().write(true).open(&path)?.set_len(SPARE_BYTES)?;
            }
            if let Some(spare) = spare {
                std::fs::rename(&path, &spare)?;
            }
        }
        if floor == u64::MAX {
            let _ = std::fs::remove_dir(vol_dir(&self.dir, vol));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
