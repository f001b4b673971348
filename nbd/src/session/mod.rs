//! The transmission phase of one connection: requests are read in a loop
//! on the connection's thread; a quick one alone on the connection runs
//! there, the others on the connection's request threads (`workers.rs`),
//! and replies go out in completion order.
//! Every request is charged to the connection's and the server's memory
//! budget (`limits.rs`) before its payload is read, and the charge goes
//! with its reply to the writer, which releases it once the bytes are on
//! the socket: a client that does not read replies stops being read.
//! Malformed requests get their error reply and the connection stays
//! usable; only lost framing closes it. A stop (SIGTERM) or the idle
//! timeout ends the loop between requests, never inside a request the
//! server has admitted.

mod encode;
mod execute;
mod workers;

use crate::export::{Counters, Export, errno};
use crate::limits::{Budget, Charge, Limits, REQUEST_OVERHEAD, STATUS_REPLY};
use crate::negotiate::{MetaContext, Negotiated, invalid};
use crate::persist::End;
use crate::persist::clients::{Client, Peer};
use crate::proto::consts::REQUEST_HEADER_LEN;
use crate::proto::{self, Command, Errno, Request};
use encode::{encode, reply_error};
use execute::{execute, validate};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use workers::Workers;

/// A write payload over the limit is read and dropped up to this size
/// (so the connection stays in sync); beyond it the connection closes.
const MAX_DISCARD: u64 = 256 << 20;
/// Bytes of small replies gathered into one write.
const WRITE_BUFFER: usize = 16 << 10;
/// Bytes read from the socket at a time.
const READ_BUFFER: usize = 64 << 10;
/// After a stop, how long replies already computed may take to reach a
/// client that does not read them before the connection is dropped.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Minimum time between versions created after flushes.
    pub checkpoint_after_flush: Duration,
    pub limits: Limits,
}

/// What one request produced.
enum Outcome {
    Done,
    Data(Vec<forkfs::Piece>),
    Status(Vec<(u32, Vec<proto::BlockDescriptor>)>),
}

/// A reply ready to write, and the memory it holds until written.
type Frame = (encode::Reply, Charge);

/// Serves one connection from `peer` (which says what client it is part
/// of, see `persist/clients.rs`) until it ends.
pub async fn serve<S>(
    stream: S,
    n: Negotiated,
    peer: Peer,
    cfg: SessionConfig,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Negotiated { export, structured, contexts } = n;
    let client = export.attach(peer);
    let res = transmit(stream, &export, structured, contexts, client.clone(), cfg, &mut stop).await;
    let end = match &res {
        Ok(true) => End::Clean,
        _ if *stop.borrow() => End::Stopped,
        _ => End::Lost,
    };
    let ex = export.clone();
    let _ = tokio::task::spawn_blocking(move || ex.detach(client.as_ref(), end)).await;
    res.map(|_| ())
}

/// Runs requests until the connection ends; `Ok(true)` after NBD_CMD_DISC.
async fn transmit<S>(
    stream: S,
    export: &Arc<Export>,
    structured: bool,
    contexts: Vec<MetaContext>,
    client: Option<Client>,
    cfg: SessionConfig,
    stop: &mut watch::Receiver<bool>,
) -> std::io::Result<bool>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let contexts = Arc::new(contexts);
    let (rd, wr) = tokio::io::split(stream);
    // Buffered: headers and small payloads take no read call each, and
    // what is buffered says whether more requests are waiting.
    let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
    // Small replies queued together go out in one write (a reply larger
    // than the buffer is written straight from its pieces); the buffer is
    // flushed whenever the queue is empty.
    let mut wr = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, wr);
    // Unbounded as a queue, bounded by the charges its frames carry.
    let (tx, mut rx) = mpsc::unbounded_channel::<Frame>();
    let mut writer = tokio::spawn(async move {
        while let Some((frame, charge)) = rx.recv().await {
            frame.write_to(&mut wr).await?;
            drop((frame, charge));
            // Nothing more to write for now: what a writer holds back (TLS
            // records the socket could not take yet) goes out before it
            // waits, or the client would wait for it for ever.
            if rx.is_empty() {
                wr.flush().await?;
            }
        }
        wr.flush().await?;
        Ok::<_, std::io::Error>(wr)
    });
    let mut tasks = Workers::new(cfg.limits.threads);
    let budget = cfg.limits.budget();
    let conn = Conn { export: export.clone(), structured, contexts, client, cfg, tx, budget };
    // However the loop ends, the requests in flight finish first: a
    // connection is over only when nothing of it can still touch the disk.
    // They never wait for the socket, so this ends.
    let ended = requests(&mut rd, &conn, &mut tasks, stop).await;
    tasks.finish().await;
    drop(conn);
    // A client that does not read its replies holds the writer; a stop
    // gives it STOP_GRACE, then drops them.
    let written = tokio::select! {
        w = &mut writer => w,
        _ = async { drop(stop.wait_for(|s| *s).await) } => match tokio::time::timeout(STOP_GRACE, &mut writer).await {
            Ok(w) => w,
            Err(_) => {
                writer.abort();
                return Err(invalid("stopping: the client did not read its replies"));
            }
        },
    };
    match written {
        Ok(Ok(mut wr)) => {
            let _ = wr.shutdown().await;
            ended
        }
        Ok(Err(e)) => Err(e),
        Err(e) => Err(invalid(e)),
    }
}

