//! Listeners and lifecycle: accept TCP and Unix connections (up to the
//! connection limit, `admit.rs`), run the handshake and a session for
//! each, and on shutdown stop accepting, end handshakes and idle
//! connections, let sessions finish their in-flight requests, then persist
//! every export.

use crate::admit::{Admission, Admit, refuse};
use crate::exports::Exports;
use crate::metrics;
use crate::negotiate::{Negotiated, Outcome, TlsState, greet, invalid, options};
use crate::peers::Peers;
use crate::persist::clients::Peer;
use crate::session::{self, SessionConfig};
use crate::systemd::{self, Inherited};
use crate::tls::{Tls, TlsFiles};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tracing::Instrument;

pub struct ServerConfig {
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    /// Listening sockets passed by socket activation (`systemd.rs`): at
    /// most one TCP and one Unix socket, in place of `listen` and `socket`.
    pub inherited: Vec<Inherited>,
    /// Stop (as on SIGTERM) once no client was connected for this long.
    pub exit_when_idle: Option<Duration>,
    /// Whether something besides connections keeps the server busy (the
    /// mounts it hosts): it is not idle then.
    pub busy: Arc<dyn Fn() -> bool + Send + Sync>,
    pub session: SessionConfig,
    /// Versions are also taken on this timer when a head changed.
    pub checkpoint_every: Duration,
    pub client_by: ClientBy,
    /// With TLS every connection must upgrade first (`tls.rs`); SIGHUP
    /// loads the files again.
    pub tls: Arc<parking_lot::RwLock<Option<Tls>>>,
    pub tls_files: TlsFiles,
    /// Who may connect over the Unix socket.
    pub peers: Peers,
    /// Where to serve `GET /metrics` (`metrics.rs`).
    pub metrics: Option<String>,
}

/// What makes connections one client (see `persist/clients.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientBy {
    /// The peer process (Unix socket) or IP address (TCP).
    Peer,
    /// The export: every connection of an export is one client.
    Export,
}

impl ClientBy {
    fn tcp(self, addr: std::net::SocketAddr) -> Peer {
        match self {
            ClientBy::Peer => Peer::Host(addr.ip().to_canonical()),
            ClientBy::Export => Peer::Anyone,
        }
    }

    fn unix(self, s: &tokio::net::UnixStream) -> Peer {
        match self {
            ClientBy::Peer => {
                s.peer_cred().ok().and_then(|c| c.pid()).map_or(Peer::UnknownProcess, Peer::Process)
            }
            ClientBy::Export => Peer::Anyone,
        }
    }
}

/// A connection past its handshake, plain or upgraded to TLS.
enum Attached<S> {
    Plain(S, Negotiated),
    Tls(Box<tokio_rustls::server::TlsStream<S>>, Negotiated),
}

/// The handshake: greeting, options, and with TLS the upgrade and the
/// options again over it. `Ok(None)`: the client left.
async fn handshake<S>(
    mut s: S,
    exports: &Arc<Exports>,
    max_request: u32,
    tls: Option<&Tls>,
) -> std::io::Result<Option<Attached<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let no_zeroes = greet(&mut s).await?;
    let plain = TlsState { required: tls.is_some(), active: false, client: None };
    match options(&mut s, exports, max_request, no_zeroes, plain).await? {
        Outcome::Left => Ok(None),
        Outcome::Attach(n) => Ok(Some(Attached::Plain(s, n))),
        Outcome::StartTls => {
            let tls = tls.ok_or_else(|| invalid("STARTTLS without TLS"))?;
            let mut t = tls.acceptor.accept(s).await?;
            let client = t.get_ref().1.peer_certificates().and_then(|c| c.first()).map(identity);
            let on = TlsState { required: true, active: true, client };
            match options(&mut t, exports, max_request, no_zeroes, on).await? {
                Outcome::Attach(n) => Ok(Some(Attached::Tls(Box::new(t), n))),
                Outcome::Left => Ok(None),
                Outcome::StartTls => Err(invalid("STARTTLS over TLS")),
            }
        }
    }
}

