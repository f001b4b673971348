//! `forkfs volume create|list|delete|retention|quota|consistency`.

use super::Global;
use super::output::{age, bytes, parse_size, print_json};
use forkfs::service::{QuotaReport, Request};
use forkfs::{Consistency, PolicyChange, VolumeKind, VolumeRecord};

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Create a volume (an fs workspace, or with --block a disk)
    Create {
        name: String,
        /// A block device volume instead of a directory tree
        #[arg(long)]
        block: bool,
        /// Size (required for --block), e.g. 64G
        #[arg(long)]
        size: Option<String>,
        /// Block size, e.g. 64KiB
        #[arg(long)]
        block_size: Option<String>,
        /// The most its files may take, e.g. 10G (fs volumes; see `volume quota`)
        #[arg(long, conflicts_with = "block")]
        quota: Option<String>,
    },
    /// Show or set the most an fs volume's files may take: past it writes
    /// fail with ENOSPC, and the mount's df shows it as the size
    Quota {
        name: String,
        /// The new quota, e.g. 10G
        size: Option<String>,
        /// Remove the quota (only the disk under the store limits the volume)
        #[arg(long, conflicts_with = "size")]
        none: bool,
    },
    /// List volumes
    List,
    /// Delete a volume and its versions (space is reclaimed by gc)
    Delete { name: String },
    /// Show or set how automatic versions are thinned (named ones never are)
    Retention {
        name: String,
        /// Always keep this many newest automatic versions
        #[arg(long)]
        keep_recent: Option<usize>,
        /// Age of the first bucket (buckets double from there), e.g. 60s, 10m
        #[arg(long)]
        unit: Option<String>,
        /// Versions kept per bucket
        #[arg(long)]
        per_bucket: Option<usize>,
        /// Prune after every automatic checkpoint (on) or only on `forkfs prune` (off)
        #[arg(long, value_parser = ["on", "off"])]
        auto_prune: Option<String>,
        /// Back to the default policy
        #[arg(long, conflicts_with_all = ["keep_recent", "unit", "per_bucket"])]
        default: bool,
    },
    /// Show or set how a disk persists over NBD: at every flush, or only at
    /// btrfs commits (also while it is served)
    Consistency {
        name: String,
        /// `flush` or `btrfs`
        mode: Option<Consistency>,
    },
}

pub fn run(g: &Global, c: Cmd) -> anyhow::Result<()> {
    if let Cmd::Consistency { name, mode } = c {
        return consistency(g, &name, mode);
    }
    match c {
        Cmd::Create { name, block, size, block_size, quota } => {
            let kind = if block { VolumeKind::Block } else { VolumeKind::Fs };
            let size = size.as_deref().map(parse_size).transpose()?;
            let bs = block_size.as_deref().map(parse_size).transpose()?;
            let bs = bs
                .map(u32::try_from)
                .transpose()
                .map_err(|_| forkfs::Error::invalid("block size too large"))?;
            let quota = quota.as_deref().map(parse_size).transpose()?;
            let req = Request::CreateVolume { name, kind, size, block_size: bs, quota };
            let rec: VolumeRecord = g.call(&req)?;
            if g.json {
                return print_json(&rec);
            }
            match rec.quota {
                Some(q) => {
                    println!("created {} volume {} (quota {})", rec.kind, rec.name, bytes(q))
                }
                None => println!("created {} volume {} ({})", rec.kind, rec.name, bytes(rec.size)),
            }
        }
        Cmd::Quota { name, size, none } => {
            let set = size.as_deref().map(parse_size).transpose()?;
            let r: QuotaReport = g.call(&Request::Quota { volume: name, set, remove: none })?;
            if g.json {
                return print_json(&r);
            }
            match r.quota {
                Some(q) => println!(
                    "{}: {} used of a {} quota ({}%)",
                    r.volume,
                    bytes(r.used),
                    bytes(q),
                    r.used.saturating_mul(100) / q.max(1)
                ),
                None => println!("{}: {} used, no quota", r.volume, bytes(r.used)),
            }
        }
        Cmd::List => {
            let vols: Vec<VolumeRecord> = g.call(&Request::Volumes)?;
            if g.json {
                return print_json(&vols);
            }
            println!("{:<24} {:<6} {:>10} {:>8}  created", "NAME", "KIND", "SIZE", "BLOCK");
            for v in vols {
                println!(
                    "{:<24} {:<6} {:>10} {:>8}  {}",
                    v.name.as_str(),
                    v.kind.to_string(),
                    bytes(v.size),
                    bytes(v.block_size as u64),
                    age(v.created_at_ms)
                );
            }
        }
        Cmd::Delete { name } => {
            g.call::<serde_json::Value>(&Request::DeleteVolume { name: name.clone() })?;
            if g.json {
                return print_json(&serde_json::json!({ "deleted": name }));
            }
            println!("deleted volume {name}");
        }
        Cmd::Retention { name, keep_recent, unit, per_bucket, auto_prune, default } => {
            let unit_ms = match unit.as_deref() {
                Some(u) => {
                    let d = humantime::parse_duration(u)
                        .map_err(|e| forkfs::Error::invalid(format!("bad age {u:?}: {e}")))?;
                    Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                }
                None => None,
            };
            let change = PolicyChange {
                keep_recent,
                unit_ms,
                per_bucket,
                auto_prune: auto_prune.map(|a| a == "on"),
                default,
            };
            // Merged where the record changes: one round trip, and two
            // changes of different fields at once both hold.
            let rec: VolumeRecord = if change.is_empty() {
                g.call(&Request::Consistency { volume: name.clone(), mode: None })?
            } else {
                g.call(&Request::Retention { volume: name.clone(), change })?
            };
            let p = rec.retention.clone().unwrap_or_default();
            if g.json {
                return print_json(&serde_json::json!({
                    "volume": name, "policy": p, "default": rec.retention.is_none(),
                    "auto_prune": rec.auto_prune,
                }));
            }
            println!(
                "{name}: keep the newest {} automatic versions, then {} per bucket of {} s doubling with age{}; automatic pruning {}",
                p.keep_recent,
                p.per_bucket,
                p.unit_ms / 1000,
                if rec.retention.is_none() { " (default)" } else { "" },
                if rec.auto_prune { "on" } else { "off" }
            );
        }
        Cmd::Consistency { .. } => unreachable!("handled above"),
    }
    Ok(())
}

fn consistency(g: &Global, name: &str, mode: Option<Consistency>) -> anyhow::Result<()> {
    let req = Request::Consistency { volume: name.to_string(), mode };
    let rec: VolumeRecord = g.call(&req)?;
    if g.json {
        return print_json(&serde_json::json!({ "volume": name, "consistency": rec.consistency }));
    }
    println!("{name}: consistency {}", rec.consistency);
    Ok(())
}
