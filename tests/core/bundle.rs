//! History bundles end to end: `forkfs bundle create | import | verify`
//! between two stores that share nothing, with real binaries.

use crate::common::mount::new_store as store;
use crate::common::{fails, json, ok, random};
use forkfs::fs::{FileKind, ROOT_INO};
use forkfs::{SnapshotOptions, Store};
use std::path::{Path, PathBuf};

const MIB: usize = 1 << 20;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A 4 MiB disk image: random data with a hole in the middle.
fn image(seed: u64) -> Vec<u8> {
    let mut d = random(4 * MIB, seed);
    d[MIB..2 * MIB].fill(0);
    d
}

/// Store `s` gets block volume `disk` with versions `one`, `two` and a
/// third (unnamed); returns the three images.
fn three_versions(s: &Path, dir: &Path) -> Vec<Vec<u8>> {
    let img = dir.join("disk.img");
    let mut states = vec![image(1)];
    std::fs::write(&img, &states[0]).unwrap();
    ok(s, &["import", "disk", p(&img)]);
    ok(s, &["tag", "disk@~0", "one"]);
    for (i, at) in [(2u64, 3 * MIB + 4096), (3, 100)] {
        let mut next = states.last().unwrap().clone();
        next[at..at + 70_000].copy_from_slice(&random(70_000, i));
        std::fs::write(&img, &next).unwrap();
        ok(s, &["import", "disk", p(&img)]);
        states.push(next);
    }
    ok(s, &["tag", "disk@~1", "two"]);
    states
}

fn export(s: &Path, spec: &str, dir: &Path) -> Vec<u8> {
    let out = dir.join(format!("{}.img", spec.replace(['@', '~'], "_")));
    ok(s, &["export", "--force", spec, p(&out)]);
    std::fs::read(&out).unwrap()
}

fn volumes(s: &Path) -> usize {
    json(s, &["volume", "list"]).as_array().unwrap().len()
}

#[test]
fn block_history_moves_whole_then_incrementally_and_reads_back_exactly() {
    let (a_dir, a) = store();
    let (b_dir, b) = store();
    let states = three_versions(&a, a_dir.path());
    let full = a_dir.path().join("full.bundle");
    let inc = a_dir.path().join("inc.bundle");
    let made = json(&a, &["bundle", "create", p(&full), "disk@two"]);
    assert_eq!(made["versions"].as_array().unwrap().len(), 2, "{made}");
    let made_inc = json(&a, &["bundle", "create", p(&inc), "disk@two.."]);
    assert_eq!(made_inc["versions"].as_array().unwrap().len(), 1, "{made_inc}");
    // Only what changed after `two` travels: 70,000 bytes touch two 64 KiB blocks.
    let data = made_inc["plain_bytes"].as_u64().unwrap();
    assert!(data < 200_000 + 64 * 1024, "incremental bundle carries {data} bytes: {made_inc}");
    assert!(!a_dir.path().join("inc.bundle.partial").exists());

    let got = json(&b, &["bundle", "import", p(&full)]);
    assert_eq!(got["created"], true, "{got}");
    assert_eq!(got["head_moved"], true, "{got}");
    assert_eq!(export(&b, "disk@one", b_dir.path()), states[0]);
    assert_eq!(export(&b, "disk@two", b_dir.path()), states[1]);
    assert_eq!(
        export(&b, "disk", b_dir.path()),
        states[1],
        "the head stands at the newest version"
    );
    let got = json(&b, &["bundle", "import", p(&inc)]);
    assert_eq!(got["versions"].as_array().unwrap().len(), 1, "{got}");
    assert_eq!(got["head_moved"], true, "{got}");
    assert_eq!(export(&b, "disk", b_dir.path()), states[2]);
    assert_eq!(export(&b, "disk@~2", b_dir.path()), states[0]);

    // Importing again adds nothing; the whole history again neither.
    for f in [&inc, &full] {
        let again = json(&b, &["bundle", "import", p(f)]);
        assert_eq!(again["versions"].as_array().unwrap().len(), 0, "{again}");
        assert_eq!(again["new_chunks"], 0, "{again}");
    }
    assert_eq!(json(&b, &["log", "disk"]).as_array().unwrap().len(), 3);
    assert!(ok(&b, &["fsck"]).contains("ok"));
}

