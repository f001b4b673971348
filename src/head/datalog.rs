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
//! last sync; the caller syncs the RocksDB WAL after it, so a synced
//! overlay entry never names unsynced data. An entry that reached disk
//! without its data (power loss before any flush) fails its CRC on read.

use crate::error::{Error, Result};
use crate::id::VolumeId;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

struct Segment {
    seq: u64,
    file: File,
    len: AtomicU64,
    dirty: AtomicBool,
}

#[derive(Default)]
struct VolumeLog {
    /// The segment new appends go to; `None` until the first append.
    current: Option<Arc<Segment>>,
    /// Older segments opened for reading.
    readers: HashMap<u64, Arc<File>>,
}

pub struct DataLog {
    dir: PathBuf,
    volumes: Mutex<HashMap<VolumeId, VolumeLog>>,
}

fn vol_dir(dir: &Path, vol: VolumeId) -> PathBuf {
    dir.join(format!("{:016x}", vol.0))
}

fn seg_path(dir: &Path, vol: VolumeId, seq: u64) -> PathBuf {
    vol_dir(dir, vol).join(format!("{seq:016x}.seg"))
}

/// Segment numbers present on disk for a volume.
fn list_segments(dir: &Path, vol: VolumeId) -> Result<Vec<u64>> {
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
        if let Some(seq) = name.strip_suffix(".seg").and_then(|s| u64::from_str_radix(s, 16).ok()) {
            out.push(seq);
        }
    }
    out.sort_unstable();
    Ok(out)
}

impl DataLog {
    pub fn open(dir: PathBuf) -> Result<DataLog> {
        std::fs::create_dir_all(&dir)?;
        Ok(DataLog { dir, volumes: Mutex::new(HashMap::new()) })
    }

    fn current(&self, vol: VolumeId) -> Result<Arc<Segment>> {
        let mut vols = self.volumes.lock();
        let v = vols.entry(vol).or_default();
        if let Some(s) = &v.current {
            return Ok(s.clone());
        }
        let seq = list_segments(&self.dir, vol)?.last().map_or(1, |s| s + 1);
        let seg = self.create(vol, seq)?;
        v.current = Some(seg.clone());
        Ok(seg)
    }

    fn create(&self, vol: VolumeId, seq: u64) -> Result<Arc<Segment>> {
        std::fs::create_dir_all(vol_dir(&self.dir, vol))?;
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(seg_path(&self.dir, vol, seq))?;
        Ok(Arc::new(Segment { seq, file, len: AtomicU64::new(0), dirty: AtomicBool::new(true) }))
    }

    /// Appends one block's data; concurrent appends do not serialize.
    pub fn append(&self, vol: VolumeId, data: &[u8]) -> Result<LogRef> {
        let seg = self.current(vol)?;
        let offset = seg.len.fetch_add(data.len() as u64, Ordering::Relaxed);
        seg.file.write_all_at(data, offset)?;
        seg.dirty.store(true, Ordering::Release);
        let len = u32::try_from(data.len()).map_err(|_| Error::invalid("block over 4 GiB"))?;
        Ok(LogRef { seq: seg.seq, offset, len, crc: crc32fast::hash(data) })
    }

    /// Reads and verifies one block's data.
    pub fn read(&self, vol: VolumeId, r: &LogRef) -> Result<Bytes> {
        let file = {
            let mut vols = self.volumes.lock();
            let v = vols.entry(vol).or_default();
            match &v.current {
                Some(s) if s.seq == r.seq => None,
                _ => Some(match v.readers.get(&r.seq) {
                    Some(f) => f.clone(),
                    None => {
                        let f = File::open(seg_path(&self.dir, vol, r.seq)).map_err(|e| {
                            Error::corrupt(format!("data log segment {} is missing: {e}", r.seq))
                        })?;
                        let f = Arc::new(f);
                        v.readers.insert(r.seq, f.clone());
                        f
                    }
                }),
            }
        };
        let mut buf = vec![0u8; r.len as usize];
        let res = match &file {
            Some(f) => f.read_exact_at(&mut buf, r.offset),
            None => self.current(vol)?.file.read_exact_at(&mut buf, r.offset),
        };
        res.map_err(|e| Error::corrupt(format!("data log read failed: {e}")))?;
        if crc32fast::hash(&buf) != r.crc {
            return Err(Error::corrupt(format!(
                "dirty data at log segment {} offset {} fails its checksum (lost in a crash before any flush?)",
                r.seq, r.offset
            )));
        }
        Ok(Bytes::from(buf))
    }

