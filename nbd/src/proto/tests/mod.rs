//! Unit tests for the NBD wire protocol module: byte-exact encodings checked
//! against the protocol document, decode round trips, and robustness of every
//! parser against truncated, oversized and random input.

mod fuzz;
mod handshake;
mod options;
mod transmission;

/// Builds a byte vector from big-endian fields, for hand-written fixtures.
#[derive(Default)]
pub(super) struct Bytes(pub Vec<u8>);

impl Bytes {
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
}
