//! TLS and access control through libnbd (GnuTLS) over TCP on loopback:
//! with a certificate every connection must upgrade before it may list,
//! query or attach; with a client CA only clients holding a certificate
//! it signed get in. Certificates are made per test with `openssl`.

use crate::common::{Server, nbdsh, need, run};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Runs `openssl ARGS` in `dir`, asserting success.
fn openssl(dir: &Path, args: &[&str]) {
    need("openssl");
    let out = Command::new("openssl").current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A key and a certificate `name` signed by `ca` (or self-signed), with
/// the extensions `ext` (an openssl extension file's lines).
fn issue(dir: &Path, name: &str, ca: Option<&str>, subject: &str, ext: &str) {
    let key = format!("{name}-key.pem");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    let ext_file = format!("{name}.ext");
    match ca {
        None => {
            let mut a = vec!["req", "-x509", "-days", "2", "-subj", subject, "-keyout", &key];
            a.extend_from_slice(&ec);
            let out = format!("{name}-cert.pem");
            a.extend_from_slice(&["-out", &out, "-extensions", "v3", "-config", &ext_file]);
            openssl(dir, &a);
        }
        Some(ca) => {
            let csr = format!("{name}.csr");
            let mut a = vec!["req", "-new", "-subj", subject, "-keyout", &key, "-out", &csr];
            a.extend_from_slice(&ec);
            openssl(dir, &a);
            let (ca_cert, ca_key) = (format!("{ca}-cert.pem"), format!("{ca}-key.pem"));
            let out = format!("{name}-cert.pem");
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-days",
                    "2",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_cert,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-out",
                    &out,
                    "-extfile",
                    &ext_file,
                    "-extensions",
                    "v3",
                ],
            );
        }
    }
}

/// openssl extensions of a server certificate for 127.0.0.1, and of a
/// client certificate.
const SERVER_EXT: &str = "[v3]\nbasicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n";
const CLIENT_EXT: &str = "[v3]\nbasicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";

