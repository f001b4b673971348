//! Transmission-phase reply encoders: the 16-byte simple reply header and
//! structured reply chunks (`NONE`, `OFFSET_DATA`, `OFFSET_HOLE`,
//! `BLOCK_STATUS`, `ERROR`, `ERROR_OFFSET`).
//!
//! `done` marks the final chunk of a structured reply (`NBD_REPLY_FLAG_DONE`).
//! Encoders that return `Result` validate before writing: on error `out` is
//! left untouched.

use super::consts::*;
use super::error::ProtoError;
use super::flags::ReplyFlags;
use super::types::ReplyType;
use super::wire::{len_u32, truncate_message};

/// Appends a simple reply header: magic, `error` (0 for success), `cookie`.
/// For a successful `NBD_CMD_READ` the caller appends the data afterwards.
pub fn encode_simple_reply(out: &mut Vec<u8>, error: u32, cookie: u64) {
    out.reserve(SIMPLE_REPLY_HEADER_LEN);
    out.extend_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Appends a structured reply chunk header announcing `len` payload bytes.
pub fn encode_chunk_header(
    out: &mut Vec<u8>,
    flags: ReplyFlags,
    kind: ReplyType,
    cookie: u64,
    len: u32,
) {
    out.reserve(STRUCTURED_REPLY_HEADER_LEN);
    out.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
    out.extend_from_slice(&u16::from(kind).to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Appends the final, empty `NBD_REPLY_TYPE_NONE` chunk (always `DONE`).
pub fn encode_none_chunk(out: &mut Vec<u8>, cookie: u64) {
    encode_chunk_header(out, ReplyFlags::DONE, ReplyType::None, cookie, 0);
}

/// Appends an `NBD_REPLY_TYPE_OFFSET_DATA` chunk header and its `offset`;
/// the caller must then append exactly `data_len` bytes of data.
///
/// Fails if `data_len` is 0 or if `8 + data_len` overflows the u32 length.
pub fn encode_offset_data_header(
    out: &mut Vec<u8>,
    done: bool,
    cookie: u64,
    offset: u64,
    data_len: u32,
) -> Result<(), ProtoError> {
    if data_len == 0 {
        return Err(ProtoError::EmptyChunk { what: "offset data" });
    }
    let len = data_len
        .checked_add(8)
        .ok_or(ProtoError::PayloadTooLarge { what: "offset data", len: data_len as usize })?;
    encode_chunk_header(out, ReplyFlags::done_if(done), ReplyType::OffsetData, cookie, len);
    out.extend_from_slice(&offset.to_be_bytes());
    Ok(())
}

/// Appends a complete `NBD_REPLY_TYPE_OFFSET_DATA` chunk carrying `data`.
pub fn encode_offset_data(
    out: &mut Vec<u8>,
    done: bool,
    cookie: u64,
    offset: u64,
    data: &[u8],
) -> Result<(), ProtoError> {
    let data_len = len_u32(data.len(), "offset data")?;
    encode_offset_data_header(out, done, cookie, offset, data_len)?;
    out.extend_from_slice(data);
    Ok(())
}

/// Appends an `NBD_REPLY_TYPE_OFFSET_HOLE` chunk: `hole_len` zero bytes at
/// `offset`. Fails if `hole_len` is 0.
pub fn encode_offset_hole(
    out: &mut Vec<u8>,
    done: bool,
    cookie: u64,
    offset: u64,
    hole_len: u32,
) -> Result<(), ProtoError> {
    if hole_len == 0 {
        return Err(ProtoError::EmptyChunk { what: "offset hole" });
    }
    encode_chunk_header(out, ReplyFlags::done_if(done), ReplyType::OffsetHole, cookie, 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&hole_len.to_be_bytes());
    Ok(())
}

/// One extent of a block status reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockDescriptor {
    /// Extent length in bytes (must be nonzero).
    pub length: u32,
    /// Status flags as defined by the metadata context (for
    /// `base:allocation`: `NBD_STATE_HOLE`, `NBD_STATE_ZERO`).
    pub status: u32,
}

/// Appends an `NBD_REPLY_TYPE_BLOCK_STATUS` chunk: `context_id` followed by
/// `(length, status)` descriptors for consecutive extents.
///
/// Fails if `descriptors` is empty or too long for the u32 length field.
/// (The protocol also asks servers to send at most 2^20 descriptors.)
pub fn encode_block_status(
    out: &mut Vec<u8>,
    done: bool,
    cookie: u64,
    context_id: u32,
    descriptors: &[BlockDescriptor],
) -> Result<(), ProtoError> {
    const WHAT: &str = "block status";
    if descriptors.is_empty() {
        return Err(ProtoError::EmptyChunk { what: WHAT });
    }
    let bytes = descriptors
        .len()
        .checked_mul(8)
        .and_then(|n| n.checked_add(4))
        .ok_or(ProtoError::PayloadTooLarge { what: WHAT, len: descriptors.len() })?;
    let len = len_u32(bytes, WHAT)?;
    out.reserve(STRUCTURED_REPLY_HEADER_LEN + bytes);
    encode_chunk_header(out, ReplyFlags::done_if(done), ReplyType::BlockStatus, cookie, len);
    out.extend_from_slice(&context_id.to_be_bytes());
    for d in descriptors {
        out.extend_from_slice(&d.length.to_be_bytes());
        out.extend_from_slice(&d.status.to_be_bytes());
    }
    Ok(())
}

/// Appends an `NBD_REPLY_TYPE_ERROR` chunk: `error` (must be nonzero), then
/// a u16 message length and the message (cut to 4096 bytes; may be empty).
pub fn encode_error_chunk(out: &mut Vec<u8>, done: bool, cookie: u64, error: u32, message: &str) {
    let message = truncate_message(message);
    let len = 6 + message.len() as u32;
    encode_chunk_header(out, ReplyFlags::done_if(done), ReplyType::Error, cookie, len);
    put_error_body(out, error, message);
}

/// Appends an `NBD_REPLY_TYPE_ERROR_OFFSET` chunk: like
/// [`encode_error_chunk`] followed by the `offset` where the error occurred.
pub fn encode_error_offset_chunk(
    out: &mut Vec<u8>,
    done: bool,
    cookie: u64,
    error: u32,
    message: &str,
    offset: u64,
) {
    let message = truncate_message(message);
    let len = 14 + message.len() as u32;
    encode_chunk_header(out, ReplyFlags::done_if(done), ReplyType::ErrorOffset, cookie, len);
    put_error_body(out, error, message);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Writes error, message length and message (message already truncated).
fn put_error_body(out: &mut Vec<u8>, error: u32, message: &str) {
    debug_assert_ne!(error, 0, "error chunks must carry a nonzero error");
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}
