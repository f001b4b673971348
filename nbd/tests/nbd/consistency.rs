//! `--consistency btrfs` through a real server and nbdsh: writes persist
//! only at safe points (a valid btrfs primary superblock made durable by a
//! FLUSH); a connection that ends without NBD_CMD_DISC rolls its client's
//! writes back to the last one, leaves a record, and fails the connections
//! of clients that shared those writes (see also `consistency_clients.rs`,
//! for clients that shared nothing). The
//! superblocks are real: mkfs.btrfs writes one into an image, the test
//! makes later generations of it with a correct crc32c.

use crate::common::{Server, nbdsh, need, ok};
use std::path::{Path, PathBuf};

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const SUPER: u64 = 65536;
const X_AT: u64 = 200 * MIB;

pub(crate) fn forkfs_bin() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_forkfs-nbd")).with_file_name("forkfs")
}

pub(crate) fn forkfs(srv: &Server, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(forkfs_bin())
        .arg("--store")
        .arg(&srv.store)
        .arg("--json")
        .args(args)
        .output()
        .expect("run forkfs");
    assert!(out.status.success(), "forkfs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The primary superblock of a fresh 256 MiB btrfs image.
pub(crate) fn real_super(dir: &Path) -> (PathBuf, Vec<u8>) {
    need("mkfs.btrfs");
    let img = dir.join("btrfs.img");
    std::fs::File::create(&img).unwrap().set_len(256 * MIB).unwrap();
    ok("mkfs.btrfs", &["-q", "-f", img.to_str().unwrap()]);
    let all = std::fs::read(&img).unwrap();
    (img, all[SUPER as usize..SUPER as usize + 4096].to_vec())
}

/// `sb` with another generation, checksum recomputed (crc32c of 32..4096).
pub(crate) fn with_generation(sb: &[u8], generation: u64) -> Vec<u8> {
    let mut s = sb.to_vec();
    s[72..80].copy_from_slice(&generation.to_le_bytes());
    let c = crc32c::crc32c(&s[32..]);
    s[..32].fill(0);
    s[..4].copy_from_slice(&c.to_le_bytes());
    s
}

fn generation(sb: &[u8]) -> u64 {
    u64::from_le_bytes(sb[72..80].try_into().unwrap())
}

/// Runs `body` in nbdsh with `data` readable as the Python bytes `data`.
fn with_data(srv: &Server, tag: &str, data: &[u8], body: &str) -> String {
    let f = srv.path(tag);
    std::fs::write(&f, data).unwrap();
    let script = format!("data = open({:?}, 'rb').read()\n{body}", f.display().to_string());
    nbdsh(&srv.uri("vm"), &script)
}

/// Python that drops the connection without NBD_CMD_DISC.
const CUT: &str = "import os, sys\nsys.stdout.flush()\nos._exit(0)";

pub(crate) fn read_at(srv: &Server, off: u64, len: u64) -> Vec<u8> {
    let hexed = nbdsh(&srv.uri("vm"), &format!("print(h.pread({len}, {off}).hex())"));
    (0..len as usize).map(|i| u8::from_str_radix(&hexed[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// Waits until the server has noticed a cut connection and rolled back
/// (`n` rollbacks in all): a read before that would still see the cut
/// client's pending writes, so reads wait for it.
pub(crate) fn wait_rollbacks(srv: &Server, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while rollbacks(srv).len() < n {
        assert!(std::time::Instant::now() < deadline, "no rollback recorded: {}", srv.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Rollback events of `forkfs log`, newest first.
pub(crate) fn rollbacks(srv: &Server) -> Vec<serde_json::Value> {
    let log = forkfs(srv, &["log", "vm"]);
    log.as_array().unwrap().iter().filter(|e| e["event"] == "rollback").cloned().collect()
}

#[test]
fn btrfs_mode_persists_only_at_safe_points_and_rolls_back_lost_connections() {
    let mut srv = Server::start(&[("vm", 512 * MIB)]);
    // Switched through the running server's control socket.
    let rec = forkfs(&srv, &["volume", "consistency", "vm", "btrfs"]);
    assert_eq!(rec["consistency"], "btrfs", "{rec}");
    let (img, sb) = real_super(srv.dir.path());
    let g = generation(&sb);
    // The image goes in with nbdcopy --flush: the first
    // valid superblock made durable is a safe point.
    ok("nbdcopy", &["--flush", img.to_str().unwrap(), &srv.uri("vm")]);
    assert_eq!(generation(&read_at(&srv, SUPER, 4096)), g);

    // Data and a FLUSH, but no new superblock: acknowledged, not persisted;
    // a cut connection discards it.
    let x = vec![0x5au8; 3 * 65536];
    with_data(&srv, "x", &x, &format!("h.pwrite(data, {X_AT})\nh.flush()\n{CUT}"));
    wait_rollbacks(&srv, 1);
    assert_eq!(
        read_at(&srv, X_AT, 8),
        vec![0u8; 8],
        "a write after the last safe point survived a cut"
    );
    let rb = rollbacks(&srv);
    assert_eq!(rb.len(), 1, "{rb:?}");
    assert_eq!(rb[0]["discarded_bytes"], x.len() as u64, "{rb:?}");
    assert!(rb[0]["reason"].as_str().unwrap().contains("without NBD_CMD_DISC"), "{rb:?}");

    // A new superblock without a FLUSH after it: still not durable.
    let sb1 = with_generation(&sb, g + 1);
    let mut both = x.clone();
    both.extend_from_slice(&sb1);
    let body = format!(
        "h.pwrite(data[:{n}], {X_AT})\nh.flush()\nh.pwrite(data[{n}:], {SUPER})\n{CUT}",
        n = x.len()
    );
    with_data(&srv, "xs", &both, &body);
    wait_rollbacks(&srv, 2);
    assert_eq!(generation(&read_at(&srv, SUPER, 4096)), g, "an unflushed superblock persisted");
    assert_eq!(read_at(&srv, X_AT, 8), vec![0u8; 8]);
    assert_eq!(rollbacks(&srv).len(), 2);

    // The full commit sequence: data, FLUSH, superblock, FLUSH. A cut after
    // it loses nothing.
    let body = format!(
        "h.pwrite(data[:{n}], {X_AT})\nh.flush()\nh.pwrite(data[{n}:], {SUPER})\nh.flush()\n{CUT}",
        n = x.len()
    );
    with_data(&srv, "xs2", &both, &body);
    assert_eq!(read_at(&srv, X_AT, x.len() as u64), x, "a safe point was lost");
    assert_eq!(generation(&read_at(&srv, SUPER, 4096)), g + 1);
    assert_eq!(rollbacks(&srv).len(), 2, "nothing was pending, so no rollback");

    // Versions of a deferred head are safe points, labelled with the generation.
    let v = forkfs(&srv, &["snapshot", "vm"]);
    assert_eq!(v["generation"], g + 1, "{v}");
    // A fork taken now is that safe point, and is served the same way.
    let f = forkfs(&srv, &["fork", "vm", "vm2"]);
    assert_eq!(f["consistency"], "btrfs", "{f}");
    assert_eq!(f["forked_from"], v["id"], "{f}");
    // The server's own checkpoints (here the one at SIGTERM) are safe-point versions.
    let sb2 = with_generation(&sb, g + 2);
    with_data(&srv, "s2", &sb2, &format!("h.pwrite(data, {SUPER})\nh.flush()\n{CUT}"));
    assert!(srv.stop().success());
    let log = forkfs(&srv, &["log", "vm"]);
    let newest = log.as_array().unwrap().iter().find(|e| e["event"] == "version").unwrap();
    assert_eq!(newest["origin"], "safe-point", "{log}");
    assert_eq!(newest["generation"], g + 2, "{log}");
}

#[test]
fn a_lost_connection_fails_the_clients_that_read_its_writes_and_a_server_crash_is_recorded() {
    let mut srv = Server::start(&[("vm", 64 * MIB)]);
    srv.stop();
    srv.spawn(&["--consistency", "btrfs"]);
    // No btrfs here: flush semantics (FLUSH persists), still rolled back
    // to the last FLUSH when a connection is lost.
    nbdsh(&srv.uri("vm"), "h.pwrite(b'A' * 65536, 0)\nh.flush()");
    // Client 1 (this nbdsh) stays attached while client 2 (another
    // process) writes, client 1 reads that write, and client 2 is cut:
    // client 1's cache holds discarded data, so it falls with client 2.
    let uri = srv.uri("vm");
    let script = format!(
        r#"
import nbd, subprocess, sys
h.pwrite(b'B' * 65536, 65536)
other = "import sys, os\nh.pwrite(b'C' * 65536, 131072)\nprint('W', flush=True)\nsys.stdin.readline()\nos._exit(0)"
p = subprocess.Popen(["nbdsh", "-u", {uri:?}, "-c", other], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert p.stdout.readline().strip() == b'W'
assert h.pread(4, 131072) == b'CCCC'
p.stdin.write(b'go\n')
p.stdin.close()
p.wait()
import time
for _ in range(100):
    try:
        h.pread(512, 0)
        time.sleep(0.05)
    except nbd.Error as e:
        print("FAILED", e.errno)
        break
else:
    print("STILL-SERVED")
"#
    );
    let out = nbdsh(&uri, &script);
    assert!(out.contains("FAILED"), "a client that read discarded writes was not failed: {out}");
    assert_eq!(read_at(&srv, 0, 4), b"AAAA");
    assert_eq!(
        read_at(&srv, 65536, 4),
        vec![0; 4],
        "unflushed write of the fallen client 1 survived"
    );
    assert_eq!(
        read_at(&srv, 131072, 4),
        vec![0; 4],
        "unflushed write of the lost connection survived"
    );
    // A clean disconnect on a disk without btrfs persists, like flush mode.
    nbdsh(&uri, "h.pwrite(b'D' * 65536, 196608)\nh.shutdown()");
    assert_eq!(read_at(&srv, 196608, 4), b"DDDD");

    // SIGKILL with unsealed writes: after the restart the disk is at its
    // last safe point and the loss is recorded.
    let before = rollbacks(&srv).len();
    nbdsh(&uri, "h.pwrite(b'E' * 65536, 262144)");
    // That client left without NBD_CMD_DISC: once the server has rolled it
    // back, a new connection is not cut off by that rollback.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rollbacks(&srv).len() == before {
        assert!(std::time::Instant::now() < deadline, "the lost connection was not rolled back");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let before = before + 1;
    let script = "import time\nh.pwrite(b'F' * 65536, 327680)\ntime.sleep(30)";
    let mut holder = std::process::Command::new("nbdsh")
        .args(["-u", &uri, "-c", script])
        .env("PATH", format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default()))
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    srv.child.as_mut().unwrap().kill().unwrap();
    srv.child.take().unwrap().wait().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    srv.spawn(&["--consistency", "btrfs"]);
    assert_eq!(read_at(&srv, 327680, 4), vec![0; 4], "an unsealed write survived SIGKILL");
    let rb = rollbacks(&srv);
    assert!(rb.len() > before, "the crash left no rollback record: {rb:?}");
    // Newest first.
    assert!(rb[0]["reason"].as_str().unwrap().contains("stopped"), "{rb:?}");
}
