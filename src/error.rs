//! Errors of the core library.
//!
//! Each module keeps a detailed cause; callers see one coarse [`ErrorKind`]
//! that tells them what to do (retry, fix the input, repair the store).
//! Front-ends map kinds to errnos or NBD error codes in exactly one place.

use std::fmt;

/// What a caller can do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The named volume, version, chunk or object does not exist.
    NotFound,
    /// Stored data failed verification (checksum, magic, decoding).
    Corrupt,
    /// A backend (object store, local disk, database) could not be reached or failed.
    Unavailable,
    /// The request itself is malformed or out of range.
    InvalidInput,
    /// The target is read-only (a version, or a read-only attachment).
    ReadOnly,
    /// Out of space, or a configured limit was reached.
    NoSpace,
    /// Somebody else holds the resource, or it already exists.
    Conflict,
}

impl ErrorKind {
    /// The exit code every forkfs command uses for this kind (sysexits.h).
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::InvalidInput => 64,
            ErrorKind::Corrupt => 65,
            ErrorKind::NotFound => 66,
            ErrorKind::Unavailable => 69,
            ErrorKind::NoSpace => 73,
            ErrorKind::ReadOnly | ErrorKind::Conflict => 75,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::ReadOnly => "read-only",
            ErrorKind::NoSpace => "no space",
            ErrorKind::Conflict => "conflict",
        };
        f.write_str(s)
    }
}

/// Why an fs volume refused an operation, in POSIX terms (the errno a
/// front-end returns; the core names conditions, not numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posix {
    /// ENOENT
    NoEntry,
    /// EEXIST
    Exists,
    /// ENOTEMPTY
    NotEmpty,
    /// EISDIR
    IsDir,
    /// ENOTDIR
    NotDir,
    /// ENAMETOOLONG
    NameTooLong,
    /// EINVAL
    Invalid,
    /// EPERM
    NotPermitted,
    /// ENODATA (no such extended attribute)
    NoAttr,
    /// E2BIG (attribute value too large)
    TooBig,
    /// ERANGE (attribute name too long)
    Range,
    /// EFBIG
    FileTooBig,
    /// EMLINK
    TooManyLinks,
    /// EOPNOTSUPP
    Unsupported,
    /// ENOSPC
    NoSpace,
}

impl Posix {
    fn kind(self) -> ErrorKind {
        match self {
            Posix::NoEntry | Posix::NoAttr => ErrorKind::NotFound,
            Posix::Exists | Posix::NotEmpty => ErrorKind::Conflict,
            Posix::FileTooBig | Posix::TooManyLinks | Posix::NoSpace => ErrorKind::NoSpace,
            _ => ErrorKind::InvalidInput,
        }
    }
}

/// The error type of the core library: a kind plus a message and its cause.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    /// The POSIX condition behind a namespace error of an fs volume.
    posix: Option<Posix>,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, posix: None, message: message.into(), source: None }
    }

    /// A namespace error of an fs volume: the front-end maps `posix` to its errno.
    pub fn posix(posix: Posix, message: impl Into<String>) -> Self {
        Error { kind: posix.kind(), posix: Some(posix), message: message.into(), source: None }
    }

    /// The POSIX condition, for errors of fs volume operations.
    pub fn posix_condition(&self) -> Option<Posix> {
        self.posix
    }

    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error { kind, posix: None, message: message.into(), source: Some(Box::new(source)) }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotFound, message)
    }

    pub fn corrupt(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Corrupt, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Conflict, message)
    }

    pub fn read_only(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::ReadOnly, message)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        let kind = match e.kind() {
            rocksdb::ErrorKind::Corruption => ErrorKind::Corrupt,
            rocksdb::ErrorKind::InvalidArgument => ErrorKind::InvalidInput,
            _ => ErrorKind::Unavailable,
        };
        Error::with_source(kind, format!("index database: {e}"), e)
    }
}

impl From<object_store::Error> for Error {
    fn from(e: object_store::Error) -> Self {
        let kind = match &e {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => ErrorKind::Conflict,
            _ => ErrorKind::Unavailable,
        };
        Error::with_source(kind, format!("object store: {e}"), e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::AlreadyExists => ErrorKind::Conflict,
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                ErrorKind::InvalidInput
            }
            std::io::ErrorKind::StorageFull => ErrorKind::NoSpace,
            _ => ErrorKind::Unavailable,
        };
        Error::with_source(kind, format!("I/O: {e}"), e)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::with_source(ErrorKind::Corrupt, format!("record decoding: {e}"), e)
    }
}
