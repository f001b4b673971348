//! Every command and error case through libnbd (nbdsh) with client-side
//! checks off, plus malformed handshakes and truncated requests over raw
//! sockets: each gets the documented error and the server keeps serving.

use crate::common::{Server, nbdsh};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

const MIB: u64 = 1 << 20;

#[test]
fn each_command_and_each_error_case() {
    let srv = Server::start(&[("disk", 16 * MIB)]);
    let script = r#"
h.set_strict_mode(0)
size = h.get_size()
def err(f):
    try:
        f()
        return 'ok'
    except nbd.Error as e:
        return e.errno
out = []
out.append(err(lambda: h.pwrite(b'a' * 4096, 0, nbd.CMD_FLAG_FUA)))
assert h.pread(4096, 0) == b'a' * 4096
out.append(err(lambda: h.pread(10, size)))             # read past the end
out.append(err(lambda: h.pread(10, size - 5)))         # read straddling the end
out.append(err(lambda: h.pwrite(b'x' * 10, size - 5))) # write past the end
out.append(err(lambda: h.trim(4096, size)))            # trim past the end
out.append(err(lambda: h.zero(4096, size)))            # zero past the end
out.append(err(lambda: h.pread(33 * 1024 * 1024, 0)))  # over 32 MiB
out.append(err(lambda: h.pread(10, 0, nbd.CMD_FLAG_NO_HOLE)))  # flag not valid for READ
out.append(err(lambda: h.trim(8192, 0)))
out.append(err(lambda: h.zero(8192, 8192, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)))
out.append(err(lambda: h.cache(4096, 0)))
out.append(err(lambda: h.flush()))
assert h.pread(16384, 0) == b'\0' * 16384
out.append(err(lambda: h.block_status(size, 0, lambda *a: 0)))  # no context negotiated
h2 = nbd.NBD()
h2.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h2.connect_uri(h.get_uri())
entries = []
def cb(metacontext, offset, e, err):
    entries.extend(e)
h2.block_status(size, 0, cb)
out.append('ok' if entries and sum(entries[0::2]) == size else 'bad status')
assert h.pread(4, 0) == b'\0\0\0\0'
print(' '.join(out))
"#;
    let out = nbdsh(&srv.uri("disk"), script);
    assert_eq!(
        out.trim(),
        "ok EINVAL EINVAL ENOSPC ENOSPC ENOSPC EINVAL EINVAL ok ok ok ok EINVAL ok",
        "{}",
        srv.log()
    );
}

fn greeting(s: &mut UnixStream) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[..8], b"NBDMAGIC");
}

/// After each bad connection the server must still serve a good one.
fn still_serving(srv: &Server) {
    let out = nbdsh(&srv.uri("disk"), "print(h.get_size())");
    assert_eq!(out.trim(), (16 * MIB).to_string(), "{}", srv.log());
}

#[test]
fn malformed_handshakes_and_truncated_requests_close_only_that_connection() {
    let srv = Server::start(&[("disk", 16 * MIB)]);
    // Garbage instead of client flags.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greeting(&mut s);
    s.write_all(&[0xff; 4]).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "server should close on bad client flags");
    still_serving(&srv);

    // A bad option magic.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greeting(&mut s);
    s.write_all(&[0, 0, 0, 3]).unwrap();
    s.write_all(&[0x12; 16]).unwrap();
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
    still_serving(&srv);

    // An unknown option gets NBD_REP_ERR_UNSUP and the connection lives on.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greeting(&mut s);
    s.write_all(&[0, 0, 0, 3]).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&999u32.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).unwrap();
    let mut rep = [0u8; 20];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(u32::from_be_bytes(rep[12..16].try_into().unwrap()), (1 << 31) | 1, "ERR_UNSUP");
    let len = u32::from_be_bytes(rep[16..20].try_into().unwrap()) as usize;
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).unwrap();
    // ... and an oversized option is refused with ERR_TOO_BIG after being drained.
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&7u32.to_be_bytes());
    opt.extend_from_slice(&(100_000u32).to_be_bytes());
    s.write_all(&opt).unwrap();
    s.write_all(&vec![0u8; 100_000]).unwrap();
    s.read_exact(&mut rep).unwrap();
    assert_eq!(u32::from_be_bytes(rep[12..16].try_into().unwrap()), (1 << 31) | 9, "ERR_TOO_BIG");
    drop(s);
    still_serving(&srv);

    // A request header cut short, then a request with a bad magic.
    for tail in [&b"\x25\x60\x95\x13\x00\x00"[..], &[0xaa; 28][..]] {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        greeting(&mut s);
        s.write_all(&[0, 0, 0, 3]).unwrap();
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes()); // EXPORT_NAME
        opt.extend_from_slice(&4u32.to_be_bytes());
        opt.extend_from_slice(b"disk");
        s.write_all(&opt).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).unwrap();
        assert_eq!(u64::from_be_bytes(info[..8].try_into().unwrap()), 16 * MIB);
        s.write_all(tail).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
        still_serving(&srv);
    }
    assert!(!srv.log().contains("panicked"), "{}", srv.log());
}

