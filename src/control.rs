//! The control socket: how a command reaches a store that another process
//! holds open (an NBD server, later a mount). The store is single-process
//! (RocksDB's lock), so maintenance runs inside the process that owns it.
//!
//! `<store>/control.sock`, a Unix socket (mode 0600): one JSON request per
//! connection, one JSON response, then the connection closes.

use crate::error::{Error, ErrorKind, Result};
use crate::gc::GcOptions;
use crate::progress::{Progress, Quiet};
use crate::store::Store;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub const SOCKET: &str = "control.sock";
/// A request larger than this is refused.
const MAX_REQUEST: u64 = 64 << 10;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Gc {
        dry_run: bool,
        grace_ms: u64,
        compact_below: f64,
    },
    Check {
        deep: bool,
    },
    Prune {
        volume: String,
        keep_recent: Option<usize>,
        unit_ms: Option<u64>,
        dry_run: bool,
    },
    Snapshot {
        volume: String,
        name: Option<String>,
        label: Option<String>,
    },
    /// Fork `source` (VOL for its current state, or VOL@VERSION) as `new`.
    Fork {
        source: String,
        new: String,
    },
    /// Set the head of `volume` to `version` (VOL@VERSION or a version of `volume`).
    Restore {
        volume: String,
        version: String,
    },
    /// Show (`None`) or set a block volume's consistency mode.
    Consistency {
        volume: String,
        mode: Option<crate::consistency::Consistency>,
    },
    /// The version graph of `volume`: versions (with names and damage
    /// marks), rollbacks and the head's base.
    Log {
        volume: String,
    },
    /// What changed from `from` to `to` (VOL for a head, VOL@VERSION;
    /// `to` defaults to the head of `from`'s volume).
    Diff {
        from: String,
        to: Option<String>,
    },
    /// Every volume of the store.
    Volumes,
    /// Volumes, sizes, stored bytes, cache and uploads ([`Store::stats`]).
    Status,
    /// Records a version of each volume (or of `volume`) that has changes
    /// not yet in one, and syncs the store (see [`sync`]).
    Sync {
        volume: Option<String>,
    },
    CreateVolume {
        name: String,
        kind: crate::version::VolumeKind,
        size: Option<u64>,
        block_size: Option<u32>,
    },
    /// A front-end's own request, served by the handler the holding
    /// process registered ([`Store::serve_extension`]).
    Extension {
        name: String,
        args: serde_json::Value,
    },
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "kebab-case")]
enum Response {
    Ok(serde_json::Value),
    Err { kind: ErrorKind, message: String },
}

/// Runs a request against an open store.
pub fn execute(store: &Store, req: &Request, progress: &dyn Progress) -> Result<serde_json::Value> {
    Ok(match req {
        Request::Gc { dry_run, grace_ms, compact_below } => {
            let opts = GcOptions {
                dry_run: *dry_run,
                grace: Duration::from_millis(*grace_ms),
                compact_below: *compact_below,
                ..Default::default()
            };
            serde_json::to_value(store.gc(&opts, progress)?)?
        }
        Request::Check { deep } => {
            let opts = crate::check::CheckOptions { deep: *deep };
            serde_json::to_value(store.check_with(&opts, progress)?)?
        }
        Request::Prune { volume, keep_recent, unit_ms, dry_run } => {
            let p = store.volume(volume)?.retention.unwrap_or_default();
            let policy = crate::retention::Policy {
                keep_recent: keep_recent.unwrap_or(p.keep_recent),
                unit_ms: unit_ms.unwrap_or(p.unit_ms).max(1),
                ..p
            };
            let now = crate::version::now_ms();
            let pruned = store.prune(volume, &policy, now, *dry_run)?;
            serde_json::to_value(pruned.iter().map(|v| v.id.to_string()).collect::<Vec<_>>())?
        }
        Request::Snapshot { volume, name, label } => {
            let opts = crate::graph::SnapshotOptions {
                name: name.clone(),
                label: label.clone(),
                ..Default::default()
            };
            serde_json::to_value(store.snapshot(volume, &opts)?)?
        }
        Request::Fork { source, new } => {
            let from = store.resolve_version(source)?;
            let rec = store.fork(&from, new)?;
            serde_json::json!({ "from": from, "volume": rec })
        }
        Request::Restore { volume, version } => {
            let spec =
                if version.contains('@') { version.clone() } else { format!("{volume}@{version}") };
            let crate::graph::Target::Version(to) = store.resolve(&spec)? else {
                return Err(Error::invalid("restore needs a version"));
            };
            let pre = store.restore(volume, &to)?;
            serde_json::json!({ "restored": to, "previous_head": pre })
        }
        Request::Consistency { volume, mode: Some(m) } => {
            serde_json::to_value(store.set_consistency(volume, *m)?)?
        }
        Request::Consistency { volume, mode: None } => serde_json::to_value(store.volume(volume)?)?,
        Request::Log { volume } => log(store, volume)?,
        Request::Volumes => serde_json::to_value(store.volumes()?)?,
        Request::Status => serde_json::to_value(store.stats()?)?,
        Request::Sync { volume } => serde_json::to_value(sync(store, volume.as_deref())?)?,
        Request::CreateVolume { name, kind, size, block_size } => {
            serde_json::to_value(store.create_volume(name, *kind, *size, *block_size)?)?
        }
        Request::Extension { name, args } => match store.extension(name) {
            Some(handler) => handler(args)?,
            None => {
                return Err(Error::conflict(format!(
                    "the process holding the store at {} does not serve {name} requests",
                    store.dir().display()
                )));
            }
        },
        Request::Diff { from, to } => {
            let a = store.resolve(from)?;
            let b = match to {
                Some(t) => store.resolve(t)?,
                None => crate::graph::Target::Head(store.volume(a.volume_name().as_str())?),
            };
            serde_json::to_value(store.diff(&a, &b)?)?
        }
    })
}