#[test]
fn a_bundle_whose_base_is_missing_names_it_and_imports_nothing() {
    let (a_dir, a) = store();
    let (_b_dir, b) = store();
    three_versions(&a, a_dir.path());
    let inc = a_dir.path().join("inc.bundle");
    ok(&a, &["bundle", "create", p(&inc), "disk@two.."]);
    let (code, msg) = fails(&b, &["bundle", "import", p(&inc)]);
    assert_eq!(code, 66, "{msg}");
    assert!(
        msg.contains("(named two)") && msg.contains("import the bundle that carries it"),
        "{msg}"
    );
    assert_eq!(volumes(&b), 0);
    // Nor into a volume of that name without it.
    ok(&b, &["volume", "create", "disk", "--block", "--size", "4M"]);
    let (code, msg) = fails(&b, &["bundle", "import", p(&inc)]);
    assert_eq!(code, 66, "{msg}");
    assert!(json(&b, &["log", "disk"]).as_array().unwrap().is_empty());
    // A whole history into a volume of the same name with a history of
    // its own: refused.
    let full = a_dir.path().join("full.bundle");
    ok(&a, &["bundle", "create", p(&full), "disk"]);
    let img = a_dir.path().join("other.img");
    std::fs::write(&img, random(4 * MIB, 7)).unwrap();
    ok(&b, &["import", "disk", p(&img)]);
    let (code, msg) = fails(&b, &["bundle", "import", p(&full)]);
    assert_eq!(code, 75, "{msg}");
    assert!(msg.contains("--as"), "{msg}");
    let got = json(&b, &["bundle", "import", p(&full), "--as", "disk2"]);
    assert_eq!(got["volume"], "disk2", "{got}");
    let (code, msg) = fails(&a, &["bundle", "create", p(&full), "disk@~0..~1"]);
    assert_eq!(code, 64, "{msg}");
}

/// Every cut and every flipped byte is caught by `verify` and by `import`,
/// which then adds no volume, version or name.
#[test]
fn truncated_or_altered_bundles_import_nothing() {
    let (a_dir, a) = store();
    three_versions(&a, a_dir.path());
    let good = a_dir.path().join("good.bundle");
    ok(&a, &["bundle", "create", p(&good), "disk"]);
    let bytes = std::fs::read(&good).unwrap();
    ok(&a, &["bundle", "verify", p(&good)]);
    let len = bytes.len();
    let name_at = find(&bytes, b"\"name\":\"two\"") + 9;
    let version_at = find(&bytes, b"\"seq\":0") + 6;
    let mut damaged: Vec<(String, Vec<u8>)> = [0, 7, 8, 12, len / 3, len / 2, len - 33, len - 1]
        .into_iter()
        .map(|cut| (format!("cut at {cut} of {len}"), bytes[..cut].to_vec()))
        .collect();
    for (what, at) in [
        ("the header", 20),
        ("a version record", version_at),
        ("a version's name", name_at),
        ("a chunk", len / 2),
        ("the end checksum", len - 3),
    ] {
        let mut b = bytes.clone();
        b[at] ^= 0x01;
        damaged.push((format!("a flipped bit in {what}"), b));
    }
    let mut longer = bytes.clone();
    longer.push(0);
    damaged.push(("a byte after the end".into(), longer));
    let (b_dir, b) = store();
    for (what, data) in damaged {
        let f = b_dir.path().join("bad.bundle");
        std::fs::write(&f, &data).unwrap();
        let (_, msg) = fails(&b, &["bundle", "verify", p(&f)]);
        assert!(
            ["truncated", "damaged", "not a forkfs bundle"].iter().any(|w| msg.contains(w)),
            "{what}: {msg}"
        );
        let (_, msg2) = fails(&b, &["bundle", "import", p(&f)]);
        assert_eq!(msg2.replace("import", "verify"), msg.replace("import", "verify"), "{what}");
        assert_eq!(volumes(&b), 0, "{what}: the store changed");
    }
    assert!(ok(&b, &["fsck"]).contains("ok"));
    // The intact bundle still imports.
    ok(&b, &["bundle", "import", p(&good)]);
    assert_eq!(json(&b, &["log", "disk"]).as_array().unwrap().len(), 3);
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("the bundle holds it")
}

