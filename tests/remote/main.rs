//! Remote stores on a real S3 API server (moto) on loopback: several
//! hosts, faults through a proxy and an object-store decorator, crashes,
//! outages and takeovers. One test binary.

#[path = "../common/mod.rs"]
mod common;

mod remote;
mod remote_crash;
mod remote_faults;
mod remote_gc;
mod remote_gc_hosts;
mod remote_outage;
mod remote_shared_graph;
mod remote_takeover;
