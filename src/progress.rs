//! Progress of long operations (fsck, gc), reported to whoever runs them:
//! a terminal progress bar in the CLI, nothing in library callers.

pub trait Progress: Send + Sync {
    /// A new stage begins with `total` units of work (0: unknown).
    fn stage(&self, name: &str, total: u64);
    /// `n` more units of the current stage are done.
    fn advance(&self, n: u64);
}

/// Reports nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn stage(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
}
