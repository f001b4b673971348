//! PostgreSQL on a kernel FUSE mount: a cluster (fsync on, data checksums)
//! takes pgbench load, and a snapshot taken in the middle of it is a crash
//! image: a fork of it, mounted while the original still runs, recovers
//! with PostgreSQL's own crash recovery to a consistent database (the
//! pgbench balances agree; amcheck finds the heap and every B-tree sound).

use crate::common::mount::{Mounted, new_store, run};
use crate::common::ok;
use crate::common::postgres::{Postgres, initdb, pg_bin};
use std::time::{Duration, Instant};

const SCALE: u64 = 5;
const LOAD_SECS: u64 = 15;

/// Asserts the pgbench database is consistent; returns its history rows.
fn check_consistent(pg: &Postgres) -> u64 {
    assert_eq!(pg.sql("SELECT count(*) FROM pgbench_accounts"), (SCALE * 100_000).to_string());
    // Each transaction adds one delta to an account, a teller, a branch and
    // the history: in any consistent state the four sums agree.
    let sums = pg.sql(
        "SELECT (SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts),
                (SELECT coalesce(sum(tbalance), 0) FROM pgbench_tellers),
                (SELECT coalesce(sum(bbalance), 0) FROM pgbench_branches),
                (SELECT coalesce(sum(delta), 0) FROM pgbench_history)",
    );
    let s: Vec<&str> = sums.split('|').collect();
    assert!(s.len() == 4 && s.iter().all(|x| *x == s[0]), "pgbench sums disagree: {sums}");
    pg.sql("CREATE EXTENSION IF NOT EXISTS amcheck");
    let btrees = pg.sql(
        "SELECT count(*) FROM (SELECT bt_index_check(c.oid, true) FROM pg_index i
         JOIN pg_class c ON c.oid = i.indexrelid
         WHERE c.relam = (SELECT oid FROM pg_am WHERE amname = 'btree')) s",
    );
    assert!(btrees.parse::<u32>().unwrap() > 3, "{btrees} B-trees checked");
    let heap = "SELECT count(*) FROM pg_class c, verify_heapam(c.oid) WHERE c.relkind = 'r'";
    assert_eq!(pg.sql(heap), "0", "verify_heapam reports corruption");
    pg.sql("SELECT count(*) FROM pgbench_history").parse().unwrap()
}

#[test]
fn postgres_snapshot_under_load_recovers_consistent() {
    let t0 = Instant::now();
    let bin = pg_bin();
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "pg", &["--checkpoint-every", "0"]);
    let data = m.path("data");
    initdb(&bin, &data);
    let pg = Postgres::start(&bin, &data);
    run(pg.client("pgbench").args(["-i", "-q", "-s", &SCALE.to_string(), "postgres"]));

    // Load; a checkpoint a quarter in, the snapshot half way.
    let load = pg
        .client("pgbench")
        .args(["-c", "4", "-j", "2", "-T", &LOAD_SECS.to_string(), "postgres"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("pgbench starts");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(LOAD_SECS / 4));
    pg.sql("CHECKPOINT");
    std::thread::sleep(Duration::from_secs(LOAD_SECS / 2).saturating_sub(started.elapsed()));
    ok(&store, &["snapshot", "pg", "--name", "mid"]);
    let snapshot_at = started.elapsed();
    let out = load.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pgbench: {report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("number of failed transactions: 0 "), "{report}");
    let done = check_consistent(&pg);

    // The fork of the snapshot, mounted beside the running original. Its
    // lock file names the original's live postmaster: a clone's is stale.
    ok(&store, &["fork", "pg@mid", "pgfork"]);
    let m2 = Mounted::new(&store, "pgfork", &["--checkpoint-every", "0"]);
    std::fs::remove_file(m2.path("data/postmaster.pid")).unwrap();
    let pg2 = Postgres::start(&bin, &m2.path("data"));
    let log = pg2.log();
    assert!(log.contains("database system was not properly shut down"), "{log}");
    assert!(log.contains("redo done"), "{log}");
    let at_snapshot = check_consistent(&pg2);
    assert!(0 < at_snapshot && at_snapshot < done, "{at_snapshot} of {done} transactions");
    // The original is untouched by the fork's recovery.
    assert_eq!(check_consistent(&pg), done);

    pg2.stop();
    pg.stop();
    m2.unmount();
    m.unmount();
    eprintln!(
        "{done} transactions, snapshot at {snapshot_at:?} with {at_snapshot}; test took {:?}",
        t0.elapsed()
    );
}