#[test]
fn a_pipe_carries_a_bundle_between_stores() {
    let (a_dir, a) = store();
    let (b_dir, b) = store();
    let states = three_versions(&a, a_dir.path());
    let first = a_dir.path().join("first.bundle");
    ok(&a, &["bundle", "create", p(&first), "disk@one"]);
    ok(&b, &["bundle", "import", p(&first)]);
    let create = ["bundle", "create", "-", "disk@one.."];
    let (created, out) = crate::common::piped(&a, &create, &b, &["bundle", "import", "-"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let report = String::from_utf8_lossy(&created.stderr);
    assert!(report.contains("bundled 2 versions"), "the report goes to stderr: {report}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(export(&b, "disk", b_dir.path()), states[2]);
    assert_eq!(export(&b, "disk@two", b_dir.path()), states[1]);
}

#[test]
fn a_head_with_changes_of_its_own_keeps_them() {
    let (a_dir, a) = store();
    let (b_dir, b) = store();
    let states = three_versions(&a, a_dir.path());
    let (full, inc) = (a_dir.path().join("full.bundle"), a_dir.path().join("inc.bundle"));
    ok(&a, &["bundle", "create", p(&full), "disk@two"]);
    ok(&a, &["bundle", "create", p(&inc), "disk@two.."]);
    ok(&b, &["bundle", "import", p(&full)]);
    let mine = random(4 * MIB, 99);
    let img = b_dir.path().join("mine.img");
    std::fs::write(&img, &mine).unwrap();
    ok(&b, &["import", "disk", p(&img), "--no-snapshot"]);
    let out = ok(&b, &["bundle", "import", p(&inc)]);
    assert!(out.contains("stayed") && out.contains("forkfs restore disk"), "{out}");
    assert_eq!(export(&b, "disk", b_dir.path()), mine, "the head's own writes stay");
    assert_eq!(export(&b, "disk@~0", b_dir.path()), states[2], "the imported version is there");
}

/// Files, directories, links and modes of an fs volume, through the library.
#[test]
fn fs_history_round_trips() {
    let (a_dir, a) = store();
    let (b_dir, b) = store();
    {
        let store = Store::open(&a).unwrap();
        store.volumes().create("ws", forkfs::VolumeKind::Fs, None, None).unwrap();
        let h = store.volumes().open_fs("ws").unwrap();
        let dir = h.create(ROOT_INO, b"src", FileKind::Dir, 0o750, (0, 0), None).unwrap();
        let f = h.create(dir.ino, b"big", FileKind::File, 0o600, (0, 0), None).unwrap();
        h.write_file(f.ino, 0, &random(300_000, 5)).unwrap();
        let small = h.create(ROOT_INO, b"small", FileKind::File, 0o644, (0, 0), None).unwrap();
        h.write_file(small.ino, 0, b"hello").unwrap();
        let named = SnapshotOptions { name: Some("first".into()), ..Default::default() };
        store.graph().snapshot("ws", &named).unwrap();
        h.write_file(f.ino, 100_000, &random(1000, 6)).unwrap();
        h.unlink(ROOT_INO, b"small", &forkfs::fs::never_open).unwrap();
        store.graph().snapshot("ws", &SnapshotOptions::default()).unwrap();
    }
    let f = a_dir.path().join("ws.bundle");
    ok(&a, &["bundle", "create", p(&f), "ws"]);
    ok(&b, &["bundle", "import", p(&f)]);
    for spec in ["ws", "ws@first"] {
        let (x, y) = (a_dir.path().join(spec), b_dir.path().join(spec));
        ok(&a, &["export", spec, p(&x)]);
        ok(&b, &["export", spec, p(&y)]);
        assert_eq!(tree(&x), tree(&y), "{spec}");
    }
    assert!(tree(&b_dir.path().join("ws@first")).iter().any(|(n, ..)| n == "small"));
}

/// (path, mode, content) of every entry under `root`.
fn tree(root: &Path) -> Vec<(String, u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let content = if meta.is_dir() {
                stack.push(e.path());
                Vec::new()
            } else {
                std::fs::read(e.path()).unwrap()
            };
            out.push((rel, meta.permissions().mode(), content));
        }
    }
    out.sort();
    out
}

/// A btrfs-mode disk's writes that no safe point sealed belong to the
/// tree in place: an import does not move such a head under them.
#[test]
fn a_head_with_unsealed_writes_is_not_moved() {
    let dir = tempfile::tempdir().unwrap();
    let a = Store::init(&dir.path().join("a"), forkfs::StoreConfig::default()).unwrap();
    let b = Store::init(&dir.path().join("b"), forkfs::StoreConfig::default()).unwrap();
    a.volumes().create("disk", forkfs::VolumeKind::Block, Some(4 << 20), None).unwrap();
    let h = a.volumes().open_block("disk").unwrap();
    h.write_at(0, &random(65536, 1)).unwrap();
    a.graph().snapshot("disk", &SnapshotOptions::default()).unwrap();
    let mut whole = Vec::new();
    a.bundle_create("disk", &mut whole, &forkfs::Quiet).unwrap();
    h.write_at(65536, &random(65536, 2)).unwrap();
    a.graph().snapshot("disk", &SnapshotOptions::default()).unwrap();
    let mut inc = Vec::new();
    a.bundle_create("disk@~1..", &mut inc, &forkfs::Quiet).unwrap();
    b.bundle_import(&mut &whole[..], None, &forkfs::Quiet).unwrap();
    b.volumes().set_consistency("disk", forkfs::Consistency::Btrfs).unwrap();
    let hb = b.volumes().open_block("disk").unwrap();
    let mine = random(65536, 3);
    hb.write_at(3 << 20, &mine).unwrap();
    let r = b.bundle_import(&mut &inc[..], None, &forkfs::Quiet).unwrap();
    assert_eq!(r.versions.len(), 1);
    assert!(!r.head_moved, "the head moved under unsealed writes");
    let mut got = vec![0u8; 65536];
    hb.read_at(3 << 20, &mut got).unwrap();
    assert_eq!(got, mine);
}
