//! Content-addressed bytes: chunks named by the blake3 hash of their plain
//! bytes, stored zstd-compressed in immutable ~16 MiB packs whose footers
//! describe them, and indexed in the local database.
//!
//! - [`codec`]: compression and verification of one chunk;
//! - [`pack`]: the pack format (writer, footer, trailer);
//! - [`index`]: chunk id -> pack location, and what is known of each pack;
//! - [`chunks`]: the chunk store writers put into and readers read from,
//!   with its memory cache, a disk cache for remote stores
//!   ([`diskcache`]) and sequential read-ahead ([`readahead`]);
//! - [`tracking`]: write sessions and what a running GC must see of writers;
//! - [`tombstone`]: packs retired by GC on a shared store, and each host's
//!   acknowledgement of them.
//!
//! Uses the database and the object stores below it. Knows nothing of
//! maps, volumes or versions.

pub mod chunks;
pub mod codec;
pub mod diskcache;
#[cfg(test)]
mod golden;
pub mod index;
pub mod pack;
pub mod readahead;
pub mod tombstone;
pub mod tracking;

pub use chunks::{ChunkConfig, ChunkStore};
pub use index::{ChunkIndex, Location, PackInfo};
pub use tracking::GcScope;
