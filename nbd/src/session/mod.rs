//! The transmission phase of one connection, on blocking sockets. Its
//! request threads (`workers.rs`, at most `--threads`) take turns: one
//! reads the next request (or a run of small writes that go on from each
//! other), then runs it and writes its reply itself; it wakes (or starts)
//! another thread to read on only when more requests are already
//! received, the request may wait long or other threads are running. So
//! a request alone on its connection never changes threads, and a deep
//! queue costs no hand-off per request: on 2 cores the wake-ups of a
//! reader thread, a worker and a writer were half of a 4 KiB read's CPU.
//! Replies go out in completion order. A TLS connection is served the
//! same way through a socket pair (`relay.rs`).
//! Every request is charged to the connection's and the server's memory
//! budget (`limits.rs`) before its payload is read, and the charge goes
//! with its reply, which releases it once the bytes are on the socket: a
//! client that does not read replies stops being read.
//! Malformed requests get their error reply and the connection stays
//! usable; only lost framing closes it. A stop (SIGTERM) ends the reading
//! between requests, never inside a request the server has admitted; the
//! idle timeout closes a connection with nothing in flight, also one
//! that sent part of a header and stopped.

mod encode;
mod execute;
mod relay;
mod wire;
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
pub use relay::{Relay, start as relay};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
pub use wire::Wire;
use wire::{Reader, Short};
use workers::Workers;

