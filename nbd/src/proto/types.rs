//! Typed enums for the NBD code points (option, option-reply, info, command,
//! structured-reply and error values), each with a lossless `Unknown` case.
//!
//! Conversions both ways go through `From`: `OptionType::from(7u32)` and
//! `u32::from(OptionType::Go)`. Decoding a known value never yields
//! `Unknown`.

use super::consts::*;
use super::flags::CmdFlags;
use std::io::ErrorKind;

/// Defines an enum over a wire integer with an `Unknown` catch-all.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident($ty:ty) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:path, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this module does not name, kept verbatim.
            Unknown($ty),
        }

        impl From<$ty> for $name {
            fn from(raw: $ty) -> Self {
                match raw {
                    $( $value => Self::$variant, )*
                    other => Self::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            fn from(value: $name) -> $ty {
                match value {
                    $( $name::$variant => $value, )*
                    $name::Unknown(raw) => raw,
                }
            }
        }
    };
}

wire_enum! {
    /// Option sent by the client during option haggling.
    OptionType(u32) {
        /// `NBD_OPT_EXPORT_NAME`.
        ExportName = NBD_OPT_EXPORT_NAME,
        /// `NBD_OPT_ABORT`.
        Abort = NBD_OPT_ABORT,
        /// `NBD_OPT_LIST`.
        List = NBD_OPT_LIST,
        /// `NBD_OPT_STARTTLS`.
        StartTls = NBD_OPT_STARTTLS,
        /// `NBD_OPT_INFO`.
        Info = NBD_OPT_INFO,
        /// `NBD_OPT_GO`.
        Go = NBD_OPT_GO,
        /// `NBD_OPT_STRUCTURED_REPLY`.
        StructuredReply = NBD_OPT_STRUCTURED_REPLY,
        /// `NBD_OPT_LIST_META_CONTEXT`.
        ListMetaContext = NBD_OPT_LIST_META_CONTEXT,
        /// `NBD_OPT_SET_META_CONTEXT`.
        SetMetaContext = NBD_OPT_SET_META_CONTEXT,
        /// `NBD_OPT_EXTENDED_HEADERS`: unsupported, answer `ErrUnsup`.
        ExtendedHeaders = NBD_OPT_EXTENDED_HEADERS,
    }
}

wire_enum! {
    /// Reply type of a fixed-newstyle option reply.
    OptionReplyType(u32) {
        /// `NBD_REP_ACK`.
        Ack = NBD_REP_ACK,
        /// `NBD_REP_SERVER`.
        Server = NBD_REP_SERVER,
        /// `NBD_REP_INFO`.
        Info = NBD_REP_INFO,
        /// `NBD_REP_META_CONTEXT`.
        MetaContext = NBD_REP_META_CONTEXT,
        /// `NBD_REP_ERR_UNSUP`.
        ErrUnsup = NBD_REP_ERR_UNSUP,
        /// `NBD_REP_ERR_POLICY`.
        ErrPolicy = NBD_REP_ERR_POLICY,
        /// `NBD_REP_ERR_INVALID`.
        ErrInvalid = NBD_REP_ERR_INVALID,
        /// `NBD_REP_ERR_PLATFORM`.
        ErrPlatform = NBD_REP_ERR_PLATFORM,
        /// `NBD_REP_ERR_TLS_REQD`.
        ErrTlsReqd = NBD_REP_ERR_TLS_REQD,
        /// `NBD_REP_ERR_UNKNOWN`.
        ErrUnknown = NBD_REP_ERR_UNKNOWN,
        /// `NBD_REP_ERR_SHUTDOWN`.
        ErrShutdown = NBD_REP_ERR_SHUTDOWN,
        /// `NBD_REP_ERR_BLOCK_SIZE_REQD`.
        ErrBlockSizeReqd = NBD_REP_ERR_BLOCK_SIZE_REQD,
        /// `NBD_REP_ERR_TOO_BIG`.
        ErrTooBig = NBD_REP_ERR_TOO_BIG,
    }
}

impl OptionReplyType {
    /// Whether this is an error reply (bit 31 set).
    pub fn is_error(self) -> bool {
        u32::from(self) & NBD_REP_FLAG_ERROR != 0
    }
}

wire_enum! {
    /// Information item requested by `NBD_OPT_INFO` / `NBD_OPT_GO`.
    InfoType(u16) {
        /// `NBD_INFO_EXPORT`.
        Export = NBD_INFO_EXPORT,
        /// `NBD_INFO_NAME`.
        Name = NBD_INFO_NAME,
        /// `NBD_INFO_DESCRIPTION`.
        Description = NBD_INFO_DESCRIPTION,
        /// `NBD_INFO_BLOCK_SIZE`.
        BlockSize = NBD_INFO_BLOCK_SIZE,
    }
}

