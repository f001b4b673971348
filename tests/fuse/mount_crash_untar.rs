//! SIGKILL of the mount in the middle of real untars (issue 16): tar
//! extracts a source tree into the workspace again and again
//! (`crash_rounds.rs` says how the rounds run and what is checked).

use crate::common::mount::{new_store, require_tool, run};
use crate::crash_rounds::{Rounds, Tree, Workload, base_seed, failed, tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const VOL: &str = "untar";

/// A source tree of small, inline, multi-block and empty files in nested
/// directories, with executables and symbolic links; its tarball.
fn source(dir: &Path, seed: u64) -> (Tree, PathBuf) {
    let src = dir.join("src");
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..240u64 {
        let d = src.join(format!("d{}/e{}", i % 12, i % 5));
        std::fs::create_dir_all(&d).unwrap();
        let len = match i % 8 {
            0 => 0,
            1..=4 => rng.random_range(1..2048),
            5 | 6 => rng.random_range(2048..40_000),
            _ => rng.random_range(64 * 1024..200_000),
        };
        let f = d.join(format!("f{i}"));
        std::fs::write(&f, crate::common::random(len, seed ^ i)).unwrap();
        if i % 9 == 0 {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if i % 31 == 0 {
            std::os::unix::fs::symlink(format!("f{i}"), d.join(format!("l{i}"))).unwrap();
        }
    }
    let tarball = dir.join("src.tar");
    run(Command::new("tar").arg("-C").arg(&src).arg("-cf").arg(&tarball).arg("."));
    (tree(&src).unwrap(), tarball)
}

/// Extracts `tarball` into the directory it is given.
fn untar(tarball: PathBuf) -> Workload {
    Arc::new(move |to: &Path| {
        failed("tar", Command::new("tar").arg("-C").arg(to).arg("-xf").arg(&tarball).output())
    })
}

/// A run changed by hand: one byte of a file flipped.
fn tamper(run: &Path) {
    let f = run.join("d1/e1/f1"); // 1 to 2047 bytes
    let mut b = std::fs::read(&f).unwrap();
    b[0] ^= 1;
    std::fs::write(&f, b).unwrap();
}

fn rounds<'a>(store: &'a Path, tarball: PathBuf, want: &'a Tree) -> Rounds<'a> {
    Rounds { store, vol: VOL, work: untar(tarball), want, seen: |t| t, tamper }
}

#[test]
fn fsynced_untars_survive_sigkill_of_the_mount() {
    require_tool("tar");
    let seed = base_seed();
    let (d, store) = new_store();
    let (want, tarball) = source(d.path(), seed);
    crate::common::ok(&store, &["volume", "create", VOL]);
    rounds(&store, tarball, &want).run(seed, 8, 300..2500);
}

/// The verifier's negative control (see `crash_rounds.rs`).
#[test]
fn untar_crash_check_detects_lost_extractions() {
    require_tool("tar");
    let (d, store) = new_store();
    let (want, tarball) = source(d.path(), base_seed());
    crate::common::ok(&store, &["volume", "create", VOL]);
    rounds(&store, tarball, &want).control();
}
