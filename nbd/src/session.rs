//! The transmission phase of one connection: requests are read in a loop
//! and each runs as its own task (replies go out in completion order), with
//! the bytes in flight bounded. Malformed requests get their error reply
//! and the connection stays usable; only lost framing closes it.

use crate::export::{Counters, Export, errno};
use crate::negotiate::{MAX_REQUEST, MetaContext, Negotiated, invalid};
use crate::persist::End;
use crate::persist::clients::{Client, Peer};
use crate::proto::consts::REQUEST_HEADER_LEN;
use crate::proto::{self, CmdFlags, Command, Errno, Request};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, watch};

/// Bytes of request and reply data in flight per connection.
const MAX_INFLIGHT: usize = 128 << 20;
/// A write payload over the limit is read and dropped up to this size
/// (so the connection stays in sync); beyond it the connection closes.
const MAX_DISCARD: u64 = 64 << 20;
/// Descriptors per BLOCK_STATUS reply chunk.
const MAX_DESCRIPTORS: usize = 4096;

#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Minimum time between versions created after flushes.
    pub checkpoint_after_flush: Duration,
}

/// What one request produced.
enum Outcome {
    Done,
    Data(Vec<u8>),
    Status(Vec<(u32, Vec<proto::BlockDescriptor>)>),
}

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
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            wr.write_all(&frame).await?;
        }
        wr.flush().await?;
        Ok::<_, std::io::Error>(wr)
    });
    let mut tasks = tokio::task::JoinSet::new();
    let conn = Conn { export: export.clone(), structured, contexts, client, cfg, tx };
    // However the loop ends, the requests in flight finish first: a
    // connection is over only when nothing of it can still touch the disk.
    let ended = requests(&mut rd, &conn, &mut tasks, stop).await;
    while tasks.join_next().await.is_some() {}
    drop(conn);
    match writer.await {
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
    tx: mpsc::UnboundedSender<Vec<u8>>,
}

/// Reads requests and starts each as a task until the connection ends;
/// `Ok(true)` after NBD_CMD_DISC.
async fn requests<R: AsyncRead + Unpin>(
    rd: &mut R,
    conn: &Conn,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &mut watch::Receiver<bool>,
) -> std::io::Result<bool> {
    let Conn { export, structured, contexts, client, cfg, tx } = conn;
    let structured = *structured;
    let budget = Arc::new(Semaphore::new(MAX_INFLIGHT));
    let mut clean = false;
    loop {
        let mut hdr = [0u8; REQUEST_HEADER_LEN];
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            r = rd.read_exact(&mut hdr) => match r {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            },
        }
        let req = match proto::decode_request(&hdr) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(export = %export.name, error = %e, "bad request framing; closing");
                break;
            }
        };
        tracing::debug!(export = %export.name, cmd = ?req.command, offset = req.offset, len = req.length, "request");
        let payload_len = req.payload_len();
        let mut payload = Vec::new();
        if payload_len > 0 {
            if payload_len > MAX_REQUEST {
                if u64::from(payload_len) > MAX_DISCARD {
                    return Err(invalid("write payload too large"));
                }
                tokio::io::copy(
                    &mut (&mut *rd).take(u64::from(payload_len)),
                    &mut tokio::io::sink(),
                )
                .await?;
                reply_error(tx, &req, structured, Errno::Inval, "request over 32 MiB");
                continue;
            }
            payload = vec![0u8; payload_len as usize];
            rd.read_exact(&mut payload).await?;
        }
        if req.command == Command::Disc {
            clean = true;
            break;
        }
        if let Err((e, msg)) = validate(&req, export, structured, contexts.len()) {
            Counters::add(&export.counters.errors, 1);
            reply_error(tx, &req, structured, e, msg);
            continue;
        }
        let mutating = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
        let arrival = export.arrive(mutating);
        let cost = (req.length as usize).min(MAX_REQUEST as usize).max(1);
        let permit = budget.clone().acquire_many_owned(cost as u32).await.map_err(invalid)?;
        let (ex, ctx, tx, cfg) = (export.clone(), contexts.clone(), tx.clone(), cfg.clone());
        let client = client.clone();
        tasks.spawn(async move {
            let ex2 = ex.clone();
            let res = tokio::task::spawn_blocking(move || {
                let fail = |e: forkfs::Error| (errno(&e), e.to_string());
                if let (Command::Flush, Some(a)) = (req.command, &arrival) {
                    ex2.wait_for_earlier_writes(a).map_err(fail)?;
                }
                let _op = ex2.begin(client.as_ref()).map_err(fail)?;
                let _touch = touches(&req).and_then(|write| {
                    ex2.touch(client.as_ref(), write, req.offset, u64::from(req.length))
                });
                let out = execute(&ex2, &req, payload, &ctx);
                drop(arrival);
                out
            })
            .await;
            let res = res.unwrap_or_else(|e| Err((Errno::Io, format!("request task failed: {e}"))));
            match res {
                Ok(out) => {
                    let _ = tx.send(encode(&req, structured, out, ex.block_size));
                    if req.command == Command::Flush {
                        let ex = ex.clone();
                        tokio::task::spawn_blocking(move || {
                            if let Err(e) = ex.checkpoint(cfg.checkpoint_after_flush) {
                                tracing::warn!(export = %ex.name, error = %e, "checkpoint after flush failed");
                            }
                        });
                    }
                }
                Err((e, msg)) => {
                    Counters::add(&ex.counters.errors, 1);
                    tracing::debug!(export = %ex.name, error = %msg, "request failed");
                    reply_error(&tx, &req, structured, e, &msg);
                }
            }
            drop(permit);
        });
        // Reap finished tasks so the set does not grow without bound.
        while tasks.try_join_next().is_some() {}
    }
    Ok(clean)
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

