//! Golden tests of the records (docs/FORMAT.md: version, volume, head and
//! rollback records, their `meta` keys, durable marks and the object key
//! layout): fixed records encoded by the real code are compared byte for
//! byte with `tests/golden/`, and the checked-in bytes decode to them.
//! `FORKFS_BLESS=1` rewrites the files (see `files::golden`).

use super::keys;
use super::{
    Consistency, HeadRecord, Origin, Policy, RECORD_FORMAT, RollbackRecord, VersionRecord,
    VolumeKind, VolumeRecord,
};
use crate::files::golden;
use crate::id::{ChunkId, PackId, VersionId, VolumeId, VolumeName};
use crate::objects::keys as objects;

fn version() -> VersionRecord {
    VersionRecord {
        format: RECORD_FORMAT,
        id: VersionId([0; 16]),
        volume: VolumeId(3),
        volume_name: VolumeName::new("web").expect("a name"),
        seq: 7,
        parents: vec![VersionId([0x44; 16])],
        root: Some(ChunkId([0x55; 32])),
        kind: VolumeKind::Block,
        size: 68_719_476_736,
        block_size: 65_536,
        created_at_ms: 1_790_000_000_000,
        label: Some("before".into()),
        origin: Origin::SafePoint,
        pinned: true,
        generation: Some(12),
    }
    .seal()
    .expect("seals")
}

#[test]
fn golden_version_record() {
    let v = version();
    // The object copy (pretty JSON) and the bytes the id is the hash of.
    let want = golden("version-record.json", &super::encode(&v).expect("encodes"));
    assert_eq!(VersionRecord::decode(&want).expect("decodes"), v);
    let unnamed = VersionRecord { id: VersionId([0; 16]), ..v.clone() };
    let hashed =
        golden("version-record-id-input.json", &serde_json::to_vec(&unnamed).expect("json"));
    assert_eq!(
        &blake3::hash(&hashed).as_bytes()[..16],
        &v.id.0[..],
        "id = blake3 of the zero-id record"
    );
}

#[test]
fn golden_volume_and_head_records() {
    let vol = VolumeRecord {
        format: RECORD_FORMAT,
        id: VolumeId(3),
        name: VolumeName::new("web").expect("a name"),
        kind: VolumeKind::Fs,
        size: 1 << 40,
        block_size: 65_536,
        created_at_ms: 1_790_000_000_000,
        forked_from: Some(VersionId([0x66; 16])),
        retention: Some(Policy { keep_recent: 32, unit_ms: 300_000, per_bucket: 1 }),
        auto_prune: false,
        consistency: Consistency::Btrfs,
        quota: None,
    };
    let want = golden("volume-record.json", &super::encode(&vol).expect("encodes"));
    assert_eq!(serde_json::from_slice::<VolumeRecord>(&want).expect("decodes"), vol);
    let vol = VolumeRecord { quota: Some(10 << 30), ..vol };
    let want = golden("volume-record-quota.json", &super::encode(&vol).expect("encodes"));
    assert_eq!(serde_json::from_slice::<VolumeRecord>(&want).expect("decodes"), vol);
    let head =
        HeadRecord { base: Some(version().id), root: Some(ChunkId([0x77; 32])), next_seq: 8 };
    let want = golden("head-record.json", &super::encode(&head).expect("encodes"));
    assert_eq!(serde_json::from_slice::<HeadRecord>(&want).expect("decodes"), head);
}

#[test]
fn golden_rollback_record() {
    let r = RollbackRecord {
        volume: VolumeId(3),
        volume_name: VolumeName::new("web").expect("a name"),
        at_ms: 1_790_000_000_000,
        reason: "connection lost".into(),
        discarded_bytes: Some(8192),
        discarded_blocks: Some(2),
        unsealed_since_ms: Some(1_789_999_999_000),
        head_base: Some(version().id),
        sealed_generation: Some(11),
    };
    let want = golden("rollback-record.json", &serde_json::to_vec(&r).expect("json"));
    assert_eq!(serde_json::from_slice::<RollbackRecord>(&want).expect("decodes"), r);
}

/// Every key of the `meta` column family and of the object store, and the
/// small text values (durable marks, tags, log entries), for fixed ids.
#[test]
fn golden_keys_and_small_values() {
    let (vol, v, pack) = (VolumeId(3), version().id, PackId([0xab; 16]));
    let lines = [
        ("meta", keys::volume("web")),
        ("meta", keys::head(vol)),
        ("meta", keys::published(vol)),
        ("meta", keys::version(&v)),
        ("meta", keys::log(vol, 7)),
        ("meta", keys::durable(vol, 5)),
        ("meta", keys::log_floor(vol)),
        ("meta", keys::damaged(&v)),
        ("meta", keys::unsealed(vol)),
        ("meta", keys::rollback(vol, 1_790_000_000_000, 2)),
        ("meta", keys::tag(vol, "before")),
        ("meta", keys::NEXT_VOLUME_ID.to_string()),
        ("meta", keys::STORE_ID.to_string()),
        ("meta", keys::HOST_ID.to_string()),
        ("object", objects::pack(&pack).to_string()),
        ("object", objects::quarantine(&pack).to_string()),
        ("object", objects::version(&v).to_string()),
        ("object", objects::volume(vol).to_string()),
        ("object", objects::head(vol).to_string()),
        ("object", objects::lease(vol).to_string()),
        ("object", objects::tag(vol, "before").to_string()),
        ("object", objects::store_config().to_string()),
        // Values: a durable mark (bytes, text), a log entry and a tag (id, text).
        ("value durable", 65_536u64.to_string()),
        ("value log/tag", v.to_string()),
    ];
    let text: String = lines.iter().map(|(k, s)| format!("{k}\t{s}\n")).collect();
    let want = golden("keys.txt", text.as_bytes());
    // Decoding: the parsers read back what the checked-in keys say.
    let want = String::from_utf8(want).expect("text");
    let field = |i: usize| want.lines().nth(i).and_then(|l| l.split('\t').nth(1)).expect("a line");
    let p = |s: &str| object_store::path::Path::from(s);
    assert_eq!(objects::parse_pack(&p(field(14))), Some(pack));
    assert_eq!(objects::parse_tag(&p(field(20))), Some((vol, "before".to_string())));
    assert_eq!(super::parse_id(field(23).as_bytes(), "golden").expect("an id"), v);
    assert_eq!(field(22).parse::<u64>().expect("a mark"), 65_536);
}
