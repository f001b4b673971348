//! History bundles: a volume's versions in one self-contained, verified
//! stream, to carry them to a store that shares no object store with this
//! one (`forkfs bundle create | ssh host forkfs bundle import -`).
//!
//! - `format.rs`: the stream (frames, the end hash) and its checked reader;
//! - `create.rs`: [`Store::bundle_create`] of a range `VOL@A..B`: the
//!   versions after A up to B and the chunks they reach that A does not
//!   (incremental, like `zfs send -i` and `git bundle`);
//! - `import.rs`: [`Store::bundle_import`] and [`verify`].
//!
//! Uses the store and everything below it.
//!
//! [`Store::bundle_create`]: crate::store::Store::bundle_create
//! [`Store::bundle_import`]: crate::store::Store::bundle_import

mod create;
mod format;
mod import;

pub use import::verify;

use crate::graph::Foreign;
use crate::id::VersionId;
use serde::{Deserialize, Serialize};

/// What a bundle holds, and what an import did with it.
#[derive(Serialize, Deserialize, Debug, Default)]
pub struct Report {
    /// The volume (an import: the one here).
    pub volume: String,
    /// The version the bundle builds on (`None`: a whole history).
    pub base: Option<Foreign>,
    /// The versions carried (an import: those added, as named here).
    pub versions: Vec<VersionId>,
    /// Names of versions carried (an import: those given here).
    pub names: Vec<String>,
    pub chunks: u64,
    /// Bytes of the chunks, uncompressed.
    pub plain_bytes: u64,
    pub bundle_bytes: u64,
    /// Import only: whether the volume was created, versions it had
    /// already, names another version holds here, whether its head moved
    /// to the newest version, chunks stored and chunks it had.
    pub created: bool,
    pub known_versions: usize,
    pub names_taken: Vec<String>,
    pub head_moved: bool,
    pub new_chunks: u64,
    pub known_chunks: u64,
}