/// One connection's fixed context for its requests.
struct Conn {
    export: Arc<Export>,
    structured: bool,
    contexts: Arc<Vec<MetaContext>>,
    /// The client the connection belongs to (live exports).
    client: Option<Client>,
    cfg: SessionConfig,
    tx: mpsc::UnboundedSender<Frame>,
    budget: Budget,
}

/// How waiting for the client ended.
enum Wait<T> {
    Got(T),
    Stopped,
    Idle,
}

/// Runs `f` until it ends, the server stops or (if `idle` says so) the
/// connection has been idle for the idle timeout. `f` must be cancel-safe
/// unless the caller closes the connection on `Stopped`/`Idle`.
async fn wait<T>(
    f: impl std::future::Future<Output = T>,
    stop: &mut watch::Receiver<bool>,
    idle: Option<Duration>,
) -> Wait<T> {
    let idle = async {
        match idle {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => Wait::Stopped,
        r = f => Wait::Got(r),
        _ = idle => Wait::Idle,
    }
}

/// Reads one request header; `None` when the connection is to end
/// cleanly (EOF between requests, stop, idle timeout).
async fn header<R: AsyncRead + Unpin>(
    rd: &mut R,
    conn: &Conn,
    stop: &mut watch::Receiver<bool>,
) -> std::io::Result<Option<[u8; REQUEST_HEADER_LEN]>> {
    let mut hdr = [0u8; REQUEST_HEADER_LEN];
    let mut filled = 0;
    while filled < hdr.len() {
        // When the timer fires with something in flight or unsent, it
        // starts again; a partial `read` is cancel-safe, so the header
        // survives that.
        match wait(rd.read(&mut hdr[filled..]), stop, conn.cfg.limits.idle_timeout).await {
            Wait::Got(Ok(0)) if filled == 0 => return Ok(None),
            Wait::Got(Ok(0)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Wait::Got(Ok(n)) => filled += n,
            Wait::Got(Err(e)) => return Err(e),
            Wait::Stopped => return Ok(None),
            Wait::Idle if conn.budget.idle() => {
                tracing::info!(export = %conn.export.name, "idle timeout; closing");
                return Ok(None);
            }
            Wait::Idle => {}
        }
    }
    Ok(Some(hdr))
}

/// What admitting a request costs in reply memory.
fn cost(req: &Request, max_request: u32) -> u32 {
    let data = match req.command {
        Command::Read | Command::Write => req.length.min(max_request),
        Command::BlockStatus => STATUS_REPLY,
        _ => 0,
    };
    data + REQUEST_OVERHEAD
}

/// Reads requests and runs or queues each until the connection ends;
/// `Ok(true)` after NBD_CMD_DISC.
async fn requests<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    conn: &Conn,
    tasks: &mut Workers,
    stop: &mut watch::Receiver<bool>,
) -> std::io::Result<bool> {
    let Conn { export, structured, contexts, client, cfg, tx, budget } = conn;
    let structured = *structured;
    let max_request = cfg.limits.max_request;
    loop {
        let Some(hdr) = header(rd, conn, stop).await? else { return Ok(false) };
        let req = match proto::decode_request(&hdr) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(export = %export.name, error = %e, "bad request framing; closing");
                return Ok(false);
            }
        };
        tracing::debug!(export = %export.name, cmd = ?req.command, offset = req.offset, len = req.length, "request");
        // Back-pressure: nothing more is read until the memory is free.
        let charge = match wait(budget.charge(cost(&req, max_request)), stop, None).await {
            Wait::Got(c) => c,
            _ => return Ok(false),
        };
        let payload_len = req.payload_len();
        let mut payload = Vec::new();
        if payload_len > max_request {
            if u64::from(payload_len) > MAX_DISCARD {
                return Err(invalid("write payload too large"));
            }
            let (mut rest, mut sink) = ((&mut *rd).take(u64::from(payload_len)), tokio::io::sink());
            let drain = tokio::io::copy(&mut rest, &mut sink);
            match wait(drain, stop, None).await {
                Wait::Got(r) => r?,
                _ => return Ok(false),
            };
            let msg = format!("request over the maximum of {max_request} bytes");
            reply_error(tx, charge, &req, structured, Errno::Inval, &msg);
            continue;
        } else if payload_len > 0 {
            payload = vec![0u8; payload_len as usize];
            match wait(rd.read_exact(&mut payload), stop, None).await {
                Wait::Got(r) => r?,
                _ => return Ok(false),
            };
        }
        if req.command == Command::Disc {
            return Ok(true);
        }
        if let Err((e, msg)) = validate(&req, export, structured, contexts.len(), max_request) {
            Counters::add(&export.counters.errors, 1);
            reply_error(tx, charge, &req, structured, e, &msg);
            continue;
        }
        // Recorded only now that nothing can wait any more: a FLUSH on
        // another connection waits for the writes that arrived before it.
        let mutating = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
        let quick = export.is_quick(&req);
        let job = Job {
            arrival: export.arrive(mutating),
            arrived: std::time::Instant::now(),
            ex: export.clone(),
            ctx: contexts.clone(),
            tx: tx.clone(),
            checkpoint_after_flush: cfg.checkpoint_after_flush,
            client: client.clone(),
            structured,
            req,
            payload,
            charge,
        };
        // A quick request alone on its connection (nothing in flight,
        // nothing more received) runs here, on the connection's thread: no
        // hand-off to another thread and back, the cost that dominated a
        // queue depth of 1. Anything else, and anything that may wait
        // long (a FLUSH, a fetch) and so hold up requests sent behind it,
        // runs on a request thread, in parallel.
        if quick && tasks.pending() == 0 && rd.buffer().is_empty() {
            job.run();
        } else {
            tasks.submit(job);
        }
    }
}

