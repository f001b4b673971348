//! The control socket: how a command reaches a store that another process
//! holds open (an NBD server, a mount). The store is single-process (its
//! directory lock), so work on it runs inside the process that owns it.
//!
//! `<store>/control.sock`, a Unix socket (mode 0600): one JSON request per
//! connection, one JSON response, then the connection closes.

use super::request::{Request, execute};
use crate::config::Settings;
use crate::error::{Detail, Error, ErrorKind, Result};
use crate::progress::{Progress, Quiet};
use crate::store::Store;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub const SOCKET: &str = "control.sock";
/// A request larger than this is refused.
const MAX_REQUEST: u64 = 64 << 10;

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "kebab-case")]
enum Response {
    Ok(serde_json::Value),
    Err {
        kind: ErrorKind,
        message: String,
        /// The holder is on its way out ([`Error::is_holder_exiting`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        exiting: bool,
    },
}

/// Runs a request on the store at `dir`: here when the store is free
/// (opened for this one request), else inside the process that holds it.
pub fn run(
    dir: &Path,
    settings: &Settings,
    req: &Request,
    progress: &dyn Progress,
) -> Result<serde_json::Value> {
    let start = std::time::Instant::now();
    let deadline = start + HOLDER_EXIT_WAIT;
    loop {
        let answer = match Store::open_with(dir, settings) {
            Ok(store) => return execute(&store, &Extensions::default(), req, progress),
            Err(e) if e.is_store_in_use() && dir.join(SOCKET).exists() => call(dir, req),
            // Held, without a socket: a command of its own (usually short),
            // or a holder starting up or on its way out (the socket goes
            // first): worth a short wait.
            Err(e) if e.is_store_in_use() && start.elapsed() < NO_SOCKET_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e),
        };
        match answer {
            // The holder is on its way out (it stopped answering, or says
            // so): the store is free once it has exited.
            Err(e) if e.is_holder_exiting() && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            answer => return answer,
        }
    }
}

/// How long a command waits for a process holding the store that is on
/// its way out (its last mount ended and it is saving): it answers
/// "unavailable" or not at all meanwhile.
pub const HOLDER_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a command waits for a word from the process holding the store:
/// it answers, or sends a heartbeat every [`HEARTBEAT`] while it works.
pub const SILENCE: std::time::Duration = std::time::Duration::from_secs(10);
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a command waits for a store held by a process without a
/// control socket (see `run`).
const NO_SOCKET_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Sends a request to the process that holds the store at `dir`.
pub fn call(dir: &Path, req: &Request) -> Result<serde_json::Value> {
    let path = dir.join(SOCKET);
    // A holder that holds the lock but no longer answers is on its way
    // out (the socket goes first); callers wait for it (see `run`).
    let mut s = UnixStream::connect(&path).map_err(|e| {
        let by = crate::db::Holder::of(dir).map(|h| format!(" ({h})")).unwrap_or_default();
        Error::new(ErrorKind::Unavailable, format!(
            "the store at {} is in use by another process{by}, and its control socket does not answer ({e})",
            dir.display()
        ))
        .with_detail(Detail::HolderExiting)
    })?;
    // A connection the holder's listener accepted as it closed is reset
    // unread (the server finishes every request it read before it goes):
    // on its way out, like a socket that does not answer.
    let exiting = |e: std::io::Error| Error::from(e).with_detail(Detail::HolderExiting);
    // A holder that says nothing for this long is stopped (SIGSTOP) or
    // hung: working on a request, it sends a heartbeat every second.
    let silent = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            let by = crate::db::Holder::of(dir).map(|h| format!(" ({h})")).unwrap_or_default();
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the process holding the store at {}{by} has not answered for {} s: it is stopped \
                 (kill -CONT) or hung (kill it)",
                    dir.display(),
                    SILENCE.as_secs()
                ),
            )
        }
        _ => exiting(e),
    };
    s.set_read_timeout(Some(SILENCE))?;
    s.set_write_timeout(Some(SILENCE))?;
    let mut raw = serde_json::to_vec(req)?;
    raw.push(b'\n');
    s.write_all(&raw).map_err(silent)?;
    let mut line = String::new();
    let mut reader = BufReader::new(s);
    // Heartbeats are empty lines; the answer is the first other line (or
    // nothing, if the connection closes first).
    while line.trim().is_empty() {
        line.clear();
        if reader.read_line(&mut line).map_err(silent)? == 0 {
            break;
        }
    }
    match serde_json::from_str::<Response>(&line) {
        Ok(Response::Ok(v)) => Ok(v),
        Ok(Response::Err { kind, message, exiting }) => {
            let e = Error::new(kind, message);
            Err(if exiting { e.with_detail(Detail::HolderExiting) } else { e })
        }
        // It answers every request it read: it exited (on its way out, or
        // killed, which frees the store at once).
        Err(_) => Err(Error::new(
            ErrorKind::Unavailable,
            "the process holding the store closed the control connection without an answer",
        )
        .with_detail(Detail::HolderExiting)),
    }
}

/// A running control socket. Dropping it stops the listener, waits for
/// requests in progress, and so releases its handle on the store: the store
/// (and RocksDB) must be closed before the process exits.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A front-end's handler of its own control requests: JSON in, JSON out.
pub type Extension = Arc<dyn Fn(&serde_json::Value) -> Result<serde_json::Value> + Send + Sync>;

