//! Transmission phase: request decoding against hand-built headers, and
//! simple / structured reply encodings checked byte by byte.

use super::super::consts::*;
use super::super::*;
use super::Bytes;
use std::io::ErrorKind;

fn header(flags: u16, ty: u16, cookie: u64, offset: u64, length: u32) -> [u8; 28] {
    let v =
        Bytes::default().u32(0x2560_9513).u16(flags).u16(ty).u64(cookie).u64(offset).u32(length).0;
    v.try_into().unwrap()
}

#[test]
fn decode_read_and_write() {
    let buf = [
        0x25, 0x60, 0x95, 0x13, // magic
        0x00, 0x00, // flags
        0x00, 0x00, // NBD_CMD_READ
        0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x01, // cookie
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, // offset
        0x00, 0x00, 0x10, 0x00, // length
    ];
    let req = decode_request(&buf).unwrap();
    assert_eq!(
        req,
        Request {
            flags: CmdFlags::empty(),
            command: Command::Read,
            cookie: 0xdead_beef_0000_0001,
            offset: 0x10_0000,
            length: 4096,
        }
    );
    assert_eq!(req.payload_len(), 0);
    let mut out = Vec::new();
    encode_request(&mut out, &req);
    assert_eq!(out, buf);

    let req = decode_request(&header(1, 1, 7, 512, 1024)).unwrap();
    assert_eq!(req.command, Command::Write);
    assert_eq!(req.flags, CmdFlags::FUA);
    assert_eq!(req.payload_len(), 1024);
    assert!(req.invalid_flags().is_empty());
}

#[test]
fn decode_all_commands_round_trip() {
    let names = [
        (0, Command::Read),
        (1, Command::Write),
        (2, Command::Disc),
        (3, Command::Flush),
        (4, Command::Trim),
        (5, Command::Cache),
        (6, Command::WriteZeroes),
        (7, Command::BlockStatus),
        (8, Command::Resize),
        (9, Command::Unknown(9)),
        (0xffff, Command::Unknown(0xffff)),
    ];
    for (raw, cmd) in names {
        let buf = header(0x1f, raw, u64::MAX, u64::MAX - 1, u32::MAX);
        let req = decode_request(&buf).unwrap();
        assert_eq!(req.command, cmd);
        assert_eq!((req.cookie, req.offset, req.length), (u64::MAX, u64::MAX - 1, u32::MAX));
        let mut out = Vec::new();
        encode_request(&mut out, &req);
        assert_eq!(out, buf);
    }
    for raw in 0..=u16::MAX {
        assert_eq!(u16::from(Command::from(raw)), raw);
    }
}

#[test]
fn decode_rejects_bad_magic() {
    for magic in [0u32, 0x1256_0953, 0x2560_9514, 0x21e4_1c71] {
        let mut buf = header(0, 0, 1, 0, 512);
        buf[..4].copy_from_slice(&magic.to_be_bytes());
        assert_eq!(
            decode_request(&buf),
            Err(ProtoError::BadMagic {
                what: "request",
                expected: 0x2560_9513,
                found: u64::from(magic)
            })
        );
    }
}

#[test]
fn request_helpers() {
    let req = decode_request(&header(0x40 | 0x04, 0, 1, u64::MAX - 10, 11)).unwrap();
    assert_eq!(req.flags.unknown_bits(), 0x40);
    assert_eq!(req.end(), None);
    assert!(!req.in_bounds(u64::MAX));
    assert_eq!(req.invalid_flags().bits(), 0x40);

    let req = decode_request(&header(0, 7, 1, 100, 28)).unwrap();
    assert_eq!(req.end(), Some(128));
    assert!(req.in_bounds(128));
    assert!(!req.in_bounds(127));

    let wz = CmdFlags::FUA | CmdFlags::NO_HOLE | CmdFlags::FAST_ZERO;
    assert_eq!(Command::WriteZeroes.allowed_flags(), wz);
    assert_eq!(Command::Read.allowed_flags(), CmdFlags::FUA | CmdFlags::DF);
    assert_eq!(Command::BlockStatus.allowed_flags(), CmdFlags::FUA | CmdFlags::REQ_ONE);
    assert_eq!(Command::Flush.allowed_flags(), CmdFlags::FUA);
    assert!(Command::Unknown(99).allowed_flags().is_empty());
    let trim = decode_request(&header(0x02, 4, 1, 0, 1)).unwrap();
    assert_eq!(trim.invalid_flags(), CmdFlags::NO_HOLE);
}

