//! The settings a store is created with (`<store>/forkfs.json`; for a
//! remote store, shared by every host through `store.json` in the bucket).

use crate::cas::ChunkConfig;
use crate::objects::RemoteConfig;
use crate::records::RECORD_FORMAT;
use serde::{Deserialize, Serialize};

pub const CONFIG_FILE: &str = "forkfs.json";
pub const DEFAULT_BLOCK_SIZE: u32 = 64 << 10;
pub const DEFAULT_DISK_CACHE: u64 = 8 << 30;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StoreConfig {
    pub format: u8,
    /// The store's identity, also recorded in its index (see
    /// `store/identity.rs`); absent in stores made before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub pack_target: usize,
    pub zstd_level: i32,
    /// Bytes of chunks kept in memory; 0: sized by each host's memory
    /// (`config::auto_cache`). `FORKFS_MEMORY_CACHE` overrides it.
    pub cache_bytes: u64,
    pub default_block_size: u32,
    /// Objects live here instead of `<store>/objects` (`forkfs init --remote`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteConfig>,
    /// Bytes of chunks a remote store keeps on local disk (`<store>/cache`);
    /// a setting of this host, not of the shared store.
    #[serde(default = "default_disk_cache")]
    pub disk_cache_bytes: u64,
}

fn default_disk_cache() -> u64 {
    DEFAULT_DISK_CACHE
}

impl Default for StoreConfig {
    fn default() -> Self {
        let c = ChunkConfig::default();
        StoreConfig {
            format: RECORD_FORMAT,
            id: None,
            pack_target: c.pack_target,
            zstd_level: c.zstd_level,
            cache_bytes: 0,
            default_block_size: DEFAULT_BLOCK_SIZE,
            remote: None,
            disk_cache_bytes: DEFAULT_DISK_CACHE,
        }
    }
}
