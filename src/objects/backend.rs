//! The object store behind a store, and the bridge from the core's blocking
//! API to `object_store`'s async one.
//!
//! The core is called from FUSE threads and from tokio tasks (through
//! `spawn_blocking`), so every call runs its future on the backend's own
//! runtime and waits for it with a plain blocking wait, which is sound from
//! any thread.

use super::keys;
use crate::error::{Error, Result};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

pub struct Backend {
    store: Arc<dyn ObjectStore>,
    /// Set for the embedded local store: puts are fsynced there, since
    /// `LocalFileSystem` only renames into place.
    local_root: Option<PathBuf>,
    /// The embedded store's directory, which only this process writes
    /// (under the store's lock): an object put again reuses its previous
    /// file (`local.rs`).
    exclusive: bool,
    runtime: Option<tokio::runtime::Runtime>,
    description: String,
    /// Open files of the local store, for ranged reads without a runtime
    /// hop and an open() per read. Objects are immutable, so a cached fd
    /// always reads what the key named.
    fds: quick_cache::sync::Cache<String, Arc<std::fs::File>>,
    /// Reads that take longer fail (remote stores).
    read_deadline: Option<std::time::Duration>,
    /// Remote stores: packs and version records go to local disk first
    /// and upload in the background (see `outbox.rs`).
    outbox: Option<super::outbox::Outbox>,
    /// Held until everything above has stopped: the store's lock, so no
    /// other process opens the store while upload workers still write in
    /// it. Declared last: dropped after `Drop::drop` joined them.
    _guard: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Backend {
    /// The embedded default: objects are files under `root`.
    pub fn local(root: PathBuf) -> Result<Backend> {
        std::fs::create_dir_all(&root)?;
        let fs = LocalFileSystem::new_with_prefix(&root)?;
        let description = format!("file://{}", root.display());
        let mut b = Backend::new(Arc::new(fs), Some(root), description)?;
        b.exclusive = true;
        Ok(b)
    }

    /// Any object store, e.g. one wrapped in a fault-injecting decorator.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        local_root: Option<PathBuf>,
        description: String,
    ) -> Result<Backend> {
        prepare_io()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("forkfs-io")
            .on_thread_start(block_sigpipe)
            .enable_all()
            .build()?;
        let fds = quick_cache::sync::Cache::new(256);
        Ok(Backend {
            store,
            local_root,
            exclusive: false,
            runtime: Some(runtime),
            description,
            fds,
            read_deadline: None,
            outbox: None,
            _guard: None,
        })
    }

    /// Keeps `guard` (the store's lock) until this backend and its upload
    /// workers have stopped.
    pub fn with_guard(mut self, guard: Arc<dyn std::any::Any + Send + Sync>) -> Backend {
        self._guard = Some(guard);
        self
    }

    /// Puts of immutable objects (packs, version records) land in `dir`
    /// and upload in the background; puts wait while more than `limit`
    /// bytes are pending.
    pub fn with_outbox(mut self, dir: PathBuf, limit: u64) -> Result<Backend> {
        let rt = self.runtime.as_ref().expect("runtime lives until drop").handle().clone();
        self.outbox = Some(super::outbox::Outbox::open(dir, self.store.clone(), rt, limit)?);
        Ok(self)
    }

    /// The upload queue (remote stores opened with one).
    pub fn outbox(&self) -> Option<&super::outbox::Outbox> {
        self.outbox.as_ref()
    }

    /// The outbox, if `key` is an object it takes.
    fn outbox_for(&self, key: &Path) -> Option<&super::outbox::Outbox> {
        let immutable = key.as_ref().starts_with("packs/") || key.as_ref().starts_with("versions/");
        self.outbox.as_ref().filter(|_| immutable)
    }

    /// Ranged reads (chunks, pack footers) fail once they have waited
    /// `d`, retries included, rather than hang on an unreachable store.
    /// Zero: no deadline.
    pub fn with_read_deadline(mut self, d: std::time::Duration) -> Backend {
        self.read_deadline = (!d.is_zero()).then_some(d);
        self
    }

