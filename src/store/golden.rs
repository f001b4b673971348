//! Golden test of the store configuration file (`forkfs.json`,
//! docs/FORMAT.md: Store directory): a fixed configuration encoded as the
//! store writes it, compared byte for byte with `tests/golden/`, and read
//! back. `FORKFS_BLESS=1` rewrites the file (see `files::golden`).

use super::StoreConfig;
use crate::files::golden;

#[test]
fn golden_store_config() {
    let c = StoreConfig {
        id: Some("00112233445566778899aabbccddeeff".into()),
        pack_target: 16 << 20,
        zstd_level: 1,
        cache_bytes: 256 << 20,
        default_block_size: 65_536,
        ..StoreConfig::default()
    };
    let want = golden("store-config.json", &serde_json::to_vec_pretty(&c).expect("json"));
    let back: StoreConfig = serde_json::from_slice(&want).expect("decodes");
    assert_eq!(serde_json::to_value(&back).expect("json"), serde_json::to_value(&c).expect("json"));
    assert_eq!(back.format, crate::records::RECORD_FORMAT);
    assert!(back.remote.is_none());
}
