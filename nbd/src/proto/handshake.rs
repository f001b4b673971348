//! Fixed-newstyle handshake framing: the server greeting, the client flags,
//! the 16-byte option header, and the old-style `NBD_OPT_EXPORT_NAME` reply.
//!
//! Option payloads are parsed in [`super::options`]; option replies are
//! encoded in [`super::opt_reply`].

use super::consts::*;
use super::error::ProtoError;
use super::flags::{ClientFlags, HandshakeFlags, TransmissionFlags};
use super::types::OptionType;
use super::wire::Reader;

/// Appends the 18-byte server greeting: `NBDMAGIC`, `IHAVEOPT`, `flags`.
pub fn encode_greeting(out: &mut Vec<u8>, flags: HandshakeFlags) {
    out.reserve(GREETING_LEN);
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
}

/// Decodes the 4-byte client flags and checks them against the handshake
/// flags the server advertised.
///
/// Unknown bits, or `NO_ZEROES` when the server did not offer it, yield
/// [`ProtoError::BadClientFlags`]; the server must then drop the connection.
/// A client that omits `FIXED_NEWSTYLE` is accepted (the protocol allows
/// honouring fixed newstyle anyway).
pub fn decode_client_flags(
    buf: &[u8; CLIENT_FLAGS_LEN],
    advertised: HandshakeFlags,
) -> Result<ClientFlags, ProtoError> {
    let raw = u32::from_be_bytes(*buf);
    let flags = ClientFlags::from_bits_retain(raw);
    let no_zeroes_unoffered =
        flags.contains(ClientFlags::NO_ZEROES) && !advertised.contains(HandshakeFlags::NO_ZEROES);
    if flags.unknown_bits() != 0 || no_zeroes_unoffered {
        return Err(ProtoError::BadClientFlags(raw));
    }
    Ok(flags)
}

/// A decoded client option header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// Option type as sent (echo it verbatim in every reply).
    pub option: OptionType,
    /// Length of the option data that follows, at most
    /// [`MAX_OPTION_DATA_LEN`].
    pub len: u32,
}

impl OptionHeader {
    /// [`len`](Self::len) as a `usize`, for sizing the read buffer.
    pub fn data_len(&self) -> usize {
        // `len` is capped at 64 KiB, which fits every supported `usize`.
        self.len as usize
    }
}

/// Decodes a 16-byte option header (`IHAVEOPT`, option u32, length u32).
///
/// Errors: [`ProtoError::BadMagic`] (disconnect) or
/// [`ProtoError::OptionTooBig`] when the data exceeds
/// [`MAX_OPTION_DATA_LEN`] (reply `NBD_REP_ERR_TOO_BIG` or disconnect; do
/// not allocate `len` bytes).
pub fn decode_option_header(buf: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtoError> {
    let mut r = Reader::new(buf);
    let magic = r.u64("option header")?;
    let option = r.u32("option header")?;
    let len = r.u32("option header")?;
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic { what: "option", expected: IHAVEOPT, found: magic });
    }
    if len > MAX_OPTION_DATA_LEN {
        return Err(ProtoError::OptionTooBig { option, len });
    }
    Ok(OptionHeader { option: OptionType::from(option), len })
}

/// Appends a 16-byte option header (client side; used by tests and tools).
pub fn encode_option_header(out: &mut Vec<u8>, option: OptionType, len: u32) {
    out.reserve(OPTION_HEADER_LEN);
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&u32::from(option).to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Appends the reply to `NBD_OPT_EXPORT_NAME`: export size, transmission
/// flags, then 124 zero bytes unless the client negotiated
/// `NBD_FLAG_C_NO_ZEROES` (`no_zeroes == true`).
pub fn encode_export_name_reply(
    out: &mut Vec<u8>,
    size: u64,
    flags: TransmissionFlags,
    no_zeroes: bool,
) {
    out.reserve(10 + EXPORT_NAME_ZERO_PAD_LEN);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; EXPORT_NAME_ZERO_PAD_LEN]);
    }
}
