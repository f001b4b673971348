//! The full kernel stack: nbdfuse exposes the export as a file, losetup
//! makes it a block device, kernel btrfs runs on it. Files written and
//! synced must survive unmount, server restart (SIGTERM), and be intact in
//! both the live export and a read-only export of a version, per
//! `btrfs check --readonly`.

use crate::common::attach::Attached;
use crate::common::{Server, need, ok, run};
use std::path::Path;

fn files(root: &Path) -> Vec<(String, blake3::Hash)> {
    let mut out = Vec::new();
    for i in 0..20 {
        let p = root.join(format!("f{i}"));
        out.push((format!("f{i}"), blake3::hash(&std::fs::read(p).unwrap())));
    }
    out
}

#[test]
fn btrfs_over_nbdfuse_survives_restart_and_snapshots() {
    need("mkfs.btrfs");
    let mut srv = Server::start(&[("vm", 1 << 40)]);
    let mnt = srv.path("mnt");
    let written = {
        let mut a = Attached::new(&srv, "vm", "a", false);
        // mkfs discards the whole 1 TiB device: metadata only.
        ok("mkfs.btrfs", &["-f", "-q", &a.loopdev]);
        a.mount(&mnt, "rw").unwrap();
        for i in 0..20u64 {
            let len = 1000 + i as usize * 50_000;
            let data: Vec<u8> = (0..len).map(|j| (j as u64 * 31 + i) as u8).collect();
            std::fs::write(mnt.join(format!("f{i}")), data).unwrap();
        }
        std::fs::create_dir(mnt.join("dir")).unwrap();
        std::fs::write(mnt.join("dir/x"), b"inner").unwrap();
        ok("sync", &[]);
        let w = files(&mnt);
        a.unmount().unwrap();
        w
    };
    assert!(srv.stop().success(), "graceful shutdown failed: {}", srv.log());

    // The shutdown persisted the head as a version; name it.
    {
        let s = forkfs::Store::open(&srv.store).unwrap();
        let log = s.graph().log(&s.volumes().get("vm").unwrap()).unwrap();
        let last = log.last().expect("shutdown left a version");
        s.graph().tag(last, "after-mkfs").unwrap();
    }
    srv.spawn(&[]);
    {
        let live = Attached::new(&srv, "vm", "b", false);
        let out = run("btrfs", &["check", "--readonly", &live.loopdev]);
        assert!(
            out.status.success(),
            "btrfs check (live): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut snap = Attached::new(&srv, "vm@after-mkfs", "c", true);
        let out = run("btrfs", &["check", "--readonly", &snap.loopdev]);
        assert!(
            out.status.success(),
            "btrfs check (version): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        drop(live);
        let smnt = srv.path("smnt");
        snap.mount(&smnt, "ro,norecovery").unwrap();
        assert_eq!(files(&smnt), written);
        assert_eq!(std::fs::read(smnt.join("dir/x")).unwrap(), b"inner");
        snap.unmount().unwrap();
    }
    assert!(srv.stop().success());
}
