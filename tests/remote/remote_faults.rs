//! A remote store behind a fault-injecting HTTP proxy: between forkfs and
//! a real S3 API (moto's server), the proxy answers some requests with 503
//! SlowDown or 500, drops connections before or after forwarding, and
//! delays others. forkfs retries; commands may still fail, but data stays
//! correct and nothing a command reported as committed is lost: a second
//! host, joined directly to the S3 server, reads every such version back
//! bit for bit and `fsck --deep` finds nothing wrong.

use crate::common::forkfs;
use crate::common::proxy::{forward, read_request};
use crate::common::s3::S3;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Counts of what the proxy did.
#[derive(Default)]
struct Faults {
    forwarded: AtomicU64,
    errors: AtomicU64,
    dropped: AtomicU64,
    delayed: AtomicU64,
}

/// The proxy: listens on a free port, forwards to `upstream`, misbehaves
/// at random (seeded). Runs until the test ends.
fn proxy(upstream: u16, seed: u64, faults: Arc<Faults>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let rng = Arc::new(AtomicU64::new(seed | 1));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (rng, faults) = (rng.clone(), faults.clone());
            std::thread::spawn(move || {
                let _ = serve(conn, upstream, &rng, &faults);
            });
        }
    });
    port
}

fn next(rng: &AtomicU64) -> u64 {
    let mut x = rng.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng.store(x, Ordering::Relaxed);
    x
}

/// One client connection of the faulty proxy.
fn serve(conn: TcpStream, upstream: u16, rng: &AtomicU64, faults: &Faults) -> std::io::Result<()> {
    let mut rd = BufReader::new(conn.try_clone()?);
    let mut wr = conn;
    let Some((head, body)) = read_request(&mut rd)? else { return Ok(()) };
    match next(rng) % 100 {
        0..8 => {
            faults.errors.fetch_add(1, Ordering::Relaxed);
            let (code, what) = if next(rng) % 2 == 0 {
                ("503 Slow Down", "SlowDown")
            } else {
                ("500 Internal Server Error", "InternalError")
            };
            let xml = format!("<Error><Code>{what}</Code><Message>injected</Message></Error>");
            write!(
                wr,
                "HTTP/1.1 {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                xml.len()
            )?;
            return Ok(());
        }
        8..12 => {
            faults.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(()); // the request never arrives
        }
        12..16 => {
            faults.delayed.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(300 + next(rng) % 700));
        }
        _ => {}
    }
    let resp = forward(upstream, &head, &body)?;
    faults.forwarded.fetch_add(1, Ordering::Relaxed);
    // Now and then the answer is lost after the server acted on it.
    if next(rng) % 100 < 3 {
        faults.dropped.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    wr.write_all(&resp) // upstream closed: so do we (the client reconnects)
}

/// A proxy that forwards everything, except that while `stall` is set it
/// never answers ranged reads (a store that stopped answering reads).
fn stalling_proxy(upstream: u16, stall: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let stall = stall.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut rd = BufReader::new(conn.try_clone()?);
                let mut wr = conn;
                let Some((head, body)) = read_request(&mut rd)? else { return Ok(()) };
                let ranged =
                    String::from_utf8_lossy(&head).to_ascii_lowercase().contains("\r\nrange:");
                if ranged && stall.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_secs(120));
                    return Ok(());
                }
                wr.write_all(&forward(upstream, &head, &body)?)
            });
        }
    });
    port
}

