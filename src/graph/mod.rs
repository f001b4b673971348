//! The version graph: volumes and their versions. Snapshot, fork, restore,
//! tags, diff, rollbacks of unsealed writes, and retention.
//!
//! - [`Volumes`] (`volumes.rs`): create, open (one head per volume per
//!   process), change and delete volumes;
//! - [`Graph`]: everything about versions, one file per operation family:
//!   `snapshot.rs` (the commit protocol), `restore.rs` (restore, fork),
//!   `refs.rs` (resolving names, logs, tags), `diff.rs`, `rollback.rs`,
//!   `prune.rs` (retention);
//! - [`reach`]: the walk from versions and heads to every node and data
//!   chunk (GC marks with it, fsck verifies with it, a host absorbing
//!   another host's GC keeps what it reaches).
//!
//! Uses the heads, the remote side (leases, publishing), the records and
//! everything below them.

mod adopt;
mod diff;
pub mod group;
mod prune;
pub mod reach;
mod refs;
mod restore;
mod rollback;
mod snapshot;
pub mod volumes;

pub use adopt::Foreign;
pub use diff::{BlockRange, Diff, PathChange, PathDiff};
pub(crate) use refs::check_tag as check_name;
pub(crate) use volumes::check_quota;
pub use volumes::{DEFAULT_FS_SIZE, Volumes};

use crate::db::Db;
use crate::error::Result;
use crate::head::{BlockHead, Frozen, FsHead, Opened, Storage};
use crate::id::VolumeName;
use crate::records::{Origin, VersionRecord, VolumeRecord};
use parking_lot::Mutex;
use std::sync::Arc;

/// What to snapshot.
#[derive(Clone, Debug, Default)]
pub struct SnapshotOptions {
    /// A name (tag) for the new version; named versions are never pruned.
    pub name: Option<String>,
    pub label: Option<String>,
    pub origin: Option<Origin>,
    /// Skip creating a version when nothing changed since the last one.
    pub skip_if_clean: bool,
}

/// A resolved reference: the live head of a volume, or one of its versions.
#[derive(Clone, Debug)]
pub enum Target {
    Head(VolumeRecord),
    Version(VersionRecord),
}

impl Target {
    pub fn volume_name(&self) -> &VolumeName {
        match self {
            Target::Head(v) => &v.name,
            Target::Version(v) => &v.volume_name,
        }
    }
}

/// A front-end's reaction to a restore of a volume it serves.
pub type RestoreHook = Arc<dyn Fn(&Restored<'_>) + Send + Sync>;

/// A restore that has happened: the head of `volume` moved from the state
/// kept as `before` (the pre-restore version) to the state of `to`.
pub struct Restored<'a> {
    pub volume: &'a str,
    pub before: &'a VersionRecord,
    pub to: &'a VersionRecord,
}

/// The versions of a store's volumes, and what can be done with them.
pub struct Graph {
    storage: Arc<Storage>,
    volumes: Arc<Volumes>,
    /// Called after each restore (see [`Graph::on_restore`]).
    restore_hooks: Mutex<Vec<(u64, RestoreHook)>>,
}

impl Graph {
    pub(crate) fn new(storage: Arc<Storage>, volumes: Arc<Volumes>) -> Graph {
        Graph { storage, volumes, restore_hooks: Mutex::new(Vec::new()) }
    }

    fn db(&self) -> &Db {
        &self.storage.db
    }

    /// Opens what `target` names on a block volume: its live head
    /// (read-write) or a version (read-only).
    pub fn open_block(&self, target: &Target) -> Result<Opened<BlockHead>> {
        Ok(match target {
            Target::Head(v) => Opened::Live(self.volumes.open_block(v.name.as_str())?),
            Target::Version(v) => Opened::Version(self.frozen(v)?),
        })
    }

    /// Opens what `target` names on an fs volume.
    pub fn open_fs(&self, target: &Target) -> Result<Opened<FsHead>> {
        Ok(match target {
            Target::Head(v) => Opened::Live(self.volumes.open_fs(v.name.as_str())?),
            Target::Version(v) => Opened::Version(self.frozen(v)?),
        })
    }

    /// A version, opened for reading (fails if it was deleted meanwhile).
    pub fn frozen(&self, version: &VersionRecord) -> Result<Frozen> {
        Frozen::new(&self.storage, version.clone())
    }

    /// Calls `hook` after every restore in this process (a mount drops
    /// what the kernel cached of the part of the tree that changed), until
    /// [`Graph::drop_restore_hook`] with the number returned.
    pub fn on_restore(&self, hook: RestoreHook) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.restore_hooks.lock().push((id, hook));
        id
    }

    pub fn drop_restore_hook(&self, id: u64) {
        self.restore_hooks.lock().retain(|(n, _)| *n != id);
    }

    /// Calls `hook` after every change of any volume's version names in
    /// this process (a version recorded or deleted, a tag set or
    /// removed: what `.forkfs/versions` of a mount lists), on the thread
    /// that made it, until [`Graph::drop_names_hook`] with the number
    /// returned.
    pub fn on_names_changed(&self, hook: std::sync::Arc<dyn Fn() + Send + Sync>) -> u64 {
        self.db().watch_meta(&crate::records::keys::NAME_ROOTS, hook)
    }

    pub fn drop_names_hook(&self, id: u64) {
        self.db().unwatch_meta(id)
    }
}
