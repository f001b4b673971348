//! `forkfs volume create|list|delete`.

use super::Global;
use super::output::{age, bytes, parse_size, print_json};
use forkfs::VolumeKind;

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
    },
    /// List volumes
    List,
    /// Delete a volume and its versions (space is reclaimed by gc)
    Delete { name: String },
}

pub fn run(g: &Global, c: Cmd) -> anyhow::Result<()> {
    let store = g.open()?;
    match c {
        Cmd::Create { name, block, size, block_size } => {
            let kind = if block { VolumeKind::Block } else { VolumeKind::Fs };
            let size = size.as_deref().map(parse_size).transpose()?;
            let bs = block_size.as_deref().map(parse_size).transpose()?;
            let bs = bs
                .map(u32::try_from)
                .transpose()
                .map_err(|_| forkfs::Error::invalid("block size too large"))?;
            let rec = store.create_volume(&name, kind, size, bs)?;
            if g.json {
                return print_json(&rec);
            }
            println!("created {} volume {} ({})", rec.kind, rec.name, bytes(rec.size));
        }
        Cmd::List => {
            let vols = store.volumes()?;
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
            store.delete_volume(&name)?;
            if g.json {
                return print_json(&serde_json::json!({ "deleted": name }));
            }
            println!("deleted volume {name}");
        }
    }
    Ok(())
}
