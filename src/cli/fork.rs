//! `forkfs fork` and `forkfs restore`.

use super::Global;
use super::output::print_json;
use forkfs::service::Request;
use forkfs::{VersionRecord, VolumeRecord};

#[derive(clap::Args)]
pub struct ForkArgs {
    /// VOL (its current state) or VOL@VERSION
    source: String,
    /// Name of the new volume
    new: String,
}

/// Works while a server holds the store (through its control socket).
pub fn fork(g: &Global, a: ForkArgs) -> anyhow::Result<()> {
    let req = Request::Fork { source: a.source, new: a.new };
    let j: serde_json::Value = g.call(&req)?;
    let from: VersionRecord = serde_json::from_value(j["from"].clone())?;
    let rec: VolumeRecord = serde_json::from_value(j["volume"].clone())?;
    if g.json {
        return print_json(&rec);
    }
    println!("forked {}@{} as {}", from.volume_name, from.id.short(), rec.name);
    Ok(())
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    volume: String,
    /// A version of VOLUME (id, name or ~N), or OTHER@VERSION
    version: String,
}

/// Works while a server holds the store (through its control socket).
pub fn restore(g: &Global, a: RestoreArgs) -> anyhow::Result<()> {
    let req = Request::Restore { volume: a.volume.clone(), version: a.version };
    let j: serde_json::Value = g.call(&req)?;
    let to: VersionRecord = serde_json::from_value(j["restored"].clone())?;
    let pre: VersionRecord = serde_json::from_value(j["previous_head"].clone())?;
    if g.json {
        return print_json(&serde_json::json!({ "restored": to.id, "previous_head": pre.id }));
    }
    println!(
        "restored {} to {}; the previous state is {}@{} (restore that to undo)",
        a.volume,
        to.id.short(),
        pre.volume_name,
        pre.id.short()
    );
    Ok(())
}
