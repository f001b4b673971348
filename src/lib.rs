//! forkfs core: one copy-on-write, content-addressed chunk store and one
//! version graph, under a FUSE workspace and an NBD server.
//!
//! Layers, each using only those below it (see docs/ARCHITECTURE.md):
//! - [`store`], [`graph`], [`diff`]: volumes, versions, snapshot/fork/restore/diff
//! - [`volume`]: heads (base root + overlay), the block and inode APIs
//! - [`map`]: the persistent Merkle map
//! - [`chunk`], [`pack`], [`index`]: content-addressed chunks in packs, indexed in RocksDB
//! - [`backend`]: object stores through `object_store`
//!
//! This crate knows nothing of FUSE or NBD.

pub mod attach;
pub mod backend;
pub mod check;
pub mod chunk;
pub mod consistency;
pub mod control;
pub mod datalog;
pub mod diff;
pub mod diskcache;
pub mod error;
pub mod gc;
pub mod graph;
pub mod id;
pub mod index;
pub mod lease;
pub mod map;
pub mod outbox;
pub mod overlay;
pub mod pack;
pub mod paths;
pub mod progress;
pub mod publish;
pub mod reach;
pub mod readahead;
pub mod remote;
pub mod repair;
pub mod retention;
pub mod rollback;
pub mod settings;
pub mod stats;
pub mod store;
pub mod version;
pub mod volume;

pub use consistency::Consistency;
pub use diff::{BlockRange, Diff, PathChange, PathDiff};
pub use error::{Error, ErrorKind, Result};
pub use graph::{SnapshotOptions, Target};
pub use id::{ChunkId, PackId, VersionId, VolumeId, VolumeName};
pub use rollback::RollbackRecord;
pub use store::{Store, StoreConfig};
pub use version::{Origin, VersionRecord, VolumeKind, VolumeRecord};
pub use volume::Head;
