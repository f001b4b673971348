//! `forkfs mount` and `forkfs umount`: an fs volume (or one of its
//! versions, read-only) through the kernel's FUSE. The mount process holds
//! the store, so `forkfs snapshot|fork|restore|log|diff` reach it through
//! the store's control socket while it runs.

mod convert;
mod fuse;
mod history;
pub mod host;
mod record;
mod umount;
mod users;

pub use umount::{UmountArgs, umount};
mod workspace;

use anyhow::{Context, Result, bail};
use forkfs::{Error, Settings, Store};
use std::io::{BufRead, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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
    /// Mount options, comma-separated: nodev, nosuid, noexec (and dev,
    /// suid, exec), ro, and relatime (the default), strictatime or noatime
    #[arg(short = 'o', long = "options", value_delimiter = ',')]
    pub options: Vec<String>,
    /// After SIGTERM, SIGINT or SIGHUP, how long the mounts may take to
    /// unmount and save (a busy mount waits for its users) before the
    /// process detaches them and exits at once; a second signal does so
    /// sooner
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub stop_timeout: Duration,
}

/// Set in the background child of `--daemon`: it reports on stdout.
const READY_ENV: &str = "FORKFS_MOUNT_REPORT";

pub fn mount(store_dir: &Path, settings: &Settings, a: Args) -> Result<()> {
    if a.daemon {
        return daemonize(store_dir, &a);
    }
    let report = std::env::var_os(READY_ENV).is_some();
    match serve(store_dir, settings, &a, report) {
        Ok(()) => Ok(()),
        Err(e) if report => {
            println!("error: {}", forkfs::one_line(e.as_ref()));
            Err(e)
        }
        Err(e) => Err(e),
    }
}

fn serve(store_dir: &Path, settings: &Settings, a: &Args, report: bool) -> Result<()> {
    // Before any thread starts (the store starts several): every thread
    // inherits the mask, so only the signal thread ever receives them.
    let signals = block_stop_signals();
    let req = request(a)?;
    // A holder on its way out (its last mount just ended) is waited for:
    // the store is ours once it has exited.
    let deadline = std::time::Instant::now() + forkfs::service::HOLDER_EXIT_WAIT;
    let store = loop {
        match Store::open_with(store_dir, settings) {
            Ok(s) => break s,
            Err(e) if e.is_store_in_use() => match ask_holder(store_dir, &req) {
                Ok(pid) => return hosted(store_dir, &req, pid, report, signals),
                Err(e) if e.is_holder_exiting() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    bail!(Error::new(e.kind(), format!("cannot mount {}: {e}", req.spec)))
                }
            },
            Err(e) => return Err(e.into()),
        }
    };
    // The mount request is served before the socket answers anything.
    let extensions = forkfs::service::Extensions::default();
    let host = host::Host::new(store.clone(), &extensions);
    let control = forkfs::service::serve(store.clone(), extensions)?;
    if let Err(e) = host.mount(&req) {
        // A mount asked for over the socket meanwhile ends too, cleanly.
        host.unmount_all();
        host.wait();
        drop(control);
        store.flush()?;
        return Err(e.into());
    }
    stop_on_signals(signals, host.clone(), a.stop_timeout)?;
    ready(
        report,
        std::process::id(),
        &format!("{} mounted on {}", a.spec, req.dir.display()),
        &req,
    );
    let failure = host.wait();
    drop(control);
    store.flush()?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The store is held by another process: asks it to host this mount
/// too; its pid.
fn ask_holder(store_dir: &Path, req: &host::MountRequest) -> forkfs::Result<u64> {
    let call = forkfs::service::Request::Extension {
        name: host::MOUNT_REQUEST.into(),
        args: serde_json::to_value(req)?,
    };
    Ok(forkfs::service::call(store_dir, &call)?["pid"].as_u64().unwrap_or(0))
}

