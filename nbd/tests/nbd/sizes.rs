//! Request sizes: the server advertises minimum, preferred and maximum
//! block sizes (NBD_INFO_BLOCK_SIZE), serves requests up to the maximum
//! (64 MiB by default, configurable) and answers larger ones with EINVAL
//! on a connection that goes on working. Before, anything over 32 MiB got
//! EINVAL (the 64 MiB pwrite below failed). Listening beyond loopback
//! needs `--insecure-listen`.

use crate::common::raw::{attach, request, simple_reply};
use crate::common::{Server, nbdsh, ok, write_random};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

const MIB: u64 = 1 << 20;

#[test]
fn block_sizes_are_advertised_and_64_mib_requests_work() {
    let srv = Server::start(&[("disk", 256 * MIB)]);
    let info = ok("nbdinfo", &["--json", &srv.uri("disk")]);
    for want in [
        "\"block_size_minimum\": 1",
        "\"block_size_preferred\": 65536",
        "\"block_size_maximum\": 67108864",
    ] {
        assert!(info.contains(want), "{want} in {info}");
    }
    let script = r#"
h.set_strict_mode(0)
def err(f):
    try:
        f()
        return 'ok'
    except nbd.Error as e:
        return e.errno
big = 64 << 20
data = bytes(range(256)) * (big // 256)
out = [str(h.get_block_size(nbd.SIZE_MAXIMUM) == big)]
out.append(err(lambda: h.pwrite(data, 4096)))
out.append(str(h.pread(big, 4096) == data))
print(' '.join(out))
"#;
    let out = nbdsh(&srv.uri("disk"), script);
    assert_eq!(out.trim(), "True ok True", "{}", srv.log());
    // libnbd will not send more than 64 MiB: a raw client does. A READ
    // and a WRITE (payload drained) just over the maximum get EINVAL and
    // the connection goes on.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    attach(&mut s, "disk");
    let over = (64 << 20) + 4096;
    s.write_all(&request(0, 1, 0, over)).unwrap();
    assert_eq!(simple_reply(&mut s), (22, 1), "{}", srv.log());
    s.write_all(&request(1, 2, 0, over)).unwrap();
    s.write_all(&vec![7u8; over as usize]).unwrap();
    assert_eq!(simple_reply(&mut s), (22, 2), "{}", srv.log());
    s.write_all(&request(0, 3, 4096, 4096)).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 3), "{}", srv.log());
    let mut buf = vec![0u8; 4096];
    s.read_exact(&mut buf).unwrap();
    let want: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    assert_eq!(buf, want);
}

#[test]
fn nbdcopy_and_qemu_img_with_large_requests_round_trip() {
    let mut srv = Server::create(&[("disk", 192 * MIB)]);
    srv.spawn(&["--max-request", "128MiB", "--connection-memory", "512MiB"]);
    let src = srv.path("src.img");
    let data = write_random(&src, (192 * MIB) as usize, 19);
    let uri = srv.uri("disk");
    // nbdcopy (libnbd 1.14) goes up to 32 MiB per request.
    ok("nbdcopy", &["--request-size=33554432", "--requests=4", src.to_str().unwrap(), &uri]);
    let back = srv.path("back.img");
    ok("nbdcopy", &["--request-size=33554432", &uri, back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "nbdcopy round trip differs");
    // qemu sizes its requests by the advertised maximum (capped at 32 MiB).
    std::fs::write(&src, vec![0x33u8; (192 * MIB) as usize]).unwrap();
    ok("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", src.to_str().unwrap(), &uri]);
    let out = ok("qemu-img", &["compare", "-f", "raw", "-F", "raw", src.to_str().unwrap(), &uri]);
    assert!(out.contains("identical"), "{out}");
    // The maximum is what the flag says.
    let out = nbdsh(&uri, "print(h.get_block_size(nbd.SIZE_MAXIMUM))");
    assert_eq!(out.trim(), (128 * MIB).to_string());
}

#[test]
fn listening_beyond_loopback_needs_insecure_listen() {
    let mut srv = Server::create(&[("disk", MIB)]);
    let serve = |extra: &[&str]| {
        std::process::Command::new(&srv.bin)
            .arg("--store")
            .arg(&srv.store)
            .arg("serve")
            .args(extra)
            .output()
            .unwrap()
    };
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let out = serve(&["--listen", addr]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{err}");
        let lines: Vec<_> = err.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains("--insecure-listen") && lines[0].contains("--tls-client-ca"),
            "{err}"
        );
    }
    // Bad flag values are refused the same way.
    let out = serve(&["--socket", "/nonexistent/x.sock", "--connection-memory", "1MiB"]);
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    // With the flag it listens (and says nothing against loopback).
    srv.spawn(&["--listen", "0.0.0.0:0", "--insecure-listen"]);
    let addr = srv.tcp_addr();
    let port = addr.rsplit(':').next().unwrap();
    let size = ok("nbdinfo", &["--size", &format!("nbd://127.0.0.1:{port}/disk")]);
    assert_eq!(size.trim(), MIB.to_string());
    assert!(srv.stop().success());
}

/// A READ of a hole right after a READ of data, same size, same
/// connection, is all zeros, with simple replies and structured ones (where
/// a stray byte would turn a hole into data), over sizes that end inside a
/// block and past it. (Written when READ buffers were reused; replies now
/// share the store's bytes, and the test holds that path to the same.)
#[test]
fn a_hole_read_after_a_data_read_is_all_zeros() {
    let srv = Server::start(&[("disk", 16 * MIB)]);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    attach(&mut s, "disk");
    let data = vec![0xa5u8; 2 * MIB as usize];
    s.write_all(&request(1, 1, 0, data.len() as u32)).unwrap();
    s.write_all(&data).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 1));
    let mut cookie = 2;
    for len in [4096u32, 65536, 65536 + 512, MIB as u32, 2 * MIB as u32] {
        let mut got = vec![0u8; len as usize];
        s.write_all(&request(0, cookie, 0, len)).unwrap();
        assert_eq!(simple_reply(&mut s), (0, cookie));
        s.read_exact(&mut got).unwrap();
        assert!(got.iter().all(|b| *b == 0xa5), "the data read back at {len}");
        // The hole, on the same connection.
        s.write_all(&request(0, cookie + 1, 8 * MIB, len)).unwrap();
        assert_eq!(simple_reply(&mut s), (0, cookie + 1));
        s.read_exact(&mut got).unwrap();
        assert!(got.iter().all(|b| *b == 0), "a {len}-byte hole shows earlier bytes");
        cookie += 2;
    }
    let script = "h.pwrite(b'\\x5a' * 1048576, 0)\n\
                  assert h.pread(1048576, 0) == b'\\x5a' * 1048576\n\
                  assert h.pread(1048576, 8 << 20) == bytes(1048576)\n\
                  print('ok')";
    assert_eq!(nbdsh(&srv.uri("disk"), script).trim(), "ok", "{}", srv.log());
}
