//! Maintenance: the commands `forkfs-fsck` drives, added to [`Store`] the
//! way a repository's commands are (one file per command family).
//!
//! - [`check`]: verify packs, the index, records and every tree (`fsck`);
//! - [`repair`]: rebuild the index from pack footers, salvage damaged
//!   packs, restore records from their object copies, mark damage;
//! - [`gc`]: tracing garbage collection with pack compaction;
//! - [`stats`]: what `forkfs status` shows;
//! - `usage`: the quota count of fs volumes, checked and recounted.
//!
//! The walk from roots to every node and data chunk that check and gc
//! share is `graph::reach` (a host absorbing another's GC needs it too).
//!
//! Uses the store and everything below it.
//!
//! [`Store`]: crate::store::Store

pub mod check;
mod copies;
pub mod gc;
pub mod repair;
pub mod stats;
mod unsaved;
mod usage;

pub use check::{CheckOptions, CheckReport};
pub use gc::{GcOptions, GcReport};
pub use repair::RepairReport;
pub use stats::{StoreStats, VolumeStats};