    /// Runs a read under the read deadline.
    fn read<F, T>(&self, key: &Path, fut: F) -> Result<T>
    where
        F: Future<Output = object_store::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        self.within(key, self.read_deadline, "read deadline", fut)
    }

    /// Runs a request about `key` that fails once it has waited `deadline`
    /// (`what` names the deadline in the error).
    fn within<F, T>(
        &self,
        key: &Path,
        deadline: Option<std::time::Duration>,
        what: &'static str,
        fut: F,
    ) -> Result<T>
    where
        F: Future<Output = object_store::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let key = key.clone();
        self.run(async move {
            match deadline {
                None => Ok(fut.await?),
                Some(d) => match tokio::time::timeout(d, fut).await {
                    Ok(r) => Ok(r?),
                    Err(_) => Err(Error::new(
                        crate::error::ErrorKind::Unavailable,
                        format!(
                            "reading {key} from the object store took longer than the {} s {what}",
                            d.as_secs_f64()
                        ),
                    )),
                },
            }
        })
    }

    pub fn describe(&self) -> &str {
        &self.description
    }

    fn run<F, T>(&self, fut: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let rt = self.runtime.as_ref().expect("runtime lives until drop");
        let handle = rt.spawn(fut);
        match futures::executor::block_on(handle) {
            Ok(r) => r,
            Err(e) => Err(Error::with_source(
                crate::error::ErrorKind::Unavailable,
                "object store task failed",
                e,
            )),
        }
    }

    /// Writes an object and makes it durable before returning (on local
    /// disk, for an object the outbox takes).
    pub fn put(&self, key: &Path, data: Bytes) -> Result<()> {
        if let Some(o) = self.outbox_for(key) {
            return o.put(key, &data);
        }
        if let Some(root) = &self.local_root {
            self.fds.remove(key.as_ref());
            // Not a pack through its spare: packs are read through cached
            // descriptors, and one put again must not write over a file a
            // reader may still hold (a pack is never changed, so its spare
            // would only ever be the same bytes).
            let reuse = self.exclusive && keys::parse_pack(key).is_none();
            return super::local::put(&root.join(key.as_ref()), &data, reuse);
        }
        let store = self.store.clone();
        let k = key.clone();
        self.run(async move {
            store.put(&k, PutPayload::from(data)).await?;
            Ok(())
        })
    }

    /// Reads an object with the version a conditional put must name to
    /// replace it; `None` if there is no such object.
    pub fn get_versioned(&self, key: &Path) -> Result<Option<(Bytes, UpdateVersion)>> {
        let store = self.store.clone();
        let k = key.clone();
        self.run(async move {
            match store.get(&k).await {
                Ok(r) => {
                    let v = UpdateVersion {
                        e_tag: r.meta.e_tag.clone(),
                        version: r.meta.version.clone(),
                    };
                    Ok(Some((r.bytes().await?, v)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Writes an object only if it is still at `expected` (`None`: only if
    /// absent), and returns its new version. A lost race is a `Conflict`.
    pub fn put_conditional(
        &self,
        key: &Path,
        data: Bytes,
        expected: Option<UpdateVersion>,
    ) -> Result<UpdateVersion> {
        if let Some(root) = &self.local_root {
            return self.put_conditional_local(root, key, data, expected);
        }
        let store = self.store.clone();
        let k = key.clone();
        self.run(async move {
            let mode = expected.map_or(PutMode::Create, PutMode::Update);
            let opts = PutOptions { mode, ..Default::default() };
            let r = store.put_opts(&k, PutPayload::from(data), opts).await?;
            Ok(UpdateVersion { e_tag: r.e_tag, version: r.version })
        })
    }

    /// [`Backend::put_conditional`], where a conflict may be our own
    /// earlier attempt whose answer was lost and which the client retried:
    /// if the object now holds exactly `data`, the put did happen.
    pub fn put_or_same(
        &self,
        key: &Path,
        data: Bytes,
        expected: Option<UpdateVersion>,
    ) -> Result<UpdateVersion> {
        match self.put_conditional(key, data.clone(), expected) {
            Err(e) if e.kind() == crate::error::ErrorKind::Conflict => {
                match self.get_versioned(key)? {
                    Some((raw, v)) if raw == data => Ok(v),
                    _ => Err(e),
                }
            }
            r => r,
        }
    }

    /// [`Backend::put_conditional`] in a local directory (a `file://`
    /// remote), which `LocalFileSystem` cannot do (it has no conditional
    /// update): the comparison and the put are one step for every process
    /// on the host under an exclusive `flock` of `<root>/.conditional.lock`,
    /// which every conditional put takes. The version is the object's
    /// ETag (inode, mtime and size: every put makes a new file).
    fn put_conditional_local(
        &self,
        root: &std::path::Path,
        key: &Path,
        data: Bytes,
        expected: Option<UpdateVersion>,
    ) -> Result<UpdateVersion> {
        use std::os::fd::AsRawFd;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(".conditional.lock"))?;
        // SAFETY: flock on a descriptor this function owns; released when
        // `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let current = match self.head(key) {
            Ok(m) => Some(m.e_tag),
            Err(e) if e.kind() == crate::error::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let holds = match (&expected, &current) {
            (None, None) => true,
            (Some(want), Some(have)) => want.e_tag.is_some() && want.e_tag == *have,
            _ => false,
        };
        if !holds {
            return Err(Error::conflict(format!("{key}: changed by another writer")));
        }
        // A new file, never a spare: the version compares inodes.
        self.fds.remove(key.as_ref());
        super::local::put(&root.join(key.as_ref()), &data, false)?;
        let m = self.head(key)?;
        Ok(UpdateVersion { e_tag: m.e_tag, version: None })
    }

    pub fn get(&self, key: &Path) -> Result<Bytes> {
        if let Some(b) = self.outbox_for(key).map(|o| o.read(key)).transpose()?.flatten() {
            return Ok(b);
        }
        let store = self.store.clone();
        let k = key.clone();
        // Whole objects (records, whole packs for GC and fsck) may take long
        // on a slow link: no deadline.
        self.run(async move { Ok(store.get(&k).await?.bytes().await?) })
    }

    pub fn get_range(&self, key: &Path, range: Range<u64>) -> Result<Bytes> {
        if let Some(root) = &self.local_root {
            return self.local_range(root, key, range);
        }
        if let Some(o) = self.outbox_for(key)
            && let Some(b) = o.read_range(key, range.clone())?
        {
            return Ok(b);
        }
        let store = self.store.clone();
        let k = key.clone();
        self.read(key, async move { store.get_range(&k, range).await })
    }

    pub fn head(&self, key: &Path) -> Result<ObjectMeta> {
        if let Some(size) = self.outbox_for(key).and_then(|o| o.len_of(key)) {
            return Ok(ObjectMeta {
                location: key.clone(),
                last_modified: chrono::Utc::now(),
                size,
                e_tag: None,
                version: None,
            });
        }
        let store = self.store.clone();
        let k = key.clone();
        self.run(async move { Ok(store.head(&k).await?) })
    }

    /// [`Backend::head`] of an object no outbox holds, failing once it
    /// has waited `d` (a check that must not hold its caller up).
    pub fn head_within(&self, key: &Path, d: std::time::Duration) -> Result<ObjectMeta> {
        let (store, k) = (self.store.clone(), key.clone());
        self.within(key, Some(d), "check deadline", async move { store.head(&k).await })
    }

    pub fn delete(&self, key: &Path) -> Result<()> {
        self.fds.remove(key.as_ref());
        if let Some(o) = self.outbox_for(key) {
            o.forget(key);
        }
        let store = self.store.clone();
        let k = key.clone();
        self.run(async move {
            match store.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })?;
        match &self.local_root {
            Some(root) if self.exclusive => super::local::remove_spare(&root.join(key.as_ref())),
            _ => Ok(()),
        }
    }

    /// Moves an object (a copy then a delete on most object stores).
    pub fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.fds.remove(from.as_ref());
        if let Some(data) = self.outbox_for(from).map(|o| o.read(from)).transpose()?.flatten() {
            self.put(to, data)?;
            return self.delete(from);
        }
        let store = self.store.clone();
        let (f, t) = (from.clone(), to.clone());
        self.run(async move { Ok(store.rename(&f, &t).await?) })?;
        if let Some(root) = self.local_root.as_ref().filter(|_| self.exclusive) {
            super::local::remove_spare(&root.join(from.as_ref()))?;
        }
        self.sync_local(to)
    }

    /// The objects under `prefix`, queued ones included (once each).
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        // Queued ones first: one that finishes uploading meanwhile is then
        // in the object store's listing, never in neither.
        let queued = self.outbox.as_ref().map(|o| o.list(prefix)).unwrap_or_default();
        let store = self.store.clone();
        let p = Path::from(prefix);
        let mut out =
            self.run(async move { Ok(store.list(Some(&p)).try_collect::<Vec<_>>().await?) })?;
        let listed: std::collections::HashSet<Path> =
            out.iter().map(|m| m.location.clone()).collect();
        out.extend(queued.into_iter().filter(|m| !listed.contains(&m.location)));
        Ok(out)
    }

    fn local_range(&self, root: &std::path::Path, key: &Path, range: Range<u64>) -> Result<Bytes> {
        use std::os::unix::fs::FileExt;
        let file = match self.fds.get(key.as_ref()) {
            Some(f) => f,
            None => {
                let f =
                    std::fs::File::open(root.join(key.as_ref())).map_err(|e| match e.kind() {
                        std::io::ErrorKind::NotFound => {
                            Error::not_found(format!("object {key} is missing"))
                        }
                        _ => Error::from(e).context(format!("opening object {key}")),
                    })?;
                let f = Arc::new(f);
                self.fds.insert(key.to_string(), f.clone());
                f
            }
        };
        let len = usize::try_from(range.end.saturating_sub(range.start))
            .map_err(|_| Error::invalid("range too large"))?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, range.start).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                Error::corrupt(format!("object {key} is shorter than {}", range.end))
            }
            _ => Error::from(e).context(format!("reading object {key}")),
        })?;
        Ok(Bytes::from(buf))
    }

    fn sync_local(&self, key: &Path) -> Result<()> {
        let Some(root) = &self.local_root else { return Ok(()) };
        let path = root.join(key.as_ref());
        let f = std::fs::File::open(&path)?;
        // object_store creates it with the umask's mode: the owner's only.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(crate::files::FILE_MODE))?;
        f.sync_all()?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Makes tokio's process-wide signal state, which every runtime with I/O
/// shares and which tokio makes when the first one is built. Tokio panics
/// if the process is out of file descriptors at that moment (EMFILE under
/// a low `ulimit -n`), so this checks first that descriptors are free and
/// is called early, before the index's threads open files: a low limit is
/// then an EMFILE error, never a panic. Cheap after the first call.
pub fn prepare_io() -> Result<()> {
    static READY: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if READY.get().is_some() {
        return Ok(());
    }
    // A runtime takes an epoll fd and an eventfd; the signal state a
    // socket pair, and each runtime a duplicate of one end.
    let spare =
        (0..6).map(|_| std::fs::File::open("/dev/null")).collect::<std::io::Result<Vec<_>>>();
    drop(spare.map_err(|e| Error::from(e).context("starting the I/O runtime"))?);
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| Error::from(e).context("starting the I/O runtime"))?;
    let _ = READY.set(());
    Ok(())
}

/// A peer that closes a connection mid-request must fail that request
/// (EPIPE), never kill the process: the `forkfs` command restores SIGPIPE's
/// default action for its output, and HTTP clients write with `writev`,
/// which raises it. Blocked in the threads that do network I/O, the signal
/// stays pending there and the write returns the error.
fn block_sigpipe() {
    // SAFETY: plain libc calls on a local, initialized signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // Upload workers stop before the runtime they upload on.
        self.outbox.take();
        // A runtime may not be dropped with a blocking wait inside async code.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
