//! The upload outbox of a remote store: immutable objects (packs, version
//! records) land on local disk first and reach the object store in the
//! background.
//!
//! A put writes the object to `<store>/outbox/` and fsyncs it, so it is
//! durable before the caller goes on; worker threads then upload with
//! bounded concurrency and retry with backoff until the object store takes
//! it, and delete the local copy. Until then the object is served from its
//! local file, so to every reader (chunk reads, fsck, gc) the store holds
//! it already. A crash leaves the files; the next open uploads them.
//!
//! Order: packs upload in any order, but an object of any other kind (a
//! version record) waits until everything queued before it is in the
//! object store, so no other host ever sees a record whose data is
//! missing. [`Outbox::wait_through`] gives the same guarantee to a caller
//! about to publish a head.
//!
//! Backpressure: writers wait ([`Outbox::wait_for_room`]) while more than
//! the configured limit of bytes is pending, so an unreachable object store
//! fills the local disk no further than the limit plus one checkpoint.

use super::keys;
use crate::error::{Error, ErrorKind, Result};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, PutPayload};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Uploads at once.
const WORKERS: usize = 4;
/// The longest wait between retries of a failing upload.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What `forkfs status` shows of the outbox.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq, Eq)]
pub struct OutboxStats {
    pub pending_objects: u64,
    pub pending_bytes: u64,
    /// The configured limit of pending bytes; writers wait above it.
    pub limit_bytes: u64,
    /// Age of the oldest object waiting, in milliseconds.
    pub oldest_ms: u64,
    /// The last upload failure, if uploads have not succeeded since.
    pub last_error: Option<String>,
}

struct Entry {
    key: Path,
    len: u64,
    file: PathBuf,
    /// The file is complete and synced (else a put is still writing it).
    ready: bool,
    uploading: bool,
    /// No retry before this instant.
    not_before: Option<Instant>,
    queued: Instant,
}

#[derive(Default)]
struct State {
    next_seq: u64,
    entries: BTreeMap<u64, Entry>,
    pending_bytes: u64,
    /// Consecutive failures (backoff), and the last one.
    failures: u32,
    last_error: Option<String>,
    /// Advanced by every completed upload (drain watches it for progress).
    completed: u64,
    /// Writers are waiting for room (said once per episode).
    behind: bool,
    /// This process queued an object (closing then uploads).
    queued_here: bool,
    /// The uploads under way, to cancel when the outbox closes.
    running: Vec<tokio::task::AbortHandle>,
    stop: bool,
}

/// Called with each object just uploaded, before its local copy goes.
pub type UploadedHook = Arc<dyn Fn(&Path, &Bytes) + Send + Sync>;

struct Shared {
    dir: PathBuf,
    uploaded: Mutex<Option<UploadedHook>>,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Handle,
    limit: u64,
    /// `state.pending_bytes`, readable without the lock: writers check it
    /// on every write and lock only when over the limit.
    pending: AtomicU64,
    state: Mutex<State>,
    changed: Condvar,
}

pub struct Outbox {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// `packs/ab.pack` <-> `0000000000000007-packs%ab.pack`.
fn file_name(seq: u64, key: &Path) -> String {
    format!("{seq:016x}-{}", key.as_ref().replace('/', "%"))
}

fn parse_name(name: &str) -> Option<(u64, Path)> {
    let (seq, key) = name.split_once('-')?;
    let seq = u64::from_str_radix(seq, 16).ok().filter(|_| seq.len() == 16)?;
    let key = key.replace('%', "/");
    Path::parse(&key).ok().filter(|p| !p.as_ref().is_empty()).map(|p| (seq, p))
}

/// Whether other objects must wait for everything queued before this one.
fn is_barrier(key: &Path) -> bool {
    keys::parse_pack(key).is_none()
}

fn sync_dir(dir: &std::path::Path) -> Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

impl Outbox {
    /// Opens the outbox in `dir`, resuming the uploads a previous process
    /// left, and starts its workers.
    pub fn open(
        dir: PathBuf,
        store: Arc<dyn ObjectStore>,
        rt: tokio::runtime::Handle,
        limit: u64,
    ) -> Result<Outbox> {
        std::fs::create_dir_all(&dir)?;
        let mut state = State::default();
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            match parse_name(&name) {
                Some((seq, key)) => {
                    let len = e.metadata()?.len();
                    state.pending_bytes += len;
                    state.next_seq = state.next_seq.max(seq + 1);
                    let entry = Entry {
                        key,
                        len,
                        file: e.path(),
                        ready: true,
                        uploading: false,
                        not_before: None,
                        queued: Instant::now(),
                    };
                    state.entries.insert(seq, entry);
                }
                // A put cut short before its rename: nothing names it.
                None => std::fs::remove_file(e.path())?,
            }
        }
        if !state.entries.is_empty() {
            tracing::info!(
                objects = state.entries.len(),
                bytes = state.pending_bytes,
                "resuming uploads left by an earlier process"
            );
        }
        let shared = Arc::new(Shared {
            dir,
            uploaded: Mutex::new(None),
            store,
            rt,
            limit: limit.max(1),
            pending: AtomicU64::new(state.pending_bytes),
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
        let mut workers = Vec::new();
        for i in 0..WORKERS {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("forkfs-upload-{i}"))
                .spawn(move || worker(&s))?;
            workers.push(t);
        }
        Ok(Outbox { shared, workers })
    }