/// A client certificate's identity: its SHA-256 fingerprint
/// (`sha256:` and 64 hex digits), what `openssl x509 -fingerprint -sha256`
/// prints, without parsing the certificate.
fn identity(cert: &tokio_rustls::rustls::pki_types::CertificateDer<'_>) -> String {
    use sha2::Digest;
    use std::fmt::Write;
    let digest = sha2::Sha256::digest(cert.as_ref());
    digest.iter().fold(String::from("sha256:"), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// One admitted connection: the handshake (bounded by the handshake
/// timeout, and ended by a stop), then the session.
async fn handle<S: Socket>(
    s: S,
    exports: Arc<Exports>,
    cfg: SessionConfig,
    mut stop: watch::Receiver<bool>,
    peer: Peer,
    tls: Option<Tls>,
) {
    let limits = &cfg.limits;
    let handshake = tokio::time::timeout(
        limits.handshake_timeout,
        handshake(s, &exports, limits.max_request, tls.as_ref()),
    );
    let attached = tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => return,
        r = handshake => match r {
            Ok(Ok(Some(a))) => a,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                // A client that just left is not news (a port scan or a
                // connection churn would flood the log at info).
                use std::io::ErrorKind::*;
                if matches!(e.kind(), UnexpectedEof | BrokenPipe | ConnectionReset) {
                    tracing::debug!(error = %e, "handshake ended");
                } else {
                    tracing::info!(error = %e, "handshake ended");
                }
                return;
            }
            Err(_) => {
                tracing::info!(after = ?limits.handshake_timeout, "handshake timeout; closing");
                return;
            }
        },
    };
    let (wire, relay, n, tls) = match attached {
        Attached::Plain(s, n) => match s.into_std() {
            Ok(s) => (s.into(), None, n, false),
            Err(e) => return tracing::warn!(error = %e, "cannot take over a connection"),
        },
        Attached::Tls(t, n) => match session::relay(*t) {
            Ok((wire, relay)) => (wire, Some(relay), n, true),
            Err(e) => return tracing::warn!(error = %e, "no socket pair for a TLS connection"),
        },
    };
    let name = n.export.name.clone();
    tracing::info!(export = %name, structured = n.structured, tls, "attached");
    match session::serve(wire, relay, n, peer, cfg, stop).await {
        Ok(()) => tracing::info!(export = %name, "detached"),
        Err(e) => tracing::info!(export = %name, error = %e, "connection ended"),
    }
}

/// A socket a connection's thread can take over: it crosses to the
/// thread in its std form and is registered there with that thread's
/// runtime for the handshake; the session then serves it blocking.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send + Sized + 'static {
    type Std: Into<session::Wire> + Send + 'static;
    fn into_std(self) -> std::io::Result<Self::Std>;
    fn from_std(s: Self::Std) -> std::io::Result<Self>;
}

impl Socket for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    fn into_std(self) -> std::io::Result<Self::Std> {
        tokio::net::TcpStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> std::io::Result<Self> {
        tokio::net::TcpStream::from_std(s)
    }
}

impl Socket for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_std(self) -> std::io::Result<Self::Std> {
        tokio::net::UnixStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> std::io::Result<Self> {
        tokio::net::UnixStream::from_std(s)
    }
}

/// Starts serving (or refusing) an accepted connection.
///
/// A served connection gets a thread of its own running a single-threaded
/// runtime: its handshake runs there, then it watches the session (stop,
/// grace, a TLS connection's relay) while the connection's request
/// threads read requests, run them and write replies
/// (`session/workers.rs`). On the shared runtime each request crossed
/// three or four threads, and those wake-ups were most of a 4 KiB
/// request's time. The shared runtime keeps accepting, refusals, timers
/// and the drain at shutdown, which waits for each thread's end.
///
/// The span is attached to the future, not entered across its awaits: an
/// entered span held over an `.await` became the parent of every later
/// connection's span, a chain that grew with each connection (130,000
/// connections: 240 MB) until dropping it overflowed the stack.
fn start<S: Socket>(
    conns: &mut tokio::task::JoinSet<()>,
    admission: &Admission,
    s: S,
    exports: &Arc<Exports>,
    cfg: &ServerConfig,
    stop: &watch::Receiver<bool>,
    peer: Peer,
) {
    let span = tracing::info_span!(parent: None, "conn", %peer);
    match admission.admit() {
        Admit::Serve(slot) => {
            let (session, tls) = (cfg.session.clone(), cfg.tls.read().clone());
            let (exports, stop) = (exports.clone(), stop.clone());
            let std = match s.into_std() {
                Ok(s) => s,
                Err(e) => {
                    span.in_scope(|| tracing::warn!(error = %e, "cannot take over a connection"));
                    return;
                }
            };
            // Resolves when the thread ends (its sender is dropped then).
            let (ended, done) = tokio::sync::oneshot::channel::<()>();
            let thread = move || {
                // Dropped last, after the runtime has waited for its
                // blocking threads: the slot and the server's drain cover
                // everything the connection started.
                let (_slot, _ended) = (slot, ended);
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
                let rt = match rt {
                    Ok(rt) => rt,
                    Err(e) => return span.in_scope(|| tracing::warn!(error = %e, "no runtime")),
                };
                rt.block_on(
                    async move {
                        match S::from_std(std) {
                            Ok(s) => handle(s, exports, session, stop, peer, tls).await,
                            Err(e) => tracing::warn!(error = %e, "cannot take over a connection"),
                        }
                    }
                    .instrument(span),
                );
            };
            match std::thread::Builder::new().name("forkfs-nbd-conn".into()).spawn(thread) {
                Ok(_) => drop(conns.spawn(async move { drop(done.await) })),
                Err(e) => tracing::warn!(error = %e, "no thread for a connection; closed"),
            }
        }
        Admit::Refuse(slot) => {
            let msg = admission.message();
            span.in_scope(|| tracing::warn!("{msg}; refusing a connection"));
            conns.spawn(
                async move {
                    refuse(s, msg).await;
                    drop(slot);
                }
                .instrument(span),
            );
        }
        Admit::Close => drop(s),
    }
}

