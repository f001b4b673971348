//! A filesystem that loses what was not synced, to cut the power under a
//! store (the model of LazyFS, dsrhaslab/lazyfs): a FUSE passthrough over a
//! backing directory that keeps file data written since the last
//! `fsync`/`fdatasync` in its own memory, as a page cache does, and drops
//! it all on [`Mounted::cut_power`]. Reads see the unsynced data; the
//! backing directory holds only what was synced, which is what a machine
//! sees after it lost power.
//!
//! The model is LazyFS's: file data (and sizes) are lost unless synced;
//! namespace operations (create, rename, unlink, mkdir) reach the backing
//! directory at once, as a journalling filesystem commits them with the
//! next fsync of the file anyway. Served in the test's own process.
//!
//! It can also fail reads of chosen files with EIO ([`Mounted::fail_reads`]),
//! and their writes and fsyncs ([`Mounted::fail_writes`]),
//! as a disk with bad sectors does.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod ops;

const PAGE: u64 = 4096;
const ROOT: u64 = 1;
/// No caching in the kernel: sizes change with unsynced writes here.
const TTL: Duration = Duration::ZERO;

/// Data written to a file since its last sync.
#[derive(Default)]
struct Dirty {
    /// The file's size as its writers see it.
    size: u64,
    pages: BTreeMap<u64, Vec<u8>>,
}

#[derive(Default)]
struct State {
    /// Inode (the backing file's) -> path relative to the backing root.
    paths: HashMap<u64, PathBuf>,
    dirty: HashMap<u64, Dirty>,
    /// Open handles: file handle -> (inode, file).
    handles: HashMap<u64, (u64, Arc<File>)>,
    /// Reads of files whose path (relative to the root) contains one of
    /// these fail with EIO: a disk failing some sectors.
    failing: Vec<String>,
    /// Writes and fsyncs of files whose path contains one of these fail
    /// with EIO: a disk that stopped taking writes.
    failing_writes: Vec<String>,
    /// Bumped when an inode is gone: the backing file system hands its
    /// number to new files, and the kernel must not take one for the
    /// other (it keeps pages and attributes per node).
    generations: HashMap<u64, u64>,
}

impl State {
    /// Whether reads of `ino` fail (see [`Mounted::fail_reads`]).
    fn read_fails(&self, ino: u64) -> bool {
        self.matches(ino, &self.failing)
    }

    /// Whether writes and fsyncs of `ino` fail (see [`Mounted::fail_writes`]).
    fn write_fails(&self, ino: u64) -> bool {
        self.matches(ino, &self.failing_writes)
    }

    fn matches(&self, ino: u64, patterns: &[String]) -> bool {
        let Some(path) = self.paths.get(&ino) else { return false };
        let path = path.to_string_lossy();
        patterns.iter().any(|p| path.contains(p.as_str()))
    }

    /// The unsynced data of `ino`, begun at the `backing` file's size.
    fn dirty_of(&mut self, ino: u64, backing: u64) -> &mut Dirty {
        self.dirty.entry(ino).or_insert_with(|| Dirty { size: backing, ..Default::default() })
    }
}

/// What happened so far (for a test's report).
#[derive(Default)]
pub struct Counters {
    pub syncs: AtomicU64,
    pub bytes_dropped: AtomicU64,
}

struct LazyFs {
    backing: PathBuf,
    state: Arc<Mutex<State>>,
    next_fh: AtomicU64,
    counters: Arc<Counters>,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from(e)
}

fn kind_of(m: &std::fs::Metadata) -> FileType {
    FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 { UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32) } else { UNIX_EPOCH }
}

impl LazyFs {
    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn path_of(&self, ino: u64) -> Result<PathBuf, Errno> {
        if ino == ROOT {
            return Ok(PathBuf::new());
        }
        self.state.lock().paths.get(&ino).cloned().ok_or(Errno::ENOENT)
    }

    /// The inode number the kernel sees for a backing file.
    fn ino_of(rel: &Path, m: &std::fs::Metadata) -> u64 {
        if rel.as_os_str().is_empty() { ROOT } else { m.ino() }
    }

