//! Every message against bytes written by hand from `doc/proto.md`, and
//! decode(encode(x)) == x.

use super::*;

/// Hex string (spaces ignored) to bytes.
fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn constants_match_the_spec() {
    assert_eq!(&NBDMAGIC.to_be_bytes(), b"NBDMAGIC");
    assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    assert_eq!(NBD_REP_MAGIC, 0x3e889045565a9);
    assert_eq!(NBD_REP_ERR_UNSUP, 0x8000_0001);
    assert_eq!(NBD_REP_ERR_EXT_HEADER_REQD, 0x8000_000a);
    assert_eq!(NBD_REPLY_TYPE_ERROR, 0x8001);
    assert_eq!(NBD_REPLY_TYPE_ERROR_OFFSET, 0x8002);
    assert_eq!(NBD_FLAG_CAN_MULTI_CONN, 0x100);
    assert_eq!(NBD_FLAG_BLOCK_STATUS_PAYLOAD, 0x1000);
    assert_eq!(
        (NBD_EINVAL, NBD_ENOSPC, NBD_EOVERFLOW, NBD_ESHUTDOWN),
        (22, 28, 75, 108)
    );
    assert_eq!(MAX_PAYLOAD, 33_554_432);
}

#[test]
fn greeting() {
    let g = Greeting {
        handshake_flags: NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES,
    };
    let wire = hex("4e42444d41474943 49484156454f5054 0003");
    assert_eq!(g.encode().to_vec(), wire);
    assert_eq!(Greeting::decode(&wire), Ok(g));
    assert!(matches!(
        Greeting::decode(&wire[..17]),
        Err(ProtoError::Truncated { need: 18, got: 17 })
    ));
    let mut bad = wire.clone();
    bad[0] = 0;
    assert!(matches!(
        Greeting::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
}

#[test]
fn option_header() {
    let h = OptionHeader {
        option: NBD_OPT_GO,
        length: 0x0102_0304,
    };
    let wire = hex("49484156454f5054 00000007 01020304");
    assert_eq!(h.encode().to_vec(), wire);
    assert_eq!(OptionHeader::decode(&wire), Ok(h));
    let mut bad = wire.clone();
    bad[7] ^= 1;
    assert!(matches!(
        OptionHeader::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
    assert!(OptionHeader::decode(&wire[..15]).is_err());
}

#[test]
fn option_reply() {
    let wire = hex("0003e889045565a9 00000003 80000001 00000002 abcd");
    assert_eq!(
        encode_option_reply(NBD_OPT_LIST, NBD_REP_ERR_UNSUP, &[0xab, 0xcd]),
        wire
    );
    let h = OptionReplyHeader::decode(&wire).unwrap();
    assert_eq!(
        h,
        OptionReplyHeader {
            option: NBD_OPT_LIST,
            reply_type: NBD_REP_ERR_UNSUP,
            length: 2
        }
    );
    assert_eq!(h.encode().to_vec(), wire[..20]);
    assert!(OptionReplyHeader::decode(&wire[..19]).is_err());
}

#[test]
fn export_name_reply() {
    let r = ExportNameReply {
        size: 1 << 30,
        transmission_flags: 0x016d,
    };
    let short = hex("0000000040000000 016d");
    assert_eq!(r.encode(true), short);
    let long = r.encode(false);
    assert_eq!(long.len(), 134);
    assert_eq!(long[..10], short[..]);
    assert!(long[10..].iter().all(|&b| b == 0));
    assert_eq!(ExportNameReply::decode(&long), Ok(r));
    assert!(ExportNameReply::decode(&short[..9]).is_err());
}

#[test]
fn info_request() {
    let r = InfoRequest {
        name: b"ab".to_vec(),
        requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME],
    };
    let wire = hex("00000002 6162 0002 0003 0001");
    assert_eq!(r.encode(), wire);
    assert_eq!(InfoRequest::decode(&wire), Ok(r));
    let empty = InfoRequest {
        name: vec![],
        requests: vec![],
    };
    assert_eq!(empty.encode(), hex("00000000 0000"));
    assert_eq!(InfoRequest::decode(&hex("00000000 0000")), Ok(empty));
    // Name length past the data, count not matching the rest, too short.
    assert!(matches!(
        InfoRequest::decode(&hex("00000009 6162 0000")),
        Err(ProtoError::BadLength(_))
    ));
    assert!(matches!(
        InfoRequest::decode(&hex("00000000 0002 0003")),
        Err(ProtoError::BadLength(_))
    ));
    assert!(matches!(
        InfoRequest::decode(&hex("00000000 0000 00")),
        Err(ProtoError::BadLength(_))
    ));
    assert!(matches!(
        InfoRequest::decode(&hex("000000")),
        Err(ProtoError::Truncated { .. })
    ));
}

#[test]
fn server_entry() {
    let e = ServerEntry {
        name: b"disk".to_vec(),
        details: b"ram".to_vec(),
    };
    let wire = hex("00000004 6469736b 72616d");
    assert_eq!(e.encode(), wire);
    assert_eq!(ServerEntry::decode(&wire), Ok(e));
    assert!(matches!(
        ServerEntry::decode(&hex("00000005 6469736b")),
        Err(ProtoError::BadLength(_))
    ));
    assert!(ServerEntry::decode(&hex("000000")).is_err());
}

#[test]
fn info_payloads() {
    let cases = [
        (
            Info::Export {
                size: 0x1_0000_0000,
                transmission_flags: 0x01ed,
            },
            "0000 0000000100000000 01ed",
        ),
        (Info::Name(b"x".to_vec()), "0001 78"),
        (Info::Description(b"hi".to_vec()), "0002 6869"),
        (
            Info::BlockSize {
                min: 1,
                preferred: 4096,
                max: 1 << 25,
            },
            "0003 00000001 00001000 02000000",
        ),
        (
            Info::Unknown {
                info_type: 9,
                data: vec![7],
            },
            "0009 07",
        ),
    ];
    for (info, bytes) in cases {
        let wire = hex(bytes);
        assert_eq!(info.encode(), wire, "{info:?}");
        assert_eq!(Info::decode(&wire), Ok(info));
    }
    assert!(matches!(
        Info::decode(&hex("0000 0000000100000000")),
        Err(ProtoError::BadLength(_))
    ));
    assert!(matches!(
        Info::decode(&hex("0003 00000001 00001000 02000000 00")),
        Err(ProtoError::BadLength(_))
    ));
    assert!(Info::decode(&hex("00")).is_err());
}

#[test]
fn request() {
    let r = Request {
        flags: NBD_CMD_FLAG_FUA,
        command: NBD_CMD_WRITE,
        cookie: 0x0102_0304_0506_0708,
        offset: 0x1000,
        length: 0x200,
    };
    let wire = hex("25609513 0001 0001 0102030405060708 0000000000001000 00000200");
    assert_eq!(wire.len(), REQUEST_LEN);
    assert_eq!(r.encode().to_vec(), wire);
    assert_eq!(Request::decode(&wire), Ok(r));
    let mut bad = wire.clone();
    bad[3] = 0x14;
    assert!(matches!(
        Request::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
    assert!(Request::decode(&wire[..27]).is_err());
}

#[test]
fn simple_reply() {
    let r = SimpleReply {
        error: NBD_EINVAL,
        cookie: 42,
    };
    let wire = hex("67446698 00000016 000000000000002a");
    assert_eq!(r.encode().to_vec(), wire);
    assert_eq!(SimpleReply::decode(&wire), Ok(r));
    assert!(SimpleReply::decode(&hex("67446699 00000016 000000000000002a")).is_err());
}

#[test]
fn chunk_header_and_offset_data() {
    let h = ChunkHeader {
        flags: NBD_REPLY_FLAG_DONE,
        chunk_type: NBD_REPLY_TYPE_NONE,
        cookie: 7,
        length: 0,
    };
    let wire = hex("668e33ef 0001 0000 0000000000000007 00000000");
    assert_eq!(h.encode().to_vec(), wire);
    assert_eq!(ChunkHeader::decode(&wire), Ok(h));
    assert!(ChunkHeader::decode(&wire[..19]).is_err());

    let mut buf = [0u8; OFFSET_DATA_PREFIX_LEN];
    encode_offset_data_prefix(&mut buf, 9, 0x2000, 4096, true);
    assert_eq!(
        buf.to_vec(),
        hex("668e33ef 0001 0001 0000000000000009 00001008 0000000000002000")
    );
    let h = ChunkHeader::decode(&buf).unwrap();
    assert_eq!(
        (h.chunk_type, h.length, h.flags),
        (NBD_REPLY_TYPE_OFFSET_DATA, 4104, NBD_REPLY_FLAG_DONE)
    );
    encode_offset_data_prefix(&mut buf, 9, 0, 1, false);
    assert_eq!(ChunkHeader::decode(&buf).unwrap().flags, 0);
}

#[test]
fn offset_hole() {
    let h = OffsetHole {
        offset: 0x10,
        size: 0x1000,
    };
    let wire = hex("0000000000000010 00001000");
    assert_eq!(h.encode().to_vec(), wire);
    assert_eq!(OffsetHole::decode(&wire), Ok(h));
    assert!(OffsetHole::decode(&wire[..11]).is_err());
    assert!(OffsetHole::decode(&hex("0000000000000010 00001000 00")).is_err());
}

#[test]
fn error_chunk() {
    let e = ErrorChunk {
        error: NBD_ENOSPC,
        message: b"full".to_vec(),
    };
    let wire = hex("0000001c 0004 66756c6c");
    assert_eq!(e.encode(), wire);
    assert_eq!(ErrorChunk::decode(&wire), Ok(e));
    assert!(matches!(
        ErrorChunk::decode(&hex("0000001c 0005 66756c6c")),
        Err(ProtoError::BadLength(_))
    ));
    let whole = encode_error_chunk(3, NBD_EINVAL, "no");
    assert_eq!(
        whole,
        hex("668e33ef 0001 8001 0000000000000003 00000008 00000016 0002 6e6f")
    );
    let long = ErrorChunk {
        error: 5,
        message: vec![b'a'; 5000],
    }
    .encode();
    assert_eq!(long.len(), 6 + 4096);
    assert_eq!(ErrorChunk::decode(&long).unwrap().message.len(), 4096);
}

#[test]
fn decoders_never_panic_on_short_input() {
    for n in 0..40 {
        let buf = vec![0xffu8; n];
        let _ = Greeting::decode(&buf);
        let _ = OptionHeader::decode(&buf);
        let _ = OptionReplyHeader::decode(&buf);
        let _ = ExportNameReply::decode(&buf);
        let _ = InfoRequest::decode(&buf);
        let _ = ServerEntry::decode(&buf);
        let _ = Info::decode(&buf);
        let _ = Request::decode(&buf);
        let _ = SimpleReply::decode(&buf);
        let _ = ChunkHeader::decode(&buf);
        let _ = OffsetHole::decode(&buf);
        let _ = ErrorChunk::decode(&buf);
        // 0xff bytes are never a valid magic, so the framed messages fail.
        assert!(Greeting::decode(&buf).is_err() && Request::decode(&buf).is_err());
        assert!(SimpleReply::decode(&buf).is_err() && ChunkHeader::decode(&buf).is_err());
    }
}

#[test]
fn names_for_logs() {
    assert_eq!(option_name(NBD_OPT_GO), "NBD_OPT_GO");
    assert_eq!(option_name(99), "unknown option");
    assert_eq!(command_name(NBD_CMD_WRITE_ZEROES), "NBD_CMD_WRITE_ZEROES");
    assert_eq!(command_name(99), "unknown command");
}
