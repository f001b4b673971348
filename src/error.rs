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
    /// EACCES
    Denied,
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
    /// ENXIO (lseek: no data or hole past the offset)
    NoSuchAddress,
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

/// Where an error came from, typed, for the callers that must tell apart
/// errors of one kind (never found by reading a message).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Detail {
    /// The POSIX condition behind a namespace error of an fs volume.
    Posix(Posix),
    /// The store is open in another process (its directory lock is held).
    StoreInUse,
    /// A call to the local file system failed: its kind and errno.
    Io { kind: std::io::ErrorKind, errno: Option<i32> },
    /// The index database (RocksDB) returned this status.
    Db(rocksdb::ErrorKind),
    /// The store's index is missing, empty or another store's: the store
    /// opens only through `forkfs fsck --repair`, which rebuilds it.
    IndexLost,
    /// The process holding the store is on its way out (its last mount
    /// ended; it is saving): once it has exited, the store opens.
    HolderExiting,
}

/// The error type of the core library: a kind plus a message and its cause.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    detail: Option<Detail>,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, detail: None, message: message.into(), source: None }
    }

    /// A namespace error of an fs volume: the front-end maps `posix` to its errno.
    pub fn posix(posix: Posix, message: impl Into<String>) -> Self {
        Error::new(posix.kind(), message).with_detail(Detail::Posix(posix))
    }

    /// The store's index is not its own (see [`Detail::IndexLost`]).
    pub fn index_lost(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Corrupt, message).with_detail(Detail::IndexLost)
    }

    /// True when the store's index must be rebuilt before it opens.
    pub fn is_index_lost(&self) -> bool {
        self.detail == Some(Detail::IndexLost)
    }

    /// The store at a directory is open in another process.
    pub fn store_in_use(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Conflict, message).with_detail(Detail::StoreInUse)
    }

    pub fn with_detail(mut self, detail: Detail) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Where the error came from, when that is known and typed.
    pub fn detail(&self) -> Option<&Detail> {
        self.detail.as_ref()
    }

    /// The POSIX condition, for errors of fs volume operations.
    pub fn posix_condition(&self) -> Option<Posix> {
        match self.detail {
            Some(Detail::Posix(p)) => Some(p),
            _ => None,
        }
    }

    /// True when the store is open in another process (whose control
    /// socket can then run the request).
    pub fn is_store_in_use(&self) -> bool {
        self.detail == Some(Detail::StoreInUse)
    }

    /// See [`Detail::HolderExiting`]: worth waiting for.
    pub fn is_holder_exiting(&self) -> bool {
        self.detail == Some(Detail::HolderExiting)
    }

    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error { kind, detail: None, message: message.into(), source: Some(Box::new(source)) }
    }

    /// The same error, its message prefixed with `context`.
    pub fn context(mut self, context: impl std::fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
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
            // RocksDB wraps some I/O failures of its open (EMFILE reading
            // CURRENT) as "options incompatible with filesystem".
            rocksdb::ErrorKind::InvalidArgument if e.to_string().contains("IO error") => {
                ErrorKind::Unavailable
            }
            rocksdb::ErrorKind::InvalidArgument => ErrorKind::InvalidInput,
            rocksdb::ErrorKind::IOError if db_out_of_space(&e) => ErrorKind::NoSpace,
            _ => ErrorKind::Unavailable,
        };
        let detail = Detail::Db(e.kind());
        Error::with_source(kind, format!("index database: {e}"), e).with_detail(detail)
    }
}

/// Whether a RocksDB I/O error is a full disk or quota. RocksDB's C API
/// gives a status as text only, so this is the one place that reads it:
/// for the system's own description of ENOSPC or EDQUOT (strerror), which
/// RocksDB's POSIX layer puts in every failed file operation's message.
fn db_out_of_space(e: &rocksdb::Error) -> bool {
    let text = e.to_string();
    [libc::ENOSPC, libc::EDQUOT].iter().any(|&errno| {
        let io = std::io::Error::from_raw_os_error(errno).to_string();
        // "No space left on device (os error 28)": the strerror part.
        let strerror = io.split(" (os error").next().unwrap_or(&io);
        text.contains(strerror)
    })
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
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                ErrorKind::NoSpace
            }
            std::io::ErrorKind::ReadOnlyFilesystem => ErrorKind::ReadOnly,
            _ => ErrorKind::Unavailable,
        };
        let detail = Detail::Io { kind: e.kind(), errno: e.raw_os_error() };
        Error::with_source(kind, format!("I/O: {e}"), e).with_detail(detail)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::with_source(ErrorKind::Corrupt, format!("record decoding: {e}"), e)
    }
}

/// The exit code of a command that failed with `e`: the kind of the first
/// forkfs error (or I/O error) in its chain of causes (see
/// [`ErrorKind::exit_code`]), else 1. Every forkfs binary exits by this.
pub fn exit_code(e: &(dyn std::error::Error + 'static)) -> i32 {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(fe) = c.downcast_ref::<Error>() {
            return fe.kind().exit_code();
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Error::from(std::io::Error::from(io.kind())).kind().exit_code();
        }
        cause = c.source();
    }
    1
}

/// An error and its causes on one line (`outer: inner: ...`), each cause
/// once: how every forkfs command reports a failure.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !s.contains(&c_text) {
            s = format!("{s}: {c_text}");
        }
        cause = c.source();
    }
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_keep_their_kind_and_errno() {
        let e: Error = std::io::Error::from_raw_os_error(libc::ENOSPC).into();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(
            e.detail(),
            Some(&Detail::Io { kind: std::io::ErrorKind::StorageFull, errno: Some(libc::ENOSPC) })
        );
        let e: Error = std::io::Error::from_raw_os_error(libc::EIO).into();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let e: Error = std::io::Error::from_raw_os_error(libc::EROFS).into();
        assert_eq!(e.kind(), ErrorKind::ReadOnly);
    }

    #[test]
    fn in_use_is_a_typed_conflict() {
        let e = Error::store_in_use("held");
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.is_store_in_use());
        assert!(!Error::conflict("exists").is_store_in_use());
    }

    #[test]
    fn exit_codes_come_from_the_first_known_cause() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrapper(#[source] Error);
        let e = Wrapper(Error::not_found("no volume"));
        assert_eq!(exit_code(&e), 66);
        assert_eq!(exit_code(&Error::store_in_use("held")), 75);
        let io = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(exit_code(&io), 73);
        assert_eq!(exit_code(&std::fmt::Error), 1);
    }

    #[test]
    fn one_line_names_each_cause_once() {
        let inner = std::io::Error::other("disk on fire");
        let e = Error::with_source(ErrorKind::Unavailable, "writing pack", inner);
        assert_eq!(one_line(&e), "writing pack: disk on fire");
        let e = Error::with_source(
            ErrorKind::Unavailable,
            "I/O: disk on fire",
            std::io::Error::other("disk on fire"),
        );
        assert_eq!(one_line(&e), "I/O: disk on fire");
    }
}
