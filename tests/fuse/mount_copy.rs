//! copy_file_range(2) inside a mount: whole blocks of a stored file are
//! shared with the copy (metadata only, nothing logged), the rest copied
//! as bytes. The copies read back exact through every path (aligned,
//! unaligned, differently aligned, data not yet stored, from a version),
//! and versions, restores, a SIGKILL and fsck keep them exact.

use crate::common::mount::{Mounted, diff, new_store};
use crate::common::{ok, random};
use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

const MIB: usize = 1 << 20;

/// Bytes in the store's data log segments (what writes append to).
fn log_bytes(store: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.map(|e| e.unwrap())
                .map(|e| {
                    let md = e.metadata().unwrap();
                    if md.is_dir() { walk(&e.path()) } else { md.len() }
                })
                .sum()
        })
    }
    walk(&store.join("log"))
}

/// copy_file_range until `len` bytes are copied or the source ends.
fn copy(src: &File, src_off: u64, dst: &File, dst_off: u64, len: usize) -> usize {
    let (mut from, mut to) = (src_off as i64, dst_off as i64);
    let mut done = 0;
    while done < len {
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut from,
                dst.as_raw_fd(),
                &mut to,
                len - done,
                0,
            )
        };
        assert!(n >= 0, "copy_file_range: {}", std::io::Error::last_os_error());
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    done
}

fn open_rw(p: &Path) -> File {
    std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).unwrap()
}

#[test]
fn copy_file_range_shares_stored_blocks_and_stays_exact() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "cp", &["--checkpoint-every", "0"]);
    let data = random(32 * MIB + 12_345, 9);
    std::fs::write(m.path("src"), &data).unwrap();
    ok(&store, &["snapshot", "cp", "--name", "stored"]);
    let src = File::open(m.path("src")).unwrap();

    // The whole file: 512 blocks shared, the 12,345-byte tail copied.
    let logged = log_bytes(&store);
    let dst = open_rw(&m.path("whole"));
    assert_eq!(copy(&src, 0, &dst, 0, data.len() + 99), data.len(), "stops at the source's end");
    dst.sync_all().unwrap();
    let grew = log_bytes(&store) - logged;
    assert!(grew < MIB as u64, "a copy of 32 MiB logged {grew} bytes: its blocks were not shared");
    assert!(std::fs::read(m.path("whole")).unwrap() == data, "the shared copy differs");

    // Equally aligned, not on a block: bytes to the boundary, then shared.
    let part = open_rw(&m.path("part"));
    assert_eq!(copy(&src, 100, &part, 100, 5 * MIB), 5 * MIB);
    let mut want = vec![0u8; 100];
    want.extend_from_slice(&data[100..100 + 5 * MIB]);
    assert!(std::fs::read(m.path("part")).unwrap() == want, "the unaligned copy differs");

    // Differently aligned: all bytes, still exact.
    let skew = open_rw(&m.path("skew"));
    assert_eq!(copy(&src, 1, &skew, 0, 3 * MIB), 3 * MIB);
    assert!(std::fs::read(m.path("skew")).unwrap() == data[1..1 + 3 * MIB], "skewed copy");

    // Into the middle of a small (inline) file, past its end.
    std::fs::write(m.path("small"), b"small file").unwrap();
    let small = open_rw(&m.path("small"));
    assert_eq!(copy(&src, 0, &small, 128 << 10, 2 * MIB), 2 * MIB);
    let mut want = b"small file".to_vec();
    want.resize(128 << 10, 0);
    want.extend_from_slice(&data[..2 * MIB]);
    assert!(std::fs::read(m.path("small")).unwrap() == want, "copy into an inline file");

    // Data written since the last version (not yet stored as chunks).
    let fresh = random(4 * MIB, 10);
    std::fs::write(m.path("fresh"), &fresh).unwrap();
    let f = File::open(m.path("fresh")).unwrap();
    let out = open_rw(&m.path("fresh-copy"));
    assert_eq!(copy(&f, 0, &out, 0, fresh.len()), fresh.len());
    // ... and then overwritten: the copy keeps what it copied.
    std::fs::write(m.path("fresh"), random(4 * MIB, 11)).unwrap();
    assert!(std::fs::read(m.path("fresh-copy")).unwrap() == fresh, "copy of unstored data");

    // From a version under .forkfs: bytes, exact.
    let old = File::open(m.path(".forkfs/versions/stored/src")).unwrap();
    let from_version = open_rw(&m.path("from-version"));
    assert_eq!(copy(&old, 0, &from_version, 0, MIB), MIB);
    assert!(std::fs::read(m.path("from-version")).unwrap() == data[..MIB], "from a version");

    // Onto itself: refused as on ext4.
    let mut a = 0i64;
    let mut b = 4096i64;
    let r = unsafe {
        libc::copy_file_range(dst.as_raw_fd(), &mut a, dst.as_raw_fd(), &mut b, 1 << 20, 0)
    };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EINVAL)));

    // Versions and restores keep the copies exact.
    drop((src, dst, part, skew, small, f, out, old, from_version));
    ok(&store, &["snapshot", "cp", "--name", "copied"]);
    let added: BTreeSet<String> =
        diff(&store, "cp@stored", "cp@copied").into_iter().map(|(_, p, _)| p).collect();
    for name in ["whole", "part", "skew", "fresh-copy", "from-version"] {
        assert!(added.iter().any(|p| p.trim_start_matches('/') == name), "{name} in {added:?}");
    }
    std::fs::write(m.path("src"), b"changed").unwrap();
    ok(&store, &["restore", "cp", "stored"]);
    assert!(!m.path("whole").exists());
    ok(&store, &["restore", "cp", "copied"]);
    assert!(std::fs::read(m.path("whole")).unwrap() == data, "whole after restores");
    assert!(std::fs::read(m.path("src")).unwrap() == data, "src after restores");

    // A copy made durable survives SIGKILL of the mount.
    let again = open_rw(&m.path("again"));
    let src = File::open(m.path("src")).unwrap();
    assert_eq!(copy(&src, 0, &again, 0, data.len()), data.len());
    again.sync_all().unwrap();
    drop((src, again));
    m.kill();
    drop(m);
    let m = Mounted::new(&store, "cp", &[]);
    assert!(std::fs::read(m.path("again")).unwrap() == data, "the copy after SIGKILL");
    ok(&store, &["snapshot", "cp", "--name", "after-crash"]);
    m.unmount();
    let fsck = crate::common::forkfs(&store, &["fsck"]);
    assert!(fsck.status.success(), "fsck: {}", String::from_utf8_lossy(&fsck.stdout));
}
