//! Running one validated request against the export (blocking), and the
//! checks that decide its errno before it runs.

use super::Outcome;
use crate::export::{Export, errno};
use crate::negotiate::MetaContext;
use crate::proto::{self, CmdFlags, Command, Errno, Request};

/// Descriptors per BLOCK_STATUS reply chunk.
const MAX_DESCRIPTORS: usize = 4096;

/// Checks a request before running it: the documented errno on failure.
pub(super) fn validate(
    req: &Request,
    ex: &Export,
    structured: bool,
    ncontexts: usize,
    max_request: u32,
) -> Result<(), (Errno, String)> {
    if let Command::Unknown(_) | Command::Resize = req.command {
        return Err((Errno::Inval, "unknown or unsupported command".into()));
    }
    if !req.invalid_flags().is_empty() {
        return Err((Errno::Inval, "flag not valid for this command".into()));
    }
    if req.flags.contains(CmdFlags::DF) && !structured {
        return Err((Errno::Inval, "DF needs structured replies".into()));
    }
    let mutating = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
    if mutating && ex.read_only {
        return Err((Errno::Perm, "export is read-only".into()));
    }
    if req.command == Command::Read && req.length > max_request {
        return Err((Errno::Inval, format!("request over the maximum of {max_request} bytes")));
    }
    let bounded = !matches!(req.command, Command::Flush);
    if bounded && !req.in_bounds(ex.size) {
        return Err(if mutating {
            (Errno::NoSpc, "beyond the end of the export".into())
        } else {
            (Errno::Inval, "beyond the end of the export".into())
        });
    }
    if req.command == Command::BlockStatus && (!structured || ncontexts == 0) {
        return Err((Errno::Inval, "no metadata context negotiated".into()));
    }
    if req.command == Command::Flush && (req.offset != 0 || req.length != 0) {
        return Err((Errno::Inval, "flush takes no range".into()));
    }
    Ok(())
}

/// Runs a validated request against the export (blocking).
pub(super) fn execute(
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
                // Sorted: skip the ranges that end before the request.
                let all = ex.changed_since(v)?;
                let first = all.partition_point(|&(o, l)| o + l <= start);
                all[first..]
                    .iter()
                    .take_while(|&&(o, _)| o < end)
                    .map(|&(o, l)| (o, o + l, 1))
                    .collect()
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
