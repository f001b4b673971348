//! Private byte-level helpers: a bounds-checked big-endian reader for
//! untrusted payloads, and string validation shared by decoders/encoders.

use super::consts::MAX_STRING_LEN;
use super::error::ProtoError;

/// Bounds-checked cursor over an untrusted payload. Every read either
/// succeeds or returns [`ProtoError::Truncated`]; it never panics.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not yet consumed.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Consumes exactly `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let (head, tail) = self.buf.split_at_checked(n).ok_or(ProtoError::Truncated { what })?;
        self.buf = tail;
        Ok(head)
    }

    /// Consumes a fixed-size array.
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        let bytes = self.take(N, what)?;
        bytes.try_into().map_err(|_| ProtoError::Truncated { what })
    }

    /// Consumes a big-endian `u16`.
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        self.array(what).map(u16::from_be_bytes)
    }

    /// Consumes a big-endian `u32`.
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        self.array(what).map(u32::from_be_bytes)
    }

    /// Consumes a big-endian `u64`.
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        self.array(what).map(u64::from_be_bytes)
    }

    /// Consumes a `u32` length followed by that many bytes of NBD string.
    pub(crate) fn string32(&mut self, what: &'static str) -> Result<String, ProtoError> {
        let len = self.u32(what)?;
        let len = usize::try_from(len).map_err(|_| ProtoError::Truncated { what })?;
        if len > MAX_STRING_LEN {
            return Err(ProtoError::StringTooLong { what, len });
        }
        let bytes = self.take(len, what)?;
        decode_string(bytes, what)
    }

    /// Succeeds only if the whole payload was consumed.
    pub(crate) fn finish(self, what: &'static str) -> Result<(), ProtoError> {
        match self.buf.len() {
            0 => Ok(()),
            extra => Err(ProtoError::TrailingBytes { what, extra }),
        }
    }
}

/// Validates an NBD string received from the peer: at most 4096 bytes,
/// UTF-8, no NUL.
pub(crate) fn decode_string(bytes: &[u8], what: &'static str) -> Result<String, ProtoError> {
    if bytes.len() > MAX_STRING_LEN {
        return Err(ProtoError::StringTooLong { what, len: bytes.len() });
    }
    let s = std::str::from_utf8(bytes).map_err(|_| ProtoError::InvalidString { what })?;
    if s.contains('\0') {
        return Err(ProtoError::InvalidString { what });
    }
    Ok(s.to_owned())
}

/// Validates an NBD string we are about to send: at most 4096 bytes, no NUL.
pub(crate) fn check_out_string(s: &str, what: &'static str) -> Result<(), ProtoError> {
    if s.len() > MAX_STRING_LEN {
        return Err(ProtoError::StringTooLong { what, len: s.len() });
    }
    if s.contains('\0') {
        return Err(ProtoError::InvalidString { what });
    }
    Ok(())
}

/// Cuts `s` to at most 4096 bytes on a character boundary (for error
/// messages, which are best-effort and must never make encoding fail).
pub(crate) fn truncate_message(s: &str) -> &str {
    if s.len() <= MAX_STRING_LEN {
        return s;
    }
    let mut end = MAX_STRING_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Converts a payload length to the `u32` a header carries.
pub(crate) fn len_u32(len: usize, what: &'static str) -> Result<u32, ProtoError> {
    u32::try_from(len).map_err(|_| ProtoError::PayloadTooLarge { what, len })
}
