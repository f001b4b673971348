//! Connection-kill chaos for the btrfs transaction-safe commit path
//! (issue 5): kernel btrfs on nbdfuse through a proxy that cuts every NBD
//! connection at random moments (or the server is SIGKILLed), then
//! `btrfs check` and a file-by-file comparison with what was durable.
//! Each run prints `rounds, corruptions, lost-fsynced-files: N, C, L`.
//! `scripts/chaos` runs hundreds of rounds. Environment:
//! FORKFS_CHAOS_ROUNDS (chaos_btrfs_mode, default 8), FORKFS_CHAOS_SEED
//! (repeats a run's random choices; the seed is printed first),
//! FORKFS_CHAOS_SERVE_FLAGS (another mode, e.g. `--consistency flush`),
//! FORKFS_CHAOS_REFERENCE=nbdkit (control run: nbdkit instead of forkfs-nbd
//! on the same kernel path), FORKFS_CHAOS_KEEP=1 (keep store and logs; kept
//! anyway after a failure), FORKFS_CHAOS_NEGATIVE_ROUNDS (default 30).

mod forks;
mod harness;
mod model;
mod proxy;
mod workload;

use harness::Config;

/// The mode under test (`&[]` would be the volume's setting, flush by default).
const BTRFS_MODE: &[&str] = &["--consistency", "btrfs"];
/// The test-only unsafe mode: FLUSH acknowledged without persisting.
const NAIVE_MODE: &[&str] = &["--consistency", "naive-timer"];
const NAIVE_ENV: &[(&str, &str)] = &[("FORKFS_UNSAFE_TEST_MODES", "1")];

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `--consistency btrfs`, or FORKFS_CHAOS_SERVE_FLAGS (whitespace-separated)
/// to run the same harness against another mode, e.g. `--consistency flush`.
fn mode_flags() -> Vec<String> {
    match std::env::var("FORKFS_CHAOS_SERVE_FLAGS") {
        Ok(f) => f.split_whitespace().map(String::from).collect(),
        Err(_) => BTRFS_MODE.iter().map(|s| s.to_string()).collect(),
    }
}

fn config(name: &'static str, rounds: usize) -> Config {
    Config {
        name,
        serve_flags: mode_flags(),
        server_env: &[],
        rounds,
        cut_ms: (300, 4000),
        kill_one_in: 4,
        forks: false,
        stop_at_first_failure: false,
    }
}

#[test]
fn chaos_btrfs_mode() {
    let rounds = env_or("FORKFS_CHAOS_ROUNDS", 8);
    let s = harness::run(&config("btrfs-mode", rounds));
    assert_eq!(s.rounds, rounds, "not every round ran");
    assert!(
        s.corruptions == 0 && s.lost == 0,
        "{} corruptions, {} lost durable files:\n{}",
        s.corruptions,
        s.lost,
        s.details.join("\n")
    );
}

/// The harness must tell an unsafe mode from a safe one: naive-timer
/// acknowledges FLUSH without persisting and persists blocks one at a time
/// on a timer, so btrfs breaks or fsynced files vanish within a few rounds.
#[test]
fn chaos_negative_control_naive_timer() {
    let mut cfg = config("naive-timer", env_or("FORKFS_CHAOS_NEGATIVE_ROUNDS", 30));
    cfg.serve_flags = NAIVE_MODE.iter().map(|s| s.to_string()).collect();
    cfg.server_env = NAIVE_ENV;
    cfg.stop_at_first_failure = true;
    let s = harness::run(&cfg);
    let Some((round, t)) = s.first_failure else {
        panic!("naive-timer survived {} rounds: the harness cannot see unsafe commits", s.rounds)
    };
    println!(
        "negative control: first failure in round {round} after {:.1} s ({} corruptions, {} lost)",
        t.as_secs_f64(),
        s.corruptions,
        s.lost
    );
    assert!(s.corruptions + s.lost > 0);
}

/// `forkfs fork vm fork-N` at random instants while btrfs is busy on the
/// live volume (through the running server's control socket): every fork,
/// attached read-only, passes `btrfs check --readonly`.
#[test]
fn random_forks_pass_btrfs_check() {
    let rounds = 3;
    let mut cfg = config("forks", rounds);
    cfg.forks = true;
    // Long enough for at least one fork per round (forks come 0.2–1.2 s apart).
    cfg.cut_ms = (1500, 4000);
    let s = harness::run(&cfg);
    assert!(s.fork_failures.is_empty(), "{}", s.fork_failures.join("\n"));
    assert!(s.forks.len() >= rounds, "only {} forks in {rounds} rounds", s.forks.len());
    assert!(s.corruptions == 0 && s.lost == 0, "{}", s.details.join("\n"));
}

/// The verifier itself, on a plain directory: a newer complete version is
/// fine, a durable file that vanished is a loss, content never written is
/// corruption, and the model then continues from what was found.
#[test]
fn model_tells_rollbacks_from_garbage() {
    use model::{Model, St};
    let dir = tempfile::tempdir().unwrap();
    let (live, snaps) = (dir.path().join("live"), dir.path().join("snaps"));
    std::fs::create_dir_all(&live).unwrap();
    std::fs::create_dir_all(&snaps).unwrap();
    let mut m = Model::default();
    m.push("a", St::data(b"durable".to_vec()));
    m.push("b", St::data(b"fsynced".to_vec()));
    m.push("d", St::data(b"renamed, then rewritten".to_vec()));
    m.synced();
    m.push("a", St::data(b"newer".to_vec()));
    m.push("c", St::data(b"maybe".to_vec()));
    m.taint("d");
    m.push("d", St::data(b"shorter".to_vec()));
    std::fs::write(live.join("a"), b"newer").unwrap();
    std::fs::write(live.join("c"), b"garbage").unwrap();
    // The new length over the old data: what btrfs leaves for renamed files.
    std::fs::write(live.join("d"), b"renamed").unwrap();
    let f = m.verify(&live, &snaps);
    assert!(f.lost.len() == 1 && f.lost[0].contains("live/b"), "{:?}", f.lost);
    assert!(f.corruptions.len() == 1 && f.corruptions[0].contains("live/c"), "{:?}", f.corruptions);
    assert!(f.notes.len() == 1 && f.notes[0].contains("live/d"), "{:?}", f.notes);
    let again = m.verify(&live, &snaps);
    assert!(again.lost.is_empty() && again.corruptions.is_empty());

    // Renamed over without a sync: gone is allowed (kernel btrfs does it,
    // scripts/btrfs-rename-loss), garbage is still corruption, and a name
    // that only lost its file (no rename over it) still counts as lost.
    m.push("e", St::data(b"fsynced e".to_vec()));
    m.push("f", St::data(b"fsynced f".to_vec()));
    m.push("g", St::data(b"fsynced g".to_vec()));
    m.synced();
    for name in ["e", "f"] {
        m.renamed_over(name);
        m.taint(name);
        m.push(name, St::data(b"the file renamed over it".to_vec()));
    }
    std::fs::write(live.join("f"), b"neither of the two").unwrap();
    let f = m.verify(&live, &snaps);
    assert!(
        f.notes.iter().any(|n| n.contains("live/e") && n.contains("renamed over")),
        "{:?}",
        f.notes
    );
    assert!(f.corruptions.len() == 1 && f.corruptions[0].contains("live/f"), "{:?}", f.corruptions);
    assert!(f.lost.len() == 1 && f.lost[0].contains("live/g"), "{:?}", f.lost);
}
