//! Raw numeric constants of the NBD protocol (fixed newstyle negotiation and
//! the transmission phase), named as in the protocol document `doc/proto.md`.
//!
//! Typed wrappers over these values live in [`super::types`] and
//! [`super::flags`]; everything here is a plain integer as sent on the wire
//! (always big-endian).

// ---------------------------------------------------------------- magics

/// `NBDMAGIC`: first 8 bytes the server sends (also called `INIT_PASSWD`).
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle greeting magic, also prefixes every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic prefixing every fixed-newstyle option reply.
pub const NBD_OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request header (`NBD_REQUEST_MAGIC`).
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply (`NBD_SIMPLE_REPLY_MAGIC`).
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk (`NBD_STRUCTURED_REPLY_MAGIC`).
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------- sizes

/// Length of the server greeting: magic, `IHAVEOPT`, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Length of the client flags field sent after the greeting.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Length of a client option header: `IHAVEOPT`, option, data length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of an option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Largest option payload this implementation accepts (64 KiB); longer
/// options are refused so a client cannot force large allocations.
pub const MAX_OPTION_DATA_LEN: u32 = 64 * 1024;
/// Longest string (export name, query, message) the protocol allows.
pub const MAX_STRING_LEN: usize = 4096;
/// Reserved zero padding after the `NBD_OPT_EXPORT_NAME` reply.
pub const EXPORT_NAME_ZERO_PAD_LEN: usize = 124;
/// Length of a transmission request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Length of a simple reply header.
pub const SIMPLE_REPLY_HEADER_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const STRUCTURED_REPLY_HEADER_LEN: usize = 20;

// ---------------------------------------------------------------- handshake flags (u16)

/// Server supports fixed newstyle negotiation.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

// ---------------------------------------------------------------- client flags (u32)

/// Client speaks fixed newstyle negotiation.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client asks the server to omit the 124 zero bytes.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------------------- option types (u32)

/// Choose an export and enter transmission (no error reply possible).
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// Abort negotiation.
pub const NBD_OPT_ABORT: u32 = 2;
/// List exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Upgrade to TLS.
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Query export information.
pub const NBD_OPT_INFO: u32 = 6;
/// Query export information and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Enable structured replies.
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
/// List metadata contexts.
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
/// Select metadata contexts.
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
/// Experimental extended headers; this implementation does not support it.
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------------- option reply types (u32)

/// Bit set in every option error reply type.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// Option accepted / list finished.
pub const NBD_REP_ACK: u32 = 1;
/// One export in reply to `NBD_OPT_LIST`.
pub const NBD_REP_SERVER: u32 = 2;
/// One information item in reply to `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const NBD_REP_INFO: u32 = 3;
/// One metadata context.
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Option unknown to this server.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
/// Option forbidden by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
/// Option syntactically or semantically invalid.
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
/// Option not supported on this platform.
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
/// TLS required first.
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
/// Requested export unknown.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
/// Server shutting down.
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
/// Client must request `NBD_INFO_BLOCK_SIZE` first.
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
/// Request or reply too large.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

// ---------------------------------------------------------------- info types (u16)

/// Export size and transmission flags.
pub const NBD_INFO_EXPORT: u16 = 0;
/// Canonical export name.
pub const NBD_INFO_NAME: u16 = 1;
/// Human-readable description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Block size constraints.
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------- transmission flags (u16)

/// Always set.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Export is read-only.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// `NBD_CMD_FLUSH` supported.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// `NBD_CMD_FLAG_FUA` supported.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// Export behaves like rotational media.
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
/// `NBD_CMD_TRIM` supported.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// `NBD_CMD_WRITE_ZEROES` (and `NBD_CMD_FLAG_NO_HOLE`) supported.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// `NBD_CMD_FLAG_DF` supported (requires structured replies).
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
/// Multiple connections share one coherent cache.
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Experimental `RESIZE` extension.
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
/// `NBD_CMD_CACHE` understood.
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
/// `NBD_CMD_FLAG_FAST_ZERO` supported.
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
/// Experimental `EXTENDED_HEADERS` extension.
pub const NBD_FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// ---------------------------------------------------------------- command types (u16)

/// Read.
pub const NBD_CMD_READ: u16 = 0;
/// Write (payload follows the header).
pub const NBD_CMD_WRITE: u16 = 1;
/// Disconnect (no reply).
pub const NBD_CMD_DISC: u16 = 2;
/// Flush.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Trim / discard.
pub const NBD_CMD_TRIM: u16 = 4;
/// Cache hint.
pub const NBD_CMD_CACHE: u16 = 5;
/// Write zeroes.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
/// Block status query.
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
/// Experimental resize.
pub const NBD_CMD_RESIZE: u16 = 8;

// ---------------------------------------------------------------- command flags (u16)

/// Force unit access.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Do not punch holes (write zeroes).
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Do not fragment the structured read reply.
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
/// Only one extent per context (block status).
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Fail fast unless zeroing is faster than writing.
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Experimental `EXTENDED_HEADERS` payload length flag.
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// ---------------------------------------------------------------- structured replies (u16)

/// Final chunk of a structured reply.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
/// Empty final chunk.
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
/// Data at an offset.
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Zeroes at an offset.
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Block status descriptors for one metadata context.
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Bit set in every error chunk type.
pub const NBD_REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
/// Error without offset.
pub const NBD_REPLY_TYPE_ERROR: u16 = NBD_REPLY_TYPE_FLAG_ERROR | 1;
/// Error at an offset.
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = NBD_REPLY_TYPE_FLAG_ERROR | 2;

// ---------------------------------------------------------------- error values (u32)

/// Operation not permitted.
pub const NBD_EPERM: u32 = 1;
/// Input/output error.
pub const NBD_EIO: u32 = 5;
/// Cannot allocate memory.
pub const NBD_ENOMEM: u32 = 12;
/// Invalid argument.
pub const NBD_EINVAL: u32 = 22;
/// No space left on device.
pub const NBD_ENOSPC: u32 = 28;
/// Value too large.
pub const NBD_EOVERFLOW: u32 = 75;
/// Operation not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Server is shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;

// ---------------------------------------------------------------- base:allocation (u32)

/// Name of the one metadata context the base namespace defines.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// `base:allocation` status: extent is a hole (unallocated).
pub const NBD_STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` status: extent reads as zeroes.
pub const NBD_STATE_ZERO: u32 = 1 << 1;
