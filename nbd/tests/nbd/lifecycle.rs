//! Stopping: SIGTERM and SIGINT end the server within a bounded time (exit
//! 0) whatever its clients do: one stuck mid-handshake, one attached and
//! idle, one with replies it does not read. What was acknowledged after a
//! FLUSH is there after a restart. Before this, the stuck handshake kept
//! the server running forever after SIGTERM.

use crate::common::raw::{attach, greet, request};
use crate::common::{Server, nbdsh, run};
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

/// A control request straight to the store's socket; the answer's line
/// (after the heartbeats, empty lines, of a request that takes a while).
fn control(store: &std::path::Path, request: &str) -> std::io::Result<String> {
    use std::io::{BufRead, BufReader};
    let mut s = UnixStream::connect(store.join("control.sock"))?;
    s.write_all(format!("{request}\n").as_bytes())?;
    let mut line = String::new();
    let mut r = BufReader::new(&s);
    while line.trim().is_empty() {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
    }
    Ok(line)
}

/// Waits up to `limit` for `f` to answer.
fn within<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The control socket removed or replaced under a running server (a tmp
/// cleaner, a person): the server binds it again within seconds, so
/// commands reach it and the store is never held by a process nobody can
/// reach; after one more removal SIGTERM still ends it. Then the store
/// directory itself goes away: a FLUSH after it fails, and SIGTERM still
/// ends the server in bounded time (before, its control thread waited on
/// the vanished socket for ever, and `stopped` was logged by a process
/// that never exited).
#[test]
fn a_removed_control_socket_comes_back_and_sigterm_ends_the_server_without_it() {
    let mut srv = Server::start(&[("disk", 64 * MIB)]);
    let sock = srv.store.join("control.sock");
    let volumes = r#"{"op":"volumes"}"#;
    assert!(control(&srv.store, volumes).unwrap().contains("disk"));
    std::fs::remove_file(&sock).unwrap();
    let back = within(Duration::from_secs(10), || control(&srv.store, volumes).ok());
    let back = back.unwrap_or_else(|| panic!("the socket did not come back:\n{}", srv.log()));
    assert!(back.contains("disk"), "{back}");
    // Replaced by something else: the same.
    std::fs::remove_file(&sock).unwrap();
    std::fs::write(&sock, b"not a socket").unwrap();
    let back = within(Duration::from_secs(10), || control(&srv.store, volumes).ok());
    assert!(back.is_some_and(|b| b.contains("disk")), "{}", srv.log());
    std::fs::remove_file(&sock).unwrap();
    srv.signal(libc::SIGTERM);
    let st = srv.wait_exit(Duration::from_secs(30));
    let st = st.unwrap_or_else(|| panic!("no exit within 30 s of SIGTERM:\n{}", srv.log()));
    assert_eq!(st.code(), Some(0), "{}", srv.log());

    // The store directory gone under a running server.
    srv.spawn(&[]);
    nbdsh(&srv.uri("disk"), "h.pwrite(b'\\x5a' * 4096, 0)\nh.flush()");
    std::fs::remove_dir_all(&srv.store).unwrap();
    // A FLUSH after it fails: nothing written now reaches a store.
    let flush = "h.pwrite(b'\\x6b' * 4096, 0)\nh.flush()";
    let out = run("nbdsh", &["-u", &srv.uri("disk"), "-c", flush]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a FLUSH without the store directory succeeded");
    assert!(err.contains("flush"), "{err}");
    srv.signal(libc::SIGTERM);
    let st = srv.wait_exit(Duration::from_secs(30));
    let st = st.unwrap_or_else(|| panic!("no exit within 30 s of SIGTERM without its store"));
    // What it could not persist makes the exit "unavailable", not 0.
    assert_eq!(st.code(), Some(69), "{}", srv.log());
}

/// A stop kept waiting by a client that does not read its replies (the
/// server gives such replies 5 s): `--stop-timeout 1s` ends it sooner,
/// and so does a second SIGTERM, each with exit 75; what was flushed is
/// there after a restart.
#[test]
fn a_second_signal_or_the_stop_timeout_ends_a_waiting_stop_at_once() {
    for second_signal in [false, true] {
        let mut srv = Server::create(&[("disk", 64 * MIB)]);
        let extra: &[&str] = if second_signal { &[] } else { &["--stop-timeout", "1s"] };
        srv.spawn(extra);
        nbdsh(&srv.uri("disk"), "h.pwrite(b'\\x3c' * 65536, 0)\nh.flush()");
        let mut deaf = UnixStream::connect(&srv.sock).unwrap();
        attach(&mut deaf, "disk");
        for i in 0..8 {
            deaf.write_all(&request(0, i, i * 2 * MIB, 2 << 20)).unwrap();
        }
        // The first reply has begun: the server is writing 2 MiB replies
        // into a socket buffer far smaller, so requests are in flight
        // (without this a stop could find none yet and exit 0 at once).
        std::io::Read::read_exact(&mut deaf, &mut [0u8; 16]).unwrap();
        let t = std::time::Instant::now();
        srv.signal(libc::SIGTERM);
        if second_signal {
            std::thread::sleep(Duration::from_millis(500));
            srv.signal(libc::SIGTERM);
        }
        let st = srv.wait_exit(Duration::from_secs(30));
        let st = st.unwrap_or_else(|| panic!("no exit within 30 s:\n{}", srv.log()));
        let took = t.elapsed();
        assert_eq!(st.code(), Some(75), "{}", srv.log());
        // Sooner than the 5 s the undelivered replies would have had.
        assert!(took < Duration::from_millis(4500), "took {took:?}:\n{}", srv.log());
        assert!(srv.log().contains("stopping now"), "{}", srv.log());
        drop(deaf);
        srv.spawn(&[]);
        let out = nbdsh(&srv.uri("disk"), "print(h.pread(65536, 0) == b'\\x3c' * 65536)");
        assert_eq!(out.trim(), "True", "{}", srv.log());
    }
}