    fn attr(&self, ino: u64, m: &std::fs::Metadata) -> FileAttr {
        let size = self.state.lock().dirty.get(&ino).map_or(m.len(), |d| d.size);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.ctime(), m.ctime_nsec()),
            kind: kind_of(m),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Stats `rel`, remembers its inode, and gives its attributes.
    fn entry(&self, rel: PathBuf) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.full(&rel)).map_err(errno)?;
        let ino = Self::ino_of(&rel, &m);
        let attr = self.attr(ino, &m);
        if ino != ROOT {
            self.state.lock().paths.insert(ino, rel);
        }
        Ok(attr)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path_of(parent.0)?.join(name))
    }

    /// Writes the dirty data of `ino` to its backing file.
    /// `file` may be any handle of the inode, a read-only one too (fsync
    /// through it syncs the inode, as on a disk).
    fn sync_ino(&self, ino: u64, file: &File) -> Result<(), Errno> {
        // Held while the pages go to the backing file: a reader between
        // taking them out and writing them would find the file short.
        let mut st = self.state.lock();
        let Some(d) = st.dirty.get(&ino) else { return Ok(()) };
        // Reopened for writing through the handle, whatever its name now.
        let file = &std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(errno)?;
        for (idx, page) in &d.pages {
            let at = idx * PAGE;
            if at >= d.size {
                continue;
            }
            let n = (d.size - at).min(PAGE) as usize;
            file.write_all_at(&page[..n], at).map_err(errno)?;
        }
        file.set_len(d.size).map_err(errno)?;
        st.dirty.remove(&ino);
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Swaps two names (renameat2's RENAME_EXCHANGE), at once like every
    /// namespace change here; each file keeps its own unsynced data.
    fn exchange(&self, a: &Path, b: &Path) -> Result<(), Errno> {
        let c = |p: &Path| {
            CString::new(self.full(p).into_os_string().into_vec()).map_err(|_| Errno::EINVAL)
        };
        let (ca, cb) = (c(a)?, c(b)?);
        // SAFETY: both are valid NUL-terminated paths that outlive the call.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                ca.as_ptr(),
                libc::AT_FDCWD,
                cb.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if r != 0 {
            return Err(errno(std::io::Error::last_os_error()));
        }
        let under = |to: &Path, rest: &Path| {
            if rest.as_os_str().is_empty() { to.to_path_buf() } else { to.join(rest) }
        };
        let mut st = self.state.lock();
        for p in st.paths.values_mut() {
            let swapped = if let Ok(rest) = p.strip_prefix(a) {
                under(b, rest)
            } else if let Ok(rest) = p.strip_prefix(b) {
                under(a, rest)
            } else {
                continue;
            };
            *p = swapped;
        }
        Ok(())
    }

    /// Drops what is kept of an inode whose last name and last handle are
    /// gone (`links` names left): the backing file system reuses its
    /// number for new files.
    fn forget_if_gone(&self, ino: u64, links: u64) {
        let mut st = self.state.lock();
        if links == 0 && !st.handles.values().any(|(i, _)| *i == ino) {
            st.dirty.remove(&ino);
            st.paths.remove(&ino);
            *st.generations.entry(ino).or_default() += 1;
        }
    }

    fn generation(&self, ino: u64) -> Generation {
        Generation(self.state.lock().generations.get(&ino).copied().unwrap_or(0))
    }

    fn handle(&self, fh: FileHandle) -> Result<(u64, Arc<File>), Errno> {
        self.state.lock().handles.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn open_file(&self, ino: u64, flags: i32) -> Result<FileHandle, Errno> {
        let rel = self.path_of(ino)?;
        let acc = flags & libc::O_ACCMODE;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(acc != libc::O_RDONLY)
            .open(self.full(&rel))
            .map_err(errno)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.state.lock().handles.insert(fh, (ino, Arc::new(f)));
        Ok(FileHandle(fh))
    }
}

/// A lazy filesystem mounted in this process.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    state: Arc<Mutex<State>>,
    pub counters: Arc<Counters>,
    pub mountpoint: PathBuf,
}

impl Mounted {
    /// Mounts at `mountpoint` a lazy view of `backing` (both existing dirs).
    pub fn mount(backing: &Path, mountpoint: &Path) -> Mounted {
        let state: Arc<Mutex<State>> = Arc::default();
        let counters: Arc<Counters> = Arc::default();
        let fs = LazyFs {
            backing: backing.to_path_buf(),
            state: state.clone(),
            next_fh: AtomicU64::new(1),
            counters: counters.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("lazyfs".into())];
        config.acl = fuser::SessionACL::All;
        config.n_threads = Some(4);
        config.clone_fd = true;
        let session = fuser::Session::new(fs, mountpoint, &config)
            .and_then(|s| s.spawn())
            .unwrap_or_else(|e| panic!("mounting lazyfs on {}: {e}", mountpoint.display()));
        Mounted { session: Some(session), state, counters, mountpoint: mountpoint.to_path_buf() }
    }

    /// From now on reads of files whose path relative to the root contains
    /// one of `patterns` fail with EIO (none: every read works again).
    pub fn fail_reads(&self, patterns: &[&str]) {
        self.state.lock().failing = patterns.iter().map(|p| p.to_string()).collect();
    }

    /// From now on writes and fsyncs of files whose path relative to the
    /// root contains one of `patterns` fail with EIO (none: all work again).
    pub fn fail_writes(&self, patterns: &[&str]) {
        self.state.lock().failing_writes = patterns.iter().map(|p| p.to_string()).collect();
    }

    /// Power lost: every byte not synced is gone, and the filesystem is
    /// unmounted (kill its users first). Returns the bytes dropped.
    pub fn cut_power(mut self) -> u64 {
        let dropped: u64 = {
            let mut st = self.state.lock();
            let n = st.dirty.values().map(|d| d.pages.len() as u64 * PAGE).sum();
            st.dirty.clear();
            st.handles.clear();
            n
        };
        self.counters.bytes_dropped.fetch_add(dropped, Ordering::Relaxed);
        self.unmount();
        dropped
    }

    fn unmount(&mut self) {
        let Some(s) = self.session.take() else { return };
        if s.umount_and_join().is_err() {
            // Still busy (a process we could not kill in time): detach it.
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.unmount();
    }
}
