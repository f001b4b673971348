//! `forkfs init`.

use super::Global;
use super::output::{parse_size, print_json};
use forkfs::RemoteConfig;
use forkfs::{Store, StoreConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Seal packs at this size [default: 16MiB]
    #[arg(long)]
    pack_size: Option<String>,
    /// Default block size of new volumes [default: 64KiB]
    #[arg(long)]
    block_size: Option<String>,
    /// zstd level for chunks (1 is fast; higher compresses more) [default: 1]
    #[arg(long)]
    zstd_level: Option<i32>,
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
    /// used go first; every cached chunk is verified when read) [default: 8GiB]
    #[arg(long, requires = "remote")]
    cache_size: Option<String>,
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
    let d = StoreConfig::default();
    let size = |s: Option<&str>, default: u64| s.map_or(Ok(default), parse_size);
    let config = StoreConfig {
        pack_target: size(a.pack_size.as_deref(), d.pack_target as u64)? as usize,
        default_block_size: u32::try_from(size(
            a.block_size.as_deref(),
            d.default_block_size as u64,
        )?)
        .map_err(|_| forkfs::Error::invalid("block size too large"))?,
        zstd_level: a.zstd_level.unwrap_or(d.zstd_level),
        disk_cache_bytes: size(a.cache_size.as_deref(), d.disk_cache_bytes)?,
        remote: a.remote.map(|url| RemoteConfig {
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
    let store = Store::init_with(&dir, config, &g.settings())?;
    let volumes = store.volumes().list()?.len();
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
