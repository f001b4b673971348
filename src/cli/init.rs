//! `forkfs init`.

use super::Global;
use super::output::{parse_size, print_json};
use forkfs::{Store, StoreConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Seal packs at this size
    #[arg(long, default_value = "16MiB")]
    pack_size: String,
    /// Default block size of new volumes
    #[arg(long, default_value = "64KiB")]
    block_size: String,
    /// zstd level for chunks (1 is fast; higher compresses more)
    #[arg(long, default_value_t = 1)]
    zstd_level: i32,
}

pub fn run(g: &Global, a: Args) -> anyhow::Result<()> {
    let config = StoreConfig {
        pack_target: parse_size(&a.pack_size)? as usize,
        default_block_size: u32::try_from(parse_size(&a.block_size)?)
            .map_err(|_| forkfs::Error::invalid("block size too large"))?,
        zstd_level: a.zstd_level,
        ..StoreConfig::default()
    };
    let dir = g.store_dir();
    Store::init(&dir, config.clone())?;
    if g.json {
        print_json(&serde_json::json!({ "store": dir, "config": config }))
    } else {
        println!("initialized forkfs store at {}", dir.display());
        Ok(())
    }
}
