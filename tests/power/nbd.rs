//! A disk served over NBD under power cuts: random 4 KiB writes from libnbd
//! (nbdsh), a FLUSH now and then; the power goes at a random moment. Every
//! block must then read as its last write a FLUSH acknowledged, or as a
//! later write; blocks nobody wrote as before.

use crate::{Machine, kill, rounds, seed};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const SIZE: u64 = 16 << 20;
const BS: u64 = 4096;

/// The client: prints `w OFFSET BYTE` before each write, `f` after each
/// FLUSH returns.
const CLIENT: &str = r#"
import random
random.seed(SEED)
n = h.get_size() // 4096
while True:
    off = random.randrange(n) * 4096
    b = random.randrange(1, 256)
    print("w", off, b, flush=True)
    h.pwrite(bytes([b]) * 4096, off)
    if random.random() < 0.25:
        h.flush()
        print("f", flush=True)
"#;

/// The client's lines about the block at `off` and every flush, numbered.
fn history(lines: &[String], off: u64) -> Vec<(usize, String)> {
    let at = format!("w {off} ");
    let mine = |l: &String| l.starts_with(&at) || l == "f";
    let all: Vec<(usize, String)> =
        lines.iter().enumerate().filter(|(_, l)| mine(l)).map(|(i, l)| (i, l.clone())).collect();
    // Runs of flushes between the block's writes, shortened to one.
    let mut out: Vec<(usize, String)> = Vec::new();
    for (i, l) in all {
        if l == "f" && out.last().is_some_and(|(_, p)| p == "f") {
            continue;
        }
        out.push((i, l));
    }
    out
}

/// Per block: the values it may hold after a cut.
fn allowed(lines: &[String], base: &[u8]) -> Result<HashMap<u64, Vec<u8>>, String> {
    let mut writes: Vec<(u64, u8)> = Vec::new();
    let mut acked = 0; // writes before the last completed FLUSH
    for l in lines {
        let parts: Vec<&str> = l.split_whitespace().collect();
        match parts.as_slice() {
            ["w", off, b] => writes
                .push((off.parse().map_err(|_| l.clone())?, b.parse().map_err(|_| l.clone())?)),
            ["f"] => acked = writes.len(),
            _ => {}
        }
    }
    let mut out: HashMap<u64, Vec<u8>> = HashMap::new();
    for (i, &(off, b)) in writes.iter().enumerate() {
        let e = out.entry(off).or_insert_with(|| vec![base[off as usize]]);
        if i < acked {
            // Acknowledged: nothing older may remain.
            *e = vec![b];
        } else {
            e.push(b);
        }
    }
    Ok(out)
}

#[test]
fn power_cuts_under_an_nbd_disk_lose_no_flushed_write() {
    crate::common::mount::require_tool("nbdsh");
    let mut m = Machine::new();
    m.ok(&["init"]);
    m.ok(&["volume", "create", "disk", "--block", "--size", &SIZE.to_string()]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let nbd = crate::common::forkfs_bin().with_file_name("forkfs-nbd");
    let mut base = vec![0u8; SIZE as usize];
    let rounds = rounds();
    let (mut total_writes, mut total_flushes) = (0, 0);
    // Off the power-cut filesystem, and gone with the test (a failure
    // quotes them first).
    let logs = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        let sock = m.store().parent().unwrap().join("nbd.sock");
        let _ = std::fs::remove_file(&sock);
        let server_log = logs.path().join("server.log");
        let mut server = Command::new(&nbd)
            .arg("--store")
            .arg(m.store())
            .args(["serve", "--socket"])
            .arg(&sock)
            // Every other round checkpoints at every FLUSH: the cut then
            // often comes mid-checkpoint, and new segments are spares
            // written over (see the data log's recycling).
            .args(["--checkpoint-after-flush", if round % 2 == 1 { "0s" } else { "1s" }])
            .stderr(std::fs::File::create(&server_log).unwrap())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "forkfs-nbd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let uri = format!("nbd+unix:///disk?socket={}", sock.display());
        let client_log = server_log.with_extension("client.log");
        let mut client = Command::new("nbdsh")
            .env("PATH", format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default()))
            .args(["-u", &uri, "-c", &CLIENT.replace("SEED", &rng.random::<u32>().to_string())])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&client_log).unwrap())
            .spawn()
            .unwrap();
        let out = client.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(out).lines().map_while(Result::ok).collect::<Vec<String>>()
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
        // The client writes until the cut: ended before it, a request failed.
        if client.try_wait().unwrap().is_some() {
            kill(server.id());
            let _ = server.wait();
            let err = std::fs::read_to_string(&client_log).unwrap_or_default();
            let log = std::fs::read_to_string(&server_log).unwrap_or_default();
            panic!("round {round}: the client failed before the cut: {err}\nserver log: {log}");
        }
        kill(server.id());
        let _ = server.wait();
        let _ = client.kill();
        let _ = client.wait();
        let lines = reader.join().unwrap();
        let dropped = m.cut_power();
        let allowed = allowed(&lines, &base).unwrap();
        let (ok, problems) = m.fsck();
        assert!(ok, "round {round}: fsck after the cut: {problems:?}");
        let img = m.store().parent().unwrap().join("disk.img");
        let _ = std::fs::remove_file(&img);
        let export = m.forkfs(&["export", "disk", img.to_str().unwrap()]).output().unwrap();
        let export_log = String::from_utf8_lossy(&export.stderr).into_owned();
        assert!(export.status.success(), "round {round}: export: {export_log}");
        let now = std::fs::read(&img).unwrap();
        std::fs::remove_file(&img).unwrap();
        for (off, values) in &allowed {
            let block = &now[*off as usize..(*off + BS) as usize];
            let ok = values.iter().any(|b| block.iter().all(|x| x == b));
            if !ok {
                let log = std::fs::read_to_string(&server_log).unwrap_or_default();
                panic!(
                    "round {round}: block at {off} reads {}, allowed {values:?}\n\
                     its writes (line, value) with the flushes: {:?}\n\
                     export said: {export_log}\nserver log: {log}\nbytes dropped: {dropped}",
                    block[0],
                    history(&lines, *off)
                );
            }
        }
        for (i, (a, b)) in now.chunks(BS as usize).zip(base.chunks(BS as usize)).enumerate() {
            if !allowed.contains_key(&(i as u64 * BS)) {
                assert_eq!(a, b, "round {round}: block {i}, which nobody wrote, changed");
            }
        }
        let writes = lines.iter().filter(|l| l.starts_with('w')).count();
        total_writes += writes;
        total_flushes += lines.iter().filter(|l| *l == "f").count();
        println!("round {round}: {writes} writes; {dropped} unsynced bytes lost");
        base = now;
    }
    // A client that never wrote would make every round pass.
    assert!(total_writes > 0 && total_flushes > 0, "the client wrote nothing (nbdsh failed?)");
    println!(
        "power cuts (nbd): {rounds} rounds, {total_writes} writes, {total_flushes} flushes, 0 flushed writes lost"
    );
}
