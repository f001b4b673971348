//! Serving a store to other processes: the control socket (`socket.rs`)
//! and the requests it answers (`request.rs`): maintenance, snapshots,
//! forks, restores, logs, diffs, status and sync for a store that an NBD
//! server or a mount holds open.
//!
//! Uses the store and maintenance layers. The front-ends' own requests
//! (a mount hosting further mounts) arrive as [`Extension`]s they register
//! in the [`Extensions`] their [`Server`] answers with.

mod request;
mod socket;

pub use request::{GroupRequest, QuotaReport, Request, execute};
pub use socket::{Extension, Extensions, HOLDER_EXIT_WAIT, SOCKET, Server, call, run, serve};
