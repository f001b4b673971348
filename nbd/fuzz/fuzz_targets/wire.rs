//! Fuzzes the NBD wire decoders the server runs on untrusted bytes: option
//! headers and payloads of the handshake, and request headers, which must
//! never panic and must re-encode to the same bytes when they decode.
#![no_main]

#[path = "../../src/proto/mod.rs"]
#[allow(dead_code)]
mod proto;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 6 {
        0 => {
            if let Ok(buf) = <&[u8; 28]>::try_from(rest.get(..28).unwrap_or(&[])) {
                if let Ok(req) = proto::decode_request(buf) {
                    let mut out = Vec::new();
                    proto::encode_request(&mut out, &req);
                    assert_eq!(&out[..], &buf[..], "request round trip");
                }
            }
        }
        1 => {
            if let Ok(buf) = <&[u8; 16]>::try_from(rest.get(..16).unwrap_or(&[])) {
                if let Ok(h) = proto::decode_option_header(buf) {
                    let mut out = Vec::new();
                    proto::encode_option_header(&mut out, h.option, h.len);
                    assert_eq!(&out[..], &buf[..], "option header round trip");
                }
            }
        }
        2 => {
            let _ = proto::parse_export_name(rest);
        }
        3 => {
            let _ = proto::parse_info_request(rest);
        }
        4 => {
            let _ = proto::parse_meta_context_request(rest);
        }
        _ => {
            if let Ok(buf) = <&[u8; 4]>::try_from(rest.get(..4).unwrap_or(&[])) {
                let _ = proto::decode_client_flags(buf, proto::HandshakeFlags::FIXED_NEWSTYLE.union(proto::HandshakeFlags::NO_ZEROES));
            }
        }
    }
});