/// The front-end requests a process serves, by name.
#[derive(Clone, Default)]
pub struct Extensions(Arc<Mutex<HashMap<String, Extension>>>);

impl Extensions {
    pub fn get(&self, name: &str) -> Option<Extension> {
        self.0.lock().get(name).cloned()
    }

    /// Serves control requests named `name` with `handler` (a mount hosts
    /// further mounts of the store it holds this way).
    pub fn insert(&self, name: &str, handler: Extension) {
        self.0.lock().insert(name.to_string(), handler);
    }
}

/// How often the listener looks at its flag and at its socket file.
const TICK: std::time::Duration = std::time::Duration::from_millis(200);
/// How often it checks that its socket file is still the one it bound.
const CHECK_FILE: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves the control socket of `store` on a background thread. Call only
/// while holding the store open (so any old socket file is stale).
///
/// The socket file cannot be lost for good: when it is removed or
/// replaced (a tmp cleaner, a person), the listener binds it again within
/// a second, so the store never stays held by a process nobody can reach.
/// Stopping needs no connection to it either.
pub fn serve(store: Store, extensions: Extensions) -> Result<Server> {
    let path = store.dir().join(SOCKET);
    let mut listener = Listener::bind(&path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let served = extensions;
    let thread = std::thread::Builder::new().name("forkfs-control".into()).spawn(move || {
        let mut requests: Vec<std::thread::JoinHandle<()>> = Vec::new();
        let mut checked = std::time::Instant::now();
        while !flag.load(Ordering::SeqCst) {
            if checked.elapsed() >= CHECK_FILE {
                checked = std::time::Instant::now();
                if !listener.still_bound() {
                    match Listener::bind(&path) {
                        Ok(l) => {
                            tracing::warn!(path = %path.display(), "the control socket was removed or replaced: bound again");
                            listener = l;
                        }
                        Err(e) => tracing::error!(path = %path.display(), error = %e, "the control socket was removed and cannot be bound again"),
                    }
                }
            }
            let Some(conn) = listener.accept(TICK) else { continue };
            requests.retain(|t| !t.is_finished());
            let (store, served) = (store.clone(), served.clone());
            let spawned = std::thread::Builder::new()
                .name("forkfs-control-req".into())
                .spawn(move || handle(&store, &served, conn));
            requests.extend(spawned.ok());
        }
        listener.remove();
        for t in requests {
            let _ = t.join();
        }
    })?;
    Ok(Server { stop, thread: Some(thread) })
}

/// The listening socket and the file it is bound to.
struct Listener {
    socket: UnixListener,
    path: PathBuf,
    /// (device, inode) of the socket file this listener made.
    file: (u64, u64),
}

impl Listener {
    fn bind(path: &Path) -> Result<Listener> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let _ = std::fs::remove_file(path);
        let socket = UnixListener::bind(path)?;
        socket.set_nonblocking(true)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let m = std::fs::symlink_metadata(path)?;
        Ok(Listener { socket, path: path.to_path_buf(), file: (m.dev(), m.ino()) })
    }

    /// Whether the socket file is still the one this listener bound.
    fn still_bound(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file)
    }

    /// A connection, waiting at most `wait` for one.
    fn accept(&self, wait: std::time::Duration) -> Option<UnixStream> {
        use std::os::fd::AsRawFd;
        let mut fd = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut fd, 1, ms) } <= 0 {
            return None;
        }
        let (conn, _) = self.socket.accept().ok()?;
        // Requests are read and answered blocking, each on its thread.
        conn.set_nonblocking(false).ok()?;
        Some(conn)
    }

    /// Removes the socket file if it is still this listener's.
    fn remove(&self) {
        if self.still_bound() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn handle(store: &Store, extensions: &Extensions, conn: UnixStream) {
    let mut line = String::new();
    let mut reader = BufReader::new(std::io::Read::take(&conn, MAX_REQUEST));
    // Retention waits until the request is answered (it reads the
    // volume's whole log).
    let (resp, prunes) = store.graph().pruning_after(|| match reader.read_line(&mut line) {
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                tracing::info!(?req, "control request");
                with_heartbeats(&conn, || execute(store, extensions, &req, &Quiet))
            }
            Err(e) => Err(Error::invalid(format!("bad control request: {e}"))),
        },
        Err(e) => Err(e.into()),
    });
    let resp = match resp {
        Ok(v) => Response::Ok(v),
        Err(e) => {
            Response::Err { kind: e.kind(), message: e.to_string(), exiting: e.is_holder_exiting() }
        }
    };
    // One write: serde_json writes a value in many small pieces, each a
    // wake-up of the caller waiting for its line.
    if let Ok(mut raw) = serde_json::to_vec(&resp) {
        raw.push(b'\n');
        let _ = (&conn).write_all(&raw);
    }
    // A client reading to the end is not kept waiting for the pruning.
    let _ = conn.shutdown(std::net::Shutdown::Both);
    prunes.run(store.graph());
}

/// Runs `work`, sending an empty line on `conn` every [`HEARTBEAT`] until
/// it returns: the caller then knows a long request from a holder that is
/// stopped or hung. Returns once the last heartbeat is written, so the
/// answer that follows is never interleaved with one.
fn with_heartbeats<T>(conn: &UnixStream, work: impl FnOnce() -> T) -> T {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut w = conn;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(HEARTBEAT)
            {
                if w.write_all(b"\n").is_err() {
                    return;
                }
            }
        });
        let out = work();
        drop(done);
        out
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