    /// Makes `data` durable on local disk under `key` and queues its
    /// upload. Never waits for room: writers do, before they write (see
    /// [`Outbox::wait_for_room`]), so a checkpoint under way always ends.
    pub fn put(&self, key: &Path, data: &Bytes) -> Result<()> {
        let s = &self.shared;
        let seq = {
            let mut st = s.state.lock();
            // Objects are immutable: a queued copy is this one (a retried
            // put); it keeps its place in the order.
            if st.entries.values().any(|e| e.key == *key && e.ready) {
                return Ok(());
            }
            st.queued_here = true;
            let seq = st.next_seq;
            st.next_seq += 1;
            let file = s.dir.join(file_name(seq, key));
            let entry = Entry {
                key: key.clone(),
                len: data.len() as u64,
                file,
                ready: false,
                uploading: false,
                not_before: None,
                queued: Instant::now(),
            };
            st.pending_bytes += entry.len;
            s.pending.store(st.pending_bytes, Ordering::Relaxed);
            st.entries.insert(seq, entry);
            seq
        };
        let written = self.write_file(seq, key, data);
        let mut st = s.state.lock();
        match written {
            Ok(()) => {
                if let Some(e) = st.entries.get_mut(&seq) {
                    e.ready = true;
                }
            }
            Err(e) => {
                if let Some(gone) = st.entries.remove(&seq) {
                    st.pending_bytes -= gone.len;
                    s.pending.store(st.pending_bytes, Ordering::Relaxed);
                }
                s.changed.notify_all();
                return Err(e);
            }
        }
        s.changed.notify_all();
        Ok(())
    }

    fn write_file(&self, seq: u64, key: &Path, data: &[u8]) -> Result<()> {
        use std::io::Write;
        let dir = &self.shared.dir;
        let tmp = dir.join(format!(".tmp-{seq:016x}"));
        let mut f =
            crate::files::private_file().write(true).create(true).truncate(true).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(file_name(seq, key)))?;
        sync_dir(dir)
    }

    /// Sets what to do with each object once uploaded (the chunk store
    /// keeps this host's own writes in its disk cache).
    pub fn on_uploaded(&self, hook: UploadedHook) {
        *self.shared.uploaded.lock() = Some(hook);
    }

    /// The local copy of a queued object: its file and length.
    fn staged(&self, key: &Path) -> Option<(PathBuf, u64)> {
        let st = self.shared.state.lock();
        st.entries.values().find(|e| e.ready && e.key == *key).map(|e| (e.file.clone(), e.len))
    }

    /// Reads `range` of a queued object; `None` if it is not queued (or
    /// finished uploading meanwhile: then it is in the object store).
    pub fn read_range(&self, key: &Path, range: std::ops::Range<u64>) -> Result<Option<Bytes>> {
        use std::os::unix::fs::FileExt;
        let Some((path, len)) = self.staged(key) else { return Ok(None) };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if range.end > len || range.start > range.end {
            return Err(Error::corrupt(format!("object {key} is shorter than {}", range.end)));
        }
        let n = usize::try_from(range.end - range.start)
            .map_err(|_| Error::invalid("range too large"))?;
        let mut buf = vec![0u8; n];
        file.read_exact_at(&mut buf, range.start)?;
        Ok(Some(Bytes::from(buf)))
    }

    /// The whole of a queued object.
    pub fn read(&self, key: &Path) -> Result<Option<Bytes>> {
        match self.staged(key) {
            Some((_, len)) => self.read_range(key, 0..len),
            None => Ok(None),
        }
    }

