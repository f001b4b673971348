//! The FUSE workspace through the real kernel: POSIX behaviour against
//! ext4, errno tables, fsx, crashes, PostgreSQL, the mount lifecycle, the
//! commands that reach a mounted store, and `scripts/demo`. One test binary.

#[path = "../common/mod.rs"]
mod common;

mod crash_rounds;
mod demo;
mod mount;
mod mount_acl;
mod mount_atime;
mod mount_bundle;
mod mount_chattr;
mod mount_cli;
mod mount_copy;
mod mount_crash;
mod mount_crash_npm;
mod mount_crash_untar;
mod mount_errno;
mod mount_fsx;
mod mount_group;
mod mount_handles;
mod mount_killpriv;
mod mount_launcher;
mod mount_lifecycle;
mod mount_posix;
mod mount_postgres;
mod mount_quota;
mod mount_store_dir;