/// Certificates for one test: a CA, the server's (127.0.0.1), a client's
/// signed by the CA, a client's signed by another CA; and libnbd's
/// `tls-certificates` directories: `good` (a signed client certificate),
/// `rogue` (the other), `anonymous` (none).
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(root: &Path) -> Pki {
        let dir = root.join("pki");
        std::fs::create_dir_all(&dir).unwrap();
        let ca = "[req]\ndistinguished_name=dn\n[dn]\n[v3]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n";
        issue(&dir, "ca", None, "/CN=forkfs test CA", ca);
        issue(&dir, "other-ca", None, "/CN=someone else's CA", ca);
        issue(&dir, "server", Some("ca"), "/CN=127.0.0.1", SERVER_EXT);
        issue(&dir, "client", Some("ca"), "/CN=allowed client", CLIENT_EXT);
        issue(&dir, "rogue", Some("other-ca"), "/CN=rogue client", CLIENT_EXT);
        let pki = Pki { dir };
        for (set, who) in [("good", Some("client")), ("rogue", Some("rogue")), ("anonymous", None)]
        {
            pki.client_dir(set, "ca", who);
        }
        pki
    }

    /// libnbd's (and qemu's) `tls-certificates` directory `set`: the CA
    /// `ca` to trust, and `who`'s certificate and key (none: anonymous).
    /// Its path.
    fn client_dir(&self, set: &str, ca: &str, who: Option<&str>) -> String {
        let d = self.dir.join(set);
        std::fs::create_dir_all(&d).unwrap();
        let copy = |from: String, to: &str| std::fs::copy(self.dir.join(from), d.join(to)).unwrap();
        copy(format!("{ca}-cert.pem"), "ca-cert.pem");
        if let Some(who) = who {
            copy(format!("{who}-cert.pem"), "client-cert.pem");
            copy(format!("{who}-key.pem"), "client-key.pem");
        }
        d.to_str().unwrap().to_string()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    /// The server's arguments: TLS, and with `clients` the client CA.
    fn server_args(&self, clients: bool) -> Vec<String> {
        let mut a = vec![
            "--tls-cert".to_string(),
            self.path("server-cert.pem"),
            "--tls-key".to_string(),
            self.path("server-key.pem"),
        ];
        if clients {
            a.extend(["--tls-client-ca".to_string(), self.path("ca-cert.pem")]);
        }
        a
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `srv` listening on TCP too, with `args`; the TCP address.
fn spawn_tcp(srv: &mut Server, args: &[String]) -> String {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut a: Vec<&str> = vec!["--listen", &addr];
    a.extend(args.iter().map(String::as_str));
    srv.spawn(&a);
    addr
}

fn tls_uri(addr: &str, export: &str, certs: &str) -> String {
    format!("nbds://{addr}/{export}?tls-certificates={certs}")
}

/// `nbdsh` on a TLS URI (which names local certificate files: allowed
/// explicitly, as nbdinfo does).
fn tls_nbdsh(uri: &str, script: &str) -> String {
    let connect = format!("h.set_uri_allow_local_file(True)\nh.connect_uri({uri:?})\n{script}");
    crate::common::ok("nbdsh", &["-c", &connect])
}

/// Whether `nbdinfo URI` gets through, and what it said.
fn info(uri: &str) -> (bool, String) {
    let out = run("nbdinfo", &[uri]);
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

#[test]
fn client_certificates_are_the_access_control_and_tls_is_required() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    let addr = spawn_tcp(&mut srv, &pki.server_args(true));
    let log = |srv: &Server| srv.log();

    // A client with a certificate the CA signed: in, writes and reads.
    let good = tls_uri(&addr, "disk", &pki.path("good"));
    let out = tls_nbdsh(
        &good,
        "h.pwrite(b'\\x7e' * 65536, 1 << 20)\nh.flush()\nprint(h.pread(65536, 1 << 20) == b'\\x7e' * 65536)",
    );
    assert_eq!(out.trim(), "True", "{}", log(&srv));
    let list = run(
        "nbdinfo",
        &["--list", &format!("nbds://{addr}/?tls-certificates={}", pki.path("good"))],
    );
    assert!(list.status.success() && String::from_utf8_lossy(&list.stdout).contains("disk"));

    // Without TLS, without a certificate, with another CA's: not in.
    let refused = [
        ("plain", format!("nbd://{addr}/disk")),
        ("plain list", format!("nbd://{addr}/")),
        ("no client certificate", tls_uri(&addr, "disk", &pki.path("anonymous"))),
        ("another CA's certificate", tls_uri(&addr, "disk", &pki.path("rogue"))),
    ];
    for (what, uri) in &refused {
        let (ok, said) = if what.ends_with("list") {
            let o = run("nbdinfo", &["--list", uri]);
            (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
        } else {
            info(uri)
        };
        assert!(!ok, "{what} got in: {said}\n{}", log(&srv));
    }
    // The plain client was told why (NBD_REP_ERR_TLS_REQD).
    let (_, said) = info(&format!("nbd://{addr}/disk"));
    assert!(said.to_lowercase().contains("tls"), "{said}");

    // What came in over TLS is stored: a plain server reads it back.
    assert!(srv.stop().success(), "{}", log(&srv));
    srv.spawn(&[]);
    let out = nbdsh(&srv.uri("disk"), "print(h.pread(65536, 1 << 20) == b'\\x7e' * 65536)");
    assert_eq!(out.trim(), "True");
    // Negative control: the same plain client, refused above, gets in
    // when the server has no TLS.
    let plain = spawn_plain_tcp(&mut srv);
    let (ok, said) = info(&format!("nbd://{plain}/disk"));
    assert!(ok, "a plain client cannot get in even without TLS: {said}");
}

/// Restarts `srv` on TCP without TLS; the address.
fn spawn_plain_tcp(srv: &mut Server) -> String {
    srv.stop();
    spawn_tcp(srv, &[])
}

#[test]
fn server_tls_without_client_certificates_encrypts_but_admits_anyone_with_tls() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    let addr = spawn_tcp(&mut srv, &pki.server_args(false));
    let (ok, said) = info(&tls_uri(&addr, "disk", &pki.path("anonymous")));
    assert!(ok, "{said}\n{}", srv.log());
    assert!(said.contains("67108864"), "{said}");
    let (ok, _) = info(&format!("nbd://{addr}/disk"));
    assert!(!ok, "a plain client got in");
}

/// Bad TLS settings, and a public address without client certificates,
/// fail at start in one line with exit 64; with them it is allowed.
#[test]
fn tls_settings_are_checked_at_start() {
    let srv = Server::create(&[("disk", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    let serve = |args: &[&str]| {
        let out = Command::new(&srv.bin)
            .arg("--store")
            .arg(&srv.store)
            .arg("serve")
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).trim().to_string())
    };
    let (cert, key, ca) =
        (pki.path("server-cert.pem"), pki.path("server-key.pem"), pki.path("ca-cert.pem"));
    let other_key = pki.path("client-key.pem");
    let cases: [(&str, Vec<&str>); 4] = [
        ("a certificate without its key", vec!["--tls-cert", &cert]),
        ("a key that is not the certificate's", vec!["--tls-cert", &cert, "--tls-key", &other_key]),
        ("a client CA without a certificate", vec!["--tls-client-ca", &ca]),
        (
            "a public address without client certificates",
            vec!["--listen", "0.0.0.0:0", "--tls-cert", &cert, "--tls-key", &key],
        ),
    ];
    for (what, args) in cases {
        let (code, err) = serve(&args);
        assert_eq!(code, Some(64), "{what}: {err}");
        assert!(err.starts_with("forkfs-nbd: ") && err.lines().count() == 1, "{what}: {err}");
    }
    // With client certificates a public address is allowed.
    let mut srv = srv;
    srv.spawn(&[
        "--listen",
        "0.0.0.0:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
    ]);
    assert!(srv.log().contains("listening (tcp)"), "{}", srv.log());
    assert!(srv.stop().success());
}

/// Certificates rotated on disk take effect at SIGHUP (issue 19): before
/// it, new clients still meet the old ones; after it, clients of the new
/// CA get in and those of the old one do not. A reload that fails (a
/// broken key) keeps the certificates in use, and the server serves on.
/// Negative control: without the SIGHUP the rotated client stays out (the
/// assertion before the signal).
#[test]
fn sighup_reloads_rotated_certificates_and_a_broken_reload_keeps_the_old_ones() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    issue(&pki.dir, "server2", Some("other-ca"), "/CN=127.0.0.1", SERVER_EXT);
    // A client of the new CA (its certificate, and the new CA to trust).
    let rotated = pki.client_dir("rotated", "other-ca", Some("rogue"));
    // The files the server reads, replaced by rename as an operator would.
    let live = srv.path("live");
    std::fs::create_dir_all(&live).unwrap();
    let put = |from: &str, to: &str| {
        let tmp = live.join(format!("{to}.new"));
        std::fs::copy(pki.dir.join(from), &tmp).unwrap();
        std::fs::rename(&tmp, live.join(to)).unwrap();
    };
    put("server-cert.pem", "cert.pem");
    put("server-key.pem", "key.pem");
    put("ca-cert.pem", "ca.pem");
    let file = |name: &str| live.join(name).to_str().unwrap().to_string();
    let args = ["--tls-cert", "cert.pem", "--tls-key", "key.pem", "--tls-client-ca", "ca.pem"];
    let args: Vec<String> =
        args.iter().map(|a| if a.ends_with(".pem") { file(a) } else { a.to_string() }).collect();
    let addr = spawn_tcp(&mut srv, &args);
    let good = tls_uri(&addr, "disk", &pki.path("good"));
    let new = tls_uri(&addr, "disk", &rotated);
    assert!(info(&good).0, "{}", srv.log());
    assert!(!info(&new).0, "a client of the other CA got in");

    put("server2-cert.pem", "cert.pem");
    put("server2-key.pem", "key.pem");
    put("other-ca-cert.pem", "ca.pem");
    assert!(info(&good).0, "rotated files took effect before SIGHUP");
    assert!(!info(&new).0, "rotated files took effect before SIGHUP");
    let reloads = |srv: &Server, what: &str| srv.log().matches(what).count();
    srv.signal(libc::SIGHUP);
    wait_for(&srv, || reloads(&srv, "TLS certificates reloaded") == 1);
    assert!(info(&new).0, "the new CA's client is refused after SIGHUP: {}", srv.log());
    assert!(!info(&good).0, "the old CA's client still gets in after SIGHUP");

    // A broken key: the reload fails, the certificates in use stay.
    std::fs::write(live.join("key.pem"), b"not a key\n").unwrap();
    srv.signal(libc::SIGHUP);
    wait_for(&srv, || reloads(&srv, "TLS certificates not reloaded") == 1);
    assert!(info(&new).0, "a failed reload dropped the certificates in use: {}", srv.log());
    assert!(srv.wait_exit(std::time::Duration::ZERO).is_none(), "SIGHUP ended the server");
}

/// Waits up to 10 s for `done`.
fn wait_for(srv: &Server, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "not within 10 s:\n{}", srv.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// qemu's NBD client over TLS with a client certificate (GnuTLS, x509
/// credentials as qemu-img and qemu-io take them): it writes and reads
/// back; without the certificate, or without TLS, it does not get in.
#[test]
fn qemu_writes_and_reads_over_tls_with_a_client_certificate() {
    need("qemu-img");
    need("qemu-io");
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    let addr = spawn_tcp(&mut srv, &pki.server_args(true));
    let (host, port) = addr.rsplit_once(':').unwrap();
    let creds = |set: &str| format!("tls-creds-x509,id=tls0,dir={},endpoint=client", pki.path(set));
    let image = format!("driver=nbd,host={host},port={port},export=disk,tls-creds=tls0");
    let qemu_io = |set: &str, cmds: &[&str]| {
        let mut args = vec!["--object".to_string(), creds(set), "--image-opts".to_string()];
        args.push(image.clone());
        for c in cmds {
            args.extend(["-c".to_string(), c.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("qemu-io", &args)
    };
    let out = qemu_io("good", &["write -P 0x5c 1M 128k", "flush", "read -P 0x5c 1M 128k"]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !said.contains("Pattern verification failed"), "{said}");
    assert!(said.contains("read 131072/131072 bytes"), "{said}\n{}", srv.log());
    let info = run("qemu-img", &["info", "--object", &creds("good"), "--image-opts", &image]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success() && text.contains("64 MiB"), "{text}");
    // Another CA's client certificate, or none at all: refused.
    for set in ["rogue", "anonymous"] {
        let out = qemu_io(set, &["read 0 4k"]);
        assert!(!out.status.success(), "qemu-io with the {set} credentials got in");
    }
    let plain = format!("nbd://{addr}/disk");
    assert!(!run("qemu-img", &["info", &plain]).status.success(), "qemu-img got in without TLS");
}

/// Per-export access by certificate (`--allow-client VOL=FINGERPRINT`,
/// its SHA-256 fingerprint as openssl prints it): a volume with rules is
/// served only to the clients named, who also see it in the list; another
/// client of the same CA is refused it (and does not see it) but gets a
/// volume without rules. Without client certificates the flag is refused.
/// Negative control: the refused client gets in when the rule is not given
/// (the last case).
#[test]
fn allow_client_serves_a_volume_only_to_the_named_certificates() {
    let mut srv = Server::create(&[("disk", 64 * MIB), ("open", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    issue(&pki.dir, "client2", Some("ca"), "/CN=another client", CLIENT_EXT);
    let other = pki.client_dir("other", "ca", Some("client2"));
    // The allowed client's fingerprint, as openssl prints it.
    let fp = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(pki.dir.join("client-cert.pem"))
        .output()
        .unwrap();
    let fp = String::from_utf8_lossy(&fp.stdout).trim().to_string();
    assert!(fp.to_lowercase().starts_with("sha256 fingerprint="), "{fp}");
    let mut args = pki.server_args(true);
    args.extend(["--allow-client".to_string(), format!("disk={fp}")]);
    let addr = spawn_tcp(&mut srv, &args);
    let list = |certs: &str| {
        let o = run("nbdinfo", &["--list", &format!("nbds://{addr}/?tls-certificates={certs}")]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(info(&tls_uri(&addr, "disk", &pki.path("good"))).0, "{}", srv.log());
    assert!(list(&pki.path("good")).contains("export=\"disk\""));
    let (ok, said) = info(&tls_uri(&addr, "disk", &other));
    assert!(!ok, "another client of the CA got disk: {said}");
    assert!(srv.log().contains("may not use disk"), "{}", srv.log());
    assert!(info(&tls_uri(&addr, "open", &other)).0, "a volume without rules was refused");
    let seen = list(&other);
    assert!(seen.contains("export=\"open\"") && !seen.contains("export=\"disk\""), "{seen}");
    // Without client certificates the rule cannot hold: refused at start.
    srv.stop();
    let out = Command::new(&srv.bin)
        .arg("--store")
        .arg(&srv.store)
        .args(["serve", "--socket"])
        .arg(srv.path("x.sock"))
        .arg("--allow-client")
        .arg(format!("disk={fp}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    // A rule that names no block volume (a typo, or a version) would leave
    // the volume meant open to every client: refused at start.
    for typo in ["dsik", "disk@v1"] {
        let mut args = pki.server_args(true);
        args.extend(["--allow-client".to_string(), format!("{typo}={fp}")]);
        // Bounded: a server that starts anyway fails the test (124), not hangs.
        let out = Command::new("timeout")
            .arg("20")
            .arg(&srv.bin)
            .arg("--store")
            .arg(&srv.store)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{typo}: {err}");
        assert!(err.contains("no block volume"), "{typo}: {err}");
    }
    // The negative control: without the rule the same client gets disk.
    let addr = spawn_tcp(&mut srv, &pki.server_args(true));
    assert!(info(&tls_uri(&addr, "disk", &other)).0, "refused even without a rule");
}

/// A client that reads slower than the server writes gets every reply
/// whole over TLS: the server's writes often find the socket full, and
/// the TLS records it could not take yet must still go out once it has
/// nothing more to write (the writer flushes before it waits). This run
/// did not catch a writer without that flush: it guards the slow-reader
/// path, the flush is there for what it could not show.
#[test]
fn a_slow_reader_over_tls_gets_every_reply() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let pki = Pki::new(srv.dir.path());
    let addr = spawn_tcp(&mut srv, &pki.server_args(true));
    let uri = tls_uri(&addr, "disk", &pki.path("good"));
    let script = "import time\n\
                  h.pwrite(b'\\x3c' * (16 << 20), 0)\n\
                  for round in range(2):\n\
                  \x20   buf = nbd.Buffer(16 << 20)\n\
                  \x20   c = h.aio_pread(buf, 0)\n\
                  \x20   deadline = time.time() + 20\n\
                  \x20   while not h.aio_command_completed(c):\n\
                  \x20       assert time.time() < deadline, 'no whole reply within 20 s'\n\
                  \x20       time.sleep(0.002)\n\
                  \x20       h.poll(0)\n\
                  \x20   assert buf.to_bytearray() == b'\\x3c' * (16 << 20)\n\
                  print('ok')";
    assert_eq!(tls_nbdsh(&uri, script).trim(), "ok", "{}", srv.log());
}
