//! `forkfs fork` and `forkfs restore` (their arguments and answers are in
//! `held.rs`, shared with the `forkfs` launcher).

use super::Global;
pub use super::held::{ForkArgs, RestoreArgs};

/// Works while a server holds the store (through its control socket).
pub fn fork(g: &Global, a: ForkArgs) -> anyhow::Result<()> {
    match a.held()? {
        Some(held) => g.run_held(&held),
        None => super::group::fork(g, a.group.unwrap_or_default(), a.source),
    }
}

/// Works while a server holds the store (through its control socket).
pub fn restore(g: &Global, a: RestoreArgs) -> anyhow::Result<()> {
    match a.held()? {
        Some(held) => g.run_held(&held),
        None => super::group::restore(g, a.group.unwrap_or_default(), a.volume),
    }
}
