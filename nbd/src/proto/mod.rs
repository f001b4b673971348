//! NBD wire protocol (fixed newstyle negotiation + transmission phase):
//! constants, typed flags and code points, and pure encode/decode functions
//! over byte slices and `Vec<u8>`. No I/O and no server policy live here;
//! the server reads fixed-size headers, calls these functions, and writes
//! the bytes they produce.
//!
//! Reference: `doc/proto.md` of the NetworkBlockDevice/nbd project. All
//! integers are big-endian on the wire.
//!
//! Typical server flow:
//! 1. [`encode_greeting`], then [`decode_client_flags`].
//! 2. Loop: [`decode_option_header`], read `len` bytes, parse with
//!    [`parse_export_name`] / [`parse_info_request`] /
//!    [`parse_meta_context_request`], answer with the `encode_rep_*` /
//!    `encode_info_*` functions or [`encode_export_name_reply`].
//! 3. Loop: [`decode_request`], answer with [`encode_simple_reply`] or the
//!    structured chunk encoders in [`reply`].
//!
//! The module defines the protocol's complete vocabulary, of which a server
//! in a binary crate uses only part, hence the `dead_code` allowance.

#![allow(dead_code, reason = "full protocol vocabulary; callers use a subset")]

pub mod consts;
mod error;
pub mod flags;
pub mod handshake;
pub mod opt_reply;
pub mod options;
pub mod reply;
pub mod request;
pub mod types;
mod wire;

#[cfg(test)]
mod tests;

#[allow(unused_imports, reason = "re-exports for callers")]
pub use error::ProtoError;
#[allow(unused_imports, reason = "re-exports for callers")]
pub use flags::{ClientFlags, CmdFlags, HandshakeFlags, ReplyFlags, TransmissionFlags};
#[allow(unused_imports, reason = "re-exports for callers")]
pub use handshake::{
    OptionHeader, decode_client_flags, decode_option_header, encode_export_name_reply,
    encode_greeting, encode_option_header,
};
#[allow(unused_imports, reason = "re-exports for callers")]
pub use opt_reply::{
    BlockSizes, encode_info_block_size, encode_info_description, encode_info_export,
    encode_info_name, encode_option_reply, encode_option_reply_header, encode_rep_ack,
    encode_rep_error, encode_rep_meta_context, encode_rep_server,
};
#[allow(unused_imports, reason = "re-exports for callers")]
pub use options::{
    InfoRequest, MetaContextRequest, encode_info_request, encode_meta_context_request,
    parse_export_name, parse_info_request, parse_meta_context_request,
};
#[allow(unused_imports, reason = "re-exports for callers")]
pub use reply::{
    BlockDescriptor, encode_block_status, encode_chunk_header, encode_error_chunk,
    encode_error_offset_chunk, encode_none_chunk, encode_offset_data, encode_offset_data_header,
    encode_offset_hole, encode_simple_reply,
};
#[allow(unused_imports, reason = "re-exports for callers")]
pub use request::{Request, decode_request, encode_request};
#[allow(unused_imports, reason = "re-exports for callers")]
pub use types::{Command, Errno, InfoType, OptionReplyType, OptionType, ReplyType};