    /// The length of a queued object.
    pub fn len_of(&self, key: &Path) -> Option<u64> {
        self.staged(key).map(|(_, len)| len)
    }

    /// Queued objects under `prefix`, as a listing shows them.
    pub fn list(&self, prefix: &str) -> Vec<ObjectMeta> {
        let st = self.shared.state.lock();
        let now = chrono::Utc::now();
        st.entries
            .values()
            .filter(|e| e.ready && e.key.as_ref().starts_with(prefix))
            .map(|e| ObjectMeta {
                location: e.key.clone(),
                last_modified: now,
                size: e.len,
                e_tag: None,
                version: None,
            })
            .collect()
    }

    /// Drops a queued object (it never reaches the object store); waits
    /// for an upload under way to finish first, so the caller's delete of
    /// the remote copy comes after it.
    pub fn forget(&self, key: &Path) {
        let s = &self.shared;
        let mut st = s.state.lock();
        loop {
            let Some((&seq, e)) = st.entries.iter().find(|(_, e)| e.key == *key) else {
                return;
            };
            if e.uploading || !e.ready {
                s.changed.wait(&mut st);
                continue;
            }
            let e = st.entries.remove(&seq).expect("found above");
            st.pending_bytes -= e.len;
            s.pending.store(st.pending_bytes, Ordering::Relaxed);
            let _ = std::fs::remove_file(&e.file);
            s.changed.notify_all();
        }
    }

    /// The sequence number of the last object queued so far.
    pub fn tail(&self) -> u64 {
        self.shared.state.lock().next_seq
    }

    /// Waits until every object queued before `tail` is in the object
    /// store. Fails once uploads have made no progress for `stall` (the
    /// objects stay queued), or once `cancel` says so. `hurry`: retry now
    /// what is backing off (somebody waits for it).
    pub fn wait_through(
        &self,
        tail: u64,
        stall: Duration,
        hurry: bool,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        let s = &self.shared;
        let mut st = s.state.lock();
        if hurry {
            for e in st.entries.range_mut(..tail).map(|(_, e)| e) {
                e.not_before = None;
            }
            s.changed.notify_all();
        }
        let (mut seen, mut since) = (st.completed, Instant::now());
        loop {
            let Some((&first, _)) = st.entries.first_key_value() else { return Ok(()) };
            if first >= tail {
                return Ok(());
            }
            if st.stop || cancel() {
                return Err(Error::new(ErrorKind::Unavailable, "the store is closing"));
            }
            if st.completed != seen {
                (seen, since) = (st.completed, Instant::now());
            } else if since.elapsed() >= stall {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{} objects ({} bytes) are not yet in the object store: {}; they stay queued on local disk",
                        st.entries.range(..tail).count(),
                        st.entries.range(..tail).map(|(_, e)| e.len).sum::<u64>(),
                        st.last_error.as_deref().unwrap_or("no upload finished in time")
                    ),
                ));
            }
            s.changed.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// Waits until everything queued so far is in the object store.
    pub fn drain(&self, stall: Duration) -> Result<()> {
        self.wait_through(self.tail(), stall, true, &|| false)
    }

    /// Whether this process queued anything.
    pub fn queued_here(&self) -> bool {
        self.shared.state.lock().queued_here
    }

    /// Waits while the pending bytes are over the limit (writers call it
    /// before taking locks a checkpoint needs). The limit is soft: a
    /// checkpoint folds what writers wrote before it was reached.
    pub fn wait_for_room(&self) {
        let s = &self.shared;
        if s.pending.load(Ordering::Relaxed) <= s.limit {
            return;
        }
        let mut st = s.state.lock();
        while st.pending_bytes > s.limit && !st.stop {
            if !st.behind {
                tracing::warn!(
                    pending = st.pending_bytes,
                    limit = s.limit,
                    error = st.last_error.as_deref().unwrap_or("none yet"),
                    "uploads are behind: writers wait for the object store"
                );
                st.behind = true;
            }
            s.changed.wait(&mut st);
        }
    }

    pub fn stats(&self) -> OutboxStats {
        let st = self.shared.state.lock();
        OutboxStats {
            pending_objects: st.entries.len() as u64,
            pending_bytes: st.pending_bytes,
            limit_bytes: self.shared.limit,
            oldest_ms: st
                .entries
                .values()
                .map(|e| e.queued.elapsed().as_millis() as u64)
                .max()
                .unwrap_or(0),
            last_error: st.last_error.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        // Uploads under way are cancelled (their objects stay queued and
        // upload at the next open); no worker outlives the outbox, so none
        // can touch the files of a later one in this directory.
        {
            let mut st = self.shared.state.lock();
            st.stop = true;
            for a in st.running.drain(..) {
                a.abort();
            }
        }
        self.shared.changed.notify_all();
        for t in self.workers.drain(..) {
            let _ = t.join();
        }
    }
}

