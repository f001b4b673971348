//! The core's tests: the library API (snapshots during writes, crash
//! safety, deferred persistence, the fs API, a model of the version
//! graph, retention) and the `forkfs` command's store commands. One test
//! binary (it links RocksDB once).

#[path = "../common/mod.rs"]
mod common;

mod bundle;
mod cli;
mod concurrent;
mod crash;
mod deferred;
mod fs_api;
mod fs_concurrent;
mod graph_model;
mod group;
mod lost_rewrite;
mod patch;
mod prune;
mod quota;
