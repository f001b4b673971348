//! `forkfs fork vm fork-N` at random instants of the workload, through the
//! running server's control socket; afterwards every fork, attached
//! read-only, must pass `btrfs check --readonly`.

use crate::chaos::harness::{CMD, Chaos, sleep_until, tail};
use crate::common::attach::{Attached, ok_timeout, run_timeout};
use rand::Rng;
use rand::rngs::StdRng;
use std::time::{Duration, Instant};

impl Chaos {
    /// Forks the live volume at random instants until `until`.
    pub fn forks_until(&mut self, round: usize, until: Instant, rng: &mut StdRng) {
        // Copied next to the store at the start (see harness::run).
        let bin = self.srv.path("forkfs");
        assert!(
            bin.exists(),
            "forkfs is not built: run `cargo build --release --workspace --bins`"
        );
        loop {
            let next = Instant::now() + Duration::from_millis(rng.random_range(200..1200));
            if next >= until {
                return;
            }
            sleep_until(next);
            let name = format!("fork-{}", self.sum.forks.len() + self.sum.fork_failures.len() + 1);
            let store = self.srv.store.to_string_lossy().into_owned();
            let args = ["--store", &store, "fork", "vm", &name];
            let t = Instant::now();
            match ok_timeout(bin.to_str().unwrap(), &args, Duration::from_secs(60)) {
                Ok(_) => {
                    println!("  {name}: forked in {} ms", t.elapsed().as_millis());
                    self.sum.forks.push(name);
                }
                Err(e) => {
                    println!("  FORK FAILED round {round}: {e}");
                    self.sum.fork_failures.push(format!("round {round}: {e}"));
                }
            }
        }
    }

    /// Every fork, attached read-only, must pass `btrfs check`.
    pub fn check_forks(&mut self) {
        for (i, name) in self.sum.forks.clone().iter().enumerate() {
            let att =
                Attached::uri(self.srv.dir.path(), &self.srv.uri(name), &format!("k{i}"), true);
            let res = att.map_err(|e| format!("attach: {e}")).and_then(|a| {
                let out = run_timeout("btrfs", &["check", "--readonly", &a.loopdev], CMD * 10)?;
                if out.status.success() { Ok(()) } else { Err(tail(&out, 25)) }
            });
            match res {
                Ok(()) => println!("  {name}: btrfs check passed"),
                Err(e) => {
                    println!("  FAILURE {name}: btrfs check: {e}");
                    self.sum.fork_failures.push(format!("{name}: btrfs check: {e}"));
                }
            }
        }
    }
}