    /// Makes every append so far durable.
    pub fn sync(&self) -> Result<()> {
        let segs: Vec<Arc<Segment>> =
            self.volumes.lock().values().filter_map(|v| v.current.clone()).collect();
        for s in segs {
            if s.dirty.swap(false, Ordering::AcqRel) {
                s.file.sync_data()?;
            }
        }
        Ok(())
    }

    /// Starts a new segment for `vol` and returns its number: the floor
    /// that a checkpoint records. Call with the head's gate held exclusively.
    pub fn rotate(&self, vol: VolumeId) -> Result<u64> {
        let mut vols = self.volumes.lock();
        let v = vols.entry(vol).or_default();
        let next = match &v.current {
            Some(s) if s.len.load(Ordering::Relaxed) == 0 => return Ok(s.seq),
            Some(s) => s.seq + 1,
            None => list_segments(&self.dir, vol)?.last().map_or(1, |s| s + 1),
        };
        v.current = Some(self.create(vol, next)?);
        Ok(next)
    }

    /// Deletes the segments of `vol` below `floor` (all of them with `u64::MAX`).
    pub fn drop_below(&self, vol: VolumeId, floor: u64) -> Result<()> {
        {
            let mut vols = self.volumes.lock();
            if let Some(v) = vols.get_mut(&vol) {
                v.readers.retain(|seq, _| *seq >= floor);
                if v.current.as_ref().is_some_and(|s| s.seq < floor) {
                    v.current = None;
                }
            }
        }
        for seq in list_segments(&self.dir, vol)? {
            if seq < floor {
                std::fs::remove_file(seg_path(&self.dir, vol, seq))?;
            }
        }
        if floor == u64::MAX {
            let _ = std::fs::remove_dir(vol_dir(&self.dir, vol));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_read_back_and_rotation_drops_old_segments() {
        let dir = tempfile::tempdir().unwrap();
        let log = DataLog::open(dir.path().to_path_buf()).unwrap();
        let v = VolumeId(3);
        let a = log.append(v, b"first block").unwrap();
        let b = log.append(v, b"second").unwrap();
        assert_eq!(&log.read(v, &b).unwrap()[..], b"second");
        log.sync().unwrap();
        let floor = log.rotate(v).unwrap();
        let c = log.append(v, b"after rotation").unwrap();
        assert_eq!(&log.read(v, &a).unwrap()[..], b"first block");
        log.drop_below(v, floor).unwrap();
        assert!(log.read(v, &a).is_err(), "dropped segment must not be readable");
        assert_eq!(&log.read(v, &c).unwrap()[..], b"after rotation");
        assert_eq!(LogRef::decode(&c.encode()).unwrap(), c);
        // A reopened log starts a new segment and still reads the old one.
        drop(log);
        let log = DataLog::open(dir.path().to_path_buf()).unwrap();
        let d = log.append(v, b"new process").unwrap();
        assert!(d.seq > c.seq);
        assert_eq!(&log.read(v, &c).unwrap()[..], b"after rotation");
        // Damaged data is detected, not returned.
        let bad = LogRef { crc: c.crc ^ 1, ..c };
        assert_eq!(log.read(v, &bad).unwrap_err().kind(), crate::ErrorKind::Corrupt);
    }
}
