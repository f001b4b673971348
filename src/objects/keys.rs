//! The object key layout: the one place that knows where things live in the
//! object store. See docs/FORMAT.md.

use crate::id::{PackId, VersionId, VolumeId};
use object_store::path::Path;

/// Prefix under which every pack object lives.
pub const PACKS: &str = "packs";
/// Prefix under which every version record lives.
pub const VERSIONS: &str = "versions";
/// Prefix under which every volume record lives.
pub const VOLUMES: &str = "volumes";
/// Prefix under which head pointers live.
pub const HEADS: &str = "heads";

/// The settings shared by every host of a remote store.
pub fn store_config() -> Path {
    Path::from("store.json")
}

pub fn pack(id: &PackId) -> Path {
    Path::from(format!("{PACKS}/{id}.pack"))
}

/// Parses a pack key back into its id; `None` for anything else under `packs/`.
pub fn parse_pack(key: &Path) -> Option<PackId> {
    let name = key.as_ref().strip_prefix("packs/")?.strip_suffix(".pack")?;
    PackId::parse(name)
}

/// Where `fsck --repair` moves a damaged pack after salvaging what verifies.
pub fn quarantine(id: &PackId) -> Path {
    Path::from(format!("quarantine/{id}.pack"))
}

pub fn version(id: &VersionId) -> Path {
    Path::from(format!("{VERSIONS}/{id}.json"))
}

pub fn volume(id: VolumeId) -> Path {
    Path::from(format!("{VOLUMES}/{:016x}.json", id.0))
}

/// Parses a volume record's key back into its id.
pub fn parse_volume(key: &Path) -> Option<VolumeId> {
    let hex = key.as_ref().strip_prefix("volumes/")?.strip_suffix(".json")?;
    Some(VolumeId(u64::from_str_radix(hex, 16).ok()?))
}

/// The single-writer lease of a volume (remote stores).
pub fn lease(id: VolumeId) -> Path {
    Path::from(format!("leases/{:016x}.json", id.0))
}

pub fn head(id: VolumeId) -> Path {
    Path::from(format!("{HEADS}/{:016x}.json", id.0))
}

/// Parses a head key back into its volume id.
pub fn parse_head(key: &Path) -> Option<VolumeId> {
    let hex = key.as_ref().strip_prefix("heads/")?.strip_suffix(".json")?;
    Some(VolumeId(u64::from_str_radix(hex, 16).ok()?))
}

/// Prefix of the tombstones GC leaves on a shared store (one per pack it
/// retired; the pack object goes only once every host acknowledged it).
pub const GC_TOMBSTONES: &str = "gc";
/// Prefix of each host's acknowledgement of the tombstones it has absorbed.
pub const GC_ACKS: &str = "gc-acks";

/// The tombstone of pack `id` (shared stores).
pub fn gc_tombstone(id: &PackId) -> Path {
    Path::from(format!("{GC_TOMBSTONES}/{id}.json"))
}

/// Parses a tombstone key back into its pack id.
pub fn parse_gc_tombstone(key: &Path) -> Option<PackId> {
    let name = key.as_ref().strip_prefix("gc/")?.strip_suffix(".json")?;
    PackId::parse(name)
}

/// The acknowledgement of host `host` (its host id: 32 hex).
pub fn gc_ack(host: &str) -> Path {
    Path::from(format!("{GC_ACKS}/{host}.json"))
}

/// The graph's generation (shared stores): rewritten by a host after every
/// change of the graph it makes visible (a head published, a volume
/// created, a version deleted, a name set or removed). Other hosts compare
/// its ETag with the one they last saw: one small request tells them
/// whether there is anything to import.
pub fn generation() -> Path {
    Path::from("graph/generation")
}

/// Prefix of the deletion records of versions (shared stores).
pub const DELETED_VERSIONS: &str = "deleted/versions";

/// The record that version `id` was deleted: written before its record
/// object goes, so every host forgets it (see `sync/view.rs`).
pub fn deleted_version(id: &VersionId) -> Path {
    Path::from(format!("{DELETED_VERSIONS}/{id}"))
}

/// Prefix of the deletion records of volumes (shared stores).
pub const DELETED_VOLUMES: &str = "deleted/volumes";

/// The record that volume `id` was deleted (its name, as text).
pub fn deleted_volume(id: VolumeId) -> Path {
    Path::from(format!("{DELETED_VOLUMES}/{:016x}", id.0))
}

/// Parses a volume deletion record's key back into the volume id.
pub fn parse_deleted_volume(key: &Path) -> Option<VolumeId> {
    let hex = key.as_ref().strip_prefix("deleted/volumes/")?;
    Some(VolumeId(u64::from_str_radix(hex, 16).ok()?))
}

/// Parses a deletion record's key back into the version id.
pub fn parse_deleted_version(key: &Path) -> Option<VersionId> {
    VersionId::parse(key.as_ref().strip_prefix("deleted/versions/")?)
}

/// Prefix under which the names of versions live.
pub const TAGS: &str = "tags";

/// The object that names a version `name` (its id, as text).
pub fn tag(vol: VolumeId, name: &str) -> Path {
    Path::from(format!("{TAGS}/{:016x}/{name}", vol.0))
}

/// Parses a tag key back into its volume and name.
pub fn parse_tag(key: &Path) -> Option<(VolumeId, String)> {
    let rest = key.as_ref().strip_prefix("tags/")?;
    let (vol, name) = rest.split_once('/')?;
    Some((VolumeId(u64::from_str_radix(vol, 16).ok()?), name.to_string()))
}

/// Object copies of group records and group versions.
pub const GROUPS: &str = "groups";
pub fn group(name: &str) -> Path {
    Path::from(format!("{GROUPS}/{name}/group.json"))
}
pub fn group_version(name: &str, seq: u64) -> Path {
    Path::from(format!("{GROUPS}/{name}/versions/{seq:016x}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_keys_round_trip() {
        let id = PackId([0xab; 16]);
        assert_eq!(parse_pack(&pack(&id)), Some(id));
        assert_eq!(parse_pack(&Path::from("packs/x.pack")), None);
        assert_eq!(parse_pack(&Path::from("versions/x.json")), None);
    }

    #[test]
    fn deletion_keys_round_trip() {
        let id = VersionId([0x3d; 16]);
        assert_eq!(parse_deleted_version(&deleted_version(&id)), Some(id));
        assert_eq!(parse_deleted_version(&version(&id)), None);
        let vol = VolumeId(0x2a);
        assert_eq!(parse_head(&head(vol)), Some(vol));
        assert_eq!(parse_head(&lease(vol)), None);
        assert_eq!(parse_volume(&volume(vol)), Some(vol));
        assert_eq!(parse_volume(&head(vol)), None);
        assert_eq!(parse_deleted_volume(&deleted_volume(vol)), Some(vol));
        assert_eq!(parse_deleted_volume(&deleted_version(&id)), None);
    }

    #[test]
    fn tombstone_keys_round_trip() {
        let id = PackId([0x5c; 16]);
        assert_eq!(parse_gc_tombstone(&gc_tombstone(&id)), Some(id));
        assert_eq!(parse_gc_tombstone(&Path::from("gc-acks/x.json")), None);
        assert_eq!(parse_gc_tombstone(&pack(&id)), None);
    }
}