/// A write payload over the limit is read and dropped up to this size
/// (so the connection stays in sync); beyond it the connection closes.
const MAX_DISCARD: u64 = 256 << 20;
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
/// of, see `persist/clients.rs`) until it ends; `relay` carries it when
/// it is a TLS connection.
pub async fn serve(
    wire: Wire,
    relay: Option<Relay>,
    n: Negotiated,
    peer: Peer,
    cfg: SessionConfig,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let Negotiated { export, structured, contexts } = n;
    let client = export.attach(peer);
    let conn = Conn {
        export: export.clone(),
        structured,
        contexts: Arc::new(contexts),
        client: client.clone(),
        budget: cfg.limits.budget(),
        cfg,
        stop: stop.clone(),
        rt: tokio::runtime::Handle::current(),
    };
    let res = transmit(wire, relay, conn, &mut stop).await;
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
/// However it ends, the requests in flight finish first: a connection is
/// over only when nothing of it can still touch the disk.
async fn transmit(
    wire: Wire,
    relay: Option<Relay>,
    conn: Conn,
    stop: &mut watch::Receiver<bool>,
) -> std::io::Result<bool> {
    wire.prepare(conn.cfg.limits.idle_timeout)?;
    let wire = Arc::new(wire);
    // Every request thread holds a sender: `recv` ends when the last ends.
    let (alive, mut ended) = mpsc::channel::<()>(1);
    let workers = Workers::start(conn, wire.clone(), alive)?;
    let mut abandoned = false;
    tokio::select! {
        _ = ended.recv() => {}
        _ = stop.wait_for(|s| *s) => {
            // Nothing more is read; a thread waiting for a request wakes
            // to the end of the stream, and threads waiting for a turn end.
            workers.end(Ok(false));
            // The requests in flight run to their end however long they
            // take; then a client that does not read their replies gets
            // STOP_GRACE before the writes fail.
            let ran = async {
                while workers.running() > 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(STOP_GRACE).await;
            };
            tokio::select! {
                _ = ended.recv() => {}
                _ = ran => {
                    abandoned = true;
                    wire.shutdown(Shutdown::Both);
                    ended.recv().await;
                }
            }
        }
    }
    wire.shutdown(Shutdown::Both);
    drop(wire);
    let res = workers.outcome();
    drop(workers);
    if let Some(r) = relay {
        r.finish(stop.clone(), STOP_GRACE).await;
    }
    if abandoned {
        return Err(invalid("stopping: the client did not read its replies"));
    }
    res
}

/// One connection's fixed context for its requests.
struct Conn {
    export: Arc<Export>,
    structured: bool,
    contexts: Arc<Vec<MetaContext>>,
    /// The client the connection belongs to (live exports).
    client: Option<Client>,
    cfg: SessionConfig,
    budget: Budget,
    stop: watch::Receiver<bool>,
    /// The connection's runtime: request threads enter it (a FLUSH starts
    /// a checkpoint on its blocking pool) and wait there for memory.
    rt: tokio::runtime::Handle,
}

/// What reading the next request gave.
enum Read {
    /// A request to run.
    Job(Job),
    /// A request answered without running (an error reply).
    Reply(Frame),
    /// The end of the connection: `Ok(true)` after NBD_CMD_DISC,
    /// `Ok(false)` at EOF, a stop or the idle timeout.
    End(std::io::Result<bool>),
}

/// What admitting a request costs in reply memory.
pub(super) fn cost(req: &Request, max_request: u32) -> u32 {
    let data = match req.command {
        Command::Read | Command::Write => req.length.min(max_request),
        Command::BlockStatus => STATUS_REPLY,
        _ => 0,
    };
    data + REQUEST_OVERHEAD
}

/// Reads one request header; `None` when the connection is to end
/// cleanly (EOF between requests, stop, idle timeout).
fn header(rd: &mut Reader, conn: &Conn) -> std::io::Result<Option<[u8; REQUEST_HEADER_LEN]>> {
    let (mut hdr, mut filled) = ([0u8; REQUEST_HEADER_LEN], 0);
    loop {
        if *conn.stop.borrow() {
            return Ok(None);
        }
        // The timeout counts after part of a header too: a client that
        // sends a byte and stops is idle all the same.
        match rd.fill(&mut hdr, &mut filled) {
            Ok(()) => return Ok(Some(hdr)),
            Err(Short::Eof) => return Ok(None),
            // The read timeout is the idle timeout; with something in
            // flight or unsent the connection is not idle, and waits on.
            Err(Short::Quiet) if conn.budget.idle() => {
                tracing::info!(export = %conn.export.name, "idle timeout; closing");
                return Ok(None);
            }
            Err(Short::Quiet) => {}
            Err(Short::Err(e)) => return Err(e),
        }
    }
}

/// Reads the next request and admits it, charging it to the budget
/// unless `charge` already pays for it.
fn read_request(rd: &mut Reader, conn: &Conn, charge: Option<Charge>) -> Read {
    match admit(rd, conn, charge) {
        Ok(r) => r,
        // A stop cuts a payload short: the request was not admitted.
        Err(_) if *conn.stop.borrow() => Read::End(Ok(false)),
        Err(e) => Read::End(Err(e)),
    }
}

fn admit(rd: &mut Reader, conn: &Conn, charge: Option<Charge>) -> std::io::Result<Read> {
    let Conn { export, structured, contexts, client, cfg, budget, stop, rt } = conn;
    let structured = *structured;
    let max_request = cfg.limits.max_request;
    let Some(hdr) = header(rd, conn)? else { return Ok(Read::End(Ok(false))) };
    let req = match proto::decode_request(&hdr) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(export = %export.name, error = %e, "bad request framing; closing");
            return Ok(Read::End(Ok(false)));
        }
    };
    tracing::debug!(export = %export.name, cmd = ?req.command, offset = req.offset, len = req.length, "request");
    // Back-pressure: nothing more is read until the memory is free.
    let charge = match charge {
        Some(c) => c,
        None => match budget.charge_blocking(cost(&req, max_request), stop, rt) {
            Some(c) => c,
            None => return Ok(Read::End(Ok(false))),
        },
    };
    let payload_len = req.payload_len();
    let mut payload = Vec::new();
    if payload_len > max_request {
        if u64::from(payload_len) > MAX_DISCARD {
            return Err(invalid("write payload too large"));
        }
        rd.discard(u64::from(payload_len))?;
        let msg = format!("request over the maximum of {max_request} bytes");
        return Ok(Read::Reply(reply_error(charge, &req, structured, Errno::Inval, &msg)));
    } else if payload_len > 0 {
        payload = vec![0u8; payload_len as usize];
        rd.exact(&mut payload)?;
    }
    if req.command == Command::Disc {
        return Ok(Read::End(Ok(true)));
    }
    if let Err((e, msg)) = validate(&req, export, structured, contexts.len(), max_request) {
        Counters::add(&export.counters.errors, 1);
        return Ok(Read::Reply(reply_error(charge, &req, structured, e, &msg)));
    }
    // Recorded only now that nothing can wait any more: a FLUSH on
    // another connection waits for the writes that arrived before it.
    let mutating = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
    Ok(Read::Job(Job {
        arrival: export.arrive(mutating),
        arrived: std::time::Instant::now(),
        ex: export.clone(),
        ctx: contexts.clone(),
        checkpoint_after_flush: cfg.checkpoint_after_flush,
        client: client.clone(),
        structured,
        req,
        payload,
        charge,
    }))
}

/// One admitted, validated request and what it needs to run and reply.
struct Job {
    ex: Arc<Export>,
    ctx: Arc<Vec<MetaContext>>,
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
    /// Runs the request (blocking): its reply.
    fn run(self) -> Frame {
        let Job {
            ex,
            ctx,
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
        // A bug that panics fails its request with EIO: it must not take
        // down a request thread (the connection's reader may be its turn).
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
                if req.command == Command::Flush && ex.checkpoint_due(checkpoint_after_flush) {
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = ex.checkpoint_unless_running(checkpoint_after_flush) {
                            tracing::warn!(export = %ex.name, error = %e, "checkpoint after flush failed");
                        }
                    });
                }
                (encode(&req, structured, out), charge)
            }
            Err((e, msg)) => {
                Counters::add(&ex.counters.errors, 1);
                tracing::debug!(export = %ex.name, error = %msg, "request failed");
                reply_error(charge, &req, structured, e, &msg)
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
