//! The process that holds a store serves every mount of it: the first
//! `forkfs mount` opens the store, and later ones (other volumes, forks,
//! any number of read-only versions) ask it over the control socket to
//! mount them too. Each mount is one FUSE session on its own thread; the
//! process ends when its last mount does. forkfs-nbd hosts mounts the
//! same way ([`Host::resident`]), and stays when its last mount ends.

use super::fuse::Fuse;
use super::record::Record;
use super::workspace::{Atime, Workspace};
use forkfs::service::Extensions;
use forkfs::{Error, FsHead, Opened, Result, Store, VolumeKind};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The control request's name (see [`forkfs::service::Request::Extension`]).
pub const MOUNT_REQUEST: &str = "mount";

/// One mount, as asked for on the command line or over the control socket.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct MountRequest {
    pub spec: String,
    /// Absolute and canonical.
    pub dir: PathBuf,
    pub read_only: bool,
    pub checkpoint_every_ms: u64,
    pub threads: usize,
    /// Checked by [`mount_options`]: the kernel mount flags asked for.
    #[serde(default)]
    pub options: Vec<String>,
}

/// The `-o` options a mount takes (besides `ro`, which is `--read-only`).
const OPTIONS: [&str; 10] = [
    "nodev",
    "nosuid",
    "noexec",
    "dev",
    "suid",
    "exec",
    "noatime",
    "relatime",
    "strictatime",
    "atime",
];

/// Checks `-o` options: the flags to mount with, or which one is not
/// supported and why.
pub fn mount_options(given: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for o in given.iter().map(|o| o.trim()).filter(|o| !o.is_empty() && *o != "ro" && *o != "rw") {
        if !OPTIONS.contains(&o) {
            return Err(Error::invalid(format!(
                "unknown mount option {o:?} (supported: ro, {})",
                OPTIONS.join(", ")
            )));
        }
        out.push(o.to_string());
    }
    Ok(out)
}

/// The access-time mode the options ask for: the last of them wins, and
/// `relatime` is the default, as on Linux (`atime` means the default).
pub fn atime_mode(options: &[String]) -> Atime {
    let mut mode = Atime::Relative;
    for o in options {
        mode = match o.as_str() {
            "noatime" => Atime::Never,
            "relatime" | "atime" => Atime::Relative,
            "strictatime" => Atime::Strict,
            _ => mode,
        };
    }
    mode
}

pub struct Host {
    store: Store,
    state: Mutex<State>,
    /// Where the running mounts are (apart from `state`, so a stop that
    /// has run out of time can detach them while an unmount waits).
    points: Mutex<Vec<PathBuf>>,
    ended: Condvar,
    /// The process holds the store for more than its mounts (forkfs-nbd):
    /// it takes new mounts after its last one ends.
    resident: bool,
}

#[derive(Default)]
struct State {
    running: usize,
    /// Set once the last mount ended: the process is on its way out.
    closing: bool,
    /// Volumes whose live head is mounted (read-write or not), with where:
    /// one live mount per volume, since a mount's kernel caches and
    /// open-file table know nothing of another mount's changes. Versions
    /// are unlimited.
    live: HashMap<String, PathBuf>,
    unmounters: Vec<(PathBuf, fuser::SessionUnmounter)>,
    /// Why the first mount to fail ended (the process's exit status).
    failure: Option<Error>,
}

impl Host {
    /// Also answers mount requests arriving through `extensions`, those
    /// of the store's control socket.
    pub fn new(store: Store, extensions: &Extensions) -> Arc<Host> {
        Self::with(store, extensions, false)
    }

    /// A host in a process that serves more than mounts (forkfs-nbd): it
    /// goes on taking mounts after its last one ends, until [`Host::wait`].
    pub fn resident(store: Store, extensions: &Extensions) -> Arc<Host> {
        Self::with(store, extensions, true)
    }

    fn with(store: Store, extensions: &Extensions, resident: bool) -> Arc<Host> {
        let host = Arc::new(Host {
            store,
            state: Mutex::default(),
            points: Mutex::default(),
            ended: Condvar::new(),
            resident,
        });
        let weak: Weak<Host> = Arc::downgrade(&host);
        extensions.insert(
            MOUNT_REQUEST,
            Arc::new(move |args: &serde_json::Value| {
                let req: MountRequest = serde_json::from_value(args.clone())
                    .map_err(|e| Error::invalid(format!("bad mount request: {e}")))?;
                let host = weak.upgrade().ok_or_else(shutting_down)?;
                host.mount(&req)?;
                Ok(serde_json::json!({ "pid": std::process::id() }))
            }),
        );
        host
    }

