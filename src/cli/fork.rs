//! `forkfs fork` and `forkfs restore`.

use super::Global;
use super::output::print_json;

#[derive(clap::Args)]
pub struct ForkArgs {
    /// VOL (its current state) or VOL@VERSION
    source: String,
    /// Name of the new volume
    new: String,
}

pub fn fork(g: &Global, a: ForkArgs) -> anyhow::Result<()> {
    let store = g.open()?;
    let from = store.resolve_version(&a.source)?;
    let rec = store.fork(&from, &a.new)?;
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

pub fn restore(g: &Global, a: RestoreArgs) -> anyhow::Result<()> {
    let store = g.open()?;
    let spec = if a.version.contains('@') {
        a.version.clone()
    } else {
        format!("{}@{}", a.volume, a.version)
    };
    let to = match store.resolve(&spec)? {
        forkfs::Target::Version(v) => v,
        forkfs::Target::Head(_) => {
            return Err(forkfs::Error::invalid("restore needs a version").into());
        }
    };
    let pre = store.restore(&a.volume, &to)?;
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