/// Runs until `shutdown` resolves (or, with `exit_when_idle`, the server
/// has been without clients that long), then drains and persists.
pub async fn run(
    exports: Arc<Exports>,
    mut cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // Set up before anything listens or READY=1 is sent: a reload
    // (SIGHUP) right after must find its handler, and a metrics address
    // that cannot be bound fails the start, not a server already serving.
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let admission = Arc::new(Admission::new(cfg.session.limits.max_connections));
    let _metrics = match &cfg.metrics {
        Some(a) => {
            let l = TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a}"))?;
            tracing::info!(addr = %l.local_addr()?, "metrics (GET /metrics)");
            let src = Arc::new(metrics::Sources {
                exports: exports.clone(),
                admission: admission.clone(),
            });
            Some(AbortOnDrop(tokio::spawn(metrics::serve(l, src))))
        }
        None => None,
    };
    let (mut tcp, mut unix) = (None, None);
    for l in std::mem::take(&mut cfg.inherited) {
        let two =
            || anyhow::anyhow!("more than one socket of a kind passed by the service manager");
        match l {
            Inherited::Tcp(l) if tcp.is_none() => {
                l.set_nonblocking(true)?;
                tcp = Some(TcpListener::from_std(l)?);
            }
            Inherited::Unix(l) if unix.is_none() => {
                l.set_nonblocking(true)?;
                unix = Some(UnixListener::from_std(l)?);
            }
            _ => return Err(two()),
        }
    }
    if let Some(a) = &cfg.listen {
        tcp = Some(TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a}"))?);
    }
    let bound = match &cfg.socket {
        Some(p) => {
            let _ = std::fs::remove_file(p);
            Some(
                UnixListener::bind(p)
                    .with_context(|| format!("cannot listen on {}", p.display()))?,
            )
        }
        None => None,
    };
    unix = bound.or(unix);
    if let Some(t) = &tcp {
        tracing::info!(addr = %t.local_addr()?, "listening (tcp)");
    }
    if let Some(u) = &unix {
        let path =
            u.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string()));
        tracing::info!(path = path.unwrap_or_default(), "listening (unix)");
    }
    systemd::ready();
    let mut conns = tokio::task::JoinSet::new();
    // Refusals (a peer --allow-uid/--allow-gid turns away) are not clients:
    // they keep no server from --exit-when-idle.
    let mut refusals = tokio::task::JoinSet::new();
    let mut timer = tokio::time::interval(cfg.checkpoint_every);
    timer.tick().await;
    // Without clients since (with --exit-when-idle).
    let mut idle = tokio::time::interval(Duration::from_millis(250));
    let mut idle_since = tokio::time::Instant::now();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = idle.tick(), if cfg.exit_when_idle.is_some() => {
                let limit = cfg.exit_when_idle.unwrap_or_default();
                if !conns.is_empty() || (cfg.busy)() {
                    idle_since = tokio::time::Instant::now();
                } else if idle_since.elapsed() >= limit {
                    let after = humantime::format_duration(limit).to_string();
                    tracing::info!(after, "no client: stopping (--exit-when-idle)");
                    break;
                }
            }
            _ = timer.tick() => {
                let ex = exports.clone();
                let every = cfg.checkpoint_every;
                tokio::task::spawn_blocking(move || {
                    for e in ex.opened() {
                        // One still running (a long fold) is left to finish.
                        if let Err(err) = e.checkpoint_unless_running(Duration::ZERO) {
                            tracing::warn!(export = %e.name, error = %err, "checkpoint failed");
                        }
                        e.report(every);
                    }
                });
            }
            Ok((s, peer)) = async { tcp.as_ref().expect("guarded").accept().await }, if tcp.is_some() => {
                let _ = s.set_nodelay(true);
                idle_since = tokio::time::Instant::now();
                let peer = cfg.client_by.tcp(peer);
                start(&mut conns, &admission, s, &exports, &cfg, &stop_rx, peer);
            }
            _ = hangup.recv() => reload_tls(&cfg),
            Ok((s, _)) = async { unix.as_ref().expect("guarded").accept().await }, if unix.is_some() => {
                if let Some(why) = cfg.peers.refuses(&s) {
                    tracing::warn!("{why}; refusing a connection");
                    if let Some(slot) = admission.refusal() {
                        refusals.spawn(async move {
                            refuse(s, why).await;
                            drop(slot);
                        });
                    }
                    continue;
                }
                idle_since = tokio::time::Instant::now();
                let peer = cfg.client_by.unix(&s);
                start(&mut conns, &admission, s, &exports, &cfg, &stop_rx, peer);
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {
                idle_since = tokio::time::Instant::now();
            }
            Some(_) = refusals.join_next(), if !refusals.is_empty() => {}
        }
    }
    systemd::stopping();
    tracing::info!(connections = conns.len(), "shutting down: finishing in-flight requests");
    drop(tcp);
    drop(unix);
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
    while refusals.join_next().await.is_some() {}
    let ex = exports.clone();
    let flushed = tokio::task::spawn_blocking(move || {
        let mut first_failure = None;
        for e in ex.opened() {
            if let Err(err) = e.shutdown() {
                tracing::error!(export = %e.name, error = %err, "final flush failed");
                let name = e.name.clone();
                first_failure.get_or_insert_with(|| err.context(format!("final flush of {name}")));
            }
        }
        checkpoint_all(&ex);
        for e in ex.opened() {
            e.report(cfg.checkpoint_every);
            let c = &e.counters;
            tracing::info!(
                export = %e.name,
                reads = c.reads.load(Ordering::Relaxed),
                writes = c.writes.load(Ordering::Relaxed),
                bytes_read = c.bytes_read.load(Ordering::Relaxed),
                bytes_written = c.bytes_written.load(Ordering::Relaxed),
                flushes = c.flushes.load(Ordering::Relaxed),
                zeroes = c.zeroes.load(Ordering::Relaxed),
                errors = c.errors.load(Ordering::Relaxed),
                checkpoints = c.checkpoints.load(Ordering::Relaxed),
                "export counters"
            );
        }
        first_failure
    })
    .await?;
    if let Some(p) = &cfg.socket {
        let _ = std::fs::remove_file(p);
    }
    // A write the store did not take ends the process with its error.
    match flushed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// SIGHUP: loads the certificate, key and client CA files again (after a
/// rotation); new connections use them, established ones keep theirs. A
/// reload that fails keeps what was loaded before.
fn reload_tls(cfg: &ServerConfig) {
    match cfg.tls_files.load() {
        Ok(None) => tracing::info!("SIGHUP: no TLS configured, nothing to reload"),
        Ok(Some(tls)) => {
            *cfg.tls.write() = Some(tls);
            tracing::info!("SIGHUP: TLS certificates reloaded");
        }
        Err(e) => tracing::error!(
            error = format!("{e:#}"),
            "SIGHUP: TLS certificates not reloaded; the ones loaded before stay in use"
        ),
    }
}

/// Ends a task when dropped (the metrics endpoint ends with the server).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn checkpoint_all(exports: &Exports) {
    for e in exports.opened() {
        if let Err(err) = e.checkpoint(Duration::ZERO) {
            tracing::warn!(export = %e.name, error = %err, "checkpoint failed");
        }
    }
}