wire_enum! {
    /// Command type of a transmission request.
    Command(u16) {
        /// `NBD_CMD_READ`.
        Read = NBD_CMD_READ,
        /// `NBD_CMD_WRITE`.
        Write = NBD_CMD_WRITE,
        /// `NBD_CMD_DISC`.
        Disc = NBD_CMD_DISC,
        /// `NBD_CMD_FLUSH`.
        Flush = NBD_CMD_FLUSH,
        /// `NBD_CMD_TRIM`.
        Trim = NBD_CMD_TRIM,
        /// `NBD_CMD_CACHE`.
        Cache = NBD_CMD_CACHE,
        /// `NBD_CMD_WRITE_ZEROES`.
        WriteZeroes = NBD_CMD_WRITE_ZEROES,
        /// `NBD_CMD_BLOCK_STATUS`.
        BlockStatus = NBD_CMD_BLOCK_STATUS,
        /// `NBD_CMD_RESIZE` (experimental).
        Resize = NBD_CMD_RESIZE,
    }
}

impl Command {
    /// Command flags the protocol documents as applicable to this command.
    ///
    /// `FUA` is listed for every known command (the spec lets clients set it
    /// anywhere once `NBD_FLAG_SEND_FUA` is advertised); whether a flag is
    /// also *negotiated* (e.g. `DF`, `FAST_ZERO`) is the server's business.
    /// The server should answer `NBD_EINVAL` to flags outside this set.
    pub fn allowed_flags(self) -> CmdFlags {
        match self {
            Command::Read => CmdFlags::FUA | CmdFlags::DF,
            Command::WriteZeroes => CmdFlags::FUA | CmdFlags::NO_HOLE | CmdFlags::FAST_ZERO,
            Command::BlockStatus => CmdFlags::FUA | CmdFlags::REQ_ONE,
            Command::Unknown(_) => CmdFlags::empty(),
            _ => CmdFlags::FUA,
        }
    }
}

wire_enum! {
    /// Type of a structured reply chunk.
    ReplyType(u16) {
        /// `NBD_REPLY_TYPE_NONE`.
        None = NBD_REPLY_TYPE_NONE,
        /// `NBD_REPLY_TYPE_OFFSET_DATA`.
        OffsetData = NBD_REPLY_TYPE_OFFSET_DATA,
        /// `NBD_REPLY_TYPE_OFFSET_HOLE`.
        OffsetHole = NBD_REPLY_TYPE_OFFSET_HOLE,
        /// `NBD_REPLY_TYPE_BLOCK_STATUS`.
        BlockStatus = NBD_REPLY_TYPE_BLOCK_STATUS,
        /// `NBD_REPLY_TYPE_ERROR`.
        Error = NBD_REPLY_TYPE_ERROR,
        /// `NBD_REPLY_TYPE_ERROR_OFFSET`.
        ErrorOffset = NBD_REPLY_TYPE_ERROR_OFFSET,
    }
}

wire_enum! {
    /// Error value carried by simple replies and error chunks.
    Errno(u32) {
        /// `NBD_EPERM`.
        Perm = NBD_EPERM,
        /// `NBD_EIO`.
        Io = NBD_EIO,
        /// `NBD_ENOMEM`.
        NoMem = NBD_ENOMEM,
        /// `NBD_EINVAL`.
        Inval = NBD_EINVAL,
        /// `NBD_ENOSPC`.
        NoSpc = NBD_ENOSPC,
        /// `NBD_EOVERFLOW`.
        Overflow = NBD_EOVERFLOW,
        /// `NBD_ENOTSUP`.
        NotSup = NBD_ENOTSUP,
        /// `NBD_ESHUTDOWN`.
        Shutdown = NBD_ESHUTDOWN,
    }
}

impl Errno {
    /// Maps an I/O error kind to the closest NBD error value (`EIO` when
    /// nothing closer exists; quota and file-size errors become `ENOSPC`
    /// as the protocol recommends).
    pub fn from_io_kind(kind: ErrorKind) -> Errno {
        match kind {
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => Errno::Perm,
            ErrorKind::OutOfMemory => Errno::NoMem,
            ErrorKind::InvalidInput => Errno::Inval,
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge => {
                Errno::NoSpc
            }
            ErrorKind::Unsupported => Errno::NotSup,
            _ => Errno::Io,
        }
    }
}
