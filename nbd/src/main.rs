//! `forkfs-nbd`: serves forkfs block volumes over the NBD protocol.

mod admit;
mod changed;
mod export;
mod exports;
mod limits;
mod listen;
mod metrics;
mod negotiate;
mod peers;
mod persist;
mod proto;
mod safepoint;
mod server;
mod session;
mod systemd;
mod tls;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "forkfs-nbd", version, about = "Serve forkfs block volumes over NBD")]
struct Cli {
    /// Store directory [default: $XDG_DATA_HOME/forkfs]
    #[arg(long, env = "FORKFS_STORE", global = true)]
    store: Option<PathBuf>,
    /// Log verbosity (also RUST_LOG)
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log lines as text, or as one JSON object per line (for a log
    /// collector: timestamp, level, target, fields)
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve volumes: VOL is the live head (read-write), VOL@VERSION a version (read-only)
    Serve {
        /// TCP address to listen on [default: 127.0.0.1:10809 unless --socket is given];
        /// loopback only unless TLS with client certificates
        /// (--tls-client-ca) or --insecure-listen
        #[arg(long)]
        listen: Option<String>,
        /// Allow --listen on a non-loopback address without client
        /// certificates: anyone who reaches it reads and writes every
        /// served disk
        #[arg(long)]
        insecure_listen: bool,
        /// This server's certificate chain (PEM). With --tls-key, every
        /// connection must upgrade to TLS (NBD_OPT_STARTTLS) before it may
        /// list, query or attach
        #[arg(long, value_name = "FILE")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM)
        #[arg(long, value_name = "FILE")]
        tls_key: Option<PathBuf>,
        /// CA certificate(s) (PEM): clients must present a certificate
        /// signed by one of them (the access control)
        #[arg(long, value_name = "FILE")]
        tls_client_ca: Option<PathBuf>,
        /// Serve volume VOL only to TLS clients presenting the certificate
        /// whose SHA-256 fingerprint is FINGERPRINT (as `openssl x509
        /// -noout -fingerprint -sha256` prints it; colons and case do not
        /// matter); repeatable: several certificates per volume, several
        /// volumes. Needs --tls-client-ca. Volumes not named are served to
        /// every client the CA admits
        #[arg(long, value_name = "VOL=FINGERPRINT", value_parser = parse_rule)]
        allow_client: Vec<(String, String)>,
        /// Serve Prometheus metrics (`GET /metrics`) on this TCP address;
        /// loopback only unless --insecure-listen
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Over the Unix socket, only processes of this user id may
        /// connect (or of a group of --allow-gid); repeatable [default:
        /// whoever may open the socket file]
        #[arg(long, value_name = "UID")]
        allow_uid: Vec<u32>,
        /// Over the Unix socket, only processes whose primary group is
        /// this one may connect (or of a user of --allow-uid); repeatable
        #[arg(long, value_name = "GID")]
        allow_gid: Vec<u32>,
        /// Unix socket to listen on. Under socket activation (LISTEN_FDS,
        /// e.g. systemd's forkfs-nbd.socket) the passed sockets are used
        /// instead of --listen and --socket
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Stop (as on SIGTERM) once no client has been connected for this
        /// long: a server started on demand (socket activation) ends when
        /// its last client left
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
        exit_when_idle: Option<Duration>,
        /// Serve only these exports (VOL or VOL@VERSION; default: every block volume)
        #[arg(long)]
        export: Vec<String>,
        /// Take a version of changed volumes this often
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        checkpoint_every: Duration,
        /// After SIGTERM or SIGINT, how long the stop (in-flight requests,
        /// the final flush and checkpoint) may take before the server exits
        /// at once with 75 (what was flushed is kept); a second signal does
        /// so sooner
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        stop_timeout: Duration,
        /// After a FLUSH, take a version if this long passed since the last one
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        checkpoint_after_flush: Duration,
        /// When writes persist: `flush` (every FLUSH/FUA) or `btrfs` (only at
        /// btrfs commits; writes after the last one are discarded when a
        /// client goes away uncleanly). MODE for every live export, or
        /// VOL=MODE for one; repeatable [default: each volume's setting,
        /// see `forkfs volume consistency`]
        #[arg(long, value_name = "[VOL=]MODE", value_parser = parse_mode)]
        consistency: Vec<(Option<String>, persist::Mode)>,
        /// In btrfs mode, what one client is: a lost connection discards
        /// the writes its client made since the last safe point. `peer`:
        /// the connections of one process (Unix socket) or one IP address
        /// (TCP); `export`: every connection of the export (for a client
        /// that writes one filesystem from several processes)
        #[arg(long, value_enum, default_value = "peer")]
        client_by: server::ClientBy,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

/// Resource limits (see `limits.rs`).
#[derive(clap::Args)]
struct LimitArgs {
    /// Largest READ or WRITE a client may send (advertised as the maximum
    /// block size); larger ones get EINVAL
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE")]
    max_request: u64,
    /// Memory for the requests and replies in flight on one connection;
    /// a client that does not read its replies stops being read at this
    #[arg(long, default_value = "256MiB", value_parser = parse_size, value_name = "SIZE")]
    connection_memory: u64,
    /// The same for all connections together
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "SIZE")]
    memory: u64,
    /// Close a connection that has not finished its handshake by then
    /// (opening an export on a remote store may take a read deadline)
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    handshake_timeout: Duration,
    /// Close a connection with nothing in flight that sends no request for
    /// this long; 0 never does
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// Connections at once; more are refused (with NBD_REP_ERR_POLICY
    /// where the handshake allows)
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Request threads per connection: they take turns reading requests
    /// and run them in parallel (a request alone on its connection runs
    /// on the thread that read it) [default: 8; 16 on a store in a bucket]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    forkfs::parse_size(s).map_err(|e| e.to_string())
}

/// `VOL=FINGERPRINT`: the fingerprint as `sha256:` and 64 lowercase hex
/// digits (from `AB:CD:…`, `sha256:ab…`, or openssl's whole line).
fn parse_rule(s: &str) -> Result<(String, String), String> {
    let bad = || format!("{s:?} is not VOL=FINGERPRINT (a SHA-256 fingerprint)");
    let (vol, fp) = s.split_once('=').filter(|(v, _)| !v.is_empty()).ok_or_else(bad)?;
    let fp = fp.rsplit_once('=').map_or(fp, |(_, f)| f).to_ascii_lowercase();
    let hex: String = fp.trim_start_matches("sha256:").chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    Ok((vol.to_string(), format!("sha256:{hex}")))
}

fn parse_mode(s: &str) -> Result<(Option<String>, persist::Mode), String> {
    match s.split_once('=') {
        Some((vol, m)) => Ok((Some(vol.to_string()), m.parse()?)),
        None => Ok((None, s.parse()?)),
    }
}

fn main() {
    forkfs::restrict_umask();
    let cli = Cli::parse();
    let level = ["info", "info", "debug", "trace"][cli.verbose.min(3) as usize];
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => {
            logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init()
        }
    }
    if let Err(e) = run(cli) {
        eprintln!("forkfs-nbd: {}", forkfs::one_line(e.as_ref()));
        std::process::exit(forkfs::exit_code(e.as_ref()));
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let Command::Serve {
        listen,
        socket,
        export,
        checkpoint_every,
        checkpoint_after_flush,
        consistency,
        client_by,
        insecure_listen,
        tls_cert,
        tls_key,
        tls_client_ca,
        stop_timeout,
        exit_when_idle,
        allow_uid,
        allow_gid,
        metrics,
        allow_client,
        limits: l,
    } = cli.command;
    if exit_when_idle.is_some_and(|d| d.is_zero()) {
        return Err(forkfs::Error::invalid("--exit-when-idle must be longer than 0").into());
    }
    let inherited = systemd::listeners()?;
    if !inherited.is_empty() && (listen.is_some() || socket.is_some()) {
        return Err(forkfs::Error::invalid(
            "--listen or --socket given to a socket-activated server (LISTEN_FDS): it listens \
             on the sockets it was passed; drop the flags or the activation",
        )
        .into());
    }
    let files = tls::TlsFiles { cert: tls_cert, key: tls_key, client_ca: tls_client_ca };
    let tls = files.load().map_err(|e| forkfs::Error::invalid(format!("{e:#}")))?;
    let authenticated = tls.as_ref().is_some_and(|t| t.verifies_clients);
    if !allow_client.is_empty() && !authenticated {
        return Err(forkfs::Error::invalid(
            "--allow-client needs client certificates: give --tls-cert, --tls-key and --tls-client-ca",
        )
        .into());
    }
    if let Some(addr) = &listen {
        listen::check(addr, insecure_listen || authenticated, listen::Listener::Nbd)?;
    }
    if let Some(addr) = &metrics {
        listen::check(addr, insecure_listen, listen::Listener::Metrics)?;
    }
    for l in &inherited {
        if let systemd::Inherited::Tcp(t) = l {
            let a = t.local_addr()?.to_string();
            listen::check(&a, insecure_listen || authenticated, listen::Listener::Nbd)?;
        }
    }
    let mut limits = limits::Limits::new(
        l.max_request,
        l.connection_memory,
        l.memory,
        l.handshake_timeout,
        l.idle_timeout,
        l.max_connections,
        limits::default_threads(l.threads, false),
    )
    .map_err(forkfs::Error::invalid)?;
    let dir = cli.store.unwrap_or_else(forkfs::default_store_dir);
    let store = forkfs::Store::open_with(&dir, &forkfs::Settings::from_env()).map_err(|e| {
        if !e.is_store_in_use() {
            return e;
        }
        // A store has one holder, and forkfs-nbd hosts mounts too.
        let hint = "; stop it first, then start forkfs-nbd: `forkfs mount` then asks this \
                    server to host the mounts";
        let message = format!("{e}{hint}");
        forkfs::Error::new(e.kind(), message).with_detail(forkfs::Detail::StoreInUse)
    })?;
    limits.threads = limits::default_threads(l.threads, store.is_remote());
    // `forkfs gc`, `fsck`, `prune`, snapshots and groups reach this process
    // while it holds the store, and `forkfs mount` asks it to host mounts.
    let extensions = forkfs::service::Extensions::default();
    let mounts = forkfs::mount::host::Host::resident(store.clone(), &extensions);
    let _control = forkfs::service::serve(store.clone(), extensions)?;
    let exports = Arc::new(
        exports::Exports::new(store, export.clone(), consistency).with_clients(allow_client)?,
    );
    for name in &export {
        exports.open(name).with_context(|| format!("export {name}"))?;
    }
    let listen = match (&listen, &socket) {
        (None, None) if inherited.is_empty() => Some("127.0.0.1:10809".to_string()),
        _ => listen,
    };
    let cfg = server::ServerConfig {
        listen,
        socket,
        inherited,
        exit_when_idle,
        busy: {
            let m = mounts.clone();
            Arc::new(move || m.is_busy())
        },
        peers: peers::Peers { uids: allow_uid, gids: allow_gid },
        metrics,
        session: session::SessionConfig { checkpoint_after_flush, limits },
        checkpoint_every: checkpoint_every.max(Duration::from_millis(10)),
        client_by,
        tls: Arc::new(parking_lot::RwLock::new(tls)),
        tls_files: files,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("forkfs-nbd")
        .build()?;
    let (hosted, closing) = (mounts.clone(), mounts.clone());
    let served = rt.block_on(async move {
        // Installed before anything listens: a SIGTERM that arrives as soon
        // as the socket answers must still mean a graceful stop.
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM"),
                _ = int.recv() => tracing::info!("SIGINT"),
            }
            // No new hosted mount while the connections drain.
            closing.close();
            // The stop is bounded: a second signal or the stop timeout
            // ends the process now.
            tokio::spawn(async move {
                let why = tokio::select! {
                    _ = term.recv() => "a second signal (SIGTERM)".to_string(),
                    _ = int.recv() => "a second signal (SIGINT)".to_string(),
                    _ = tokio::time::sleep(stop_timeout) => {
                        format!("--stop-timeout {} passed", humantime::format_duration(stop_timeout))
                    }
                };
                hosted.detach_all();
                tracing::error!(
                    "stopping now ({why}): writes flushed (FLUSH, FUA) or fsynced are kept, \
                     the rest of the last requests and hosted mounts' unsynced writes may be lost"
                );
                // No destructors: threads may still be inside the store.
                unsafe { libc::_exit(75) };
            });
        };
        server::run(exports, cfg, shutdown).await
    });
    // Mounts hosted for `forkfs mount` end too, each with its last
    // checkpoint, however the server ended (a failed final flush, an idle
    // exit); within the stop timeout, else detached.
    mounts.close();
    if mounts.is_busy() {
        tracing::info!("unmounting hosted mounts");
    }
    mounts.unmount_all();
    let ended = mounts.wait_for(stop_timeout) || {
        tracing::error!("hosted mounts did not end within --stop-timeout: detaching them");
        mounts.detach_all();
        mounts.wait_for(Duration::from_secs(5))
    };
    // `wait` only once none is left running (it would wait for ever).
    if let Some(e) = ended.then(|| mounts.wait()).flatten() {
        tracing::error!(error = %e, "a hosted mount ended with an error");
    }
    served?;
    tracing::info!("stopped");
    Ok(())
}
