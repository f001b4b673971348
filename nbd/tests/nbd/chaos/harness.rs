//! One chaos round: the workload runs on kernel btrfs mounted from a loop
//! device on an nbdfuse file, whose NBD connections go through a
//! fault-injecting proxy to a real `forkfs-nbd`. At a random moment the
//! proxy cuts every connection (or the server is SIGKILLed and restarted);
//! then the device is torn down, attached afresh, `btrfs check --readonly`
//! must pass, and the mounted filesystem must match the model. The next
//! round continues from what was found.

use crate::chaos::model::Model;
use crate::chaos::proxy::{Proxy, free_port};
use crate::chaos::workload::{Stats, Workload};
use crate::common::attach::{Attached, ok_timeout, run_timeout};
use crate::common::{Server, need};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// 1 GiB: mkfs discards it in metadata only.
const VOLUME: u64 = 1 << 30;

pub struct Config {
    pub name: &'static str,
    /// `forkfs-nbd serve` flags of the mode under test.
    pub serve_flags: Vec<String>,
    /// Environment of the server process.
    pub server_env: &'static [(&'static str, &'static str)],
    pub rounds: usize,
    /// The cut comes this many milliseconds into the workload (uniform).
    pub cut_ms: (u64, u64),
    /// One round in this many SIGKILLs the server instead of cutting.
    pub kill_one_in: u32,
    /// Run `forkfs fork vm fork-N` at random instants of the workload.
    pub forks: bool,
    pub stop_at_first_failure: bool,
}

#[derive(Default)]
pub struct Summary {
    pub rounds: usize,
    pub corruptions: usize,
    pub lost: usize,
    pub details: Vec<String>,
    /// Round and elapsed time of the first corruption or loss.
    pub first_failure: Option<(usize, Duration)>,
    pub forks: Vec<String>,
    pub fork_failures: Vec<String>,
}

pub struct Chaos {
    /// nbdkit's arguments (IMG: the disk image) instead of forkfs-nbd.
    pub reference: Option<Vec<String>>,
    pub srv: Server,
    pub args: Vec<String>,
    pub port: u16,
    pub mnt: PathBuf,
    pub sum: Summary,
    pub t0: Instant,
}

pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn syncfs(dir: &Path) -> Result<(), String> {
    let d = std::fs::File::open(dir).map_err(|e| e.to_string())?;
    // SAFETY: syncfs(2) on a descriptor we own.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(format!("syncfs: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The btrfs fsid in the primary superblock of `dev`.
fn fsid(dev: &str) -> Option<String> {
    let mut b = [0u8; 16];
    std::fs::File::open(dev).ok()?.read_exact_at(&mut b, 0x10000 + 32).ok()?;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Some(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
}

pub fn tail(out: &std::process::Output, lines: usize) -> String {
    let all =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let v: Vec<&str> = all.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

impl Chaos {
    fn fail(&mut self, round: usize, corruption: bool, what: String) {
        println!("  FAILURE round {round}: {what}");
        self.sum.details.push(format!("round {round}: {what}"));
        if corruption {
            self.sum.corruptions += 1;
        } else {
            self.sum.lost += 1;
        }
        self.sum.first_failure.get_or_insert((round, self.t0.elapsed()));
    }

    fn start_server(&mut self) {
        if self.reference.is_some() {
            self.start_nbdkit();
        } else {
            let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
            self.srv.spawn(&args);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "no TCP listener: {}", self.srv.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The control experiment, FORKFS_CHAOS_REFERENCE=nbdkit (or the full
    /// argument list, e.g. `--filter=delay file IMG delay-write=2ms`):
    /// nbdkit instead of forkfs-nbd, same proxy, same kernel path. Its file
    /// plugin keeps every write it received, even when killed (page cache),
    /// so what fails against it is the kernel path or the model, not forkfs.
    fn start_nbdkit(&mut self) {
        need("nbdkit");
        let img = self.srv.path("reference.img");
        if !img.exists() {
            std::fs::File::create(&img).unwrap().set_len(VOLUME).unwrap();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.srv.path("server.log"))
            .unwrap();
        let img = img.to_string_lossy().into_owned();
        let args = self.reference.as_ref().unwrap().iter().map(|a| a.replace("IMG", &img));
        let child = std::process::Command::new("nbdkit")
            .args(["-f", "-i", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stderr(log)
            .spawn()
            .expect("nbdkit");
        self.srv.child = Some(child);
    }

    /// What the server and nbdfuse logged, for failure messages.
    fn diag(&self, tag: &str) -> String {
        let fuse = std::fs::read_to_string(self.srv.path(&format!("fuse-{tag}.log")));
        let log = self.srv.log();
        let v: Vec<&str> = log.lines().collect();
        format!(
            "nbdfuse {tag}:\n{}\nserver log (tail):\n{}",
            fuse.unwrap_or_default(),
            v[v.len().saturating_sub(30)..].join("\n")
        )
    }

    /// Waits until the server has ended every connection it attached to
    /// `vm` (since it started): a connection it noticed only after the next
    /// client attached would fail that client (btrfs mode) or race it.
    fn wait_detached(&self, round: usize) {
        if self.reference.is_some() {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.srv.log();
            let since = log.rfind("listening (tcp)").map_or(&log[..], |i| &log[i..]);
            let on_vm = |l: &&str| {
                l.split("export=").nth(1).and_then(|t| t.split_whitespace().next()) == Some("vm")
            };
            let lines: Vec<&str> = since.lines().filter(on_vm).collect();
            let attached = lines.iter().filter(|l| l.contains(" attached ")).count();
            let ended = lines
                .iter()
                .filter(|l| l.contains(" detached ") || l.contains(" connection ended "))
                .count();
            if attached == ended {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: the server still has {} of {attached} connections 30 s after the cut\n{}",
                attached - ended,
                self.diag(&tag(round - 1))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn attach(&self, uri: &str, tag: &str) -> Attached {
        Attached::uri(self.srv.dir.path(), uri, tag, false)
            .unwrap_or_else(|e| panic!("attach {tag}: {e}\nserver log:\n{}", self.srv.log()))
    }

    /// A new filesystem: subvolume `live` for the files, `snaps` for snapshots.
    fn mkfs(&self, att: &mut Attached) -> Model {
        ok_timeout("mkfs.btrfs", &["-f", "-q", &att.loopdev], Duration::from_secs(120)).unwrap();
        att.mount(&self.mnt, "rw").unwrap();
        let live = self.mnt.join("live");
        ok_timeout("btrfs", &["subvolume", "create", live.to_str().unwrap()], CMD).unwrap();
        std::fs::create_dir(self.mnt.join("snaps")).unwrap();
        Model::default()
    }

    /// After a cut: `btrfs check`, mount, compare with the model. Returns
    /// the model to continue with (a new filesystem if this one is unusable).
    fn check_and_verify(&mut self, round: usize, att: &mut Attached, mut model: Model) -> Model {
        let dev = att.loopdev.clone();
        match run_timeout("btrfs", &["check", "--readonly", &dev], Duration::from_secs(600)) {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                self.fail(round, true, format!("btrfs check failed:\n{}", tail(&out, 25)));
                return self.mkfs(att);
            }
            Err(e) => {
                self.fail(round, true, format!("btrfs check: {e}"));
                return self.mkfs(att);
            }
        }
        if let Err(e) = att.mount(&self.mnt, "rw") {
            self.fail(round, true, format!("mount failed: {e}"));
            return self.mkfs(att);
        }
        let f = model.verify(&self.mnt.join("live"), &self.mnt.join("snaps"));
        if !f.corruptions.is_empty() {
            // The kernel's view (data checksum failures name root, inode, offset).
            let dmesg = run_timeout("dmesg", &[], Duration::from_secs(10));
            let text = dmesg.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            let lines: Vec<String> = text
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("csum failed") || l.contains("BTRFS error"))
                .map(String::from)
                .collect();
            let last = &lines[lines.len().saturating_sub(4)..];
            println!("  kernel: {}", last.join("\n  kernel: "));
        }
        for n in &f.notes {
            println!("  note (allowed): {n}");
        }
        for c in f.corruptions {
            self.fail(round, true, c);
        }
        for l in f.lost {
            self.fail(round, false, l);
        }
        println!(
            "  btrfs check ok; verified {} files ({} names had durable content), {} snapshots",
            f.files,
            f.durable_checked,
            model.snaps.len()
        );
        model
    }
}

pub const CMD: Duration = Duration::from_secs(60);

/// The attachment made after round `round`'s cut (r0: the first).
fn tag(round: usize) -> String {
    format!("r{round}")
}

fn stats(s: &Stats) -> String {
    format!(
        "workload {} ops: {} writes, {} overwrites, {} fsyncs, {} syncs, {} renames, {} deletes, \
         {} snapshots, {} MiB, stopped by {}",
        s.ops,
        s.writes,
        s.overwrites,
        s.fsyncs,
        s.syncs,
        s.renames,
        s.deletes,
        s.snapshots,
        s.bytes >> 20,
        s.stopped_by.as_deref().unwrap_or("the cut flag")
    )
}

pub fn run(cfg: &Config) -> Summary {
    for tool in ["nbdfuse", "losetup", "fusermount3", "mkfs.btrfs", "btrfs", "mount", "umount"] {
        need(tool);
    }
    let seed = std::env::var("FORKFS_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>() >> 1);
    println!(
        "chaos {}: seed {seed} (FORKFS_CHAOS_SEED={seed} repeats the choices), {} rounds, \
         serve flags {:?}, env {:?}",
        cfg.name, cfg.rounds, cfg.serve_flags, cfg.server_env
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut srv = Server::create(&[("vm", VOLUME)]);
    srv.env = cfg.server_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let port = free_port();
    let mut args = vec!["--listen".to_string(), format!("127.0.0.1:{port}")];
    args.extend(cfg.serve_flags.iter().cloned());
    // Pinned copies: a build in the shared target directory during a long
    // run must not swap (or briefly remove) the binaries under it.
    for name in ["forkfs-nbd", "forkfs", "forkfs-core"] {
        let built = Path::new(env!("CARGO_BIN_EXE_forkfs-nbd")).with_file_name(name);
        if built.exists() {
            std::fs::copy(&built, srv.path(name)).unwrap();
        }
    }
    srv.bin = srv.path("forkfs-nbd");
    let mnt = srv.path("mnt");
    let keep = std::env::var_os("FORKFS_CHAOS_KEEP").is_some();
    srv.dir.disable_cleanup(keep);
    let reference = std::env::var("FORKFS_CHAOS_REFERENCE").ok().map(|v| match v.as_str() {
        "nbdkit" => vec!["file".to_string(), "IMG".to_string()],
        args => args.split_whitespace().map(String::from).collect(),
    });
    if let Some(args) = &reference {
        println!("control run: nbdkit {args:?} serves the disk instead of forkfs-nbd");
    }
    let mut c =
        Chaos { reference, srv, args, port, mnt, sum: Summary::default(), t0: Instant::now() };
    c.start_server();
    let proxy = Proxy::start(([127, 0, 0, 1], port).into());
    let uri = format!("nbd://127.0.0.1:{}/vm", proxy.port);

    let mut att = c.attach(&uri, "r0");
    let mut model = c.mkfs(&mut att);
    for round in 1..=cfg.rounds {
        let r0 = Instant::now();
        // Makes what was found (and what mount replayed) durable: a round
        // judges only its own work.
        std::fs::write(c.mnt.join("round"), round.to_string()).unwrap();
        syncfs(&c.mnt).unwrap_or_else(|e| {
            panic!("round {round}: sync before the workload: {e}\n{}", c.diag(&tag(round - 1)))
        });
        model.synced();
        let cut = Arc::new(AtomicBool::new(false));
        let w = Workload {
            mnt: c.mnt.clone(),
            model,
            stats: Stats::default(),
            rng: StdRng::seed_from_u64(rng.random()),
            cut: cut.clone(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(w.run());
        });
        let delay = Duration::from_millis(rng.random_range(cfg.cut_ms.0..cfg.cut_ms.1));
        let kill = rng.random_ratio(1, cfg.kill_one_in);
        let cut_at = Instant::now() + delay;
        if cfg.forks {
            c.forks_until(round, cut_at, &mut rng);
        }
        sleep_until(cut_at);
        // The flag first: a sync that returns after it does not count.
        cut.store(true, Ordering::SeqCst);
        if kill {
            c.srv.kill();
        }
        let socks = proxy.cut();
        let w = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            att.kill_fuse();
            let w = rx.recv_timeout(Duration::from_secs(60));
            w.unwrap_or_else(|_| panic!("round {round}: the workload hangs 90 s after the cut"))
        });
        println!(
            "round {round}/{}: {} after {} ms ({socks} sockets); {}",
            cfg.rounds,
            if kill { "SIGKILL" } else { "cut" },
            delay.as_millis(),
            stats(&w.stats)
        );
        for u in &w.stats.unexpected {
            c.fail(round, true, u.clone());
        }
        model = w.model;
        if let Some(st) = c.srv.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten()) {
            panic!("round {round}: the server exited by itself ({st})\n{}", c.diag(&tag(round)));
        }
        let old_fsid = fsid(&att.loopdev);
        for p in att.detach() {
            println!("  teardown: {p}");
        }
        if kill {
            c.start_server();
        } else {
            c.wait_detached(round);
        }
        // A zombie of the old mount would make the next mount not a fresh one.
        if let Some(id) = old_fsid {
            let gone = Instant::now() + Duration::from_secs(30);
            while Path::new("/sys/fs/btrfs").join(&id).exists() {
                assert!(Instant::now() < gone, "round {round}: btrfs {id} is still mounted");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        att = c.attach(&uri, &tag(round));
        let before = c.sum.corruptions + c.sum.lost;
        model = c.check_and_verify(round, &mut att, model);
        c.sum.rounds = round;
        let bad = c.sum.corruptions + c.sum.lost - before;
        println!("  round {round}: {bad} failures, {:.1} s", r0.elapsed().as_secs_f64());
        if cfg.stop_at_first_failure && c.sum.first_failure.is_some() {
            break;
        }
    }
    for p in att.detach() {
        println!("final teardown: {p}");
    }
    drop(att);
    if cfg.forks {
        c.check_forks();
    }
    if !c.sum.details.is_empty() {
        println!("failures:\n  {}", c.sum.details.join("\n  "));
        println!("server log (tail):\n{}", {
            let log = c.srv.log();
            let v: Vec<&str> = log.lines().collect();
            v[v.len().saturating_sub(40)..].join("\n")
        });
    }
    println!(
        "chaos {}: {} rounds in {:.0} s, seed {seed}",
        cfg.name,
        c.sum.rounds,
        c.t0.elapsed().as_secs_f64()
    );
    println!(
        "rounds, corruptions, lost-fsynced-files: {}, {}, {}",
        c.sum.rounds, c.sum.corruptions, c.sum.lost
    );
    drop(proxy);
    if keep || (c.sum.first_failure.is_some() && !cfg.stop_at_first_failure) {
        c.srv.dir.disable_cleanup(true);
        println!("kept {} (store, server.log, nbdfuse logs)", c.srv.dir.path().display());
    }
    c.sum
}