/// The next object a worker may upload: the lowest ready one not being
/// uploaded and not backing off; a barrier only once nothing is before it
/// (packs queued after a barrier may go meanwhile).
fn next_job(st: &State) -> Result<Option<(u64, Path, PathBuf)>, Instant> {
    let now = Instant::now();
    let mut earliest: Option<Instant> = None;
    for (i, (&seq, e)) in st.entries.iter().enumerate() {
        if is_barrier(&e.key) && i > 0 {
            continue;
        }
        if !e.ready || e.uploading {
            continue;
        }
        match e.not_before {
            Some(t) if t > now => earliest = Some(earliest.map_or(t, |x| x.min(t))),
            _ => return Ok(Some((seq, e.key.clone(), e.file.clone()))),
        }
    }
    earliest.map_or(Ok(None), Err)
}

fn worker(s: &Shared) {
    loop {
        let (seq, key, file) = {
            let mut st = s.state.lock();
            let job = loop {
                if st.stop {
                    return;
                }
                match next_job(&st) {
                    Ok(Some(job)) => break job,
                    Ok(None) => s.changed.wait(&mut st),
                    Err(at) => {
                        s.changed.wait_until(&mut st, at);
                    }
                }
            };
            if let Some(e) = st.entries.get_mut(&job.0) {
                e.uploading = true;
            }
            job
        };
        let res = upload(s, &key, &file);
        if let Ok(data) = &res {
            let hook = s.uploaded.lock().clone();
            if let Some(h) = hook {
                h(&key, data);
            }
        }
        let mut st = s.state.lock();
        match res {
            Ok(_) => {
                if let Some(e) = st.entries.remove(&seq) {
                    st.pending_bytes -= e.len;
                    s.pending.store(st.pending_bytes, Ordering::Relaxed);
                    let _ = std::fs::remove_file(&e.file);
                }
                st.failures = 0;
                st.last_error = None;
                st.completed += 1;
                if st.behind && st.pending_bytes <= s.limit {
                    tracing::info!(pending = st.pending_bytes, "uploads caught up: writers go on");
                    st.behind = false;
                }
            }
            // Its file is gone (removed by hand): nothing left to upload.
            Err(e) if e.kind() == ErrorKind::NotFound && !file.exists() => {
                tracing::error!(key = %key, "a queued object's file is missing; dropped from the queue");
                if let Some(gone) = st.entries.remove(&seq) {
                    st.pending_bytes -= gone.len;
                    s.pending.store(st.pending_bytes, Ordering::Relaxed);
                }
            }
            Err(e) => {
                st.failures = st.failures.saturating_add(1);
                let backoff = Duration::from_millis(250)
                    .saturating_mul(1 << st.failures.min(8))
                    .min(MAX_BACKOFF);
                if !st.stop {
                    tracing::warn!(key = %key, error = %e, retry_in = ?backoff, "upload failed");
                }
                st.last_error = Some(format!("{key}: {e}"));
                if let Some(en) = st.entries.get_mut(&seq) {
                    en.uploading = false;
                    en.not_before = Some(Instant::now() + backoff);
                }
            }
        }
        s.changed.notify_all();
    }
}

fn upload(s: &Shared, key: &Path, file: &std::path::Path) -> Result<Bytes> {
    let data = Bytes::from(std::fs::read(file)?);
    let (store, k, payload) = (s.store.clone(), key.clone(), data.clone());
    let task = {
        let mut st = s.state.lock();
        if st.stop {
            return Err(Error::new(ErrorKind::Unavailable, "the store is closing"));
        }
        let task = s.rt.spawn(async move { store.put(&k, PutPayload::from(payload)).await });
        st.running.retain(|a| !a.is_finished());
        st.running.push(task.abort_handle());
        task
    };
    match futures::executor::block_on(task) {
        Ok(r) => r.map(|_| data).map_err(Error::from),
        Err(e) => Err(Error::with_source(ErrorKind::Unavailable, "upload task ended", e)),
    }
}

#[cfg(test)]
mod tests;
