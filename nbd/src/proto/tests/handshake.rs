//! Handshake and option-reply encodings checked byte by byte.

use super::super::consts::*;
use super::super::*;
use super::Bytes;

const REPLY_MAGIC: [u8; 8] = [0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9];

#[test]
fn greeting_bytes() {
    let mut out = Vec::new();
    encode_greeting(&mut out, HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES);
    let mut want = b"NBDMAGICIHAVEOPT".to_vec();
    want.extend_from_slice(&[0x00, 0x03]);
    assert_eq!(out, want);
    assert_eq!(out.len(), GREETING_LEN);
}

#[test]
fn client_flags() {
    let offered = HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES;
    let only_fixed = HandshakeFlags::FIXED_NEWSTYLE;
    assert_eq!(decode_client_flags(&[0, 0, 0, 0], offered), Ok(ClientFlags::empty()));
    assert_eq!(decode_client_flags(&[0, 0, 0, 1], only_fixed), Ok(ClientFlags::FIXED_NEWSTYLE));
    assert_eq!(
        decode_client_flags(&[0, 0, 0, 3], offered),
        Ok(ClientFlags::FIXED_NEWSTYLE | ClientFlags::NO_ZEROES)
    );
    assert_eq!(decode_client_flags(&[0, 0, 0, 3], only_fixed), Err(ProtoError::BadClientFlags(3)));
    assert_eq!(decode_client_flags(&[0, 0, 0, 4], offered), Err(ProtoError::BadClientFlags(4)));
    assert!(decode_client_flags(&[0x80, 0, 0, 1], offered).is_err());
}

#[test]
fn option_header_decode() {
    let buf = Bytes::default().raw(b"IHAVEOPT").u32(7).u32(12).0;
    let hdr = decode_option_header(&buf.try_into().unwrap()).unwrap();
    assert_eq!(hdr, OptionHeader { option: OptionType::Go, len: 12 });
    assert_eq!(hdr.data_len(), 12);

    let max = Bytes::default().raw(b"IHAVEOPT").u32(99).u32(MAX_OPTION_DATA_LEN).0;
    let hdr = decode_option_header(&max.try_into().unwrap()).unwrap();
    assert_eq!(hdr.option, OptionType::Unknown(99));

    for len in [MAX_OPTION_DATA_LEN + 1, u32::MAX] {
        let big = Bytes::default().raw(b"IHAVEOPT").u32(1).u32(len).0;
        assert_eq!(
            decode_option_header(&big.try_into().unwrap()),
            Err(ProtoError::OptionTooBig { option: 1, len })
        );
    }

    let bad = Bytes::default().raw(b"IHAVEOPS").u32(1).u32(0).0;
    assert!(matches!(
        decode_option_header(&bad.try_into().unwrap()),
        Err(ProtoError::BadMagic { .. })
    ));

    let mut out = Vec::new();
    encode_option_header(&mut out, OptionType::SetMetaContext, 5);
    assert_eq!(out, Bytes::default().raw(b"IHAVEOPT").u32(10).u32(5).0);
}

#[test]
fn export_name_reply() {
    let flags = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH;
    let mut out = Vec::new();
    encode_export_name_reply(&mut out, 0x0102_0304_0506_0708, flags, false);
    assert_eq!(out.len(), 8 + 2 + 124);
    assert_eq!(&out[..10], &[1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x05]);
    assert!(out[10..].iter().all(|&b| b == 0));

    out.clear();
    encode_export_name_reply(&mut out, 4096, flags, true);
    assert_eq!(out, [0, 0, 0, 0, 0, 0, 0x10, 0, 0x00, 0x05]);
}

#[test]
fn rep_ack_and_generic() {
    let mut out = Vec::new();
    encode_rep_ack(&mut out, OptionType::Abort);
    let want = Bytes::default().raw(&REPLY_MAGIC).u32(2).u32(1).u32(0).0;
    assert_eq!(out, want);
    assert_eq!(out.len(), OPTION_REPLY_HEADER_LEN);

    out.clear();
    encode_option_reply(&mut out, OptionType::Unknown(42), OptionReplyType::ErrUnsup, b"xy")
        .unwrap();
    let want = Bytes::default().raw(&REPLY_MAGIC).u32(42).u32(0x8000_0001).u32(2).raw(b"xy").0;
    assert_eq!(out, want);
}

#[test]
fn rep_error_and_truncation() {
    let mut out = Vec::new();
    encode_rep_error(&mut out, OptionType::Go, OptionReplyType::ErrUnknown, "no such export");
    let want =
        Bytes::default().raw(&REPLY_MAGIC).u32(7).u32(0x8000_0006).u32(14).raw(b"no such export").0;
    assert_eq!(out, want);

    // 4095 ASCII bytes then a 2-byte char: must cut before the char.
    let long = format!("{}é{}", "a".repeat(4095), "b".repeat(100));
    out.clear();
    encode_rep_error(&mut out, OptionType::Info, OptionReplyType::ErrInvalid, &long);
    assert_eq!(&out[16..20], &4095u32.to_be_bytes());
    assert_eq!(out.len(), 20 + 4095);
}

