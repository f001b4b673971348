//! Replies on the wire: a request's outcome as a simple or structured
//! reply, and error replies.

use super::{Frame, Outcome};
use crate::limits::Charge;
use crate::proto::{self, CmdFlags, Command, Errno, Request};
use forkfs::Piece;
use std::io::{IoSlice, Write};

/// A reply for the socket: its encoded headers and, between them, a
/// read's pieces, written from where they lie (the store's chunk cache;
/// holes from one page of zeros), never copied into the reply.
pub(super) struct Reply {
    head: Vec<u8>,
    parts: Vec<Part>,
    /// How much of `head` is in `parts` already.
    sealed: usize,
}

enum Part {
    Head(usize, usize),
    Data(Piece),
}

/// What holes are written from.
static ZEROS: [u8; 65536] = [0; 65536];

impl Reply {
    fn new() -> Reply {
        Reply { head: Vec::new(), parts: Vec::new(), sealed: 0 }
    }

    /// A reply of headers only.
    fn of_head(head: Vec<u8>) -> Reply {
        Reply { head, ..Reply::new() }.finish()
    }

    /// The headers appended since the last part become the next part.
    fn close_head(&mut self) {
        if self.head.len() > self.sealed {
            self.parts.push(Part::Head(self.sealed, self.head.len()));
            self.sealed = self.head.len();
        }
    }

    /// `piece` goes next, after the headers appended so far.
    fn push_data(&mut self, piece: &Piece) {
        self.close_head();
        if !piece.is_empty() {
            self.parts.push(Part::Data(piece.clone()));
        }
    }

    fn finish(mut self) -> Reply {
        self.close_head();
        self
    }

    fn pieces(&self) -> Vec<&[u8]> {
        let mut out = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            match p {
                Part::Head(a, b) => out.push(&self.head[*a..*b]),
                Part::Data(Piece::Bytes(b)) => out.push(&b[..]),
                Part::Data(Piece::Zeros(n)) => {
                    let mut left = *n;
                    while left > 0 {
                        let k = left.min(ZEROS.len());
                        out.push(&ZEROS[..k]);
                        left -= k;
                    }
                }
            }
        }
        out
    }

    /// Its length on the wire.
    pub(super) fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Head(a, b) => b - a,
                Part::Data(d) => d.len(),
            })
            .sum()
    }

    /// Appends its bytes to `out` (a reply gathered with others).
    pub(super) fn copy_to(&self, out: &mut Vec<u8>) {
        for p in self.pieces() {
            out.extend_from_slice(p);
        }
    }

    /// Writes the whole reply, in as few (vectored) writes as the socket
    /// takes.
    pub(super) fn write_to<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
        // At most this many buffers per write (well under IOV_MAX).
        const BATCH: usize = 64;
        let pieces = self.pieces();
        let (mut i, mut off) = (0, 0);
        while i < pieces.len() {
            let rest = std::iter::once(&pieces[i][off..]).chain(pieces[i + 1..].iter().copied());
            let slices: Vec<IoSlice<'_>> = rest.take(BATCH).map(IoSlice::new).collect();
            let mut n = match w.write_vectored(&slices) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => r?,
            };
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
pub(super) fn encode(req: &Request, structured: bool, out: Outcome) -> Reply {
    let mut buf = Vec::new();
    match out {
        Outcome::Data(pieces) if structured => {
            let df = req.flags.contains(CmdFlags::DF);
            let mut r = Reply::new();
            encode_read_chunks(&mut r, req, &pieces, df);
            return r.finish();
        }
        Outcome::Data(pieces) => {
            let mut r = Reply::new();
            proto::encode_simple_reply(&mut r.head, 0, req.cookie);
            for p in &pieces {
                r.push_data(p);
            }
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

/// Structured READ reply: runs of holes (and, unless DF, of all-zero
/// blocks) as hole chunks, the rest as data chunks. The pieces are one per
/// block touched, so a run of them is a run of blocks.
fn encode_read_chunks(r: &mut Reply, req: &Request, pieces: &[Piece], df: bool) {
    let total: usize = pieces.iter().map(Piece::len).sum();
    if total == 0 {
        proto::encode_none_chunk(&mut r.head, req.cookie);
        return;
    }
    let zero = |p: &Piece| match p {
        Piece::Zeros(_) => true,
        Piece::Bytes(b) => forkfs::is_zero(b),
    };
    // (first piece, end piece, bytes, is a hole)
    let mut runs: Vec<(usize, usize, usize, bool)> = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let z = !df && zero(p);
        match runs.last_mut() {
            Some(run) if run.3 == z => (run.1, run.2) = (i + 1, run.2 + p.len()),
            _ => runs.push((i, i + 1, p.len(), z)),
        }
    }
    let (n, mut offset) = (runs.len(), req.offset);
    for (i, (a, b, len, hole)) in runs.into_iter().enumerate() {
        let done = i + 1 == n;
        let (c, len32) = (req.cookie, len as u32);
        let res = if hole {
            proto::encode_offset_hole(&mut r.head, done, c, offset, len32)
        } else {
            let res = proto::encode_offset_data_header(&mut r.head, done, c, offset, len32);
            if res.is_ok() {
                for p in &pieces[a..b] {
                    r.push_data(p);
                }
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
        offset += len as u64;
    }
}

/// An error reply, holding `charge` until written.
pub(super) fn reply_error(
    charge: Charge,
    req: &Request,
    structured: bool,
    e: Errno,
    msg: &str,
) -> Frame {
    let mut buf = Vec::new();
    let structured_cmd = matches!(req.command, Command::Read | Command::BlockStatus);
    if structured && structured_cmd {
        proto::encode_error_chunk(&mut buf, true, req.cookie, e.into(), msg);
    } else {
        proto::encode_simple_reply(&mut buf, e.into(), req.cookie);
    }
    (Reply::of_head(buf), charge)
}
