//! The store's identity: a random id kept both in its configuration
//! (`forkfs.json`) and in its index. A store whose index is missing, empty
//! or another store's refuses to open, naming `forkfs fsck --repair`, which
//! rebuilds the index from the object store; it never opens as an empty
//! store (which a gc would then empty for real).

use super::StoreConfig;
use super::config::CONFIG_FILE;
use crate::db::{Batch, Db};
use crate::error::{Error, Result};
use crate::records::keys;
use std::path::Path;

/// How a store is being opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Opening {
    /// `forkfs init`: the index is new.
    Create,
    /// An existing store: its index must be its own.
    Existing,
    /// `fsck --repair` rebuilding a lost index: the index is new.
    Rebuild,
}

/// A new store id.
pub(super) fn new_id() -> String {
    rand::random::<[u8; 16]>().iter().map(|b| format!("{b:02x}")).collect()
}

/// The error of a store whose index is not its own.
pub(super) fn index_lost(dir: &Path, why: &str) -> Error {
    Error::index_lost(format!(
        "the index of the store at {} {why}; `forkfs fsck --repair` rebuilds it from the object \
         store (writes not yet in a version are lost with it)",
        dir.display()
    ))
}

/// Checks (or, for a new index, records) that `db` is the index of the
/// store configured by `config`; gives an older store without an id one.
pub(super) fn settle(
    dir: &Path,
    config: &mut StoreConfig,
    db: &Db,
    opening: Opening,
) -> Result<()> {
    let theirs: Option<String> = db.get_json(keys::STORE_ID)?;
    match (opening, &config.id, theirs) {
        (Opening::Existing, Some(c), Some(i)) if *c == i => Ok(()),
        (Opening::Existing, Some(_), Some(_)) => Err(index_lost(dir, "belongs to another store")),
        (Opening::Existing, Some(_), None) => Err(index_lost(dir, "is empty")),
        // Written by a forkfs from before store ids: the index's, or a new one.
        (Opening::Existing, None, Some(i)) => {
            config.id = Some(i);
            rewrite_config(dir, config)
        }
        (_, id, _) => {
            let id = id.clone().unwrap_or_else(new_id);
            let mut b = Batch::default();
            db.put_json(&mut b, keys::STORE_ID, &id)?;
            db.write(b, true)?;
            if config.id.as_ref() != Some(&id) {
                config.id = Some(id);
                if opening != Opening::Create {
                    rewrite_config(dir, config)?;
                }
            }
            Ok(())
        }
    }
}

/// This host's id among the hosts of a shared store (`keys::HOST_ID`),
/// made on first use. Every host that joins a bucket takes the store id
/// from its `store.json`, so GC cannot tell hosts apart by that: one
/// host's acknowledgement would stand for all of them.
pub(super) fn host_id(db: &Db) -> Result<String> {
    if let Some(id) = db.get_json::<String>(keys::HOST_ID)? {
        return Ok(id);
    }
    let id = new_id();
    let mut b = Batch::default();
    db.put_json(&mut b, keys::HOST_ID, &id)?;
    db.write(b, true)?;
    Ok(id)
}

/// Replaces `forkfs.json` atomically and durably.
fn rewrite_config(dir: &Path, config: &StoreConfig) -> Result<()> {
    let tmp = dir.join(format!("{CONFIG_FILE}.tmp"));
    crate::files::write_private(&tmp, &serde_json::to_vec_pretty(config)?)?;
    std::fs::rename(&tmp, dir.join(CONFIG_FILE))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}
