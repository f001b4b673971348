//! A real PostgreSQL server for tests: on a data directory anywhere (a
//! FUSE mount, ext4 over forkfs-nbd), listening only on a socket of its
//! own, run as the postgres user (PostgreSQL refuses root). Shared by the
//! FUSE tests and forkfs-nbd's (`#[path]`), so it needs only std and
//! tempfile.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The newest /usr/lib/postgresql/*/bin holding pg_ctl.
pub fn pg_bin() -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten();
    let newest = versions
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("pg_ctl").exists())
        .max();
    let found = newest.map(|(_, bin)| bin);
    found.expect("this test needs PostgreSQL (/usr/lib/postgresql/*/bin); scripts/install-deps")
}

/// `program` run as the postgres user.
pub fn as_postgres(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(program);
    c
}

pub fn chown_postgres(p: &Path) {
    run(Command::new("chown").arg("postgres:postgres").arg(p));
}

/// `initdb` of a new cluster (data checksums on) in `data`, made for it.
pub fn initdb(bin: &Path, data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    chown_postgres(data);
    let mut initdb = as_postgres(bin.join("initdb"));
    initdb.current_dir("/").args(["--data-checksums", "--no-locale", "-E", "UTF8", "-D"]);
    run(initdb.arg(data));
}

/// Runs `cmd`, which must succeed; its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A PostgreSQL server on a data directory, listening only on a socket in
/// its own directory (which also holds its log); dropping it stops it.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    dir: tempfile::TempDir,
    running: bool,
}

impl Postgres {
    pub fn start(bin: &Path, data: &Path) -> Postgres {
        let dir = tempfile::tempdir().expect("tempdir");
        chown_postgres(dir.path());
        let mut pg = Postgres { bin: bin.into(), data: data.into(), dir, running: false };
        let opts = format!("-c listen_addresses='' -k {} -p 5432", pg.dir.path().display());
        run(pg.ctl().args(["start", "-w", "-t", "120", "-o", &opts, "-l"]).arg(pg.log_path()));
        pg.running = true;
        pg
    }

    /// `pg_ctl -D DATA`, run in the server's directory.
    pub fn ctl(&self) -> Command {
        let mut c = as_postgres(self.bin.join("pg_ctl"));
        c.arg("-D").arg(&self.data).current_dir(self.dir.path());
        c
    }

    /// `program` of this PostgreSQL, connected to this server.
    pub fn client(&self, program: &str) -> Command {
        let mut c = as_postgres(self.bin.join(program));
        c.current_dir(self.dir.path()).arg("-h").arg(self.dir.path()).args(["-p", "5432"]);
        c
    }

    /// One SQL statement's result: unaligned, `|`-separated, trimmed.
    pub fn sql(&self, statement: &str) -> String {
        let mut c = self.client("psql");
        c.args(["-d", "postgres", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", statement]);
        run(&mut c).trim().to_string()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A clean (fast) shutdown, checked in the log.
    pub fn stop(mut self) {
        run(self.ctl().args(["stop", "-w", "-m", "fast"]));
        self.running = false;
        assert!(self.log().contains("database system is shut down"), "{}", self.log());
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- postgres log ({}) ---\n{}", self.data.display(), self.log());
        }
        if self.running {
            let _ = self.ctl().args(["stop", "-w", "-m", "immediate"]).status();
        }
    }
}
