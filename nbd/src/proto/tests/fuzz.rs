//! Robustness loop: every prefix of valid payloads, valid payloads with
//! random mutations or trailing bytes, and pure random garbage go through
//! every decoder; none may panic, and truncated or oversized option
//! payloads must be rejected.

use super::super::*;
use super::options::{info_fixture, meta_fixture};

/// Tiny xorshift64 PRNG (deterministic, no external crate).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        a.iter_mut().for_each(|b| *b = self.next() as u8);
        a
    }
}

/// Accepts a payload iff the parser under test does.
type Accepts = fn(&[u8]) -> bool;

/// Runs every option payload parser; results are ignored, panics are not.
fn all_parsers(data: &[u8]) {
    let _ = parse_export_name(data);
    let _ = parse_info_request(data);
    let _ = parse_meta_context_request(data);
}

#[test]
fn prefixes_and_trailing_bytes_are_rejected() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let cases: [(Vec<u8>, Accepts); 2] = [
        (info_fixture(), |d| parse_info_request(d).is_ok()),
        (meta_fixture(), |d| parse_meta_context_request(d).is_ok()),
    ];
    for (valid, parses) in cases {
        assert!(parses(&valid));
        for cut in 0..valid.len() {
            all_parsers(&valid[..cut]);
            assert!(!parses(&valid[..cut]), "prefix of {cut} bytes accepted");
        }
        for _ in 0..200 {
            let mut long = valid.clone();
            let extra = 1 + rng.below(64);
            long.extend(rng.bytes(extra));
            all_parsers(&long);
            assert!(!parses(&long), "payload with {extra} trailing bytes accepted");
        }
    }
}

#[test]
fn mutated_payloads_never_panic() {
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    for valid in [info_fixture(), meta_fixture()] {
        for _ in 0..20_000 {
            let mut data = valid.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            if rng.below(4) == 0 {
                data.truncate(rng.below(data.len() + 1));
            }
            all_parsers(&data);
        }
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = XorShift(0xdead_beef_cafe_f00d);
    for round in 0..20_000 {
        let len = if round % 100 == 0 { rng.below(70_000) } else { rng.below(64) };
        let mut data = rng.bytes(len);
        // Bias length fields towards small plausible values to go deeper.
        if data.len() >= 4 && rng.below(2) == 0 {
            let small = rng.below(data.len() + 2) as u32;
            data[..4].copy_from_slice(&small.to_be_bytes());
        }
        all_parsers(&data);

        let _ = decode_option_header(&rng.array());
        let _ = decode_request(&rng.array());
        let _ = decode_client_flags(&rng.array(), HandshakeFlags::ALL);
    }
}

#[test]
fn random_headers_with_valid_magic() {
    let mut rng = XorShift(42);
    for _ in 0..20_000 {
        let mut opt: [u8; 16] = rng.array();
        opt[..8].copy_from_slice(b"IHAVEOPT");
        match decode_option_header(&opt) {
            Ok(h) => assert!(h.len <= consts::MAX_OPTION_DATA_LEN),
            Err(e) => assert!(matches!(e, ProtoError::OptionTooBig { .. })),
        }
        let mut req: [u8; 28] = rng.array();
        req[..4].copy_from_slice(&consts::NBD_REQUEST_MAGIC.to_be_bytes());
        let decoded = decode_request(&req).unwrap();
        let mut out = Vec::new();
        encode_request(&mut out, &decoded);
        assert_eq!(out, req);
    }
}
