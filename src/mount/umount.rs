//! `forkfs umount`: unmounts a forkfs mount (never another), refuses a
//! busy one naming its users (or detaches it with `--lazy`), and waits for
//! the mount's last checkpoint.

use super::{host, record, users};
use anyhow::{Context, Result, bail};
use forkfs::Error;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// The mount point
    pub dir: PathBuf,
    /// Detach the mount now even if processes still use it; it ends, with
    /// its last checkpoint, when the last of them lets go
    #[arg(long)]
    pub lazy: bool,
    /// Unmount even if busy (detached at once) and stop the mount's
    /// process unless it serves other mounts or is forkfs-nbd: its users
    /// get errors from then on, writes fsynced are kept, writes not yet
    /// fsynced are lost
    #[arg(long, conflicts_with = "lazy")]
    pub force: bool,
}

/// `forkfs umount DIR`: unmounts a forkfs mount (never another), then
/// waits for the mount's last checkpoint and, when it was the last mount
/// of its process, for the process to release the store.
pub fn umount(store_dir: &Path, a: UmountArgs) -> Result<()> {
    let dir = std::fs::canonicalize(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    match host::mounted_at(&dir) {
        None => bail!(Error::invalid(format!("{} is not mounted", dir.display()))),
        Some((t, source)) if !host::is_forkfs(&t, &source) => bail!(Error::invalid(format!(
            "{} is not a forkfs mount (it is {t} from {source}); not unmounting it",
            dir.display()
        ))),
        Some(_) => {}
    }
    let holder = record::Record::holder(store_dir, &dir);
    if a.force {
        return force(store_dir, &dir, holder);
    }
    unmount(&dir, a.lazy)?;
    if let Some(h) = holder {
        let pid = h.pid;
        let wait = if a.lazy { Duration::from_secs(2) } else { Duration::from_secs(60) };
        if !wait_for_end(store_dir, &dir, h, wait) {
            if a.lazy {
                println!(
                    "{} detached; the mount ends, with its last checkpoint, when no process uses it",
                    dir.display()
                );
                return Ok(());
            }
            bail!(Error::new(
                forkfs::ErrorKind::Unavailable,
                format!(
                    "{} unmounted, but its last checkpoint has not finished after 60 s; \
                     process {pid} goes on saving (see its log) and holds the store until then",
                    dir.display()
                )
            ));
        }
    }
    saved(store_dir, &dir)
}

/// The failure an ended mount left, if its last checkpoint failed.
fn saved(store_dir: &Path, dir: &Path) -> Result<()> {
    match record::Record::take_failure(store_dir, dir) {
        Some(f) => bail!(Error::new(
            f.kind,
            format!("{} unmounted, but not all was saved: {}", dir.display(), f.message)
        )),
        None => Ok(()),
    }
}

/// `forkfs umount --force`: unmounts `dir`, detaching it if busy; then
/// stops its process `holder` unless that serves other mounts or ends on
/// its own within 2 s: SIGTERM, then a second SIGTERM (the mount process
/// then detaches and exits at once, `mount/mod.rs`).
fn force(store_dir: &Path, dir: &Path, holder: Option<record::Holder>) -> Result<()> {
    if unmount(dir, false).is_err() {
        unmount(dir, true)?;
    }
    let Some(h) = holder else { return Ok(()) };
    let pid = h.pid;
    if wait_for_end(store_dir, dir, h, Duration::from_secs(2)) {
        return saved(store_dir, dir);
    }
    if h.stays || record::serves_other(store_dir, pid, dir) {
        let what = if h.stays { "serves more than mounts" } else { "serves other mounts too" };
        bail!(Error::conflict(format!(
            "{} is detached, but process {pid} {what}, so it was not stopped: the \
             mount ends, with its last checkpoint, when its users let go",
            dir.display()
        )));
    }
    // A second of grace after the first (a last checkpoint may finish),
    // five after the second.
    for ticks in [50, 250] {
        // SAFETY: kill(2) with a pid and a signal; no memory involved.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let gone = (0..ticks).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            !record::alive(pid)
        });
        if gone {
            eprintln!(
                "forkfs: {} detached and process {pid} stopped (writes fsynced are kept)",
                dir.display()
            );
            return Ok(());
        }
    }
    bail!(Error::new(
        forkfs::ErrorKind::Unavailable,
        format!("{} is detached, but process {pid} did not stop after two SIGTERMs", dir.display())
    ))
}

/// Unmounts `dir` (`lazy`: detached even if busy). A busy mount is
/// refused with the processes that use it.
pub(super) fn unmount(dir: &Path, lazy: bool) -> Result<()> {
    let mut fusermount = std::process::Command::new("fusermount3");
    fusermount.arg("-u");
    if lazy {
        fusermount.arg("-z");
    }
    let ok =
        fusermount.arg(dir).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
    if ok {
        return Ok(());
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EBUSY) {
        let me = std::process::id();
        let users = users::users_of(dir);
        let who = if users.is_empty() {
            "a process".to_string()
        } else {
            let name = |&(pid, ref name): &(u32, String)| match pid == me {
                true => format!("this command ({pid}: its working directory is in the mount)"),
                false => format!("{name} ({pid})"),
            };
            users.iter().map(name).collect::<Vec<_>>().join(", ")
        };
        bail!(Error::conflict(format!(
            "{} is busy: used by {who}; close them, or use --lazy to detach it now \
             and end it when they are done",
            dir.display()
        )));
    }
    bail!("cannot unmount {}: {e}", dir.display())
}

/// Waits up to `wait` for the mount's last checkpoint (its record goes;
/// a failed one leaves why) and, unless its process serves other mounts
/// or stays after them (forkfs-nbd), for the process to exit; whether
/// that happened.
fn wait_for_end(store_dir: &Path, dir: &Path, h: record::Holder, wait: Duration) -> bool {
    let start = std::time::Instant::now();
    let mut said = false;
    let pid = h.pid;
    while record::alive(pid)
        && (record::Record::find(store_dir, dir).is_some()
            || (!h.stays && !record::serves_any(store_dir, pid)))
    {
        if start.elapsed() >= wait {
            return record::Record::find(store_dir, dir).is_none();
        }
        if !said && start.elapsed() >= Duration::from_secs(2) {
            eprintln!("forkfs: waiting for the last checkpoint of {} (pid {pid})", dir.display());
            said = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    record::Record::find(store_dir, dir).is_none()
}
