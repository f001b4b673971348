//! fsck against deliberately broken stores: each kind of damage is found
//! and named with what it affects; `--repair` restores what can be
//! restored, marks what cannot, and deletes no user data; a clean store
//! passes with zero findings.

use crate::common::{forkfs, ok};
use std::path::{Path, PathBuf};

/// A store with a 1 MiB block volume holding two versions.
fn store() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("store");
    ok(&s, &["init", "--pack-size", "64KiB"]);
    let img = d.path().join("img");
    std::fs::write(&img, image()).unwrap();
    ok(&s, &["import", "disk", img.to_str().unwrap()]);
    ok(&s, &["snapshot", "disk", "--name", "second"]);
    (d, s)
}

fn image() -> Vec<u8> {
    (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

fn fsck(s: &Path, flags: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["--json", "fsck"];
    args.extend_from_slice(flags);
    let out = forkfs(s, &args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("fsck output: {out:?}"));
    (out.status.code().unwrap_or(-1), v)
}

fn packs(s: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(s.join("objects/packs")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn problems(v: &serde_json::Value) -> String {
    let list = v["problems"].as_array().expect("a problems list");
    list.iter().map(|p| p.as_str().unwrap().to_string()).collect::<Vec<_>>().join("\n")
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x55;
    std::fs::write(path, b).unwrap();
}

/// The store's RocksDB, opened from outside forkfs (as damage comes),
/// with its column families (docs/FORMAT.md).
fn raw_db(s: &Path) -> rocksdb::DB {
    let opts = rocksdb::Options::default();
    rocksdb::DB::open_cf(&opts, s.join("index"), ["chunks", "packs", "meta", "overlay"]).unwrap()
}

/// The version the store's only tag names, and its record.
fn tagged_version(s: &Path) -> (String, serde_json::Value) {
    let db = raw_db(s);
    let meta = db.cf_handle("meta").unwrap();
    let tag = db
        .prefix_iterator_cf(meta, b"tag/")
        .next()
        .expect("a tag")
        .map(|(_, v)| String::from_utf8(v.to_vec()).unwrap())
        .unwrap();
    let raw = db.get_cf(meta, format!("ver/{tag}")).unwrap().unwrap();
    (tag, serde_json::from_slice(&raw).unwrap())
}

/// Flips a byte inside the chunk that is the root node of the tagged version.
fn corrupt_root_node(s: &Path) {
    let (_, rec) = tagged_version(s);
    let root = rec["root"].as_str().unwrap().to_string();
    let db = raw_db(s);
    let id = forkfs::ChunkId::parse(&root).unwrap();
    // A chunk's location: pack id [16] | offset u64 LE | ... (docs/FORMAT.md).
    let loc = db.get_cf(db.cf_handle("chunks").unwrap(), id.0).unwrap().unwrap();
    let pack = forkfs::PackId(loc[..16].try_into().unwrap());
    let offset = u64::from_le_bytes(loc[16..24].try_into().unwrap());
    drop(db);
    flip(&s.join(format!("objects/packs/{pack}.pack")), offset as usize + 3);
}

fn delete_an_index_entry(s: &Path) {
    let db = raw_db(s);
    let cf = db.cf_handle("chunks").unwrap();
    let (k, _) = db.iterator_cf(cf, rocksdb::IteratorMode::Start).nth(5).unwrap().unwrap();
    db.delete_cf(cf, k).unwrap();
}

fn alter_version_record(s: &Path) {
    let (id, mut rec) = tagged_version(s);
    rec["label"] = "tampered".into();
    let db = raw_db(s);
    let raw = serde_json::to_vec(&rec).unwrap();
    db.put_cf(db.cf_handle("meta").unwrap(), format!("ver/{id}"), raw).unwrap();
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum AfterRepair {
    /// Everything could be restored: fsck passes.
    Clean,
    /// Data is gone: versions are marked damaged, fsck still fails.
    Damaged,
}

#[test]
fn a_clean_store_has_zero_findings() {
    let (_d, s) = store();
    for flags in [&[][..], &["--deep"][..], &["--repair"][..]] {
        let (code, v) = fsck(&s, flags);
        assert_eq!(code, 0, "{flags:?}: {v}");
        assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v}");
        assert!(v["chunks"].as_u64().unwrap() >= 16 && v["packs"].as_u64().unwrap() >= 1, "{v}");
    }
}

#[test]
fn each_kind_of_damage_is_found_named_and_repaired() {
    type Break = fn(&Path);
    let cases: [(&str, Break, &[&str], &str, AfterRepair); 7] = [
        (
            "byte flipped in a pack body",
            |s| flip(&packs(s)[0], 100),
            &["--deep"],
            "checksum",
            AfterRepair::Damaged,
        ),
        (
            "pack truncated",
            |s| {
                let p = &packs(s)[0];
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() / 2]).unwrap();
            },
            &[],
            "pack ",
            AfterRepair::Damaged,
        ),
        (
            "pack deleted",
            |s| std::fs::remove_file(&packs(s)[0]).unwrap(),
            &[],
            "pack ",
            AfterRepair::Damaged,
        ),
        (
            "footer byte flipped",
            |s| {
                let p = &packs(s)[0];
                let n = std::fs::metadata(p).unwrap().len() as usize;
                flip(p, n - 60);
            },
            &[],
            "footer",
            AfterRepair::Clean,
        ),
        ("index entry deleted", delete_an_index_entry, &[], "not in the index", AfterRepair::Clean),
        ("Merkle node corrupted", corrupt_root_node, &[], "checksum", AfterRepair::Damaged),
        ("version record altered", alter_version_record, &[], "version record", AfterRepair::Clean),
    ];
    for (what, breaks, flags, expect, after) in cases {
        let (_d, s) = store();
        breaks(&s);
        let (code, v) = fsck(&s, flags);
        assert_eq!(code, 1, "{what}: fsck passed a broken store: {v}");
        let p = problems(&v);
        assert!(p.contains(expect), "{what}: findings do not name the damage:\n{p}");
        if after == AfterRepair::Damaged && what != "version record altered" {
            assert!(p.contains("disk@"), "{what}: findings do not name a version:\n{p}");
        }

        let objects_before = count_objects(&s);
        let mut rflags = flags.to_vec();
        rflags.push("--repair");
        let (code, v) = fsck(&s, &rflags);
        let after_p = problems(&v["after_repair"]);
        match after {
            AfterRepair::Clean => {
                assert_eq!(code, 0, "{what}: repair did not restore the store: {v:#}");
                assert!(after_p.is_empty());
                // And the data reads back exactly.
                let out = s.parent().unwrap().join("out");
                ok(&s, &["export", "disk@second", out.to_str().unwrap()]);
                assert!(std::fs::read(&out).unwrap() == image(), "{what}: data differs");
            }
            AfterRepair::Damaged => {
                assert_eq!(code, 1, "{what}: damage cannot be repaired, yet fsck passed: {v:#}");
                let marked = v["repair"]["damaged_versions"].as_array().unwrap();
                assert!(!marked.is_empty(), "{what}: no version marked damaged: {v:#}");
                assert!(after_p.contains("disk@"), "{what}: {after_p}");
                // Damaged versions stay listed, marked; nothing was deleted.
                let log = crate::common::json(&s, &["log", "disk"]);
                assert_eq!(log.as_array().map(|a| a.len()), Some(2), "{what}: {log}");
                let n = log.as_array().unwrap().iter().filter(|v| !v["damaged"].is_null()).count();
                assert_eq!(n, marked.len(), "{what}: log marks {n} damaged: {log}");
            }
        }
        assert!(
            count_objects(&s) >= objects_before,
            "{what}: repair deleted objects ({objects_before} before)"
        );
    }
}

/// Objects under the store's object directory (packs, quarantine, records).
fn count_objects(s: &Path) -> usize {
    fn walk(p: &Path) -> usize {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.map(|e| e.unwrap().path()).map(|p| if p.is_dir() { walk(&p) } else { 1 }).sum()
            })
            .unwrap_or(0)
    }
    walk(&s.join("objects"))
}