/// One admitted, validated request and what it needs to run and reply.
struct Job {
    ex: Arc<Export>,
    ctx: Arc<Vec<MetaContext>>,
    tx: mpsc::UnboundedSender<Frame>,
    /// A FLUSH's reply is followed by a checkpoint at most this often.
    checkpoint_after_flush: Duration,
    client: Option<Client>,
    structured: bool,
    req: Request,
    payload: Vec<u8>,
    charge: Charge,
    /// Held until the request ran: a FLUSH waits for the writes before it.
    arrival: Option<crate::persist::Arrival>,
    arrived: std::time::Instant,
}

impl Job {
    /// Runs the request (blocking) and queues its reply for the writer.
    fn run(self) {
        let Job {
            ex,
            ctx,
            tx,
            checkpoint_after_flush,
            client,
            structured,
            req,
            payload,
            charge,
            arrival,
            arrived,
        } = self;
        let fail = |e: forkfs::Error| (errno(&e), e.to_string());
        let run = || {
            if let (Command::Flush, Some(a)) = (req.command, &arrival) {
                ex.wait_for_earlier_writes(a).map_err(fail)?;
            }
            let _op = ex.begin(client.as_ref()).map_err(fail)?;
            let _touch = touches(&req).and_then(|write| {
                ex.touch(client.as_ref(), write, req.offset, u64::from(req.length))
            });
            execute(&ex, &req, payload, &ctx)
        };
        // A bug that panics fails its request with EIO, as a task's panic
        // did: it must not take down the connection's thread (whose end
        // detaches the client) or a request thread (whose queue would stop).
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(export = %ex.name, panic = %what, "a request panicked");
            Err((Errno::Io, format!("internal error: {what}")))
        });
        drop(arrival);
        ex.latency.observe(req.command, arrived.elapsed());
        match res {
            Ok(out) => {
                let _ = tx.send((encode(&req, structured, out), charge));
                if req.command == Command::Flush && ex.checkpoint_due(checkpoint_after_flush) {
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = ex.checkpoint_unless_running(checkpoint_after_flush) {
                            tracing::warn!(export = %ex.name, error = %e, "checkpoint after flush failed");
                        }
                    });
                }
            }
            Err((e, msg)) => {
                Counters::add(&ex.counters.errors, 1);
                tracing::debug!(export = %ex.name, error = %msg, "request failed");
                reply_error(&tx, charge, &req, structured, e, &msg);
            }
        }
    }
}

/// Whether a request reads (`Some(false)`) or writes (`Some(true)`) its
/// range, for the client record of `persist/clients.rs`. BLOCK_STATUS
/// reads: the allocation it reports may be another client's pending write.
fn touches(req: &Request) -> Option<bool> {
    match req.command {
        Command::Write | Command::Trim | Command::WriteZeroes => Some(true),
        Command::Read | Command::BlockStatus => Some(false),
        _ => None,
    }
}
