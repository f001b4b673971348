//! `forkfs mount` and `forkfs umount`: an fs volume (or one of its
//! versions, read-only) through the kernel's FUSE. The mount process holds
//! the store, so `forkfs snapshot|fork|restore|log|diff` reach it through
//! the store's control socket while it runs.

mod convert;
mod fuse;
mod history;
mod record;
mod workspace;

use anyhow::{Context, Result, bail};
use forkfs::{Error, Store, VolumeKind};
use std::io::{BufRead, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use workspace::{Source, Workspace};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The fs volume (VOL), or a version of it (VOL@VERSION, with --read-only)
    pub spec: String,
    /// An existing directory (what it holds is hidden while mounted)
    pub dir: PathBuf,
    /// Refuse every change (the only way to mount a version)
    #[arg(long)]
    pub read_only: bool,
    /// Return once mounted, leaving the mount running in the background
    #[arg(long)]
    pub daemon: bool,
    /// Record a version this often when something changed (0 = never)
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub checkpoint_every: Duration,
    /// Threads answering the kernel's requests
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// The mount point
    pub dir: PathBuf,
}

/// Set in the background child of `--daemon`: it reports on stdout.
const READY_ENV: &str = "FORKFS_MOUNT_REPORT";

pub fn mount(g: &crate::cli::Global, a: Args) -> Result<()> {
    if a.daemon {
        return daemonize(g, &a);
    }
    let report = std::env::var_os(READY_ENV).is_some();
    match serve(g, &a, report) {
        Ok(()) => Ok(()),
        Err(e) if report => {
            println!("error: {}", crate::cli::one_line(&e));
            Err(e)
        }
        Err(e) => Err(e),
    }
}

fn serve(g: &crate::cli::Global, a: &Args, report: bool) -> Result<()> {
    // Before any thread starts (the store starts several): every thread
    // inherits the mask, so only the signal thread ever receives them.
    let signals = block_stop_signals();
    let dir = std::fs::canonicalize(&a.dir).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            forkfs::ErrorKind::NotFound
        } else {
            forkfs::ErrorKind::InvalidInput
        };
        Error::new(kind, format!("mount point {}: {e}", a.dir.display()))
    })?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let store_dir = g.store_dir();
    let store = open_store(&store_dir, a)?;
    let (vol_name, version) = match a.spec.split_once('@') {
        Some((v, _)) => (v.to_string(), Some(store.resolve_version(&a.spec)?)),
        None => (a.spec.clone(), None),
    };
    let vol = store.volume(&vol_name)?;
    if vol.kind != VolumeKind::Fs {
        bail!(Error::invalid(format!(
            "{vol_name} is a block volume: serve it with forkfs nbd serve"
        )));
    }
    let source = match version {
        Some(v) if a.read_only => Source::Version(v),
        Some(_) => bail!(Error::invalid("a version can only be mounted --read-only")),
        None => {
            let head = store.open_volume(&vol_name)?;
            if !a.read_only {
                let n = head.reap_orphans()?;
                if n > 0 {
                    tracing::info!(count = n, "deleted files left open by an earlier mount");
                }
            }
            Source::Live(head)
        }
    };
    let ws = Arc::new(Workspace::new(store.clone(), source, vol_name.clone(), a.read_only));
    let _control = forkfs::control::serve(store.clone())?;
    let mut session =
        fuser::Session::new(fuse::Fuse { ws: ws.clone() }, &dir, &config(a, &vol_name))
            .with_context(|| format!("mounting {} on {}", vol_name, dir.display()))?;
    let _record = record::Record::write(&store_dir, &dir, &vol_name)?;
    let notifier = session.notifier();
    // Weak: the store keeps its hooks, and the workspace keeps the store.
    let hook_ws = Arc::downgrade(&ws);
    let hook_vol = vol_name.clone();
    store.on_restore(Arc::new(move |r: &forkfs::store::Restored<'_>| {
        if let Some(ws) = hook_ws.upgrade().filter(|_| r.volume == hook_vol) {
            invalidate(&ws.store, r.before.root, r.to.root, &notifier);
        }
    }));
    stop_on_signals(signals, session.unmount_callable())?;
    let stop: Stop = Arc::default();
    let checkpoints = (!a.read_only && !a.checkpoint_every.is_zero())
        .then(|| checkpointer(store.clone(), vol_name.clone(), a.checkpoint_every, stop.clone()));
    if report {
        println!("ready {}", std::process::id());
        let _ = std::io::stdout().flush();
        // The parent stops reading now: nothing more goes to that pipe.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            use std::os::fd::AsRawFd;
            unsafe { libc::dup2(null.as_raw_fd(), 1) };
        }
    } else {
        eprintln!(
            "forkfs: {} mounted on {} (forkfs umount {} to stop)",
            a.spec,
            dir.display(),
            dir.display()
        );
    }
    let result = session.run();
    *stop.0.lock() = true;
    stop.1.notify_all();
    if let Some(t) = checkpoints {
        let _ = t.join();
    }
    if !a.read_only {
        checkpoint(&store, &vol_name).context("final checkpoint")?;
    }
    store.sync()?;
    result.context("FUSE session")?;
    Ok(())
}

fn open_store(dir: &Path, a: &Args) -> Result<Store> {
    match Store::open(dir) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == forkfs::ErrorKind::Conflict => {
            let held = record::describe_holder(dir);
            bail!(Error::conflict(format!(
                "cannot mount {}: the store at {} is in use by another process{held}; one process serves a store (unmount it or stop that server first)",
                a.spec,
                dir.display()
            )))
        }
        Err(e) => Err(e.into()),
    }
}

