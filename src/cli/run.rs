//! `forkfs run VOL -- CMD ...`: one reversible step per command. A
//! version before and one after, labelled with the command and its exit
//! status, whether or not the volume is mounted.

use super::Global;
use super::output::print_json;
use anyhow::Context;
use forkfs::VersionRecord;
use forkfs::service::Request;

#[derive(clap::Args)]
pub struct Args {
    volume: String,
    /// The command and its arguments (after `--`)
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn snapshot(g: &Global, volume: &str, label: String) -> anyhow::Result<VersionRecord> {
    let req = Request::Snapshot { volume: volume.into(), name: None, label: Some(label) };
    g.call(&req)
}

/// Returns the command's exit code (128 + N when killed by signal N).
pub fn run(g: &Global, a: Args) -> anyhow::Result<i32> {
    let shown = shell_words(&a.command);
    let before = snapshot(g, &a.volume, format!("before: {shown}"))?;
    let status = std::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .status()
        .with_context(|| format!("cannot run {}", a.command[0]));
    let code = match &status {
        Ok(s) => s.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + s.signal().unwrap_or(0)
        }),
        Err(_) => 127,
    };
    let after = snapshot(g, &a.volume, format!("after: {shown} (exit {code})"))?;
    status?;
    if g.json {
        print_json(&serde_json::json!({ "before": before, "after": after, "exit": code }))?;
    } else {
        eprintln!(
            "forkfs: {shown} exited {code}; {v}@{} before, {v}@{} after (forkfs restore {v} {} to undo)",
            before.id.short(),
            after.id.short(),
            before.id.short(),
            v = after.volume_name,
        );
    }
    Ok(code)
}

/// The command as one would type it (for labels).
fn shell_words(args: &[String]) -> String {
    let quote = |a: &String| {
        if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
        {
            a.clone()
        } else {
            format!("'{}'", a.replace('\'', r"'\''"))
        }
    };
    args.iter().map(quote).collect::<Vec<_>>().join(" ")
}
