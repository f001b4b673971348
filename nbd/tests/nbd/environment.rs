//! One environment in one process: forkfs-nbd serves a database disk and
//! hosts the FUSE mount of the application's workspace (`forkfs mount`
//! asks the process holding the store), so a group snapshot cuts both at
//! one point. PostgreSQL runs on ext4 over the served disk (nbdfuse +
//! loop); a writer commits row N, then records N in the workspace. Every
//! group version, forked and started (the disk's journal replayed, the
//! database's WAL recovered), must show the database at the workspace's
//! row or one past it (committed, not yet recorded); never behind it,
//! never further ahead. A group restore must agree the same way. And
//! the hosting itself: mounts come and go while the server runs, keep it
//! from `--exit-when-idle`, and end with its SIGTERM, each saved.

use crate::common::attach::Attached;
use crate::common::{Server, need, ok};
use crate::consistency::{forkfs, forkfs_bin};
use crate::postgres::{Postgres, chown_postgres, initdb, pg_bin};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const SNAPSHOTS: usize = 4;

/// A mount hosted by the server; unmounted (detached if need be) on drop.
struct Hosted {
    dir: PathBuf,
    store: PathBuf,
}

impl Hosted {
    fn new(srv: &Server, spec: &str, dir: &Path, extra: &[&str]) -> Hosted {
        std::fs::create_dir_all(dir).unwrap();
        let d = dir.to_str().unwrap();
        let mut args = vec!["mount", spec, d, "--daemon", "--checkpoint-every", "0"];
        args.extend_from_slice(extra);
        let out = forkfs_text(srv, &args);
        let pid = srv.child.as_ref().unwrap().id();
        assert!(out.contains(&format!("pid {pid}")), "not hosted by the server: {out}");
        Hosted { dir: dir.to_path_buf(), store: srv.store.clone() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn unmount(self) {
        let s = self.store.to_str().unwrap();
        ok(forkfs_bin().to_str().unwrap(), &["--store", s, "umount", self.dir.to_str().unwrap()]);
        std::mem::forget(self);
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount3").arg("-uz").arg(&self.dir).status();
    }
}

/// `forkfs` on the server's store, for its human output.
fn forkfs_text(srv: &Server, args: &[&str]) -> String {
    let mut all = vec!["--store", srv.store.to_str().unwrap()];
    all.extend_from_slice(args);
    ok(forkfs_bin().to_str().unwrap(), &all)
}

/// The disk export attached and its ext4 mounted at `at`.
fn attach(srv: &Server, export: &str, tag: &str, at: &Path) -> Attached {
    let mut a = Attached::new(srv, export, tag, false);
    a.mount(at, "rw").unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", srv.log()));
    a
}

fn detach(mut a: Attached) {
    let problems = a.detach();
    assert!(problems.is_empty(), "{problems:?}");
}

/// The last row the database has (0: none).
fn last_row(pg: &Postgres) -> u64 {
    pg.sql("SELECT coalesce(max(id), 0) FROM rows").parse().unwrap()
}

/// The row the workspace's file names (0: none yet).
fn recorded(path: &Path) -> u64 {
    std::fs::read_to_string(path).map_or(0, |s| {
        s.trim().parse().unwrap_or_else(|e| panic!("{}: {s:?}: {e}", path.display()))
    })
}

/// The database recovered from the disk `export` (a fork or a restored
/// head): its last row, checked against `file`'s row.
fn check_agree(srv: &Server, bin: &Path, export: &str, file_row: u64, what: &str) -> u64 {
    let mnt = srv.path(&format!("mnt-{export}"));
    let disk = attach(srv, export, export, &mnt);
    // The lock file names the live postmaster of the cut: stale here.
    let _ = std::fs::remove_file(mnt.join("data/postmaster.pid"));
    let pg = Postgres::start(bin, &mnt.join("data"));
    let db_row = last_row(&pg);
    pg.stop();
    detach(disk);
    assert!(
        file_row <= db_row && db_row <= file_row + 1,
        "{what}: the workspace names row {file_row}, the database's last row is {db_row}: \
         the two members were not cut at one point"
    );
    db_row
}

#[test]
fn a_group_snapshot_cuts_a_database_disk_and_a_hosted_workspace_at_one_point() {
    for t in ["nbdfuse", "losetup", "mkfs.ext4", "runuser", "fusermount3"] {
        need(t);
    }
    let t0 = Instant::now();
    let bin = pg_bin();
    let mut srv = Server::create(&[("pgdata", 2 * GIB)]);
    forkfs(&srv, &["volume", "create", "app"]);
    srv.spawn(&[]);
    let app = Hosted::new(&srv, "app", &srv.path("app"), &[]);
    forkfs(&srv, &["group", "create", "env", "app", "pgdata"]);

    let live = srv.path("mnt-live");
    let mut disk = Attached::new(&srv, "pgdata", "live", false);
    ok("mkfs.ext4", &["-q", "-F", &disk.loopdev]);
    disk.mount(&live, "rw").unwrap();
    chown_postgres(&live);
    initdb(&bin, &live.join("data"));
    let pg = Postgres::start(&bin, &live.join("data"));
    pg.sql("CREATE TABLE rows (id bigint PRIMARY KEY)");

    // The writer: commit row n, then record n in the workspace.
    let stop = Arc::new(AtomicBool::new(false));
    let pg = Arc::new(pg);
    let writer = {
        let (stop, pg, file) = (stop.clone(), pg.clone(), app.path("last-row"));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                pg.sql(&format!("INSERT INTO rows VALUES ({n})"));
                // Written aside and renamed over, as an application
                // records state: a cut between a truncate and a write
                // would rightly show an empty file.
                let aside = file.with_extension("new");
                std::fs::write(&aside, format!("{n}\n")).unwrap();
                std::fs::rename(&aside, &file).unwrap();
            }
            n
        })
    };
    let mut cuts = Vec::new();
    for i in 0..SNAPSHOTS {
        std::thread::sleep(Duration::from_millis(1500));
        let name = format!("s{i}");
        let g = forkfs(&srv, &["snapshot", "--group", "env", "--name", &name]);
        let app_version = g["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["volume"] == "app")
            .map(|m| m["version"].as_str().unwrap().to_string())
            .expect("app is a member");
        cuts.push((name, app_version));
    }
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().unwrap();
    let pg = Arc::into_inner(pg).expect("the writer is done");
    pg.stop();
    detach(disk);
    assert!(written > 20 * SNAPSHOTS as u64, "only {written} rows in the load");

    // Each group version: the workspace's row in its app version, the
    // database's in a fork of its disk.
    let mut rows = Vec::new();
    for (name, app_version) in &cuts {
        let file_row = recorded(&app.path(&format!(".forkfs/versions/{app_version}/last-row")));
        let fork = format!("f{name}");
        forkfs(&srv, &["fork", "--group", &format!("env@{name}"), &fork]);
        let what = format!("group version {name}");
        check_agree(&srv, &bin, &format!("{fork}.pgdata"), file_row, &what);
        rows.push(file_row);
    }
    assert!(rows.windows(2).all(|w| w[0] < w[1]), "the cuts did not advance: {rows:?}");
    assert!(rows[0] > 0 && *rows.last().unwrap() < written, "{rows:?} of {written}");

    // A group restore, while the workspace stays mounted: both members go
    // back to the cut, together.
    forkfs(&srv, &["restore", "--group", "env", "s1"]);
    let file_row = recorded(&app.path("last-row"));
    assert_eq!(file_row, rows[1], "the mounted workspace shows the restored file");
    check_agree(&srv, &bin, "pgdata", file_row, "after the group restore to s1");

    app.unmount();
    assert!(srv.stop().success(), "{}", srv.log());
    eprintln!("{written} rows, cuts at {rows:?}; test took {:?}", t0.elapsed());
}