/// Checks a request before running it: the documented errno on failure.
fn validate(
    req: &Request,
    ex: &Export,
    structured: bool,
    ncontexts: usize,
) -> Result<(), (Errno, &'static str)> {
    if let Command::Unknown(_) | Command::Resize = req.command {
        return Err((Errno::Inval, "unknown or unsupported command"));
    }
    if !req.invalid_flags().is_empty() {
        return Err((Errno::Inval, "flag not valid for this command"));
    }
    if req.flags.contains(CmdFlags::DF) && !structured {
        return Err((Errno::Inval, "DF needs structured replies"));
    }
    let mutating = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
    if mutating && ex.read_only {
        return Err((Errno::Perm, "export is read-only"));
    }
    if req.command == Command::Read && req.length > MAX_REQUEST {
        return Err((Errno::Inval, "request over 32 MiB"));
    }
    let bounded = !matches!(req.command, Command::Flush);
    if bounded && !req.in_bounds(ex.size) {
        return Err(if mutating {
            (Errno::NoSpc, "beyond the end of the export")
        } else {
            (Errno::Inval, "beyond the end of the export")
        });
    }
    if req.command == Command::BlockStatus && (!structured || ncontexts == 0) {
        return Err((Errno::Inval, "no metadata context negotiated"));
    }
    if req.command == Command::Flush && (req.offset != 0 || req.length != 0) {
        return Err((Errno::Inval, "flush takes no range"));
    }
    Ok(())
}

/// Runs a validated request against the export (blocking).
fn execute(
    ex: &Export,
    req: &Request,
    payload: Vec<u8>,
    ctx: &[MetaContext],
) -> Result<Outcome, (Errno, String)> {
    let fail = |e: forkfs::Error| (errno(&e), e.to_string());
    let fua = req.flags.contains(CmdFlags::FUA);
    match req.command {
        Command::Read => ex.read(req.offset, req.length).map(Outcome::Data).map_err(fail),
        Command::Write => ex.write(req.offset, &payload, fua).map(|()| Outcome::Done).map_err(fail),
        Command::Trim | Command::WriteZeroes => {
            ex.zero(req.offset, u64::from(req.length), fua).map(|()| Outcome::Done).map_err(fail)
        }
        Command::Flush => ex.flush().map(|()| Outcome::Done).map_err(fail),
        Command::Cache => Ok(Outcome::Done),
        Command::BlockStatus => block_status(ex, req, ctx).map(Outcome::Status).map_err(fail),
        Command::Disc | Command::Resize | Command::Unknown(_) => {
            Err((Errno::Inval, "unexpected command".into()))
        }
    }
}

