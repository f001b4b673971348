//! fsck against deliberately broken stores: each kind of damage is found
//! and named; a clean store passes with zero findings.

mod common;

use common::{forkfs, ok};
use std::path::{Path, PathBuf};

/// A store with a block volume holding two versions; returns (dir, store).
fn store() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("store");
    ok(&s, &["init", "--pack-size", "64KiB"]);
    let img = d.path().join("img");
    let data: Vec<u8> =
        (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    ok(&s, &["import", "disk", img.to_str().unwrap()]);
    ok(&s, &["snapshot", "disk", "--name", "second"]);
    (d, s)
}

fn fsck(s: &Path) -> (i32, serde_json::Value) {
    let out = forkfs(s, &["--json", "fsck"]);
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
    v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_clean_store_has_zero_findings() {
    let (_d, s) = store();
    let (code, v) = fsck(&s);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
    assert!(v["chunks"].as_u64().unwrap() >= 16 && v["packs"].as_u64().unwrap() >= 1, "{v}");
}

#[test]
fn each_kind_of_damage_is_found_and_named() {
    type Break = fn(&Path);
    let cases: [(&str, Break, &str); 4] = [
        (
            "byte flipped in a pack body",
            |s| {
                let p = &packs(s)[0];
                let mut b = std::fs::read(p).unwrap();
                b[100] ^= 0x55;
                std::fs::write(p, b).unwrap();
            },
            "checksum",
        ),
        (
            "pack truncated",
            |s| {
                let p = &packs(s)[0];
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() / 2]).unwrap();
            },
            "pack ",
        ),
        ("pack deleted", |s| std::fs::remove_file(&packs(s)[0]).unwrap(), "pack "),
        (
            "footer byte flipped",
            |s| {
                let p = &packs(s)[0];
                let mut b = std::fs::read(p).unwrap();
                let n = b.len();
                b[n - 60] ^= 1;
                std::fs::write(p, b).unwrap();
            },
            "footer",
        ),
    ];
    for (what, breaks, expect) in cases {
        let (_d, s) = store();
        breaks(&s);
        let (code, v) = fsck(&s);
        assert_eq!(code, 1, "{what}: fsck passed a broken store: {v}");
        let p = problems(&v);
        assert!(p.contains(expect), "{what}: findings do not name the damage:\n{p}");
    }
}
