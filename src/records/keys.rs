//! Keys of the records in the `meta` column family of the local database:
//! the one place that knows them.

use crate::id::{VersionId, VolumeId};

pub const NEXT_VOLUME_ID: &str = "next-volume-id";
/// The id of the store this index belongs to (see `store/identity.rs`).
pub const STORE_ID: &str = "store-id";
/// This host's id among the hosts of a shared store: its name in GC's
/// acknowledgements (`gc-acks/<host id>.json`). One per index; the store id
/// is the same on every host of a bucket.
pub const HOST_ID: &str = "host-id";
/// Prefix of every volume record (keyed by name).
pub const VOLUME_PREFIX: &str = "vol/";
/// Prefix of every version record.
pub const VERSION_PREFIX: &str = "ver/";
/// Prefix of every head record.
pub const HEAD_PREFIX: &str = "head/";

pub fn volume(name: &str) -> String {
    format!("vol/{name}")
}
pub fn head(v: VolumeId) -> String {
    format!("head/{:016x}", v.0)
}
/// Remote stores: the head this host last published to (or took from)
/// the object store; the local head differs while a publish is due.
pub fn published(v: VolumeId) -> String {
    format!("published/{:016x}", v.0)
}
pub fn version(id: &VersionId) -> String {
    format!("ver/{id}")
}
/// The prefixes of every key a volume's version names come from (its
/// log and its tags).
pub const NAME_ROOTS: [&str; 2] = ["log/", "tag/"];
pub fn log_prefix(v: VolumeId) -> String {
    format!("log/{:016x}/", v.0)
}
pub fn log(v: VolumeId, seq: u64) -> String {
    format!("log/{:016x}/{seq:016x}", v.0)
}
/// How far data log segment `seq` of a volume is durable (bytes); writes
/// below it were acknowledged as durable (see `head/datalog.rs`).
pub fn durable(v: VolumeId, seq: u64) -> String {
    format!("durable/{:016x}/{seq:016x}", v.0)
}
pub fn durable_prefix(v: VolumeId) -> String {
    format!("durable/{:016x}/", v.0)
}
/// The first data log segment the volume's overlay may still name.
pub fn log_floor(v: VolumeId) -> String {
    format!("logfloor/{:016x}", v.0)
}
/// Prefix of every damage mark.
pub const DAMAGED_PREFIX: &str = "damaged/";
/// Set by `fsck --repair` on a version that references missing data.
pub fn damaged(id: &VersionId) -> String {
    format!("damaged/{id}")
}
/// Present while a version is being deleted (its object copies go before
/// its index records): a crash in between is finished at the next open.
pub const DELETING_PREFIX: &str = "deleting/";
pub fn deleting(id: &VersionId) -> String {
    format!("{DELETING_PREFIX}{id}")
}
/// A version another host deleted (shared stores), with its volume's name:
/// what a reference to it is told.
pub const DELETED_PREFIX: &str = "deleted/";
pub fn deleted(id: &VersionId) -> String {
    format!("{DELETED_PREFIX}{id}")
}
/// The deleted versions whose id starts with `hex`.
pub fn deleted_prefix(hex: &str) -> String {
    format!("{DELETED_PREFIX}{hex}")
}
/// Shared stores: the ETag of volume `v`'s head object when this host last
/// compared it with its own head (`sync/import.rs`).
pub fn head_seen(v: VolumeId) -> String {
    format!("headseen/{:016x}", v.0)
}
/// What this host last saw of a shared store's graph (`sync/view.rs`).
pub const VIEW: &str = "view";
/// Present while a deferred head holds unsealed writes (see
/// `head/block/deferred.rs`); found at open, it means a process died with them.
pub fn unsealed(v: VolumeId) -> String {
    format!("unsealed/{:016x}", v.0)
}
pub const UNSEALED_PREFIX: &str = "unsealed/";
pub fn rollback_prefix(v: VolumeId) -> String {
    format!("rollback/{:016x}/", v.0)
}
/// A rollback of the head to its last sealed state (see `graph/rollback.rs`).
pub fn rollback(v: VolumeId, at_ms: u64, seq: u64) -> String {
    format!("rollback/{:016x}/{at_ms:016x}-{seq:08x}", v.0)
}
pub fn tag_prefix(v: VolumeId) -> String {
    format!("tag/{:016x}/", v.0)
}
pub fn tag(v: VolumeId, name: &str) -> String {
    format!("tag/{:016x}/{name}", v.0)
}
/// Shared stores: the ETag of the tag object this host last wrote or took
/// (`sync/names.rs`).
pub fn tag_seen_prefix(v: VolumeId) -> String {
    format!("tagseen/{:016x}/", v.0)
}
pub fn tag_seen(v: VolumeId, name: &str) -> String {
    format!("tagseen/{:016x}/{name}", v.0)
}
/// Prefix of every group record (keyed by name).
pub const GROUP_PREFIX: &str = "group/";
pub fn group(name: &str) -> String {
    format!("{GROUP_PREFIX}{name}")
}
/// The group versions of group `name`, by sequence number.
pub fn group_log_prefix(name: &str) -> String {
    format!("grouplog/{name}/")
}
pub fn group_log(name: &str, seq: u64) -> String {
    format!("grouplog/{name}/{seq:016x}")
}
/// Prefix of every group version of every group.
pub const GROUP_LOG_PREFIX: &str = "grouplog/";
