//! Maintenance while serving: `forkfs-fsck` check, gc and prune reach the
//! running server through the store's control socket and run inside it,
//! while a client keeps its data.

use crate::common::{Server, ok};
use std::io::{BufRead, BufReader, Write};
use std::process::Command;

fn fsck(srv: &Server, args: &[&str]) -> serde_json::Value {
    // Built by the workspace build that runs before the tests (scripts/test).
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_forkfs-nbd")).with_file_name("forkfs-fsck");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release --workspace --bins`",
        bin.display()
    );
    let out =
        Command::new(bin).arg("--store").arg(&srv.store).arg("--json").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "forkfs-fsck {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn fsck_gc_and_prune_run_inside_the_serving_process() {
    let mut srv = Server::start(&[("disk", 64 << 20)]);
    srv.stop();
    srv.spawn(&["--checkpoint-every", "200ms"]);
    let uri = srv.uri("disk");
    ok("qemu-io", &["-f", "raw", "-c", "write -P 0xaa 0 16M", "-c", "flush", &uri]);
    ok("qemu-io", &["-f", "raw", "-c", "write -P 0xbb 4M 4M", "-c", "flush", &uri]);

    // The timer makes versions in the background.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let check = loop {
        let c = fsck(&srv, &["check"]);
        if c["versions"].as_u64().unwrap() >= 1 || std::time::Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(check["ok"], true, "{check}");
    assert!(check["versions"].as_u64().unwrap() >= 1, "no version after writes: {check}");
    let gc = fsck(&srv, &["gc", "--grace", "0s"]);
    // 0xaa and 0xbb blocks: one chunk each, deduplicated.
    assert!((1..=2).contains(&gc["live_data_chunks"].as_u64().unwrap()), "{gc}");
    assert!(gc["versions"].as_u64() >= check["versions"].as_u64(), "{gc}");
    let pruned = fsck(&srv, &["prune", "disk", "--dry-run"]);
    assert!(pruned["pruned"].is_array(), "{pruned}");

    // The served data is intact, and the server still takes writes.
    ok("qemu-io", &["-f", "raw", "-c", "read -P 0xaa 0 4M", "-c", "read -P 0xbb 4M 4M", &uri]);
    ok("qemu-io", &["-f", "raw", "-c", "write -P 0xcc 8M 1M", "-c", "read -P 0xcc 8M 1M", &uri]);

    // A malformed control request gets an error reply; the server lives on.
    let mut s = std::os::unix::net::UnixStream::connect(srv.store.join("control.sock")).unwrap();
    s.write_all(b"{\"op\":\"format-everything\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert!(line.contains("bad control request"), "{line}");
    ok("qemu-io", &["-f", "raw", "-c", "read -P 0xaa 0 4M", &uri]);

    assert!(srv.stop().success(), "{}", srv.log());
    assert!(!srv.store.join("control.sock").exists(), "the socket outlived the server");
    // With the server gone, the same commands run on the store directly.
    let check = fsck(&srv, &["check", "--deep"]);
    assert_eq!(check["ok"], true, "{check}");
}
