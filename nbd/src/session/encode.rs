//! Replies on the wire: a request's outcome as a simple or structured
//! reply, and error replies.

use super::{Frame, Outcome};
use crate::limits::Charge;
use crate::proto::{self, CmdFlags, Command, Errno, Request};
use tokio::sync::mpsc;

/// Encodes a successful outcome as a simple or structured reply.
pub(super) fn encode(req: &Request, structured: bool, out: Outcome, block_size: u32) -> Vec<u8> {
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

pub(super) fn reply_error(
    tx: &mpsc::UnboundedSender<Frame>,
    charge: Charge,
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
    let _ = tx.send((buf, charge));
}
