//! forkfs-nbd against real clients: nbdinfo, nbdcopy, qemu-img, qemu-io, nbdsh.

use crate::common::{Server, nbdsh, ok, run, write_random};

const MIB: u64 = 1 << 20;

#[test]
fn nbdinfo_lists_exports_and_flags_match_the_implementation() {
    let srv = Server::start(&[("disk", 64 * MIB), ("other", 16 * MIB)]);
    let list = ok("nbdinfo", &["--list", &srv.uri("")]);
    assert!(list.contains("export=\"disk\"") && list.contains("export=\"other\""), "{list}");
    let uri = srv.uri("disk");
    for can in [
        "flush",
        "fua",
        "trim",
        "zero",
        "fast-zero",
        "cache",
        "multi-conn",
        "df",
        "structured-reply",
    ] {
        let out = run("nbdinfo", &["--can", can, &uri]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "live export should advertise {can}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(run("nbdinfo", &["--is", "read-only", &uri]).status.code(), Some(2));
    assert_eq!(run("nbdinfo", &["--can", "write", &uri]).status.code(), Some(0));
    let info: serde_json::Value = serde_json::from_str(&ok("nbdinfo", &["--json", &uri])).unwrap();
    let ctx = &info["exports"][0]["contexts"];
    assert!(ctx.as_array().unwrap().iter().any(|c| c == "base:allocation"), "{info}");
    assert_eq!(info["exports"][0]["block_size_preferred"], 65536, "{info}");
    // Allocation map: written ranges are data, the rest holes.
    nbdsh(
        &uri,
        "h.pwrite(b'\\x01' * (128*1024), 1024*1024)\nh.pwrite(b'\\x02' * 4096, 8*1024*1024)\nh.flush()",
    );
    let map = ok("nbdinfo", &["--map", "--json", &uri]);
    let m: serde_json::Value = serde_json::from_str(&map).unwrap();
    let data: Vec<(u64, u64)> = m
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == 0)
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(data, vec![(MIB, 128 * 1024), (8 * MIB, 64 * 1024)], "{map}");
}

#[test]
fn read_only_version_exports_refuse_writes() {
    let mut srv = Server::start(&[("disk", 16 * MIB)]);
    nbdsh(&srv.uri("disk"), "h.pwrite(b'v1' * 2048, 0)\nh.flush()");
    assert!(srv.stop().success(), "{}", srv.log());
    let v = {
        let s = forkfs::Store::open(&srv.store).unwrap();
        s.graph()
            .snapshot(
                "disk",
                &forkfs::SnapshotOptions { name: Some("snap".into()), ..Default::default() },
            )
            .unwrap()
    };
    srv.spawn(&[]);
    nbdsh(&srv.uri("disk"), "h.pwrite(b'v2' * 2048, 0)\nh.flush()");
    for name in ["disk@snap", &format!("disk@{}", &v.id.to_string()[..8])] {
        let uri = srv.uri(name);
        assert_eq!(run("nbdinfo", &["--is", "read-only", &uri]).status.code(), Some(0));
        assert_eq!(run("nbdinfo", &["--can", "trim", &uri]).status.code(), Some(2));
        assert_eq!(run("nbdinfo", &["--can", "write", &uri]).status.code(), Some(2));
        let out = nbdsh(
            &uri,
            "assert h.pread(4, 0) == b'v1v1'\nh.set_strict_mode(0)\ntry:\n    h.pwrite(b'x', 0)\n    print('wrote')\nexcept nbd.Error as e:\n    print(e.errno)",
        );
        assert_eq!(out.trim(), "EPERM");
    }
}

#[test]
fn nbdcopy_round_trips_a_gibibyte_and_qemu_img_agrees() {
    let srv = Server::start(&[("disk", 1024 * MIB)]);
    let src = srv.path("src.img");
    let data = write_random(&src, 1024 * MIB as usize, 7);
    ok("nbdcopy", &[src.to_str().unwrap(), &srv.uri("disk")]);
    let out = srv.path("out.img");
    ok("nbdcopy", &[&srv.uri("disk"), out.to_str().unwrap()]);
    assert!(
        blake3::hash(&data) == blake3::hash(&std::fs::read(&out).unwrap()),
        "nbdcopy out differs"
    );
    ok("qemu-img", &["compare", "-f", "raw", "-F", "raw", src.to_str().unwrap(), &srv.uri("disk")]);
}

#[test]
fn qemu_io_patterns_read_back() {
    let srv = Server::start(&[("disk", 64 * MIB)]);
    let uri = srv.uri("disk");
    let cmds = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -P 0xcd 100k 3k",
        "read -P 0xab 0 100k",
        "read -P 0xcd 100k 3k",
        "read -P 0xab 103k 921k",
        "discard 64k 128k",
        "read -P 0 64k 128k",
        "read -P 0xab 0 64k",
        "write -z 512k 256k",
        "read -P 0 512k 256k",
        "write -P 0x11 63M 1M",
        "read -P 0x11 63M 1M",
        "write -z 0 64M",
        "read -P 0 0 64M",
    ];
    let mut args = vec!["-f", "raw"];
    for c in &cmds {
        args.push("-c");
        args.push(c);
    }
    args.push(&uri);
    let out = ok("qemu-io", &args);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.to_lowercase().contains("error"), "{out}");
}

#[test]
fn changed_since_context_reports_exactly_the_blocks_written_after_a_version() {
    let mut srv = Server::start(&[("disk", 64 * MIB)]);
    nbdsh(&srv.uri("disk"), "h.pwrite(b'a' * (4 << 20), 0)\nh.flush()");
    assert!(srv.stop().success());
    {
        let s = forkfs::Store::open(&srv.store).unwrap();
        s.graph()
            .snapshot(
                "disk",
                &forkfs::SnapshotOptions { name: Some("base".into()), ..Default::default() },
            )
            .unwrap();
    }
    srv.spawn(&[]);
    let script = r#"
h.pwrite(b'b' * 65536, 10 * 65536)
h.pwrite(b'c' * 100, 40 * 1024 * 1024)
h.flush()
h2 = nbd.NBD()
h2.add_meta_context("forkfs:changed-since:base")
h2.connect_uri(h.get_uri())
assert h2.can_meta_context("forkfs:changed-since:base")
runs = []
def cb(ctx, offset, e, err):
    pos = offset
    for i in range(0, len(e), 2):
        if e[i + 1] & 1:
            runs.append((pos, e[i]))
        pos += e[i]
h2.block_status(h2.get_size(), 0, cb)
print(runs)
"#;
    let out = nbdsh(&srv.uri("disk"), script);
    assert_eq!(
        out.trim(),
        format!("[({}, 65536), ({}, 65536)]", 10 * 65536, 40 * MIB),
        "{}",
        srv.log()
    );
}

#[test]
fn tcp_listener_serves_and_a_second_server_on_the_store_is_refused() {
    let mut srv = Server::start(&[("disk", 16 * MIB)]);
    // A second server (or any process) cannot take the store for writing.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forkfs-nbd"))
        .arg("--store")
        .arg(&srv.store)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("in use by another forkfs process"), "{err}");
    assert!(srv.stop().success());
    // TCP, on a port the kernel picks; the server logs it.
    srv.spawn(&["--listen", "127.0.0.1:0"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let addr = loop {
        let log = srv.log();
        if let Some(l) = log.lines().find(|l| l.contains("listening (tcp)")) {
            break l.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no tcp listener: {log}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let size = ok("nbdinfo", &["--size", &format!("nbd://{addr}/disk")]);
    assert_eq!(size.trim(), (16 * MIB).to_string());
    assert!(srv.stop().success());
}