#[test]
fn forkfs_nbd_hosts_mounts_while_it_runs_and_saves_them_when_it_stops() {
    let mut srv = Server::create(&[("disk", 64 << 20)]);
    forkfs(&srv, &["volume", "create", "app"]);

    // A hosted mount keeps an idle server; its end lets it go.
    srv.spawn(&["--exit-when-idle", "3s"]);
    let m = Hosted::new(&srv, "app", &srv.path("app"), &[]);
    std::thread::sleep(Duration::from_millis(4500));
    let child = srv.child.as_mut().unwrap();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the server left a mounted workspace: {}",
        srv.log()
    );
    m.unmount();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = srv.child.as_mut().unwrap().try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "idle without mounts, the server stays: {}", srv.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", srv.log());
    srv.child = None;

    // Mounts come and go; SIGTERM ends the last one with its checkpoint.
    srv.spawn(&[]);
    let dir = srv.path("app");
    let t = Instant::now();
    Hosted::new(&srv, "app", &dir, &[]).unmount();
    // The server stays, so umount waits for the mount's end, not for it.
    assert!(t.elapsed() < Duration::from_secs(10), "mount and umount took {:?}", t.elapsed());
    let m = Hosted::new(&srv, "app", &dir, &[]);
    std::fs::write(m.path("kept"), b"written before SIGTERM").unwrap();
    assert!(srv.stop().success(), "{}", srv.log());
    assert!(!crate::common::attach::is_mounted(&dir), "the mount outlived the server");
    std::mem::forget(m);
    let out = srv.path("out");
    let out_s = out.to_str().unwrap();
    forkfs(&srv, &["export", "app@~0", out_s]);
    assert_eq!(std::fs::read(out.join("kept")).unwrap(), b"written before SIGTERM");
}
