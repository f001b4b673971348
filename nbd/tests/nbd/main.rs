//! forkfs-nbd through real NBD clients (libnbd's tools, qemu, nbdfuse +
//! loop + kernel btrfs): the protocol and its errors, btrfs safe points
//! and rollbacks, chaos with connections cut at random, and maintenance
//! while serving. One test binary.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../tests/common/postgres.rs"]
mod postgres;

mod access;
mod btrfs;
mod changed;
mod chaos;
mod clients;
mod consistency;
mod consistency_clients;
mod environment;
mod errors;
mod lifecycle;
mod limits;
mod maintenance;
mod sizes;
mod systemd;
mod tls;
