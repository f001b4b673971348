//! `forkfs bundle create|import|verify`: a volume's history in one file,
//! to carry to a store that shares no object store with this one.

use super::Global;
use super::output::{Stages, bytes};
use anyhow::Context;
use forkfs::bundle::Report;
use forkfs::service::Request;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Write the versions of VOL (VOL@B: up to B; VOL@A..B or VOL@A..: those
    /// after A, with only the data A does not have) to FILE (- for stdout)
    Create { file: PathBuf, range: String },
    /// Add a bundle's versions to this store (FILE, or - for stdin); the
    /// volume is created when missing
    Import {
        file: PathBuf,
        /// Import into this volume instead of the bundle's name
        #[arg(long = "as")]
        into: Option<String>,
    },
    /// Check a bundle whole (every chunk's hash, every record, the end
    /// checksum) without a store
    Verify { file: PathBuf },
}

fn is_stdio(p: &Path) -> bool {
    p.as_os_str() == "-"
}

pub fn run(g: &Global, c: Cmd) -> anyhow::Result<()> {
    let progress = Stages::new();
    let (report, what, to_stderr) = match &c {
        Cmd::Create { file, range } if is_stdio(file) => {
            let r = match g.open() {
                Ok(store) => {
                    store.bundle_create(range, &mut std::io::stdout().lock(), &progress)?
                }
                Err(e) if e.is_store_in_use() => create_through_holder(g, range, &progress)?,
                Err(e) => return Err(e.into()),
            };
            (r, "bundled", true)
        }
        Cmd::Create { file, range } => {
            let req = Request::BundleCreate { range: range.clone(), path: absolute(file)? };
            (g.call_with(&req, &progress)?, "bundled", false)
        }
        Cmd::Import { file, into } if is_stdio(file) => {
            let r = match g.open() {
                Ok(store) => store.bundle_import(&mut *input(file)?, into.as_deref(), &progress)?,
                Err(e) if e.is_store_in_use() => import_through_holder(g, into, &progress)?,
                Err(e) => return Err(e.into()),
            };
            (r, "imported", false)
        }
        Cmd::Import { file, into } => {
            let req = Request::BundleImport { path: absolute(file)?, into: into.clone() };
            (g.call_with(&req, &progress)?, "imported", false)
        }
        Cmd::Verify { file } => {
            (forkfs::bundle::verify(&mut *input(file)?, &progress)?, "verified", false)
        }
    };
    drop(progress);
    // The bundle itself may be on stdout: then the report goes to stderr.
    let mut out: Box<dyn Write> =
        if to_stderr { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) };
    if g.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    describe(&mut out, &report, what, matches!(c, Cmd::Import { .. }))?;
    Ok(())
}

/// A path the process holding the store (another working directory) reads.
fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
}

/// A private directory for a bundle on its way between a pipe and the
/// process holding the store, which reads and writes files, not pipes: in
/// the store's directory, which that process sees whatever its /tmp is.
fn spool(g: &Global) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("spool-bundle-")
        .tempdir_in(g.store_dir())
        .context("cannot make a spool directory in the store")
}

fn create_through_holder(g: &Global, range: &str, progress: &Stages) -> anyhow::Result<Report> {
    let dir = spool(g)?;
    let path = dir.path().join("out.bundle");
    let req = Request::BundleCreate { range: range.to_string(), path: path.clone() };
    let r = g.call_with(&req, progress)?;
    std::io::copy(&mut std::fs::File::open(&path)?, &mut std::io::stdout().lock())?;
    Ok(r)
}

fn import_through_holder(
    g: &Global,
    into: &Option<String>,
    progress: &Stages,
) -> anyhow::Result<Report> {
    let dir = spool(g)?;
    let path = dir.path().join("in.bundle");
    std::io::copy(&mut std::io::stdin().lock(), &mut std::fs::File::create(&path)?)?;
    g.call_with(&Request::BundleImport { path, into: into.clone() }, progress)
}

fn input(file: &Path) -> anyhow::Result<Box<dyn std::io::Read>> {
    if is_stdio(file) {
        return Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, std::io::stdin())));
    }
    let f = std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, f)))
}

fn describe(out: &mut dyn Write, r: &Report, what: &str, import: bool) -> anyhow::Result<()> {
    let base = match &r.base {
        Some(b) => format!("after {}", b.describe(&r.volume)),
        None => "whole history".into(),
    };
    writeln!(
        out,
        "{what} {} versions of {} ({base}): {} chunks, {} of data in {}",
        r.versions.len(),
        r.volume,
        r.chunks,
        bytes(r.plain_bytes),
        bytes(r.bundle_bytes)
    )?;
    if import {
        if r.created {
            writeln!(out, "created volume {}", r.volume)?;
        }
        if r.known_versions > 0 {
            writeln!(out, "{} versions were here already", r.known_versions)?;
        }
        writeln!(out, "{} chunks stored, {} were here already", r.new_chunks, r.known_chunks)?;
        if !r.names_taken.is_empty() {
            writeln!(
                out,
                "names not given (another version of {} holds them): {}",
                r.volume,
                r.names_taken.join(", ")
            )?;
        }
        match r.versions.last() {
            Some(tip) if r.head_moved => {
                writeln!(out, "{} now stands at {}@{}", r.volume, r.volume, tip.short())?
            }
            Some(tip) => writeln!(
                out,
                "the head of {} has changes of its own and stayed; `forkfs restore {} {}` takes \
                 the imported state",
                r.volume,
                r.volume,
                tip.short()
            )?,
            None => {}
        }
    }
    Ok(())
}
