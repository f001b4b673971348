//! Where a store lives when none is named. Also compiled into the
//! `forkfs` launcher (`src/main.rs`), which links no store code.

use std::path::PathBuf;

/// The store directory when none is given: `$XDG_DATA_HOME/forkfs`, else
/// `~/.local/share/forkfs` (the same for every forkfs binary).
pub fn default_store_dir() -> PathBuf {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("forkfs")
}
