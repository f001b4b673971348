//! `forkfs init`.

use super::Global;
use super::output::{parse_size, print_json};
use forkfs::remote::Remote;
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
    /// Keep objects in a remote store: s3://bucket/prefix, gs://..., az://...
    /// or file:///dir (credentials from the usual environment variables).
    /// A remote that already holds a store is joined: its volumes and
    /// versions appear here and its settings apply.
    #[arg(long, value_name = "URL")]
    remote: Option<String>,
    /// Endpoint of an S3-compatible service (MinIO, Ceph RGW, ...)
    #[arg(long, requires = "remote")]
    endpoint: Option<String>,
    /// Allow plain HTTP to the endpoint
    #[arg(long, requires = "remote")]
    allow_http: bool,
    /// Region of the bucket
    #[arg(long, requires = "remote")]
    region: Option<String>,
    /// Local disk space for chunks read from the remote (least recently
    /// used go first; every cached chunk is verified when read)
    #[arg(long, requires = "remote", default_value = "8GiB")]
    cache_size: String,
    /// A read waits this long for the remote, retries included, then fails
    /// (EIO to a client); 0 = wait forever [default: 20s;
    /// FORKFS_READ_DEADLINE overrides]
    #[arg(long, requires = "remote", value_parser = humantime::parse_duration)]
    read_deadline: Option<std::time::Duration>,
    /// Bytes of written data that may wait on local disk for upload (the
    /// remote slow or unreachable) before writers are made to wait
    /// [default: 8GiB; FORKFS_PENDING_LIMIT overrides]
    #[arg(long, requires = "remote", value_name = "SIZE")]
    pending_limit: Option<String>,
}

pub fn run(g: &Global, a: Args) -> anyhow::Result<()> {
    let pending_limit = a.pending_limit.as_deref().map(parse_size).transpose()?;
    let config = StoreConfig {
        pack_target: parse_size(&a.pack_size)? as usize,
        default_block_size: u32::try_from(parse_size(&a.block_size)?)
            .map_err(|_| forkfs::Error::invalid("block size too large"))?,
        zstd_level: a.zstd_level,
        disk_cache_bytes: parse_size(&a.cache_size)?,
        remote: a.remote.map(|url| Remote {
            url,
            endpoint: a.endpoint,
            allow_http: a.allow_http,
            region: a.region,
            // Rounded up: a sub-millisecond deadline must not become 0 (none).
            read_deadline_ms: a.read_deadline.map(|d| d.as_nanos().div_ceil(1_000_000) as u64),
            pending_limit,
        }),
        ..StoreConfig::default()
    };
    let dir = g.store_dir();
    let store = Store::init(&dir, config)?;
    let volumes = store.volumes()?.len();
    let config = store.config().clone();
    if g.json {
        return print_json(
            &serde_json::json!({ "store": dir, "config": config, "volumes": volumes }),
        );
    }
    match &config.remote {
        None => println!("initialized forkfs store at {}", dir.display()),
        Some(r) if volumes > 0 => println!(
            "joined the forkfs store in {} at {} ({volumes} volumes)",
            r.url,
            dir.display()
        ),
        Some(r) => println!("initialized forkfs store at {} on {}", dir.display(), r.url),
    }
    Ok(())
}
