//! Replies on the wire: a request's outcome as a simple or structured
//! reply, and error replies.

use super::{Frame, Outcome};
use crate::limits::Charge;
use crate::proto::{self, CmdFlags, Command, Errno, Request};
use std::io::IoSlice;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// A reply for the socket: its encoded headers and, between them, ranges
/// of a read's data, written from where the data lies (never copied after
/// the headers: a read is copied once, into the socket).
pub(super) struct Reply {
    head: Vec<u8>,
    data: Vec<u8>,
    parts: Vec<Part>,
    /// How much of `head` is in `parts` already.
    sealed: usize,
}

enum Part {
    Head(usize, usize),
    Data(usize, usize),
}

impl Reply {
    fn new(data: Vec<u8>) -> Reply {
        Reply { head: Vec::new(), data, parts: Vec::new(), sealed: 0 }
    }

    /// A reply of headers only.
    fn of_head(head: Vec<u8>) -> Reply {
        Reply { head, ..Reply::new(Vec::new()) }.finish()
    }

    /// The headers appended since the last part become the next part.
    fn close_head(&mut self) {
        if self.head.len() > self.sealed {
            self.parts.push(Part::Head(self.sealed, self.head.len()));
            self.sealed = self.head.len();
        }
    }

    /// `data[a..b]` goes next, after the headers appended so far.
    fn push_data(&mut self, a: usize, b: usize) {
        self.close_head();
        if b > a {
            self.parts.push(Part::Data(a, b));
        }
    }

    fn finish(mut self) -> Reply {
        self.close_head();
        self
    }

    /// The read's buffer, for reuse (`buffers.rs`).
    pub(super) fn into_data(self) -> Vec<u8> {
        self.data
    }

    fn pieces(&self) -> Vec<&[u8]> {
        let piece = |p: &Part| match *p {
            Part::Head(a, b) => &self.head[a..b],
            Part::Data(a, b) => &self.data[a..b],
        };
        self.parts.iter().map(piece).collect()
    }

    /// Writes the whole reply, in as few (vectored) writes as the socket
    /// takes.
    pub(super) async fn write_to<W: AsyncWrite + Unpin>(&self, w: &mut W) -> std::io::Result<()> {
        // At most this many buffers per write (well under IOV_MAX).
        const BATCH: usize = 64;
        let pieces = self.pieces();
        let (mut i, mut off) = (0, 0);
        while i < pieces.len() {
            let rest = std::iter::once(&pieces[i][off..]).chain(pieces[i + 1..].iter().copied());
            let slices: Vec<IoSlice<'_>> = rest.take(BATCH).map(IoSlice::new).collect();
            let mut n = w.write_vectored(&slices).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            while n > 0 && i < pieces.len() {
                let left = pieces[i].len() - off;
                if n >= left {
                    (n, i, off) = (n - left, i + 1, 0);
                } else {
                    (n, off) = (0, off + n);
                }
            }
        }
        Ok(())
    }
}

/// Encodes a successful outcome as a simple or structured reply.
pub(super) fn encode(req: &Request, structured: bool, out: Outcome, block_size: u32) -> Reply {
    let mut buf = Vec::new();
    match out {
        Outcome::Data(data) if structured => {
            let df = req.flags.contains(CmdFlags::DF);
            let mut r = Reply::new(data);
            encode_read_chunks(&mut r, req, block_size as usize, df);
            return r.finish();
        }
        Outcome::Data(data) => {
            let mut r = Reply::new(data);
            proto::encode_simple_reply(&mut r.head, 0, req.cookie);
            let len = r.data.len();
            r.push_data(0, len);
            return r.finish();
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
    Reply::of_head(buf)
}

/// Structured READ reply: runs of all-zero blocks as holes, the rest as data.
fn encode_read_chunks(r: &mut Reply, req: &Request, bs: usize, df: bool) {
    let data = &r.data;
    if data.is_empty() {
        proto::encode_none_chunk(&mut r.head, req.cookie);
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
        let (c, len) = (req.cookie, (b - a) as u32);
        let res = if zero {
            proto::encode_offset_hole(&mut r.head, done, c, offset, len)
        } else {
            let res = proto::encode_offset_data_header(&mut r.head, done, c, offset, len);
            if res.is_ok() {
                r.push_data(a, b);
            }
            res
        };
        if res.is_err() {
            proto::encode_error_chunk(
                &mut r.head,
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
    let _ = tx.send((Reply::of_head(buf), charge));
}