fn config(a: &Args, vol: &str) -> fuser::Config {
    use fuser::MountOption as M;
    let mut c = fuser::Config::default();
    c.mount_options = vec![
        M::FSName(format!("forkfs:{vol}")),
        M::Subtype("forkfs".into()),
        M::DefaultPermissions,
        M::NoAtime,
    ];
    if a.read_only {
        c.mount_options.push(M::RO);
    }
    // Root's mounts serve every user, like any other filesystem.
    if unsafe { libc::geteuid() } == 0 {
        c.acl = fuser::SessionACL::All;
    }
    c.n_threads = Some(a.threads.clamp(1, 64));
    c.clone_fd = true;
    c
}

/// Drops what the kernel may cache of the part of the tree a restore
/// changed: O(changes), whatever the size of the tree.
fn invalidate(
    store: &Store,
    before: forkfs::map::MapRoot,
    after: forkfs::map::MapRoot,
    n: &fuser::Notifier,
) {
    let t = std::time::Instant::now();
    let changes = match forkfs::volume::changes::fs_changes(store, before, after) {
        Ok(c) => c,
        Err(e) => {
            // Without the list, the kernel keeps stale names for up to its TTL.
            tracing::error!(error = %e, "restore: cannot list the changed names");
            return;
        }
    };
    for (parent, name) in &changes.entries {
        let _ = n.inval_entry(fuser::INodeNo(*parent), std::ffi::OsStr::from_bytes(name));
    }
    for ino in &changes.inodes {
        let _ = n.inval_inode(fuser::INodeNo(*ino), 0, 0);
    }
    tracing::info!(
        names = changes.entries.len(),
        inodes = changes.inodes.len(),
        ms = t.elapsed().as_millis() as u64,
        "restore: kernel caches dropped"
    );
}

/// Set (and notified) when the session has ended.
type Stop = Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>;

/// An automatic version, unless nothing changed since the last one.
fn checkpoint(store: &Store, vol: &str) -> forkfs::Result<forkfs::VersionRecord> {
    let opts = forkfs::SnapshotOptions {
        origin: Some(forkfs::Origin::Auto),
        skip_if_clean: true,
        ..Default::default()
    };
    store.snapshot(vol, &opts)
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (and so in every
/// thread started after).
fn block_stop_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// SIGTERM, SIGINT and SIGHUP unmount (the session then ends normally).
fn stop_on_signals(set: libc::sigset_t, mut unmount: fuser::SessionUnmounter) -> Result<()> {
    unsafe {
        std::thread::Builder::new().name("forkfs-signals".into()).spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            tracing::info!(signal = sig, "unmounting");
            if let Err(e) = unmount.unmount() {
                tracing::warn!(error = %e, "unmount failed");
            }
        })?;
    }
    Ok(())
}

fn checkpointer(
    store: Store,
    vol: String,
    every: Duration,
    stop: Stop,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        loop {
            {
                let mut stopped = stop.0.lock();
                if !*stopped {
                    stop.1.wait_for(&mut stopped, every);
                }
                if *stopped {
                    return;
                }
            }
            if let Err(e) = checkpoint(&store, &vol) {
                tracing::warn!(volume = %vol, error = %e, "checkpoint failed");
            }
        }
    })
}

/// `--daemon`: runs the mount as a detached child and returns once it is
/// mounted (or relays why it could not be).
fn daemonize(g: &crate::cli::Global, a: &Args) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let log_dir = g.store_dir().join("logs");
    std::fs::create_dir_all(&log_dir)?;
    let log_path = log_dir.join(format!("mount-{}.log", a.spec.replace(['/', '@'], "_")));
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let args: Vec<std::ffi::OsString> =
        std::env::args_os().skip(1).filter(|x| x != "--daemon").collect();
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(args)
        .env(READY_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log);
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the mount process")?;
    let out = child.stdout.take().expect("piped");
    for line in std::io::BufReader::new(out).lines() {
        let line = line?;
        if let Some(pid) = line.strip_prefix("ready ") {
            println!(
                "{} mounted on {} (pid {pid}; log {})",
                a.spec,
                a.dir.display(),
                log_path.display()
            );
            return Ok(());
        }
        if let Some(e) = line.strip_prefix("error: ") {
            // The child exits with the code its error calls for: keep it.
            let code = child.wait()?.code().unwrap_or(1);
            eprintln!("forkfs: {e}");
            std::process::exit(code);
        }
    }
    let status = child.wait()?;
    bail!("the mount process exited ({status}) before mounting; see {}", log_path.display())
}

/// `forkfs umount DIR`: unmounts, then waits for the mount process to
/// finish its last checkpoint and release the store.
pub fn umount(g: &crate::cli::Global, a: UmountArgs) -> Result<()> {
    let dir = std::fs::canonicalize(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    let holder = record::Record::find(&g.store_dir(), &dir);
    let ok = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            bail!("cannot unmount {}: {e}", dir.display());
        }
    }
    if let Some(pid) = holder {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while record::alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Block and free counts of the filesystem holding the store, for statfs.
pub fn statfs_of(dir: &Path) -> (u64, u64, u64, u32) {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return (0, 0, 0, 4096) };
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return (0, 0, 0, 4096);
    }
    let f = s.f_frsize.max(1);
    let scale = |n: u64| n * f / 4096;
    (scale(s.f_blocks), scale(s.f_bfree), scale(s.f_bavail), 4096)
}