/// Another process (`pid`) serves this mount: report it, and in the
/// foreground stay until the mount ends.
fn hosted(
    store_dir: &Path,
    req: &host::MountRequest,
    pid: u64,
    report: bool,
    signals: libc::sigset_t,
) -> Result<()> {
    let what = format!(
        "{} mounted on {} by pid {pid}, which holds the store",
        req.spec,
        req.dir.display()
    );
    ready(report, pid as u32, &what, req);
    if report {
        return Ok(());
    }
    // In the foreground: stay until the mount ends; a stop signal unmounts.
    let dir = req.dir.clone();
    std::thread::spawn(move || {
        let mut sig = 0;
        unsafe { libc::sigwait(&signals, &mut sig) };
        let _ = std::process::Command::new("fusermount3").arg("-u").arg(&dir).status();
    });
    while record::Record::find(store_dir, &req.dir).is_some() {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn request(a: &Args) -> Result<host::MountRequest> {
    Ok(host::MountRequest {
        spec: a.spec.clone(),
        dir: host::mount_point(&a.dir)?,
        read_only: a.read_only || a.options.iter().any(|o| o == "ro"),
        checkpoint_every_ms: a.checkpoint_every.as_millis() as u64,
        threads: a.threads,
        options: host::mount_options(&a.options)?,
    })
}

/// Tells the `--daemon` parent (or the terminal) that the mount is up.
fn ready(report: bool, pid: u32, what: &str, req: &host::MountRequest) {
    if report {
        let hosted = if pid == std::process::id() { "" } else { " hosted" };
        println!("ready {pid}{hosted}");
        let _ = std::io::stdout().flush();
        // The parent stops reading now: nothing more goes to that pipe.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            use std::os::fd::AsRawFd;
            unsafe { libc::dup2(null.as_raw_fd(), 1) };
        }
    } else {
        eprintln!("forkfs: {what} (forkfs umount {} to stop)", req.dir.display());
    }
}

/// Drops what the kernel may cache of the part of the tree a restore
/// changed: O(changes), whatever the size of the tree.
pub(crate) fn invalidate(
    store: &Store,
    before: forkfs::MapRoot,
    after: forkfs::MapRoot,
    n: &fuser::Notifier,
) {
    let t = std::time::Instant::now();
    let changes = match forkfs::fs::fs_changes(store.chunks(), before, after) {
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

/// SIGTERM, SIGINT and SIGHUP unmount everything this process serves
/// (each session then ends normally, with a last checkpoint). A second
/// signal, or `stop_timeout` without the process ending (a mount whose
/// users keep it busy, a checkpoint that does not finish), detaches every
/// mount and exits at once with 75: what was fsynced is in the data log
/// and comes back at the next open; writes not yet fsynced are lost, as
/// in a crash.
fn stop_on_signals(
    set: libc::sigset_t,
    host: Arc<host::Host>,
    stop_timeout: Duration,
) -> Result<()> {
    std::thread::Builder::new().name("forkfs-signals".into()).spawn(move || {
        let sig = next_signal(&set, None).unwrap_or_default();
        tracing::info!(signal = sig, "unmounting");
        host.unmount_all();
        let why = match next_signal(&set, Some(stop_timeout)) {
            Some(s) => format!("a second signal ({s})"),
            None => format!("--stop-timeout {} passed", humantime::format_duration(stop_timeout)),
        };
        host.detach_all();
        tracing::error!(
            "stopping now ({why}): mounts detached without their last checkpoint; writes \
             fsynced are kept (recovered at the next open), writes not yet fsynced are lost"
        );
        // No destructors: threads may still be inside the store.
        unsafe { libc::_exit(75) };
    })?;
    Ok(())
}

/// The next of the signals in `set`, waiting at most `wait` (`None`:
/// for ever); `None` when the wait ran out (or sigwait failed).
fn next_signal(set: &libc::sigset_t, wait: Option<Duration>) -> Option<i32> {
    let Some(w) = wait else {
        let mut sig = 0;
        // SAFETY: a valid set and out-pointer.
        return (unsafe { libc::sigwait(set, &mut sig) } == 0).then_some(sig);
    };
    let deadline = std::time::Instant::now() + w;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid set and timeout; no siginfo wanted.
        let r = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if r > 0 {
            return Some(r);
        }
        // Interrupted (EINTR): wait out the rest; else the time is up.
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Records a version every `every` while something changed; stops (and
/// is joined) when dropped.
pub(crate) struct Checkpointer {
    stop: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub(crate) fn checkpointer(store: Store, vol: String, every: Duration) -> Checkpointer {
    let stop: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)> = Arc::default();
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        loop {
            {
                let mut stopped = flag.0.lock();
                if !*stopped {
                    flag.1.wait_for(&mut stopped, every);
                }
                if *stopped {
                    return;
                }
            }
            if let Err(e) = store.graph().auto_version(&vol) {
                tracing::warn!(volume = %vol, error = %e, "checkpoint failed");
            }
        }
    });
    Checkpointer { stop, thread: Some(thread) }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `--daemon`: runs the mount as a detached child and returns once it is
/// mounted (or relays why it could not be).
fn daemonize(store_dir: &Path, a: &Args) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let log_dir = store_dir.join("logs");
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
        if let Some(rest) = line.strip_prefix("ready ") {
            match rest.strip_suffix(" hosted") {
                Some(pid) => println!(
                    "{} mounted on {} (pid {pid}, hosted by the process that holds the store)",
                    a.spec,
                    a.dir.display()
                ),
                None => println!(
                    "{} mounted on {} (pid {rest}; log {})",
                    a.spec,
                    a.dir.display(),
                    log_path.display()
                ),
            }
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
