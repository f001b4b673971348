//! Option payload parsers: hand-built fixtures, round trips, and rejection
//! of every truncated, oversized or inconsistent payload.

use super::super::consts::*;
use super::super::*;
use super::Bytes;

/// `NBD_OPT_GO` data for export "disk" requesting NAME and BLOCK_SIZE.
pub(super) fn info_fixture() -> Vec<u8> {
    Bytes::default().u32(4).raw(b"disk").u16(2).u16(1).u16(3).0
}

/// `NBD_OPT_SET_META_CONTEXT` data for "disk" with two queries.
pub(super) fn meta_fixture() -> Vec<u8> {
    Bytes::default()
        .u32(4)
        .raw(b"disk")
        .u32(2)
        .u32(15)
        .raw(b"base:allocation")
        .u32(5)
        .raw(b"x-a:b")
        .0
}

#[test]
fn export_name() {
    assert_eq!(parse_export_name(b"").unwrap(), "");
    assert_eq!(parse_export_name(b"vol@3").unwrap(), "vol@3");
    assert_eq!(parse_export_name("é".as_bytes()).unwrap(), "é");
    assert!(matches!(parse_export_name(b"a\0"), Err(ProtoError::InvalidString { .. })));
    assert!(matches!(parse_export_name(&[0xff, 0xfe]), Err(ProtoError::InvalidString { .. })));
    assert!(parse_export_name(&[b'a'; MAX_STRING_LEN]).is_ok());
    assert!(matches!(
        parse_export_name(&[b'a'; MAX_STRING_LEN + 1]),
        Err(ProtoError::StringTooLong { .. })
    ));
}

#[test]
fn info_request_fixture() {
    let req = parse_info_request(&info_fixture()).unwrap();
    assert_eq!(req.name, "disk");
    assert_eq!(req.requests, vec![InfoType::Name, InfoType::BlockSize]);
    assert!(req.wants(InfoType::BlockSize));
    assert!(!req.wants(InfoType::Export));

    let minimal = Bytes::default().u32(0).u16(0).0;
    let req = parse_info_request(&minimal).unwrap();
    assert_eq!(req, InfoRequest { name: String::new(), requests: vec![] });

    let unknown = Bytes::default().u32(0).u16(1).u16(0x7777).0;
    assert_eq!(parse_info_request(&unknown).unwrap().requests, vec![InfoType::Unknown(0x7777)]);
}

#[test]
fn info_request_round_trip() {
    let mut out = Vec::new();
    let wanted = [InfoType::Export, InfoType::Description, InfoType::Unknown(9)];
    encode_info_request(&mut out, "vol", &wanted).unwrap();
    let req = parse_info_request(&out).unwrap();
    assert_eq!(req.name, "vol");
    assert_eq!(req.requests, wanted);
    let mut fixture = Vec::new();
    encode_info_request(&mut fixture, "disk", &[InfoType::Name, InfoType::BlockSize]).unwrap();
    assert_eq!(fixture, info_fixture());
}

#[test]
fn info_request_rejects_truncation_and_excess() {
    let valid = info_fixture();
    for cut in 0..valid.len() {
        assert!(parse_info_request(&valid[..cut]).is_err(), "prefix {cut}");
    }
    let mut long = valid.clone();
    long.push(0);
    assert!(matches!(parse_info_request(&long), Err(ProtoError::TrailingBytes { extra: 1, .. })));

    // Name length larger than the data length - 6.
    let bad = Bytes::default().u32(5).raw(b"disk").u16(0).0;
    assert!(parse_info_request(&bad).is_err());
    // Name length claims more than 4 GiB / more than the string limit.
    let bad = Bytes::default().u32(u32::MAX).raw(b"disk").u16(0).0;
    assert!(parse_info_request(&bad).is_err());
    let bad = Bytes::default().u32(5000).raw(&[b'a'; 5000]).u16(0).0;
    assert!(matches!(parse_info_request(&bad), Err(ProtoError::StringTooLong { .. })));
    // Request count larger than the list.
    let bad = Bytes::default().u32(0).u16(3).u16(1).u16(2).0;
    assert!(matches!(parse_info_request(&bad), Err(ProtoError::Truncated { .. })));
    let bad = Bytes::default().u32(0).u16(u16::MAX).0;
    assert!(parse_info_request(&bad).is_err());
    // Odd byte count in the list.
    let bad = Bytes::default().u32(0).u16(1).u16(1).raw(&[0]).0;
    assert!(parse_info_request(&bad).is_err());
}

#[test]
fn meta_context_fixture() {
    let req = parse_meta_context_request(&meta_fixture()).unwrap();
    assert_eq!(req.export, "disk");
    assert_eq!(req.queries, vec!["base:allocation".to_string(), "x-a:b".to_string()]);

    let none = Bytes::default().u32(0).u32(0).0;
    let req = parse_meta_context_request(&none).unwrap();
    assert_eq!(req, MetaContextRequest { export: String::new(), queries: vec![] });
}

#[test]
fn meta_context_round_trip() {
    let mut out = Vec::new();
    encode_meta_context_request(&mut out, "disk", &["base:allocation", "x-a:b"]).unwrap();
    assert_eq!(out, meta_fixture());
    let mut out = Vec::new();
    encode_meta_context_request(&mut out, "", &[]).unwrap();
    assert_eq!(parse_meta_context_request(&out).unwrap().queries.len(), 0);
}

#[test]
fn meta_context_rejects_truncation_and_excess() {
    let valid = meta_fixture();
    for cut in 0..valid.len() {
        assert!(parse_meta_context_request(&valid[..cut]).is_err(), "prefix {cut}");
    }
    let mut long = valid.clone();
    long.extend_from_slice(&[0, 0, 0, 0]);
    assert!(matches!(
        parse_meta_context_request(&long),
        Err(ProtoError::TrailingBytes { extra: 4, .. })
    ));

    // A huge query count must fail fast, without allocating per count.
    let bad = Bytes::default().u32(0).u32(u32::MAX).0;
    assert!(matches!(parse_meta_context_request(&bad), Err(ProtoError::Truncated { .. })));
    let bad = Bytes::default().u32(0).u32(2).u32(0).0;
    assert!(parse_meta_context_request(&bad).is_err());
    // Query length running past the end, or absurdly large.
    let bad = Bytes::default().u32(0).u32(1).u32(6).raw(b"base:").0;
    assert!(parse_meta_context_request(&bad).is_err());
    let bad = Bytes::default().u32(0).u32(1).u32(u32::MAX).raw(b"base:").0;
    assert!(parse_meta_context_request(&bad).is_err());
    // Export name length past the end.
    let bad = Bytes::default().u32(100).raw(b"disk").u32(0).0;
    assert!(parse_meta_context_request(&bad).is_err());
    // Non-UTF-8 query.
    let bad = Bytes::default().u32(0).u32(1).u32(2).raw(&[0xc3, 0x28]).0;
    assert!(matches!(parse_meta_context_request(&bad), Err(ProtoError::InvalidString { .. })));
}

#[test]
fn request_encoders_validate() {
    let mut out = Vec::new();
    let long = "q".repeat(MAX_STRING_LEN + 1);
    assert!(encode_meta_context_request(&mut out, "disk", &["ok:", &long]).is_err());
    assert!(encode_info_request(&mut out, &long, &[]).is_err());
    assert!(out.is_empty());
}
