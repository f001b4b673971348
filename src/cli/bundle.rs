//! `forkfs bundle create|import|verify`: a volume's history in one file,
//! to carry to a store that shares no object store with this one.

use super::Global;
use super::output::{Stages, bytes};
use anyhow::Context;
use forkfs::bundle::Report;
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
        Cmd::Create { file, range } => {
            let store = g.open()?;
            let r = if is_stdio(file) {
                store.bundle_create(range, &mut std::io::stdout().lock(), &progress)?
            } else {
                create_file(&store, file, range, &progress)?
            };
            (r, "bundled", is_stdio(file))
        }
        Cmd::Import { file, into } => {
            let store = g.open()?;
            let r = store.bundle_import(&mut *input(file)?, into.as_deref(), &progress)?;
            (r, "imported", false)
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

/// Writes FILE.partial, syncs it and renames it: a bundle cut short never
/// takes the name.
fn create_file(
    store: &forkfs::Store,
    file: &Path,
    range: &str,
    progress: &Stages,
) -> anyhow::Result<Report> {
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let made = store.bundle_create(range, &mut f, progress).and_then(|r| {
        f.sync_all()?;
        std::fs::rename(&tmp, file)?;
        Ok(r)
    });
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(made?)
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
