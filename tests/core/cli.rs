//! The `forkfs` CLI end to end: real binaries on a real store directory.

use crate::common::mount::new_store as store;
use crate::common::{fails, json, ok};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

#[test]
fn bad_input_gets_one_line_errors_and_distinct_exit_codes() {
    let (_d, s) = store();
    assert_eq!(fails(&s, &["init"]).0, 75, "second init conflicts");
    assert_eq!(fails(&s, &["log", "nope"]).0, 66);
    assert_eq!(fails(&s, &["volume", "create", "d", "--block", "--size", "12zz"]).0, 64);
    assert_eq!(fails(&s, &["volume", "create", "d", "--block"]).0, 64, "block volumes need a size");
    assert_eq!(
        fails(&s, &["volume", "create", "d", "--block", "--size", "100000"]).0,
        64,
        "size not a block multiple"
    );
    assert_eq!(fails(&s, &["volume", "create", "../x"]).0, 64);
    ok(&s, &["volume", "create", "d", "--block", "--size", "1M"]);
    assert_eq!(fails(&s, &["volume", "create", "d"]).0, 75);
    assert_eq!(fails(&s, &["diff", "d@~5"]).0, 66);
    assert_eq!(fails(&s, &["diff", "d@zzzz"]).0, 66);
    let missing = s.parent().unwrap().join("missing-store");
    let (code, msg) = fails(&missing, &["volume", "list"]);
    assert_eq!(code, 66);
    assert!(msg.contains("forkfs init"), "{msg}");
    // A failed file-system call exits by its kind, its cause on the line.
    let absent = s.parent().unwrap().join("no-such-dir");
    let (code, msg) = fails(&s, &["import", "v", absent.to_str().unwrap()]);
    assert_eq!(code, 66, "{msg}");
    assert!(msg.contains("cannot read") && msg.contains("No such file"), "{msg}");
    // Nothing above changed the store.
    let vols = json(&s, &["volume", "list"]);
    assert_eq!(vols.as_array().unwrap().len(), 1);
}

#[test]
fn block_image_round_trips_through_versions_forks_and_restore() {
    let (d, s) = store();
    let img = d.path().join("disk.img");
    let mut data = vec![0u8; 3 << 20];
    for (i, b) in data.iter_mut().enumerate().skip(100_000).take(700_000) {
        *b = (i * 7 % 251) as u8;
    }
    std::fs::write(&img, &data).unwrap();
    ok(&s, &["import", "disk", img.to_str().unwrap()]);
    let out = d.path().join("out.img");
    ok(&s, &["export", "disk@~0", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), data);

    // Change a region, snapshot, and diff the two versions.
    data[2_000_000..2_000_010].copy_from_slice(b"0123456789");
    std::fs::write(&img, &data).unwrap();
    ok(&s, &["import", "disk", img.to_str().unwrap()]);
    let d1 = json(&s, &["diff", "disk@~1", "disk@~0"]);
    let ranges = d1["ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 1, "{d1}");
    let (off, len) = (ranges[0]["offset"].as_u64().unwrap(), ranges[0]["len"].as_u64().unwrap());
    assert!(off <= 2_000_000 && off + len >= 2_000_010 && len == 64 << 10, "{d1}");

    // Fork the old version; restore the original to it and undo that.
    ok(&s, &["fork", "disk@~1", "old"]);
    let out2 = d.path().join("old.img");
    ok(&s, &["export", "old", out2.to_str().unwrap()]);
    assert_ne!(std::fs::read(&out2).unwrap(), data);
    let r = json(&s, &["restore", "disk", "~1"]);
    let undo = r["previous_head"].as_str().unwrap().to_string();
    let out3 = d.path().join("restored.img");
    ok(&s, &["export", "disk", out3.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out3).unwrap(), std::fs::read(&out2).unwrap());
    ok(&s, &["restore", "disk", &undo[..10]]);
    ok(&s, &["export", "disk", out3.to_str().unwrap(), "--force"]);
    assert_eq!(std::fs::read(&out3).unwrap(), data);

    let st = json(&s, &["status"]);
    assert_eq!(st["volumes"].as_array().unwrap().len(), 2);
    assert!(st["stored_bytes"].as_u64().unwrap() > 0);
    let l = &st["data_log"];
    assert!(["bytes", "segments", "spare_bytes", "spares"].iter().all(|k| l[k].is_u64()), "{st}");
    assert!(ok(&s, &["status"]).contains("\ndata log "), "status names the data log");
    let log = json(&s, &["log", "disk"]);
    assert!(log.as_array().unwrap().len() >= 4, "{log}");
}

fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("src/deep/er")).unwrap();
    std::fs::write(root.join("README"), "hello\n").unwrap();
    std::fs::write(root.join("empty"), "").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(root.join("src/big.bin"), &big).unwrap();
    std::fs::write(root.join("src/deep/er/mid.txt"), vec![b'x'; 5000]).unwrap();
    std::fs::set_permissions(root.join("README"), std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink("src/big.bin", root.join("link")).unwrap();
}

