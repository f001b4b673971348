//! `forkfs status`: volumes, logical vs stored bytes, dedupe ratio.

use super::Global;
use super::output::{bytes, print_json};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(g: &Global, _a: Args) -> anyhow::Result<()> {
    let store = g.open()?;
    let s = store.stats()?;
    if g.json {
        return print_json(&s);
    }
    println!("store {}", store.dir().display());
    println!(
        "{:<24} {:<6} {:>10} {:>10} {:>9} {:>6}",
        "VOLUME", "KIND", "SIZE", "USED", "VERSIONS", "DIRTY"
    );
    for v in &s.volumes {
        println!(
            "{:<24} {:<6} {:>10} {:>10} {:>9} {:>6}",
            v.name,
            v.kind.to_string(),
            bytes(v.size),
            bytes(v.logical_bytes),
            v.versions,
            if v.dirty { "yes" } else { "no" }
        );
    }
    println!(
        "logical {} in heads, stored {} in {} packs, dedupe ratio {:.2}",
        bytes(s.logical_bytes),
        bytes(s.stored_bytes),
        s.packs,
        s.dedupe_ratio
    );
    if let Some(c) = &s.disk_cache {
        println!(
            "local cache {} of {} ({} chunks read from the remote)",
            bytes(c.bytes),
            bytes(c.limit),
            c.chunks
        );
    }
    Ok(())
}