    /// Mounts `req` and serves it on a thread of its own; returns once the
    /// kernel has the mount.
    pub fn mount(self: &Arc<Self>, req: &MountRequest) -> Result<()> {
        let vol = req.spec.split_once('@').map_or(req.spec.as_str(), |(v, _)| v).to_string();
        let live = !req.spec.contains('@');
        {
            let mut st = self.state.lock();
            if st.closing {
                return Err(shutting_down());
            }
            // Counted now: the process stays for this mount even if the
            // one waited for below was its last.
            st.running += 1;
            if live && !self.claim(&mut st, &vol, &req.dir) {
                st.running -= 1;
                self.ended.notify_all();
                return Err(Error::conflict(format!(
                    "{vol} is already mounted (one mount of a volume's live state; mount a version --read-only, or fork it)"
                )));
            }
        }
        let started = self.source(req).and_then(|(_, source)| self.start(req, &vol, source));
        if started.is_err() {
            self.end(&vol, live, None, None);
        }
        started
    }

    /// Takes `vol`'s one live mount for `dir`. A live mount whose kernel
    /// mount is gone is ending (saving its last checkpoint): waits for it,
    /// so a volume is mountable again the moment its unmount returns.
    fn claim(&self, st: &mut parking_lot::MutexGuard<'_, State>, vol: &str, dir: &Path) -> bool {
        let deadline = std::time::Instant::now() + forkfs::service::HOLDER_EXIT_WAIT;
        while let Some(at) = st.live.get(vol) {
            if is_forkfs_mount(at) || std::time::Instant::now() >= deadline {
                return false;
            }
            // Woken by every end; polled too, as the kernel's unmount
            // comes before the session notices it.
            self.ended.wait_for(st, Duration::from_millis(20));
        }
        st.live.insert(vol.to_string(), dir.to_path_buf());
        true
    }

    fn source(&self, req: &MountRequest) -> Result<(String, Opened<FsHead>)> {
        let (vol, version) = match req.spec.split_once('@') {
            Some((v, _)) => (v.to_string(), Some(self.store.graph().resolve_version(&req.spec)?)),
            None => (req.spec.clone(), None),
        };
        let rec = self.store.volumes().get(&vol)?;
        if rec.kind != VolumeKind::Fs {
            return Err(Error::invalid(format!(
                "{vol} is a block volume: serve it with forkfs-nbd serve"
            )));
        }
        let source = match version {
            Some(v) if req.read_only => Opened::Version(self.store.graph().frozen(&v)?),
            Some(_) => return Err(Error::invalid("a version can only be mounted --read-only")),
            None => Opened::Live(self.store.volumes().open_fs(&vol)?),
        };
        Ok((vol, source))
    }

    fn start(
        self: &Arc<Self>,
        req: &MountRequest,
        vol: &str,
        source: Opened<FsHead>,
    ) -> Result<()> {
        if let (Opened::Live(head), false) = (&source, req.read_only) {
            let n = head.reap_orphans()?;
            if n > 0 {
                tracing::info!(
                    volume = vol,
                    count = n,
                    "deleted files left open by an earlier mount"
                );
            }
        }
        let ws = Arc::new(Workspace::new(
            self.store.clone(),
            source,
            vol.to_string(),
            req.read_only,
            atime_mode(&req.options),
        ));
        let kernel = Arc::new(std::sync::OnceLock::new());
        let fuse = Fuse { ws: ws.clone(), kernel: kernel.clone(), no_opendir: false };
        let mut session = fuser::Session::new(fuse, &req.dir, &config(req, vol)).map_err(|e| {
            Error::new(
                forkfs::ErrorKind::Unavailable,
                format!("mounting {vol} on {}: {e}", req.dir.display()),
            )
        })?;
        let record = Record::write(self.store.dir(), &req.dir, &req.spec, self.resident)
            .map_err(|e| Error::new(forkfs::ErrorKind::Unavailable, format!("{e:#}")))?;
        let _ = kernel.set(session.notifier());
        // A version never changes: only a live mount needs the hook.
        let hook = ws.is_live().then(|| self.watch_restores(&ws, vol, session.notifier()));
        let names = self.watch_names(vol, session.notifier());
        self.points.lock().push(req.dir.clone());
        let mut unmounter = Some(session.unmount_callable());
        {
            let mut st = self.state.lock();
            // The process began to stop while this mount started: it ends
            // at once (with its last checkpoint), as the others do; the
            // unmount runs without the lock (it may wait on the kernel).
            if !st.closing {
                st.unmounters.push((req.dir.clone(), unmounter.take().expect("set")));
            }
        }
        if let Some(mut u) = unmounter
            && let Err(e) = u.unmount()
        {
            tracing::warn!(dir = %req.dir.display(), error = %e, "unmount failed");
        }
        let live = ws.is_live();
        let (host, req, vol) = (self.clone(), req.clone(), vol.to_string());
        std::thread::Builder::new().name(format!("forkfs-mount-{vol}")).spawn(move || {
            let every = Duration::from_millis(req.checkpoint_every_ms);
            let checkpoints = (!req.read_only && !every.is_zero())
                .then(|| super::checkpointer(host.store.clone(), vol.clone(), every));
            tracing::info!(volume = %vol, spec = %req.spec, dir = %req.dir.display(), "mounted");
            let result = session.run().map_err(|e| {
                Error::new(forkfs::ErrorKind::Unavailable, format!("FUSE session: {e}"))
            });
            drop(checkpoints);
            // The hook holds the session's notifier (its /dev/fuse fd).
            if let Some(h) = hook {
                host.store.graph().drop_restore_hook(h);
            }
            host.store.graph().drop_names_hook(names);
            let last = if req.read_only {
                Ok(())
            } else {
                host.store.graph().auto_version(&vol).map(|_| ())
            };
            let result = result.and(last);
            if let Err(e) = &result {
                tracing::error!(volume = %vol, error = %e, "mount ended with an error");
            }
            tracing::info!(volume = %vol, dir = %req.dir.display(), "unmounted");
            host.state.lock().unmounters.retain(|(d, _)| *d != req.dir);
            host.points.lock().retain(|d| *d != req.dir);
            host.end(&vol, live, result.err(), Some(record));
        })?;
        Ok(())
    }