fn assert_same_tree(a: &Path, b: &Path) {
    let mut ea: Vec<_> = std::fs::read_dir(a).unwrap().map(|e| e.unwrap().file_name()).collect();
    let mut eb: Vec<_> = std::fs::read_dir(b).unwrap().map(|e| e.unwrap().file_name()).collect();
    ea.sort();
    eb.sort();
    assert_eq!(ea, eb, "entries of {} and {}", a.display(), b.display());
    for n in ea {
        let (pa, pb) = (a.join(&n), b.join(&n));
        let (ma, mb) =
            (std::fs::symlink_metadata(&pa).unwrap(), std::fs::symlink_metadata(&pb).unwrap());
        assert_eq!(ma.file_type(), mb.file_type(), "{}", pa.display());
        if ma.is_symlink() {
            assert_eq!(std::fs::read_link(&pa).unwrap(), std::fs::read_link(&pb).unwrap());
        } else if ma.is_dir() {
            assert_same_tree(&pa, &pb);
        } else {
            assert_eq!(
                std::fs::read(&pa).unwrap(),
                std::fs::read(&pb).unwrap(),
                "{}",
                pa.display()
            );
            assert_eq!(ma.permissions().mode() & 0o7777, mb.permissions().mode() & 0o7777);
            assert_eq!(ma.modified().unwrap(), mb.modified().unwrap(), "{}", pa.display());
        }
    }
}

#[test]
fn directory_trees_round_trip_and_versions_are_addressable() {
    let (d, s) = store();
    let src = d.path().join("tree");
    make_tree(&src);
    let v = json(&s, &["import", "ws", src.to_str().unwrap()]);
    let id = v["version"].as_str().unwrap().to_string();
    let out = d.path().join("out");
    ok(&s, &["export", "ws", out.to_str().unwrap()]);
    assert_same_tree(&src, &out);
    ok(&s, &["tag", &format!("ws@{}", &id[..8]), "first"]);
    let out2 = d.path().join("out2");
    ok(&s, &["export", "ws@first", out2.to_str().unwrap()]);
    assert_same_tree(&src, &out2);
    // Diff against an independent import of a changed tree is empty for
    // unchanged content; a fork diffs empty against its source.
    ok(&s, &["fork", "ws@first", "ws2"]);
    let diff = json(&s, &["diff", "ws@first", "ws2"]);
    assert_eq!(diff["paths"].as_array().unwrap().len(), 0, "{diff}");
    assert_eq!(fails(&s, &["tag", "ws@first", "first"]).0, 75);
    ok(&s, &["untag", "ws", "first"]);
    assert_eq!(fails(&s, &["export", "ws@first", d.path().join("x").to_str().unwrap()]).0, 66);
}

#[test]
fn nbd_and_fsck_dispatch_git_style() {
    let (_d, s) = store();
    let help = ok(&s, &["nbd", "--help"]);
    assert!(help.contains("serve"), "{help}");
    let out = ok(&s, &["fsck"]);
    assert!(out.contains("ok"), "{out}");
}

#[test]
fn a_corrupt_store_gets_a_clear_error_not_a_panic() {
    let (d, s) = store();
    let img = d.path().join("disk.img");
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 249) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    ok(&s, &["import", "disk", img.to_str().unwrap()]);
    // Flip one byte in the middle of every pack: reads must fail verification.
    for e in std::fs::read_dir(s.join("objects/packs")).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&p, bytes).unwrap();
    }
    let (code, msg) = fails(&s, &["export", "disk@~0", d.path().join("o.img").to_str().unwrap()]);
    assert_eq!(code, 65, "{msg}");
    assert!(msg.contains("checksum") || msg.contains("decompress"), "{msg}");
    let out = crate::common::forkfs(&s, &["fsck", "--deep"]);
    assert_eq!(out.status.code(), Some(1), "fsck --deep must report the damage");
    // A garbled configuration is reported as corrupt, and nothing is rewritten.
    std::fs::write(s.join("forkfs.json"), b"{not json").unwrap();
    let (code, msg) = fails(&s, &["volume", "list"]);
    assert_eq!(code, 65, "{msg}");
    assert_eq!(std::fs::read(s.join("forkfs.json")).unwrap(), b"{not json");
}

/// A sparse image imports by its data only (holes are not read), into a
/// new volume and over an old one (whose data in the holes goes), and
/// exports byte for byte.
#[test]
fn sparse_images_import_exactly() {
    use std::os::unix::fs::FileExt;
    let (d, s) = store();
    let img = d.path().join("sparse.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap();
    let a: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    f.write_all_at(&a, 3_000).unwrap();
    f.write_all_at(&a, 40 << 20).unwrap();
    f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
    drop(f);
    let full = std::fs::File::open(&img).unwrap().metadata().unwrap();
    assert!(std::os::unix::fs::MetadataExt::blocks(&full) * 512 < 8 << 20, "the image is sparse");
    let want = std::fs::read(&img).unwrap();
    // An old volume with data everywhere: the import must clear the holes.
    let dense = d.path().join("dense.img");
    std::fs::write(&dense, vec![0xAB; 64 << 20]).unwrap();
    ok(&s, &["import", "disk", dense.to_str().unwrap()]);
    for vol in ["fresh", "disk"] {
        ok(&s, &["import", vol, img.to_str().unwrap()]);
        let out = d.path().join(format!("{vol}.out"));
        ok(&s, &["export", vol, out.to_str().unwrap()]);
        assert!(std::fs::read(&out).unwrap() == want, "{vol}: export differs from the image");
    }
}

/// A store held by a process without a control socket (here this test,
/// through the library): a command waits briefly, then fails in one line
/// naming the holder (pid, host, start, command line) and how to stop it.
#[test]
fn a_held_store_names_its_holder() {
    let (_d, s) = store();
    let held = forkfs::Store::open(&s).expect("open the store in this process");
    let (code, err) = fails(&s, &["volume", "list"]);
    let me = std::process::id();
    assert_eq!(code, 75, "{err}");
    assert!(err.contains(&format!("pid {me} on ")), "{err}");
    assert!(err.contains(&format!("`kill {me}`")), "{err}");
    let exe = std::env::args().next().unwrap_or_default();
    assert!(err.contains(&exe), "the holder's command line is not named: {err}");
    drop(held);
    ok(&s, &["volume", "list"]);
}