#[test]
fn simple_reply_bytes() {
    let mut out = Vec::new();
    encode_simple_reply(&mut out, NBD_EIO, 0x0102_0304_0506_0708);
    assert_eq!(out, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(out.len(), SIMPLE_REPLY_HEADER_LEN);
}

fn chunk(flags: u16, ty: u16, cookie: u64, len: u32) -> Bytes {
    Bytes::default().u32(0x668e_33ef).u16(flags).u16(ty).u64(cookie).u32(len)
}

#[test]
fn structured_chunks() {
    let mut out = Vec::new();
    encode_none_chunk(&mut out, 9);
    assert_eq!(out, chunk(1, 0, 9, 0).0);
    assert_eq!(out.len(), STRUCTURED_REPLY_HEADER_LEN);

    out.clear();
    encode_offset_data(&mut out, false, 9, 4096, b"abc").unwrap();
    assert_eq!(out, chunk(0, 1, 9, 11).u64(4096).raw(b"abc").0);

    out.clear();
    encode_offset_data_header(&mut out, true, 9, 0, 512).unwrap();
    assert_eq!(out, chunk(1, 1, 9, 520).u64(0).0);

    out.clear();
    encode_offset_hole(&mut out, true, 9, 8192, 4096).unwrap();
    assert_eq!(out, chunk(1, 2, 9, 12).u64(8192).u32(4096).0);

    out.clear();
    let extents = [
        BlockDescriptor { length: 4096, status: 0 },
        BlockDescriptor { length: 8192, status: NBD_STATE_HOLE | NBD_STATE_ZERO },
    ];
    encode_block_status(&mut out, true, 9, 1, &extents).unwrap();
    assert_eq!(out, chunk(1, 5, 9, 20).u32(1).u32(4096).u32(0).u32(8192).u32(3).0);

    out.clear();
    encode_error_chunk(&mut out, true, 9, NBD_EINVAL, "bad");
    assert_eq!(out, chunk(1, 0x8001, 9, 9).u32(22).u16(3).raw(b"bad").0);

    out.clear();
    encode_error_offset_chunk(&mut out, false, 9, NBD_EIO, "", 1024);
    assert_eq!(out, chunk(0, 0x8002, 9, 14).u32(5).u16(0).u64(1024).0);

    out.clear();
    let long = "m".repeat(10_000);
    encode_error_chunk(&mut out, true, 9, NBD_EIO, &long);
    assert_eq!(out.len(), 20 + 6 + MAX_STRING_LEN);
    assert_eq!(&out[24..26], &4096u16.to_be_bytes());
}

#[test]
fn structured_chunk_errors_leave_output_untouched() {
    let mut out = vec![7];
    assert!(matches!(
        encode_offset_data(&mut out, true, 1, 0, b""),
        Err(ProtoError::EmptyChunk { .. })
    ));
    assert!(matches!(
        encode_offset_data_header(&mut out, true, 1, 0, u32::MAX - 7),
        Err(ProtoError::PayloadTooLarge { .. })
    ));
    assert!(encode_offset_hole(&mut out, true, 1, 0, 0).is_err());
    assert!(encode_block_status(&mut out, true, 1, 1, &[]).is_err());
    assert_eq!(out, [7]);
    assert!(encode_offset_data_header(&mut out, true, 1, 0, u32::MAX - 8).is_ok());
}

#[test]
fn errno_and_reply_type_codes() {
    let errnos = [
        (Errno::Perm, 1),
        (Errno::Io, 5),
        (Errno::NoMem, 12),
        (Errno::Inval, 22),
        (Errno::NoSpc, 28),
        (Errno::Overflow, 75),
        (Errno::NotSup, 95),
        (Errno::Shutdown, 108),
    ];
    for (e, raw) in errnos {
        assert_eq!(u32::from(e), raw);
        assert_eq!(Errno::from(raw), e);
    }
    assert_eq!(Errno::from_io_kind(ErrorKind::StorageFull), Errno::NoSpc);
    assert_eq!(Errno::from_io_kind(ErrorKind::PermissionDenied), Errno::Perm);
    assert_eq!(Errno::from_io_kind(ErrorKind::UnexpectedEof), Errno::Io);
    let types = [(ReplyType::None, 0), (ReplyType::OffsetData, 1), (ReplyType::OffsetHole, 2)];
    for (t, raw) in types.into_iter().chain([
        (ReplyType::BlockStatus, 5),
        (ReplyType::Error, 0x8001),
        (ReplyType::ErrorOffset, 0x8002),
    ]) {
        assert_eq!(u16::from(t), raw);
        assert_eq!(ReplyType::from(raw), t);
    }
}

#[test]
fn flag_sets() {
    let f = TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH;
    assert_eq!(f.bits(), 0x0005);
    assert_eq!(TransmissionFlags::ALL.bits(), 0x1fff);
    assert_eq!(CmdFlags::ALL.bits(), 0x3f);
    assert_eq!(format!("{f:?}"), "TransmissionFlags(HAS_FLAGS | SEND_FLUSH)");
    let odd = CmdFlags::from_bits_retain(0x101);
    assert_eq!(format!("{odd:?}"), "CmdFlags(FUA | 0x100)");
    assert_eq!(format!("{:?}", ReplyFlags::empty()), "ReplyFlags()");
    let mut g = CmdFlags::empty();
    g.insert(CmdFlags::DF | CmdFlags::FUA);
    g.remove(CmdFlags::FUA);
    assert_eq!(g, CmdFlags::DF);
    assert!(g.intersects(CmdFlags::DF | CmdFlags::REQ_ONE));
    assert_eq!(ReplyFlags::done_if(true), ReplyFlags::DONE);
}
