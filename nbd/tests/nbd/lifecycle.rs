//! Stopping: SIGTERM and SIGINT end the server within a bounded time (exit
//! 0) whatever its clients do: one stuck mid-handshake, one attached and
//! idle, one with replies it does not read. What was acknowledged after a
//! FLUSH is there after a restart. Before this, the stuck handshake kept
//! the server running forever after SIGTERM.

use crate::common::raw::{attach, greet, request};
use crate::common::{Server, nbdsh};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn stop_with_stuck_clients(sig: i32) {
    let mut srv = Server::start(&[("disk", 64 * MIB)]);
    nbdsh(
        &srv.uri("disk"),
        "h.pwrite(b'\\x5a' * (1 << 20), 3 << 20)\nh.flush()\nh.pwrite(b'\\xa5' * 4096, 0, nbd.CMD_FLAG_FUA)",
    );
    // Stuck after the greeting; stuck after the client flags; attached
    // and idle; attached with 16 MiB of replies it never reads ...
    let stuck = UnixStream::connect(&srv.sock).unwrap();
    let mut flags = UnixStream::connect(&srv.sock).unwrap();
    greet(&mut flags);
    let mut idle = UnixStream::connect(&srv.sock).unwrap();
    attach(&mut idle, "disk");
    let mut deaf = UnixStream::connect(&srv.sock).unwrap();
    attach(&mut deaf, "disk");
    // ... and one that also closed its sending side (its requests ended,
    // its replies wait on the socket).
    let mut gone = UnixStream::connect(&srv.sock).unwrap();
    attach(&mut gone, "disk");
    for i in 0..8 {
        deaf.write_all(&request(0, i, i * 2 * MIB, 2 << 20)).unwrap();
        gone.write_all(&request(0, i, i * 2 * MIB, 2 << 20)).unwrap();
    }
    gone.shutdown(std::net::Shutdown::Write).unwrap();
    srv.signal(sig);
    // Generous: the bound in the server is its 5 s reply grace.
    let st = srv.wait_exit(Duration::from_secs(60));
    let log = srv.log();
    let st = st.unwrap_or_else(|| panic!("the server did not stop within 60 s:\n{log}"));
    assert_eq!(st.code(), Some(0), "{log}");
    drop((stuck, flags, idle, deaf, gone));
    srv.spawn(&[]);
    let out = nbdsh(
        &srv.uri("disk"),
        "print(h.pread(1 << 20, 3 << 20) == b'\\x5a' * (1 << 20), h.pread(4096, 0) == b'\\xa5' * 4096)",
    );
    assert_eq!(out.trim(), "True True", "{}", srv.log());
}

#[test]
fn sigterm_ends_the_server_with_clients_stuck_and_keeps_acknowledged_writes() {
    stop_with_stuck_clients(libc::SIGTERM);
}

#[test]
fn sigint_does_the_same() {
    stop_with_stuck_clients(libc::SIGINT);
}
