//! forkfs core: one copy-on-write, content-addressed chunk store and one
//! version graph, under a FUSE workspace and an NBD server.
//!
//! The layers, each using only those below it (docs/ARCHITECTURE.md walks
//! them; `scripts/check-layers` enforces the order):
//!
//! | layer | owns |
//! |---|---|
//! | [`service`] | the control socket: requests to the process holding a store |
//! | `maint`, [`bundle`] | check, repair, gc, stats: the commands `forkfs-fsck` drives; history bundles |
//! | `store` | [`Store`]: directory, configuration, lock; a handle over the services |
//! | `graph` | [`Volumes`] and the version [`Graph`]: snapshot, fork, restore, diff, retention |
//! | `sync` | many hosts on one bucket: leases, head publishing, imports |
//! | `head` | live heads ([`BlockHead`], [`FsHead`]): overlay, data log, fold |
//! | `records` | volume, head, version and rollback records and their keys |
//! | `map` | the persistent Merkle map |
//! | `cas` | chunks: blake3 ids, zstd, packs, the chunk index, caches |
//! | `db`, `objects` | the local RocksDB; object stores through `object_store` |
//! | `error`, `id`, `clock`, `config`, `progress` | the foundation |
//!
//! The core knows nothing of FUSE or NBD. What front-ends use is
//! re-exported here; everything else stays inside. One front-end lives in
//! this crate, above every layer: [`mount`] (feature `mount`), the FUSE
//! workspace, here so that whichever process holds a store (a mount, or
//! forkfs-nbd) can host mounts of it. It uses the library only as its
//! users do, through `forkfs::` paths (`scripts/check-layers` holds it to
//! that), never reaching inside.

// `forkfs::` names this crate from inside it too (for [`mount`]).
extern crate self as forkfs;

pub mod bundle;
mod cas;
mod clock;
mod config;
mod db;
mod error;
mod files;
mod graph;
mod head;
mod home;
mod id;
mod maint;
mod map;
#[cfg(feature = "mount")]
pub mod mount;
mod objects;
mod progress;
mod records;
pub mod service;
mod store;
mod sync;

pub use clock::now_ms;
pub use config::{Settings, parse_size};
pub use error::{Detail, Error, ErrorKind, Posix, Result, exit_code, one_line};
pub use files::restrict_umask;
pub use graph::group::describe as describe_group_version;
pub use graph::{
    BlockRange, DEFAULT_FS_SIZE, Diff, Graph, PathChange, PathDiff, RestoreHook, Restored,
    SnapshotOptions, Target, Volumes,
};
pub use head::block::merge_range;
pub use head::blockmap::Piece;
/// How many unflushed rewrites of one block a power loss can take and still
/// leave it readable as its last durable content (see `head/prior.rs`).
pub use head::prior::MAX_CHAIN as MAX_PRIOR_CHAIN;
pub use head::{BlockHead, Frozen, FsHead, LayerStats, Opened, WeakBlockHead, is_zero};
pub use home::default_store_dir;
pub use id::{ChunkId, PackId, VersionId, VolumeId, VolumeName};
pub use maint::{
    CheckOptions, CheckReport, GcOptions, GcReport, RepairReport, StoreStats, VolumeStats,
};
pub use map::MapRoot;
pub use objects::{OutboxStats, RemoteConfig};
pub use progress::{Progress, Quiet};
pub use records::{
    Consistency, GroupRecord, GroupVersion, HeadRecord, Member, Origin, Policy, PolicyChange,
    RollbackRecord, VersionRecord, VolumeKind, VolumeRecord,
};
pub use store::{CONFIG_FILE, DEFAULT_BLOCK_SIZE, Store, StoreConfig, Synced};
pub use sync::view::View as SharedView;

/// The inode-level API of fs volumes: what the FUSE workspace and
/// import/export of directory trees use.
pub mod fs {
    pub use crate::head::fs::inode::{
        Content, DirEntry, FL_APPEND, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP, FileKind, INLINE_MAX,
        Inode, QUOTA_UNIT, ROOT_INO, Time, charged,
    };
    pub use crate::head::fs::xattr::XattrMode;
    pub use crate::head::fs::{
        FsChanges, FsReader, NAME_MAX, NewNode, RenameMode, SetAttr, fs_changes, never_open,
    };
}
