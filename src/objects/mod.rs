//! Object stores, through `object_store`: where a store's immutable
//! objects (packs, records) and head pointers live. A local directory by
//! default, or S3, GCS, Azure or a `file://` directory (`remote.rs`).
//!
//! - [`backend`]: the blocking bridge every layer above calls, with the
//!   read deadline and fsync of local puts;
//! - [`keys`]: the one place that knows the object key layout;
//! - `local.rs`: durable puts into a local directory;
//! - [`remote`]: remote URLs and connection settings;
//! - [`outbox`]: remote puts land on local disk first and upload in the
//!   background.
//!
//! Uses only the foundation (errors, ids). Knows nothing of chunks,
//! volumes or versions beyond the names of their keys.

pub mod backend;
pub mod keys;
mod local;
pub mod outbox;
pub mod remote;

pub use backend::{Backend, prepare_io};
pub use outbox::OutboxStats;
pub use remote::RemoteConfig;