#[test]
fn rep_server() {
    let mut out = Vec::new();
    encode_rep_server(&mut out, "vol", "").unwrap();
    let want = Bytes::default().raw(&REPLY_MAGIC).u32(3).u32(2).u32(7).u32(3).raw(b"vol").0;
    assert_eq!(out, want);

    out.clear();
    encode_rep_server(&mut out, "vol", "desc").unwrap();
    let want =
        Bytes::default().raw(&REPLY_MAGIC).u32(3).u32(2).u32(11).u32(3).raw(b"vol").raw(b"desc").0;
    assert_eq!(out, want);
}

#[test]
fn rep_info_items() {
    let mut out = Vec::new();
    let flags = TransmissionFlags::HAS_FLAGS | TransmissionFlags::READ_ONLY;
    encode_info_export(&mut out, OptionType::Go, 1 << 30, flags);
    let want =
        Bytes::default().raw(&REPLY_MAGIC).u32(7).u32(3).u32(12).u16(0).u64(1 << 30).u16(3).0;
    assert_eq!(out, want);

    out.clear();
    encode_info_name(&mut out, OptionType::Info, "disk").unwrap();
    let want = Bytes::default().raw(&REPLY_MAGIC).u32(6).u32(3).u32(6).u16(1).raw(b"disk").0;
    assert_eq!(out, want);

    out.clear();
    encode_info_description(&mut out, OptionType::Go, "").unwrap();
    let want = Bytes::default().raw(&REPLY_MAGIC).u32(7).u32(3).u32(2).u16(2).0;
    assert_eq!(out, want);

    out.clear();
    let sizes = BlockSizes { min: 512, preferred: 4096, max: 32 << 20 };
    encode_info_block_size(&mut out, OptionType::Go, sizes);
    let want = Bytes::default()
        .raw(&REPLY_MAGIC)
        .u32(7)
        .u32(3)
        .u32(14)
        .u16(3)
        .u32(512)
        .u32(4096)
        .u32(32 << 20)
        .0;
    assert_eq!(out, want);
}

#[test]
fn rep_meta_context() {
    let mut out = Vec::new();
    encode_rep_meta_context(&mut out, OptionType::SetMetaContext, 9, BASE_ALLOCATION).unwrap();
    let want = Bytes::default()
        .raw(&REPLY_MAGIC)
        .u32(10)
        .u32(4)
        .u32(4 + 15)
        .u32(9)
        .raw(b"base:allocation")
        .0;
    assert_eq!(out, want);
}

#[test]
fn string_encoders_reject_bad_strings_without_writing() {
    let long = "x".repeat(MAX_STRING_LEN + 1);
    let mut out = vec![0xaa];
    assert!(matches!(
        encode_rep_server(&mut out, &long, ""),
        Err(ProtoError::StringTooLong { .. })
    ));
    assert!(encode_rep_server(&mut out, "a\0b", "").is_err());
    assert!(encode_info_name(&mut out, OptionType::Go, &long).is_err());
    assert!(encode_info_description(&mut out, OptionType::Go, &long).is_err());
    assert!(encode_rep_meta_context(&mut out, OptionType::Go, 1, &long).is_err());
    assert_eq!(out, [0xaa]);
    let max = "x".repeat(MAX_STRING_LEN);
    assert!(encode_info_name(&mut out, OptionType::Go, &max).is_ok());
}

#[test]
fn option_reply_type_codes() {
    use OptionReplyType::*;
    let all = [
        (Ack, 1),
        (Server, 2),
        (Info, 3),
        (MetaContext, 4),
        (ErrUnsup, 0x8000_0001),
        (ErrPolicy, 0x8000_0002),
        (ErrInvalid, 0x8000_0003),
        (ErrPlatform, 0x8000_0004),
        (ErrTlsReqd, 0x8000_0005),
        (ErrUnknown, 0x8000_0006),
        (ErrShutdown, 0x8000_0007),
        (ErrBlockSizeReqd, 0x8000_0008),
        (ErrTooBig, 0x8000_0009),
    ];
    for (ty, raw) in all {
        assert_eq!(u32::from(ty), raw);
        assert_eq!(OptionReplyType::from(raw), ty);
        assert_eq!(ty.is_error(), raw >= 0x8000_0000);
    }
    assert_eq!(OptionReplyType::from(0x8000_000a), Unknown(0x8000_000a));
}

#[test]
fn option_type_codes() {
    for raw in 0..=20u32 {
        let ty = OptionType::from(raw);
        assert_eq!(u32::from(ty), raw);
        let known = matches!(raw, 1..=3 | 5..=11);
        assert_eq!(!matches!(ty, OptionType::Unknown(_)), known, "{raw}");
    }
    assert_eq!(OptionType::from(11), OptionType::ExtendedHeaders);
    assert_eq!(u32::from(OptionType::StartTls), 5);
}