    fn watch_restores(&self, ws: &Arc<Workspace>, vol: &str, notifier: fuser::Notifier) -> u64 {
        // Weak: the store keeps its hooks, and the workspace keeps the store.
        let ws = Arc::downgrade(ws);
        let vol = vol.to_string();
        self.store.graph().on_restore(Arc::new(move |r: &forkfs::Restored<'_>| {
            if let Some(w) = ws.upgrade().filter(|_| r.volume == vol) {
                super::invalidate(&w.store, r.before.root, r.to.root, &notifier);
            }
        }))
    }

    /// `.forkfs/versions` lists the volume's versions and tags: its
    /// listing, cached by the kernel, is dropped whenever a version name
    /// of the store changes (see `fuse/caches.rs`), and once more a moment
    /// later: a listing read before the change whose reply the kernel
    /// caches only after the first drop would otherwise stay.
    fn watch_names(&self, vol: &str, notifier: fuser::Notifier) -> u64 {
        // ENOENT when the kernel does not hold it: nothing cached.
        let drop_listing = move || {
            let _ = notifier.inval_inode(fuser::INodeNo(super::history::VERSIONS_DIR), 0, 0);
        };
        let (tx, rx) = crossbeam::channel::unbounded::<()>();
        let again = drop_listing.clone();
        // Ends when the hook goes (its sender with it).
        let spawned =
            std::thread::Builder::new().name(format!("forkfs-names-{vol}")).spawn(move || {
                while rx.recv().is_ok() {
                    std::thread::sleep(Duration::from_millis(100));
                    while rx.try_recv().is_ok() {}
                    again();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to drop `.forkfs/versions` listings twice");
        }
        self.store.graph().on_names_changed(Arc::new(move || {
            drop_listing();
            let _ = tx.send(());
        }))
    }

    /// A mount ended (or failed to start). Its record goes last, under the
    /// lock: `forkfs umount` returns once it is gone, so by then the volume
    /// can be mounted again, and the process (if this was its last mount)
    /// cannot have exited before.
    fn end(&self, vol: &str, live: bool, failure: Option<Error>, record: Option<Record>) {
        let mut st = self.state.lock();
        if live {
            st.live.remove(vol);
        }
        if let Some(r) = record {
            r.end(failure.as_ref());
        }
        if st.failure.is_none() {
            st.failure = failure;
        }
        st.running -= 1;
        if st.running == 0 && !self.resident {
            st.closing = true;
        }
        // Wakes `wait` and any mount waiting in `claim`.
        self.ended.notify_all();
    }

    /// The mount points this process serves now (never waits for an
    /// unmount in progress).
    pub fn mount_points(&self) -> Vec<PathBuf> {
        self.points.lock().clone()
    }

    /// Unmounts everything (a stop signal). Each mount is asked once: its
    /// unmounter is spent whether or not the kernel let go (a busy mount
    /// is left to [`Host::detach_all`]). The unmounts run without the
    /// lock, as the kernel may make them wait.
    pub fn unmount_all(&self) {
        let taken = std::mem::take(&mut self.state.lock().unmounters);
        for (dir, mut u) in taken {
            if let Err(e) = u.unmount() {
                tracing::warn!(dir = %dir.display(), error = %e, "unmount failed");
            }
        }
    }

    /// Detaches every mount at once, busy or not, without waiting for
    /// their last checkpoints: for a stop that ran out of time.
    pub fn detach_all(&self) {
        for dir in self.mount_points() {
            if let Err(e) = super::umount::unmount(&dir, true) {
                tracing::error!(dir = %dir.display(), error = %e, "cannot detach");
            }
        }
    }

    /// Refuses new mounts from now on (the process is stopping); a mount
    /// still starting ends as soon as it has started.
    pub fn close(&self) {
        self.state.lock().closing = true;
    }

    /// Whether a mount is running or starting.
    pub fn is_busy(&self) -> bool {
        self.state.lock().running > 0
    }

    /// Waits up to `limit` for every mount to end; whether they did.
    pub fn wait_for(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut st = self.state.lock();
        while st.running > 0 {
            if self.ended.wait_until(&mut st, deadline).timed_out() {
                return st.running == 0;
            }
        }
        true
    }

    /// Waits until no mount is running (at once if none ever started), and
    /// refuses new ones from then on; the first failure, if any.
    pub fn wait(&self) -> Option<Error> {
        let mut st = self.state.lock();
        while st.running > 0 {
            self.ended.wait(&mut st);
        }
        st.closing = true;
        st.failure.take()
    }
}

fn shutting_down() -> Error {
    Error::new(
        forkfs::ErrorKind::Unavailable,
        "the process holding the store is shutting down; try again",
    )
    .with_detail(forkfs::Detail::HolderExiting)
}

/// Whether `dir` is a forkfs mount point now (`/proc/self/mountinfo`).
pub fn is_forkfs_mount(dir: &Path) -> bool {
    mounted_at(dir).is_some_and(|(t, source)| is_forkfs(&t, &source))
}

/// Whether a mount table entry of type `fstype` from `source` is a forkfs
/// mount: FUSE (`fuse`, or `fuse.forkfs` when mounted through
/// fusermount3), its source named `forkfs:<volume>` (see [`config`]).
pub fn is_forkfs(fstype: &str, source: &str) -> bool {
    (fstype == "fuse" || fstype == "fuse.forkfs") && source.starts_with(FSNAME_PREFIX)
}

/// The (type, source) of the file system mounted at `dir` (the topmost
/// mount), if any.
pub fn mounted_at(dir: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.as_os_str().as_bytes();
    // Fields: id parent major:minor root mountpoint options... - type source
    // super-options; the mount point escapes space, tab, newline and \\.
    info.lines().rev().find_map(|line| {
        let point = line.split(' ').nth(4)?;
        let (_, after) = line.split_once(" - ")?;
        let mut f = after.split(' ');
        let (fstype, source) = (f.next()?.to_string(), f.next().unwrap_or("").to_string());
        (unescape(point) == want).then_some((fstype, source))
    })
}

/// How forkfs names its mounts' source: `forkfs:<volume>`.
const FSNAME_PREFIX: &str = "forkfs:";

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn config(req: &MountRequest, vol: &str) -> fuser::Config {
    use fuser::MountOption as M;
    let mut c = fuser::Config::default();
    c.mount_options = vec![
        M::FSName(format!("{FSNAME_PREFIX}{vol}")),
        M::Subtype("forkfs".into()),
        M::DefaultPermissions,
    ];
    // Access times are recorded here (see Workspace::accessed); the
    // kernel's flag only shows in the mount table.
    c.mount_options.push(match atime_mode(&req.options) {
        Atime::Never => M::NoAtime,
        _ => M::Atime,
    });
    if req.read_only {
        c.mount_options.push(M::RO);
    }
    for o in &req.options {
        c.mount_options.push(match o.as_str() {
            "nodev" => M::NoDev,
            "nosuid" => M::NoSuid,
            "noexec" => M::NoExec,
            "dev" => M::Dev,
            "suid" => M::Suid,
            "exec" => M::Exec,
            // The atime options were taken above.
            _ => continue,
        });
    }
    // Root's mounts serve every user, like any other filesystem.
    if unsafe { libc::geteuid() } == 0 {
        c.acl = fuser::SessionACL::All;
    }
    c.n_threads = Some(req.threads.clamp(1, 64));
    c.clone_fd = true;
    c
}

/// The mount point, checked: absolute, canonical, a directory.
pub fn mount_point(dir: &std::path::Path) -> Result<PathBuf> {
    let canon = std::fs::canonicalize(dir).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            forkfs::ErrorKind::NotFound
        } else {
            forkfs::ErrorKind::InvalidInput
        };
        Error::new(kind, format!("mount point {}: {e}", dir.display()))
    })?;
    if !canon.is_dir() {
        return Err(Error::invalid(format!("{} is not a directory", canon.display())));
    }
    Ok(canon)
}
