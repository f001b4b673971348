//! Transmission-phase request header: decoding the 28-byte header a client
//! sends before each command (and encoding it, for tests and clients).

use super::consts::*;
use super::error::ProtoError;
use super::flags::CmdFlags;
use super::types::Command;
use super::wire::Reader;

/// A decoded request header. For [`Command::Write`], `length` bytes of data
/// follow the header on the wire; the caller reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags, unknown bits retained.
    pub flags: CmdFlags,
    /// Command type.
    pub command: Command,
    /// Opaque cookie (formerly "handle") to echo in the reply.
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Length in bytes of the affected range.
    pub length: u32,
}

impl Request {
    /// Number of payload bytes following this header on the wire
    /// (`length` for writes, 0 otherwise).
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write { self.length } else { 0 }
    }

    /// End of the affected range (`offset + length`), or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.length))
    }

    /// Whether the range lies within an export of `size` bytes.
    pub fn in_bounds(&self, size: u64) -> bool {
        self.end().is_some_and(|end| end <= size)
    }

    /// Flags set that the protocol does not document for this command
    /// (empty when the request is well-formed); answer `NBD_EINVAL` if not.
    pub fn invalid_flags(&self) -> CmdFlags {
        self.flags.difference(self.command.allowed_flags())
    }
}

/// Decodes a 28-byte request header: magic u32, flags u16, type u16,
/// cookie u64, offset u64, length u32.
///
/// Returns [`ProtoError::BadMagic`] when the magic is not
/// `NBD_REQUEST_MAGIC` (framing is lost: disconnect). Unknown commands and
/// flags are not errors here; see [`Command::Unknown`] and
/// [`Request::invalid_flags`].
pub fn decode_request(buf: &[u8; REQUEST_HEADER_LEN]) -> Result<Request, ProtoError> {
    const WHAT: &str = "request header";
    let mut r = Reader::new(buf);
    let magic = r.u32(WHAT)?;
    if magic != NBD_REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "request",
            expected: u64::from(NBD_REQUEST_MAGIC),
            found: u64::from(magic),
        });
    }
    let flags = CmdFlags::from_bits_retain(r.u16(WHAT)?);
    let command = Command::from(r.u16(WHAT)?);
    let cookie = r.u64(WHAT)?;
    let offset = r.u64(WHAT)?;
    let length = r.u32(WHAT)?;
    Ok(Request { flags, command, cookie, offset, length })
}

/// Appends a 28-byte request header (client side; write data not included).
pub fn encode_request(out: &mut Vec<u8>, req: &Request) {
    out.reserve(REQUEST_HEADER_LEN);
    out.extend_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&req.flags.bits().to_be_bytes());
    out.extend_from_slice(&u16::from(req.command).to_be_bytes());
    out.extend_from_slice(&req.cookie.to_be_bytes());
    out.extend_from_slice(&req.offset.to_be_bytes());
    out.extend_from_slice(&req.length.to_be_bytes());
}