fn image(i: u64) -> Vec<u8> {
    let mut data = crate::common::random(3 << 20, i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for block in data.chunks_mut(65536) {
        block[..16384].fill(0); // some holes and repeats too
    }
    data
}

#[test]
fn committed_data_survives_a_faulty_network_to_the_bucket() {
    let m = S3::start("faulty");
    let seed = std::env::var("FORKFS_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64,
    );
    eprintln!("fault seed {seed} (FORKFS_FAULT_SEED={seed} repeats it)");
    let faults = Arc::new(Faults::default());
    let via = proxy(m.port, seed, faults.clone());
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let remote = |port: u16| {
        vec![
            "init".to_string(),
            "--remote".into(),
            "s3://faulty/s".into(),
            "--endpoint".into(),
            format!("http://127.0.0.1:{port}"),
            "--allow-http".into(),
        ]
    };
    let init_a: Vec<String> = remote(via);
    let init_a: Vec<&str> = init_a.iter().map(String::as_str).collect();
    // Even init may need a few tries through this network.
    let mut tries = 0;
    while !forkfs(&a, &init_a).status.success() {
        tries += 1;
        assert!(tries < 10, "init never got through");
        let _ = std::fs::remove_dir_all(&a);
    }
    // Through the faulty proxy: imports into several volumes, some twice.
    let mut committed: Vec<(String, u64)> = Vec::new();
    let mut failed = 0;
    for i in 0..8u64 {
        let vol = format!("v{}", i % 5);
        let img = dir.path().join(format!("img{i}"));
        std::fs::write(&img, image(i)).unwrap();
        let out = forkfs(&a, &["--json", "import", &vol, img.to_str().unwrap()]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let id = v["version"].as_str().expect("import names its version");
            committed.push((format!("{vol}@{id}"), i));
        } else {
            failed += 1;
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.trim_end().lines().count(), 1, "not a one-line error: {err}");
            eprintln!("import {i} failed (allowed): {}", err.trim_end());
        }
    }
    eprintln!(
        "proxy: {} forwarded, {} error replies, {} dropped, {} delayed; {} imports committed, {failed} failed",
        faults.forwarded.load(Ordering::Relaxed),
        faults.errors.load(Ordering::Relaxed),
        faults.dropped.load(Ordering::Relaxed),
        faults.delayed.load(Ordering::Relaxed),
        committed.len()
    );
    assert!(faults.errors.load(Ordering::Relaxed) + faults.dropped.load(Ordering::Relaxed) > 0);
    assert!(committed.len() >= 4, "retries should get most imports through");

    // Host B talks to the S3 server directly: every committed version is there.
    let init_b: Vec<String> = remote(m.port);
    let init_b: Vec<&str> = init_b.iter().map(String::as_str).collect();
    let out = forkfs(&b, &init_b);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (spec, i) in &committed {
        let out = dir.path().join("out.img");
        let _ = std::fs::remove_file(&out);
        let r = forkfs(&b, &["export", spec, out.to_str().unwrap()]);
        assert!(r.status.success(), "{spec}: {}", String::from_utf8_lossy(&r.stderr));
        assert!(std::fs::read(&out).unwrap() == image(*i), "{spec} reads back wrong");
    }
    let r = forkfs(&b, &["--json", "fsck", "--deep"]);
    let check: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(check["problems"].as_array().map(|p| p.len()), Some(0), "{check}");
}

/// A read the object store does not answer fails after the read deadline
/// (here 2 s; retries included) with a clear error, instead of hanging; and
/// reads work again once the store answers.
#[test]
fn reads_fail_at_the_deadline_instead_of_hanging() {
    let m = S3::start("stalls");
    let stall = Arc::new(AtomicBool::new(false));
    let via = stalling_proxy(m.port, stall.clone());
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{via}");
    let init = ["init", "--remote", "s3://stalls/s", "--endpoint", &endpoint, "--allow-http"];
    let mut init = init.to_vec();
    init.extend_from_slice(&["--read-deadline", "2s"]);
    let writer = dir.path().join("a");
    let out = forkfs(&writer, &init);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let img = dir.path().join("img");
    std::fs::write(&img, image(1)).unwrap();
    assert!(forkfs(&writer, &["import", "v", img.to_str().unwrap()]).status.success());
    // The writer keeps what it wrote in its disk cache: read on a second
    // host, which has to fetch.
    let store = dir.path().join("b");
    let out = forkfs(&store, &init);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let export = || {
        let out = dir.path().join("out.img");
        let _ = std::fs::remove_file(&out);
        let t = std::time::Instant::now();
        (forkfs(&store, &["export", "v@~0", out.to_str().unwrap()]), t.elapsed(), out)
    };

    stall.store(true, Ordering::SeqCst);
    let (o, took, _) = export();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a read nobody answers cannot succeed");
    assert!(err.contains("read deadline"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(took < Duration::from_secs(15), "gave up after {took:?}, not at the 2 s deadline");

    stall.store(false, Ordering::SeqCst);
    let (o, _, out) = export();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&out).unwrap() == image(1));
}