fn block_status(
    ex: &Export,
    req: &Request,
    ctx: &[MetaContext],
) -> forkfs::Result<Vec<(u32, Vec<proto::BlockDescriptor>)>> {
    let bs = u64::from(ex.block_size);
    let (start, end) = (req.offset, req.offset + u64::from(req.length));
    let one = req.flags.contains(CmdFlags::REQ_ONE);
    let mut out = Vec::new();
    for (i, c) in ctx.iter().enumerate() {
        // Runs of (length, status) covering [start, end).
        let marks: Vec<(u64, u64, u32)> = match c {
            MetaContext::Allocation => {
                let (first, last) = (start / bs, (end.max(start + 1) - 1) / bs);
                ex.allocated(first, last)?.into_iter().map(|b| (b * bs, (b + 1) * bs, 0)).collect()
            }
            MetaContext::ChangedSince(v) => {
                ex.changed_since(v)?.into_iter().map(|(o, l)| (o, o + l, 1)).collect()
            }
        };
        let base = match c {
            MetaContext::Allocation => {
                proto::consts::NBD_STATE_HOLE | proto::consts::NBD_STATE_ZERO
            }
            MetaContext::ChangedSince(_) => 0,
        };
        let mut descs: Vec<proto::BlockDescriptor> = Vec::new();
        let mut push = |len: u64, status: u32| {
            if len == 0 {
                return;
            }
            match descs.last_mut() {
                Some(d)
                    if d.status == status && u64::from(d.length) + len <= u64::from(u32::MAX) =>
                {
                    d.length += len as u32
                }
                _ => descs.push(proto::BlockDescriptor { length: len as u32, status }),
            }
        };
        let mut pos = start;
        for (a, b, st) in marks {
            let (a, b) = (a.max(start), b.min(end));
            if a >= b {
                continue;
            }
            push(a.saturating_sub(pos), base);
            push(b - a.max(pos), st);
            pos = b;
        }
        push(end - pos.min(end), base);
        if one || descs.len() > MAX_DESCRIPTORS {
            descs.truncate(if one { 1 } else { MAX_DESCRIPTORS });
        }
        out.push((i as u32 + 1, descs));
    }
    Ok(out)
}

/// Encodes a successful outcome as a simple or structured reply.
fn encode(req: &Request, structured: bool, out: Outcome, block_size: u32) -> Vec<u8> {
    let mut buf = Vec::new();
    match out {
        Outcome::Data(data) if structured => {
            let df = req.flags.contains(CmdFlags::DF);
            encode_read_chunks(&mut buf, req, &data, block_size as usize, df);
        }
        Outcome::Data(data) => {
            proto::encode_simple_reply(&mut buf, 0, req.cookie);
            buf.extend_from_slice(&data);
        }
        Outcome::Status(per_ctx) => {
            let n = per_ctx.len();
            for (i, (id, descs)) in per_ctx.into_iter().enumerate() {
                let done = i + 1 == n;
                if proto::encode_block_status(&mut buf, done, req.cookie, id, &descs).is_err() {
                    proto::encode_error_chunk(
                        &mut buf,
                        true,
                        req.cookie,
                        Errno::Io.into(),
                        "empty status",
                    );
                    break;
                }
            }
        }
        Outcome::Done => proto::encode_simple_reply(&mut buf, 0, req.cookie),
    }
    buf
}

/// Structured READ reply: runs of all-zero blocks as holes, the rest as data.
fn encode_read_chunks(buf: &mut Vec<u8>, req: &Request, data: &[u8], bs: usize, df: bool) {
    if data.is_empty() {
        proto::encode_none_chunk(buf, req.cookie);
        return;
    }
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let next = if df {
            data.len()
        } else {
            (((req.offset as usize + pos) / bs + 1) * bs - req.offset as usize).min(data.len())
        };
        let zero = !df && forkfs::is_zero(&data[pos..next]);
        match runs.last_mut() {
            Some(r) if r.2 == zero => r.1 = next,
            _ => runs.push((pos, next, zero)),
        }
        pos = next;
    }
    let n = runs.len();
    for (i, (a, b, zero)) in runs.into_iter().enumerate() {
        let done = i + 1 == n;
        let offset = req.offset + a as u64;
        let res = if zero {
            proto::encode_offset_hole(buf, done, req.cookie, offset, (b - a) as u32)
        } else {
            proto::encode_offset_data(buf, done, req.cookie, offset, &data[a..b])
        };
        if res.is_err() {
            proto::encode_error_chunk(
                buf,
                true,
                req.cookie,
                Errno::Io.into(),
                "reply encoding failed",
            );
            return;
        }
    }
}

fn reply_error(
    tx: &mpsc::UnboundedSender<Vec<u8>>,
    req: &Request,
    structured: bool,
    e: Errno,
    msg: &str,
) {
    let mut buf = Vec::new();
    let structured_cmd = matches!(req.command, Command::Read | Command::BlockStatus);
    if structured && structured_cmd {
        proto::encode_error_chunk(&mut buf, true, req.cookie, e.into(), msg);
    } else {
        proto::encode_simple_reply(&mut buf, e.into(), req.cookie);
    }
    let _ = tx.send(buf);
}
