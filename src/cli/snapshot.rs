//! `forkfs snapshot`, `tag`, `untag`, `delete-version`.

use super::Global;
use super::output::print_json;
use forkfs::VersionRecord;
use forkfs::service::Request;

pub use super::held::SnapshotArgs as Args;

/// Works while a server holds the store (through its control socket).
pub fn run(g: &Global, a: Args) -> anyhow::Result<()> {
    match a.held()? {
        Some(held) => g.run_held(&held),
        None => super::group::snapshot(g, a.group.unwrap_or_default(), a.name, a.message),
    }
}

#[derive(clap::Args)]
pub struct SyncArgs {
    /// One volume (default: all)
    volume: Option<String>,
}

/// `forkfs sync`: works while a server or mount holds the store.
pub fn sync(g: &Global, a: SyncArgs) -> anyhow::Result<()> {
    let req = Request::Sync { volume: a.volume };
    let done: Vec<forkfs::Synced> = g.call(&req)?;
    if g.json {
        return print_json(&done);
    }
    for s in &done {
        match (&s.version, s.recorded) {
            (Some(v), true) => println!("{}: recorded {}@{}", s.volume, s.volume, v.short()),
            (Some(v), false) => {
                println!("{}: nothing new since {}@{}", s.volume, s.volume, v.short())
            }
            (None, _) => println!("{}: empty, no version yet", s.volume),
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct TagArgs {
    /// VOL@VERSION
    version: String,
    name: String,
}

pub fn tag(g: &Global, a: TagArgs) -> anyhow::Result<()> {
    let req = Request::Tag { version: a.version, name: a.name.clone() };
    let v: VersionRecord = g.call(&req)?;
    if g.json {
        return print_json(&serde_json::json!({ "version": v.id, "name": a.name }));
    }
    println!("{}@{} is now also {}@{}", v.volume_name, v.id.short(), v.volume_name, a.name);
    Ok(())
}

#[derive(clap::Args)]
pub struct UntagArgs {
    volume: String,
    name: String,
}

pub fn untag(g: &Global, a: UntagArgs) -> anyhow::Result<()> {
    let req = Request::Untag { volume: a.volume.clone(), name: a.name.clone() };
    g.call::<serde_json::Value>(&req)?;
    if g.json {
        return print_json(&serde_json::json!({ "untagged": a.name }));
    }
    println!("removed name {} from {}", a.name, a.volume);
    Ok(())
}

#[derive(clap::Args)]
pub struct DeleteArgs {
    /// VOL@VERSION
    version: String,
}

pub fn delete(g: &Global, a: DeleteArgs) -> anyhow::Result<()> {
    let v: VersionRecord = g.call(&Request::DeleteVersion { version: a.version })?;
    if g.json {
        return print_json(&serde_json::json!({ "deleted": v.id }));
    }
    println!("deleted {}@{}", v.volume_name, v.id.short());
    Ok(())
}
