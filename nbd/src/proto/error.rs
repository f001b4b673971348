//! The error type shared by every NBD decoder and by the encoders that can
//! reject their input (over-long strings or payloads).

use super::consts::{MAX_OPTION_DATA_LEN, MAX_STRING_LEN};
use thiserror::Error;

/// Why a wire message could not be decoded (or a reply could not be encoded).
///
/// During option haggling, every payload error except [`BadMagic`] and
/// [`BadClientFlags`] maps to `NBD_REP_ERR_INVALID` (or `NBD_REP_ERR_TOO_BIG`
/// for [`OptionTooBig`]); the session can continue.
///
/// [`BadMagic`]: ProtoError::BadMagic
/// [`BadClientFlags`]: ProtoError::BadClientFlags
/// [`OptionTooBig`]: ProtoError::OptionTooBig
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// A header did not start with the expected magic number; the peer does
    /// not speak this protocol (or the stream lost framing): disconnect.
    #[error("bad {what} magic: expected {expected:#x}, found {found:#x}")]
    BadMagic {
        /// Which header was being decoded.
        what: &'static str,
        /// Magic the protocol requires.
        expected: u64,
        /// Magic actually received.
        found: u64,
    },
    /// Client flags contain unknown bits or bits the server did not offer;
    /// the protocol requires the server to drop the connection.
    #[error("client flags {0:#x} contain unknown or unadvertised bits")]
    BadClientFlags(u32),
    /// Option data longer than [`MAX_OPTION_DATA_LEN`]. The server may reply
    /// `NBD_REP_ERR_TOO_BIG` after discarding `len` bytes, or disconnect.
    #[error("option {option} carries {len} bytes of data (limit {MAX_OPTION_DATA_LEN})")]
    OptionTooBig {
        /// Raw option type from the header.
        option: u32,
        /// Declared data length.
        len: u32,
    },
    /// A length field points past the end of the payload.
    #[error("{what}: payload truncated")]
    Truncated {
        /// Which field was being read.
        what: &'static str,
    },
    /// Bytes remain after every declared field was read.
    #[error("{what}: {extra} unexpected trailing bytes")]
    TrailingBytes {
        /// Which message was being parsed.
        what: &'static str,
        /// Number of unread bytes.
        extra: usize,
    },
    /// A string exceeds the protocol's 4096-byte limit.
    #[error("{what}: string of {len} bytes exceeds {MAX_STRING_LEN}")]
    StringTooLong {
        /// Which string.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A string is not UTF-8 or contains a NUL byte.
    #[error("{what}: not a valid NBD string (UTF-8 without NUL)")]
    InvalidString {
        /// Which string.
        what: &'static str,
    },
    /// An encoder was given a payload whose length does not fit its field.
    #[error("{what}: payload of {len} bytes does not fit the length field")]
    PayloadTooLarge {
        /// Which message.
        what: &'static str,
        /// Offending length.
        len: usize,
    },
    /// A structured reply chunk would describe nothing (no data bytes, a
    /// zero-length hole, or no block status descriptor), which the
    /// protocol forbids; send an `NBD_REPLY_TYPE_NONE` chunk instead.
    #[error("{what} chunk must not be empty")]
    EmptyChunk {
        /// Which chunk type.
        what: &'static str,
    },
}
