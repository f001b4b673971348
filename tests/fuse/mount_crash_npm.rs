//! SIGKILL of the mount in the middle of real `npm install`s (issue 16):
//! npm installs a project of 40 packages into the workspace again and
//! again (`crash_rounds.rs` says how the rounds run and what is checked).
//! The packages are tarballs made here in the layout `npm pack` gives
//! (`package/` inside) and named by `file:` dependencies, so npm does a
//! real install (reads each tarball into its cache, extracts it, links
//! bins, writes its hidden lockfile) with no registry and no user or
//! global npm configuration; the tree expected is npm's own install of
//! the same project outside the mount.

use crate::common::mount::{new_store, require_tool, run};
use crate::crash_rounds::{Node, Rounds, Tree, Workload, base_seed, failed, tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const VOL: &str = "npm";
const PACKAGES: u64 = 40;

/// The project's package.json: `PACKAGES` tarballs under `dir/pk`, each
/// of a manifest, an index, a README and 2-9 library files (some above a
/// 64 KiB block, some in a subdirectory), every third with a bin script.
fn project(dir: &Path, seed: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let pk = dir.join("pk");
    let mut deps = Vec::new();
    for i in 0..PACKAGES {
        let (name, version) = (format!("fk-p{i}"), format!("1.{i}.0"));
        let src = pk.join(&name);
        let root = src.join("package");
        std::fs::create_dir_all(root.join("lib/sub")).unwrap();
        let bin =
            if i % 3 == 0 { format!(r#","bin":{{"{name}":"bin/cli.js"}}"#) } else { String::new() };
        let manifest =
            format!(r#"{{"name":"{name}","version":"{version}","main":"index.js"{bin}}}"#);
        std::fs::write(root.join("package.json"), manifest).unwrap();
        std::fs::write(root.join("index.js"), format!("module.exports = {i};\n")).unwrap();
        std::fs::write(root.join("README.md"), crate::common::random(600, seed ^ i)).unwrap();
        for j in 0..rng.random_range(2..10u64) {
            let len = if (i + j) % 11 == 0 {
                rng.random_range(64 * 1024..150_000)
            } else {
                rng.random_range(0..12_000)
            };
            let at = if j % 3 == 2 { format!("lib/sub/m{j}.js") } else { format!("lib/m{j}.js") };
            std::fs::write(root.join(at), crate::common::random(len, seed ^ (i << 8) ^ j)).unwrap();
        }
        if !bin.is_empty() {
            std::fs::create_dir_all(root.join("bin")).unwrap();
            let cli = root.join("bin/cli.js");
            std::fs::write(&cli, "#!/usr/bin/env node\nrequire('..');\n").unwrap();
            std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let tgz = pk.join(format!("{name}-{version}.tgz"));
        run(Command::new("tar").arg("-C").arg(&src).arg("-czf").arg(&tgz).arg("package"));
        deps.push(format!(r#""{name}":"file:{}""#, tgz.display()));
    }
    format!(
        r#"{{"name":"crash-npm","version":"1.0.0","private":true,"dependencies":{{{}}}}}"#,
        deps.join(",")
    )
}

/// `npm install` of `manifest` in the directory it is given, offline,
/// with npm's cache and (empty) user and global configurations in `npm`
/// (outside the workspace, as `~/.npm` is).
fn npm_install(manifest: String, npm: PathBuf) -> Workload {
    Arc::new(move |to: &Path| {
        std::fs::write(to.join("package.json"), &manifest).map_err(|e| e.to_string())?;
        let out = Command::new("npm")
            .args(["install", "--offline", "--no-package-lock", "--ignore-scripts"])
            .args(["--no-audit", "--no-fund", "--loglevel=error"])
            .arg("--userconfig")
            .arg(npm.join("userrc"))
            .arg("--globalconfig")
            .arg(npm.join("globalrc"))
            .arg("--cache")
            .arg(npm.join("cache"))
            .env("npm_config_update_notifier", "false")
            .current_dir(to)
            .output();
        failed("npm install", out)
    })
}

/// npm's hidden lockfile names each tarball by its path relative to the
/// install, which differs between the workspace and the reference: the
/// tree is compared with those paths left out.
fn without_resolved(mut t: Tree) -> Tree {
    if let Some(Node::File(_, bytes)) = t.get_mut("node_modules/.package-lock.json") {
        let mut lock: serde_json::Value = match serde_json::from_slice(bytes) {
            Ok(v) => v,
            Err(_) => return t, // compared as it is, and differs
        };
        if let Some(pkgs) = lock.get_mut("packages").and_then(|p| p.as_object_mut()) {
            for p in pkgs.values_mut() {
                if let Some(p) = p.as_object_mut() {
                    p.remove("resolved");
                }
            }
        }
        *bytes = serde_json::to_vec(&lock).unwrap();
    }
    t
}

/// The tarballs, the install workload and the tree it must leave.
fn setup(d: &Path, seed: u64) -> (Workload, Tree) {
    require_tool("npm");
    require_tool("tar");
    let npm = d.join("npm");
    std::fs::create_dir(&npm).unwrap();
    for rc in ["userrc", "globalrc"] {
        std::fs::write(npm.join(rc), "").unwrap();
    }
    let work = npm_install(project(d, seed), npm);
    let reference = d.join("reference/x");
    std::fs::create_dir_all(&reference).unwrap();
    if let Err(e) = work(&reference) {
        panic!("npm install of the test project failed outside the mount: {e}");
    }
    let want = without_resolved(tree(&reference).unwrap());
    assert!(want.len() > 5 * PACKAGES as usize, "npm installed {} paths", want.len());
    (work, want)
}

/// A run changed by hand: a field of npm's hidden lockfile renamed (a
/// change `without_resolved` must not hide).
fn tamper(run: &Path) {
    let f = run.join("node_modules/.package-lock.json");
    let lock = std::fs::read_to_string(&f).unwrap();
    assert!(lock.contains("\"version\""), "{lock}");
    std::fs::write(&f, lock.replacen("\"version\"", "\"versiom\"", 1)).unwrap();
}

fn rounds<'a>(store: &'a Path, work: Workload, want: &'a Tree) -> Rounds<'a> {
    Rounds { store, vol: VOL, work, want, seen: without_resolved, tamper }
}

/// An install and its fsyncs take about 2 s in the mount here: rounds of
/// up to 6 s leave most rounds one or more.
#[test]
fn fsynced_npm_installs_survive_sigkill_of_the_mount() {
    let seed = base_seed();
    let (d, store) = new_store();
    let (work, want) = setup(d.path(), seed);
    crate::common::ok(&store, &["volume", "create", VOL]);
    rounds(&store, work, &want).run(seed, 8, 500..6000);
}

/// The verifier's negative control (see `crash_rounds.rs`).
#[test]
fn npm_crash_check_detects_lost_installs() {
    let (d, store) = new_store();
    let (work, want) = setup(d.path(), base_seed());
    crate::common::ok(&store, &["volume", "create", VOL]);
    rounds(&store, work, &want).control();
}
