//! `forkfs fork` and `forkfs restore`.

use super::Global;
use super::output::print_json;
use forkfs::service::Request;
use forkfs::{VersionRecord, VolumeRecord};

#[derive(clap::Args)]
pub struct ForkArgs {
    /// VOL (its current state) or VOL@VERSION; with --group, the new group's name
    source: String,
    /// Name of the new volume
    #[arg(required_unless_present = "group")]
    new: Option<String>,
    /// Fork every member of this volume group (GROUP: a new group
    /// snapshot; GROUP@VERSION: that group version) as NEW.MEMBER, in a
    /// new group NEW
    #[arg(long)]
    group: Option<String>,
}

/// Works while a server holds the store (through its control socket).
pub fn fork(g: &Global, a: ForkArgs) -> anyhow::Result<()> {
    let new = match (a.new, a.group) {
        (None, Some(group)) => return super::group::fork(g, group, a.source),
        (Some(_), Some(_)) => anyhow::bail!("with --group, name only the new group"),
        (Some(n), None) => n,
        (None, None) => anyhow::bail!("name the new volume"),
    };
    let req = Request::Fork { source: a.source, new };
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
    /// The volume; with --group, the group version (NAME, number or ~N)
    volume: String,
    /// A version of VOLUME (id, name or ~N), or OTHER@VERSION
    #[arg(required_unless_present = "group")]
    version: Option<String>,
    /// Restore every member of this volume group to its version in a
    /// group version
    #[arg(long)]
    group: Option<String>,
}

/// Works while a server holds the store (through its control socket).
pub fn restore(g: &Global, a: RestoreArgs) -> anyhow::Result<()> {
    let version = match (a.version, a.group) {
        (None, Some(group)) => return super::group::restore(g, group, a.volume),
        (Some(_), Some(_)) => anyhow::bail!("with --group, name only the group version"),
        (Some(v), None) => v,
        (None, None) => anyhow::bail!("name the version to restore"),
    };
    let req = Request::Restore { volume: a.volume.clone(), version };
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
