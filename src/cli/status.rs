//! `forkfs status`: volumes, logical vs stored bytes, dedupe ratio.

use super::Global;
use super::output::{bytes, print_json};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(g: &Global, _a: Args) -> anyhow::Result<()> {
    let s: forkfs::StoreStats = g.call(&forkfs::service::Request::Status)?;
    if g.json {
        return print_json(&s);
    }
    println!("store {}", g.store_dir().display());
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
    if let Some(l) = &s.data_log {
        println!(
            "data log {} on disk in {} segment(s), and {} in {} spare(s) kept for reuse",
            bytes(l.bytes),
            l.segments,
            bytes(l.spare_bytes),
            l.spares
        );
    }
    if let Some(c) = &s.disk_cache {
        println!(
            "local cache {} of {} ({} chunks read from the remote)",
            bytes(c.bytes),
            bytes(c.limit),
            c.chunks
        );
    }
    if let Some(u) = &s.upload {
        let q = &u.queue;
        println!(
            "pending upload {} in {} objects (limit {}){}",
            bytes(q.pending_bytes),
            q.pending_objects,
            bytes(q.limit_bytes),
            if q.pending_objects > 0 {
                format!(", oldest {} s", q.oldest_ms / 1000)
            } else {
                String::new()
            }
        );
        if !u.heads_pending.is_empty() {
            println!("heads not yet published: {}", u.heads_pending.join(", "));
        }
        if let Some(e) = &q.last_error {
            println!("last upload error: {e}");
        }
        for v in &u.diverged {
            println!("volume {v}: another host advanced it; this host's later versions stay local");
        }
    }
    if let Some(v) = &s.view {
        let age = forkfs::now_ms().saturating_sub(v.checked_ms) / 1000;
        println!("other hosts' changes: as of {age} s ago (when the bucket last answered)");
    }
    Ok(())
}