fn log(store: &Store, volume: &str) -> Result<serde_json::Value> {
    let vol = store.volume(volume)?;
    let mut names: std::collections::HashMap<_, Vec<String>> = Default::default();
    for (n, id) in store.tags(&vol)? {
        names.entry(id).or_default().push(n);
    }
    let mut versions = Vec::new();
    for v in store.log(&vol)? {
        let mut j = serde_json::to_value(&v)?;
        j["names"] = serde_json::json!(names.remove(&v.id).unwrap_or_default());
        // Marks left by `fsck --repair` on versions that reference lost data.
        j["damaged"] = serde_json::json!(store.damaged(&v.id)?);
        versions.push(j);
    }
    Ok(serde_json::json!({
        "head_base": store.head_base(&vol)?,
        "versions": versions,
        "rollbacks": store.rollbacks(&vol)?,
    }))
}

/// What `sync` did for one volume.
#[derive(Serialize, Deserialize, Debug)]
pub struct Synced {
    pub volume: String,
    /// The version that now holds every write made before the sync.
    pub version: Option<crate::id::VersionId>,
    /// A new version was recorded (else the head had nothing new).
    pub recorded: bool,
}

/// Makes every write acknowledged so far durable where the store keeps its
/// objects: each changed volume (a live head in this process, or one with
/// writes left by an earlier process) gets an automatic version; the index
/// and data log are synced; and on a remote store, the call returns once
/// the upload queue is empty and every head is published (or fails once
/// uploads make no progress for the read deadline, or names the volumes
/// whose heads another host holds or took over; nothing is lost, it stays
/// queued or local). Volumes this process has not opened and that hold
/// nothing unsaved are not opened (on a remote store that would take
/// their lease).
pub fn sync(store: &Store, volume: Option<&str>) -> Result<Vec<Synced>> {
    let recs = match volume {
        Some(v) => vec![store.volume(v)?],
        None => store.volumes()?,
    };
    let mut out = Vec::new();
    for rec in recs {
        let before = store.head_base(&rec)?;
        let name = rec.name.to_string();
        let open = store.open_head(&name).is_some();
        let unsaved = !crate::overlay::Overlay::new(store.index(), rec.id).is_empty()?;
        let version = if open || unsaved { Some(store.auto_version(&name)?.id) } else { before };
        out.push(Synced { volume: name, version, recorded: version != before });
    }
    store.sync()?;
    store.sync_remote()?;
    Ok(out)
}

/// Runs a request on the store at `dir`: here when the store is free
/// (opened for this one request), else inside the process that holds it.
pub fn run(dir: &Path, req: &Request, progress: &dyn Progress) -> Result<serde_json::Value> {
    match Store::open(dir) {
        Ok(store) => execute(&store, req, progress),
        Err(e) if e.kind() == ErrorKind::Conflict && dir.join(SOCKET).exists() => call(dir, req),
        Err(e) => Err(e),
    }
}

/// Sends a request to the process that holds the store at `dir`.
pub fn call(dir: &Path, req: &Request) -> Result<serde_json::Value> {
    let path = dir.join(SOCKET);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        Error::conflict(format!(
            "the store at {} is in use by another process, and its control socket does not answer ({e})",
            dir.display()
        ))
    })?;
    serde_json::to_writer(&mut s, req)?;
    s.write_all(b"\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    match serde_json::from_str::<Response>(&line) {
        Ok(Response::Ok(v)) => Ok(v),
        Ok(Response::Err { kind, message }) => Err(Error::new(kind, message)),
        Err(_) => Err(Error::new(
            ErrorKind::Unavailable,
            "the process holding the store closed the control connection without an answer",
        )),
    }
}

/// A running control socket. Dropping it stops the listener, waits for
/// requests in progress, and so releases its handle on the store: the store
/// (and RocksDB) must be closed before the process exits.
pub struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Serves the control socket of `store` on a background thread. Call only
/// while holding the store open (so any old socket file is stale).
pub fn serve(store: Store) -> Result<Server> {
    use std::os::unix::fs::PermissionsExt;
    let path = store.dir().join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new().name("forkfs-control".into()).spawn(move || {
        let mut requests: Vec<std::thread::JoinHandle<()>> = Vec::new();
        for conn in listener.incoming() {
            if flag.load(Ordering::SeqCst) {
                break;
            }
            requests.retain(|t| !t.is_finished());
            let Ok(conn) = conn else { continue };
            let store = store.clone();
            let spawned = std::thread::Builder::new()
                .name("forkfs-control-req".into())
                .spawn(move || handle(&store, conn));
            requests.extend(spawned.ok());
        }
        for t in requests {
            let _ = t.join();
        }
    })?;
    Ok(Server { path, stop, thread: Some(thread) })
}

fn handle(store: &Store, conn: UnixStream) {
    let mut line = String::new();
    let mut reader = BufReader::new(std::io::Read::take(&conn, MAX_REQUEST));
    let resp = match reader.read_line(&mut line) {
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                tracing::info!(?req, "control request");
                execute(store, &req, &Quiet)
            }
            Err(e) => Err(Error::invalid(format!("bad control request: {e}"))),
        },
        Err(e) => Err(e.into()),
    };
    let resp = match resp {
        Ok(v) => Response::Ok(v),
        Err(e) => Response::Err { kind: e.kind(), message: e.to_string() },
    };
    let mut w = &conn;
    let _ = serde_json::to_writer(&mut w, &resp).map(|_| w.write_all(b"\n"));
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