#[test]
fn random_requests_match_a_model_disk() {
    let srv = Server::start(&[("disk", 8 * MIB)]);
    // Two connections (multi-conn) interleaved, against a bytearray model.
    let script = r#"
import random
rng = random.Random(1234)
h2 = nbd.NBD()
h2.connect_uri(h.get_uri())
size = h.get_size()
model = bytearray(size)
for i in range(3000):
    c = h if rng.random() < 0.5 else h2
    op = rng.random()
    off = rng.randrange(0, size)
    n = rng.randrange(1, min(size - off, 300000) + 1)
    if op < 0.45:
        b = bytes([rng.randrange(256)]) * n
        c.pwrite(b, off, nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0)
        model[off:off + n] = b
    elif op < 0.6:
        c.trim(n, off)
        model[off:off + n] = bytes(n)
    elif op < 0.7:
        c.zero(n, off)
        model[off:off + n] = bytes(n)
    elif op < 0.75:
        c.flush()
    else:
        got = c.pread(n, off)
        assert got == model[off:off + n], f"op {i}: read {off}+{n} differs"
assert h.pread(size, 0) == model[:size] if size <= 32*1024*1024 else True
print('ok')
"#;
    assert_eq!(nbdsh(&srv.uri("disk"), script).trim(), "ok", "{}", srv.log());
}

#[test]
fn exports_that_cannot_be_opened_are_refused_by_kind_with_the_reason() {
    let srv = Server::create(&[("disk", 16 * MIB)]);
    {
        let s = forkfs::Store::open(&srv.store).unwrap();
        s.volumes().create("ws", forkfs::VolumeKind::Fs, None, None).unwrap();
    }
    let mut srv = srv;
    srv.spawn(&[]);
    // libnbd turns NBD_REP_ERR_UNKNOWN into ENOENT and NBD_REP_ERR_INVALID
    // into EINVAL; the server's message reaches its debug log.
    let script = format!(
        r#"
def go(name):
    msgs = []
    h2 = nbd.NBD()
    h2.set_debug(True)
    h2.set_debug_callback(lambda ctx, m: msgs.append(m))
    try:
        h2.connect_uri("nbd+unix:///" + name + "?socket={}")
        return 'ok'
    except nbd.Error as e:
        said = any('server error message' in m and 'not a block volume' in m for m in msgs)
        return e.errno + ':' + ('block' if said else '-')
print(' '.join(go(n) for n in ['disk', 'nope', 'ws', 'disk@~x', 'disk@0000']))
"#,
        srv.sock.display()
    );
    let out = nbdsh(&srv.uri("disk"), &script);
    assert_eq!(out.trim(), "ok ENOENT:- EINVAL:block EINVAL:- ENOENT:-", "{}", srv.log());
}

#[test]
fn the_server_exits_with_the_code_of_its_failure() {
    let bin = env!("CARGO_BIN_EXE_forkfs-nbd");
    let dir = tempfile::tempdir().unwrap();
    let serve = |store: &std::path::Path| {
        std::process::Command::new(bin)
            .arg("--store")
            .arg(store)
            .args(["serve", "--socket"])
            .arg(dir.path().join("second.sock"))
            .output()
            .unwrap()
    };
    let one_line = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let last = err.trim_end().lines().last().unwrap_or_default().to_string();
        assert!(last.starts_with("forkfs-nbd: "), "{err}");
        last
    };
    // No store there: not found (66).
    let out = serve(&dir.path().join("none"));
    let line = one_line(&out);
    assert_eq!(out.status.code(), Some(66), "{line}");
    // A store another server holds: in use, a temporary failure (75).
    let srv = Server::start(&[("disk", MIB)]);
    let out = serve(&srv.store);
    let line = one_line(&out);
    assert_eq!(out.status.code(), Some(75), "{line}");
    assert!(line.contains("in use"), "{line}");
    // An export that cannot be opened at start: its cause's code.
    let other = Server::create(&[("disk", MIB)]);
    let out = std::process::Command::new(bin)
        .arg("--store")
        .arg(&other.store)
        .args(["serve", "--export", "nope", "--socket"])
        .arg(dir.path().join("third.sock"))
        .output()
        .unwrap();
    let line = one_line(&out);
    assert_eq!(out.status.code(), Some(66), "{line}");
    assert!(line.contains("export nope"), "{line}");
}
