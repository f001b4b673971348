//! Encoders for fixed-newstyle option replies: the generic 20-byte header
//! plus payload, and the typed `NBD_REP_SERVER`, `NBD_REP_INFO` and
//! `NBD_REP_META_CONTEXT` bodies.
//!
//! Encoders that take strings validate them first (at most 4096 bytes, no
//! NUL) and write nothing to `out` when they return an error. Error
//! messages are instead truncated to 4096 bytes so error paths never fail.

use super::consts::*;
use super::error::ProtoError;
use super::flags::TransmissionFlags;
use super::types::{InfoType, OptionReplyType, OptionType};
use super::wire::{check_out_string, len_u32, truncate_message};

/// Appends an option reply header announcing `len` payload bytes; the caller
/// appends exactly `len` bytes afterwards.
pub fn encode_option_reply_header(
    out: &mut Vec<u8>,
    option: OptionType,
    reply: OptionReplyType,
    len: u32,
) {
    out.reserve(OPTION_REPLY_HEADER_LEN);
    out.extend_from_slice(&NBD_OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&u32::from(option).to_be_bytes());
    out.extend_from_slice(&u32::from(reply).to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Appends a complete option reply: header followed by `payload`.
pub fn encode_option_reply(
    out: &mut Vec<u8>,
    option: OptionType,
    reply: OptionReplyType,
    payload: &[u8],
) -> Result<(), ProtoError> {
    let len = len_u32(payload.len(), "option reply")?;
    encode_option_reply_header(out, option, reply, len);
    out.extend_from_slice(payload);
    Ok(())
}

/// Appends `NBD_REP_ACK` (no payload) for `option`.
pub fn encode_rep_ack(out: &mut Vec<u8>, option: OptionType) {
    encode_option_reply_header(out, option, OptionReplyType::Ack, 0);
}

/// Appends an error reply (`reply` should be one of the `Err*` types) with
/// an optional human-readable `message` (empty for none; cut to 4096 bytes).
pub fn encode_rep_error(
    out: &mut Vec<u8>,
    option: OptionType,
    reply: OptionReplyType,
    message: &str,
) {
    debug_assert!(reply.is_error(), "{reply:?} is not an error reply");
    let message = truncate_message(message);
    encode_option_reply_header(out, option, reply, message.len() as u32);
    out.extend_from_slice(message.as_bytes());
}

/// Appends one `NBD_REP_SERVER` reply to `NBD_OPT_LIST`: name length u32,
/// name, then an optional free-form `description` (empty for none).
pub fn encode_rep_server(
    out: &mut Vec<u8>,
    name: &str,
    description: &str,
) -> Result<(), ProtoError> {
    check_out_string(name, "export name")?;
    check_out_string(description, "export description")?;
    let len = 4 + name.len() + description.len();
    encode_option_reply_header(out, OptionType::List, OptionReplyType::Server, len as u32);
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    Ok(())
}

/// Starts an `NBD_REP_INFO` reply of `body_len` bytes after the info type.
fn info_header(out: &mut Vec<u8>, option: OptionType, info: InfoType, body_len: usize) {
    let len = 2 + body_len as u32;
    encode_option_reply_header(out, option, OptionReplyType::Info, len);
    out.extend_from_slice(&u16::from(info).to_be_bytes());
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_EXPORT` (length 12): export size and
/// transmission flags. `option` is the `Info` or `Go` being answered.
pub fn encode_info_export(
    out: &mut Vec<u8>,
    option: OptionType,
    size: u64,
    flags: TransmissionFlags,
) {
    info_header(out, option, InfoType::Export, 10);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.bits().to_be_bytes());
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_NAME` carrying the canonical name.
pub fn encode_info_name(
    out: &mut Vec<u8>,
    option: OptionType,
    name: &str,
) -> Result<(), ProtoError> {
    check_out_string(name, "export name")?;
    info_header(out, option, InfoType::Name, name.len());
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_DESCRIPTION`.
pub fn encode_info_description(
    out: &mut Vec<u8>,
    option: OptionType,
    description: &str,
) -> Result<(), ProtoError> {
    check_out_string(description, "export description")?;
    info_header(out, option, InfoType::Description, description.len());
    out.extend_from_slice(description.as_bytes());
    Ok(())
}

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Minimum block size (power of two, 1..=65536).
    pub min: u32,
    /// Preferred block size (power of two, at least max(min, 512)).
    pub preferred: u32,
    /// Maximum payload size (at least `preferred`).
    pub max: u32,
}

/// Appends `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE` (length 14).
pub fn encode_info_block_size(out: &mut Vec<u8>, option: OptionType, sizes: BlockSizes) {
    info_header(out, option, InfoType::BlockSize, 12);
    out.extend_from_slice(&sizes.min.to_be_bytes());
    out.extend_from_slice(&sizes.preferred.to_be_bytes());
    out.extend_from_slice(&sizes.max.to_be_bytes());
}

/// Appends `NBD_REP_META_CONTEXT`: context id u32 then the context name
/// (no length prefix). Use id 0 when answering `NBD_OPT_LIST_META_CONTEXT`.
pub fn encode_rep_meta_context(
    out: &mut Vec<u8>,
    option: OptionType,
    context_id: u32,
    name: &str,
) -> Result<(), ProtoError> {
    check_out_string(name, "meta context name")?;
    let len = 4 + name.len() as u32;
    encode_option_reply_header(out, option, OptionReplyType::MetaContext, len);
    out.extend_from_slice(&context_id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(())
}
