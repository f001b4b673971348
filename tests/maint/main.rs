//! Maintenance tests: fsck and repair of damaged stores, GC under
//! concurrent writers and across crashes. One test binary.

#[path = "../common/mod.rs"]
mod common;

mod damage;
mod fsck;
mod gc;
mod gc_crash;
mod patch_repair;
