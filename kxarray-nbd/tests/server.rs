//! The server driven by the test client over TCP loopback and Unix
//! sockets: data round trips, zeroing, bad requests, concurrency, the
//! handshake's options, disconnects and shutdown.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;

use common::{
    greet, info_or_go, is_closed, open, random_bytes, read_option_reply, send_option, start,
    start_with_workers, Client, Transport,
};
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache};
use kxarray_nbd::proto::*;
use kxarray_nbd::HashMapDisk;

const SIZE: u64 = 64 << 20;

fn backends() -> Vec<(&'static str, Arc<dyn Backend>)> {
    vec![
        ("xarray", Arc::new(RamDisk::new(SIZE))),
        ("hashmap", Arc::new(HashMapDisk::new(SIZE))),
        ("cached", cached_file()),
    ]
}

/// A temporary file of `SIZE` bytes through a page cache smaller than it
/// (so the round trips evict and refault), served as a backend.
fn cached_file() -> Arc<dyn Backend> {
    let f = tempfile::tempfile().unwrap();
    f.set_len(SIZE).unwrap();
    let cache = PageCache::new(CacheConfig::default().capacity(SIZE / 8));
    Arc::new(cache.open(FileBackend::from_file(f)).unwrap())
}

/// Random blocks written at random offsets read back; unwritten space reads zeros.
fn round_trip(transport: Transport, structured: bool) {
    for (name, backend) in backends() {
        let server = start(backend, "disk", transport);
        let mut c = Client::connect(&server.addr, structured);
        assert_eq!(c.size, SIZE, "{name}");
        let f = c.flags;
        for flag in [
            NBD_FLAG_HAS_FLAGS,
            NBD_FLAG_SEND_FLUSH,
            NBD_FLAG_SEND_FUA,
            NBD_FLAG_SEND_TRIM,
        ] {
            assert_ne!(f & flag, 0, "{name}: flag {flag:#x}");
        }
        assert_ne!(f & NBD_FLAG_CAN_MULTI_CONN, 0);
        assert_eq!(f & NBD_FLAG_READ_ONLY, 0);
        let mut written = Vec::new();
        for i in 0..40u64 {
            // Disjoint slots of 256 KiB, random length and alignment inside.
            let len = rand::random_range(1..200_000usize);
            let off = i * (256 << 10) + rand::random_range(0..50_000u64);
            let data = random_bytes(len);
            if i % 3 == 0 {
                c.write_fua(off, &data).unwrap();
            } else {
                c.write(off, &data).unwrap();
            }
            written.push((off, data));
        }
        c.flush().unwrap();
        for (off, data) in &written {
            assert_eq!(
                &c.read(*off, data.len() as u32).unwrap(),
                data,
                "{name} at {off}"
            );
        }
        assert!(c.read(SIZE - 4096, 4096).unwrap().iter().all(|&b| b == 0));
        assert_eq!(c.read(0, 0).unwrap(), Vec::<u8>::new());
        c.disconnect();
        server.stop();
    }
}

#[test]
fn tcp_random_blocks_round_trip() {
    round_trip(Transport::Tcp, false);
    round_trip(Transport::Tcp, true);
}

#[test]
fn unix_random_blocks_round_trip() {
    round_trip(Transport::Unix, false);
    round_trip(Transport::Unix, true);
}

#[test]
fn trim_and_write_zeroes_read_back_zeros() {
    for structured in [false, true] {
        for (name, backend) in backends() {
            let server = start(backend.clone(), "", Transport::Tcp);
            let mut c = Client::connect(&server.addr, structured);
            let data = random_bytes(64 << 10);
            for base in [0u64, 1 << 20, 2 << 20] {
                c.write(base, &data).unwrap();
            }
            // Whole and partial pages, each way.
            c.trim(4096, 3 * 4096).unwrap();
            c.trim(100, 50).unwrap();
            c.write_zeroes((1 << 20) + 1000, 20_000, 0).unwrap();
            c.write_zeroes((2 << 20) + 8192, 8192, NBD_CMD_FLAG_NO_HOLE)
                .unwrap();
            c.write_zeroes((2 << 20) + 100, 10, NBD_CMD_FLAG_FUA)
                .unwrap();

            let mut expect = data.clone();
            expect[4096..4 * 4096].fill(0);
            expect[100..150].fill(0);
            assert_eq!(c.read(0, data.len() as u32).unwrap(), expect, "{name}");
            let mut expect = data.clone();
            expect[1000..21_000].fill(0);
            assert_eq!(
                c.read(1 << 20, data.len() as u32).unwrap(),
                expect,
                "{name}"
            );
            let mut expect = data.clone();
            expect[8192..16_384].fill(0);
            expect[100..110].fill(0);
            assert_eq!(
                c.read(2 << 20, data.len() as u32).unwrap(),
                expect,
                "{name}"
            );
            c.disconnect();
            server.stop();
        }
    }
}

#[test]
fn no_hole_allocates_and_plain_write_zeroes_frees() {
    let disk = Arc::new(RamDisk::new(SIZE));
    let server = start(disk.clone(), "", Transport::Unix);
    let mut c = Client::connect(&server.addr, true);
    c.write_zeroes(0, 16 * 4096, NBD_CMD_FLAG_NO_HOLE).unwrap();
    assert_eq!(
        disk.pages_allocated(),
        16,
        "NO_HOLE must provision the range"
    );
    c.write_zeroes(0, 16 * 4096, 0).unwrap();
    assert_eq!(
        disk.pages_allocated(),
        0,
        "without NO_HOLE the pages are punched out"
    );
    assert!(c.read(0, 16 * 4096).unwrap().iter().all(|&b| b == 0));
    c.disconnect();
    server.stop();
}

#[test]
fn bad_requests_get_error_replies_and_the_connection_lives() {
    for structured in [false, true] {
        let server = start(Arc::new(RamDisk::new(SIZE)), "", Transport::Tcp);
        let mut c = Client::connect(&server.addr, structured);
        c.write(SIZE - 4096, &[7u8; 4096]).unwrap();
        // Past the end: reads and trims EINVAL, writes ENOSPC (payload consumed).
        assert_eq!(c.read(SIZE - 4096, 4097), Err(NBD_EINVAL));
        assert_eq!(c.read(u64::MAX - 10, 100), Err(NBD_EINVAL));
        assert_eq!(c.write(SIZE - 10, &[1u8; 4096]), Err(NBD_ENOSPC));
        assert_eq!(c.write(SIZE, &[1u8; 1]), Err(NBD_ENOSPC));
        assert_eq!(c.trim(SIZE, 4096), Err(NBD_EINVAL));
        assert_eq!(c.write_zeroes(SIZE - 1, 2, 0), Err(NBD_ENOSPC));
        // A READ above the 32 MiB payload cap is refused; the connection lives.
        assert_eq!(c.read(0, MAX_PAYLOAD + 1), Err(NBD_EINVAL));
        assert_eq!(c.read(u64::MAX - 10, u32::MAX), Err(NBD_EINVAL));
        // Unknown commands and flags.
        assert_eq!(
            c.call_raw(NBD_CMD_BLOCK_STATUS, 0, 0, 4096, &[]),
            Err(NBD_EINVAL)
        );
        assert_eq!(c.call_raw(99, 0, 0, 0, &[]), Err(NBD_EINVAL));
        assert_eq!(
            c.call_raw(NBD_CMD_READ, NBD_CMD_FLAG_NO_HOLE, 0, 4096, &[]),
            Err(NBD_EINVAL)
        );
        assert_eq!(
            c.call_raw(NBD_CMD_WRITE, 1 << 9, 0, 1, &[1]),
            Err(NBD_EINVAL)
        );
        // Nothing was written by the refused requests; the connection works.
        assert_eq!(c.read(SIZE - 4096, 4096).unwrap(), vec![7u8; 4096]);
        assert!(c.read(0, 8192).unwrap().iter().all(|&b| b == 0));
        // A 32 MiB request exactly is served.
        let max = random_bytes(MAX_PAYLOAD as usize);
        c.write(0, &max).unwrap();
        assert!(c.read(0, MAX_PAYLOAD).unwrap() == max);
        // A WRITE announcing more than the maximum, its payload never
        // sent: refused, and the connection closed at once (its payload
        // cannot be skipped safely).
        let cookie = c.send(NBD_CMD_WRITE, 0, 0, MAX_PAYLOAD + 1, &[]);
        let (got, out) = c.recv();
        assert_eq!((got, out), (cookie, Err(NBD_EINVAL)));
        assert!(is_closed(&mut c.socket));
        // Nothing of it was written; other connections are served.
        let mut c = Client::connect(&server.addr, structured);
        assert!(c.read(0, 4096).unwrap() == max[..4096]);
        c.disconnect();
        server.stop();
    }
}

/// 64 writes, then 64 reads, sent before any reply is read: every one is
/// answered once, with its cookie, by one worker (the RAM disk's default:
/// batches, no hand-off) and by a pool of four (replies in completion
/// order).
#[test]
fn pipelined_requests_are_all_answered_with_their_cookies() {
    for workers in [1, 4] {
        pipelined(workers);
    }
}

fn pipelined(workers: usize) {
    let server = start_with_workers(
        Arc::new(RamDisk::new(SIZE)),
        "",
        Transport::Unix,
        Some(workers),
    );
    let mut c = Client::connect(&server.addr, true);
    let blocks: Vec<Vec<u8>> = (0..64).map(|_| random_bytes(4096)).collect();
    let mut sent = std::collections::HashMap::new();
    for (i, b) in blocks.iter().enumerate() {
        sent.insert(c.send(NBD_CMD_WRITE, 0, i as u64 * 4096, 4096, b), i);
    }
    for _ in 0..64 {
        let (cookie, out) = c.recv();
        assert_eq!(out, Ok(vec![]));
        assert!(sent.remove(&cookie).is_some());
    }
    for i in 0..64u64 {
        sent.insert(c.send(NBD_CMD_READ, 0, i * 4096, 4096, &[]), i as usize);
    }
    for _ in 0..64 {
        let (cookie, out) = c.recv();
        let i = sent.remove(&cookie).expect("known cookie");
        assert_eq!(out.unwrap(), blocks[i]);
    }
    c.disconnect();
    server.stop();
}

#[test]
fn several_connections_at_once_with_multi_conn_flush() {
    for (name, backend) in backends() {
        let server = start(backend, "", Transport::Tcp);
        let addr = server.addr.clone();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut c = Client::connect(&addr, t % 2 == 0);
                    let mut mine = Vec::new();
                    for i in 0..200u64 {
                        let off = (t * 200 + i) * 8192;
                        let data = random_bytes(8192);
                        c.write(off, &data).unwrap();
                        mine.push((off, data));
                    }
                    c.flush().unwrap();
                    (c, mine)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        // Every connection sees every other connection's acknowledged writes.
        let mut reader = Client::connect(&addr, true);
        for (_, mine) in &results {
            for (off, data) in mine {
                assert_eq!(&reader.read(*off, 8192).unwrap(), data, "{name}");
            }
        }
        for (c, _) in results {
            c.disconnect();
        }
        reader.disconnect();
        server.stop();
    }
}

#[test]
fn handshake_list_info_go() {
    let server = start(Arc::new(RamDisk::new(SIZE)), "disk", Transport::Unix);
    let mut s = open(&server.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, NBD_OPT_LIST, &[]);
    let (h, data) = read_option_reply(&mut s);
    assert_eq!((h.option, h.reply_type), (NBD_OPT_LIST, NBD_REP_SERVER));
    let e = ServerEntry::decode(&data).unwrap();
    assert_eq!(
        (e.name.as_slice(), e.details.as_slice()),
        (&b"disk"[..], &b"test disk"[..])
    );
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ACK);
    send_option(&mut s, NBD_OPT_LIST, b"x");
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ERR_INVALID);

    let (infos, last) = info_or_go(
        &mut s,
        NBD_OPT_INFO,
        b"disk",
        &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION],
    );
    assert_eq!(last, NBD_REP_ACK);
    assert!(infos.contains(&Info::Name(b"disk".to_vec())));
    assert!(infos.contains(&Info::Description(b"test disk".to_vec())));
    assert!(infos.contains(&Info::BlockSize {
        min: 1,
        preferred: 4096,
        max: MAX_PAYLOAD
    }));
    let Some(Info::Export { size, .. }) = infos.iter().find(|i| matches!(i, Info::Export { .. }))
    else {
        panic!("no NBD_INFO_EXPORT")
    };
    assert_eq!(*size, SIZE);
    assert_eq!(
        info_or_go(&mut s, NBD_OPT_GO, b"other", &[]),
        (vec![], NBD_REP_ERR_UNKNOWN)
    );
    send_option(&mut s, NBD_OPT_GO, &[0, 0, 0, 9, 1]);
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ERR_INVALID);
    // Still in option haggling after INFO and the errors: GO enters transmission.
    let (_, last) = info_or_go(&mut s, NBD_OPT_GO, b"disk", &[]);
    assert_eq!(last, NBD_REP_ACK);
    let r = Request {
        flags: 0,
        command: NBD_CMD_WRITE,
        cookie: 5,
        offset: 0,
        length: 3,
    };
    s.write_all(&r.encode()).unwrap();
    s.write_all(b"abc").unwrap();
    let mut reply = [0u8; SIMPLE_REPLY_LEN];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        SimpleReply::decode(&reply).unwrap(),
        SimpleReply {
            error: 0,
            cookie: 5
        }
    );
    server.stop();
}

#[test]
fn handshake_export_name_with_and_without_zeroes() {
    let server = start(Arc::new(HashMapDisk::new(SIZE)), "disk", Transport::Tcp);
    for no_zeroes in [false, true] {
        let flags = NBD_FLAG_C_FIXED_NEWSTYLE | if no_zeroes { NBD_FLAG_C_NO_ZEROES } else { 0 };
        let mut s = open(&server.addr, flags);
        send_option(&mut s, NBD_OPT_EXPORT_NAME, b"disk");
        let mut r = vec![0u8; if no_zeroes { 10 } else { 134 }];
        s.read_exact(&mut r).unwrap();
        let r2 = ExportNameReply::decode(&r).unwrap();
        assert_eq!(r2.size, SIZE);
        assert!(r[10..].iter().all(|&b| b == 0));
        // Transmission starts right after: a FLUSH is answered.
        s.write_all(
            &Request {
                flags: 0,
                command: NBD_CMD_FLUSH,
                cookie: 1,
                offset: 0,
                length: 0,
            }
            .encode(),
        )
        .unwrap();
        let mut reply = [0u8; SIMPLE_REPLY_LEN];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(SimpleReply::decode(&reply).unwrap().error, 0);
    }
    // An unknown export name cannot be refused politely: the connection closes.
    let mut s = open(&server.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, NBD_OPT_EXPORT_NAME, b"nope");
    assert!(is_closed(&mut s));
    server.stop();
}

#[test]
fn handshake_abort_unknown_and_structured_options() {
    let server = start(Arc::new(RamDisk::new(SIZE)), "", Transport::Unix);
    let mut s = open(&server.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    for opt in [
        NBD_OPT_STARTTLS,
        NBD_OPT_SET_META_CONTEXT,
        NBD_OPT_EXTENDED_HEADERS,
        12345,
    ] {
        send_option(&mut s, opt, &[]);
        let (h, _) = read_option_reply(&mut s);
        assert_eq!((h.option, h.reply_type), (opt, NBD_REP_ERR_UNSUP));
    }
    send_option(&mut s, NBD_OPT_STRUCTURED_REPLY, b"junk");
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ERR_INVALID);
    send_option(&mut s, NBD_OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ACK);
    // Oversized option data is skipped and refused.
    send_option(&mut s, NBD_OPT_INFO, &vec![0u8; 100_000]);
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ERR_TOO_BIG);
    send_option(&mut s, NBD_OPT_ABORT, &[]);
    let (h, _) = read_option_reply(&mut s);
    assert_eq!((h.option, h.reply_type), (NBD_OPT_ABORT, NBD_REP_ACK));
    assert!(is_closed(&mut s));
    server.stop();
}

#[test]
fn malformed_handshakes_close_only_their_connection() {
    let server = start(Arc::new(RamDisk::new(SIZE)), "", Transport::Tcp);
    let mut good = Client::connect(&server.addr, true);
    good.write(0, b"still here").unwrap();
    // Bad option magic.
    let mut s = open(&server.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    s.write_all(&[0u8; 16]).unwrap();
    assert!(is_closed(&mut s));
    // Unknown client flags.
    let (mut s, _) = greet(&server.addr);
    s.write_all(&0x80u32.to_be_bytes()).unwrap();
    assert!(is_closed(&mut s));
    // A non-fixed client may only send EXPORT_NAME.
    let mut s = open(&server.addr, 0);
    send_option(&mut s, NBD_OPT_LIST, &[]);
    assert!(is_closed(&mut s));
    // A bad request magic in transmission closes that connection too.
    let mut bad = Client::connect(&server.addr, false);
    bad.socket.write_all(&[0xffu8; REQUEST_LEN]).unwrap();
    assert!(is_closed(&mut bad.socket));
    // The first connection is untouched; new ones are accepted.
    assert_eq!(good.read(0, 10).unwrap(), b"still here");
    let mut again = Client::connect(&server.addr, false);
    assert_eq!(again.read(0, 10).unwrap(), b"still here");
    good.disconnect();
    again.disconnect();
    server.stop();
}

#[test]
fn client_leaving_mid_request_loses_nothing_acknowledged() {
    let server = start(Arc::new(RamDisk::new(SIZE)), "", Transport::Unix);
    let mut c = Client::connect(&server.addr, true);
    let data = random_bytes(1 << 20);
    c.write(0, &data).unwrap();
    // Half a write payload, then gone.
    let r = Request {
        flags: 0,
        command: NBD_CMD_WRITE,
        cookie: 77,
        offset: 0,
        length: 1 << 20,
    };
    c.socket.write_all(&r.encode()).unwrap();
    c.socket.write_all(&vec![0u8; 1 << 19]).unwrap();
    drop(c);
    let mut c = Client::connect(&server.addr, false);
    assert!(c.read(0, 1 << 20).unwrap() == data);
    c.disconnect();
    server.stop();
}

#[test]
fn read_only_export_refuses_writes() {
    let mut export = kxarray_nbd::Export::new("", Arc::new(RamDisk::new(SIZE))).unwrap();
    export.read_only = true;
    let server = kxarray_nbd::Server::new(export, kxarray_nbd::Config::new(2)).unwrap();
    let listener = kxarray_nbd::Listener::tcp("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let s2 = server.clone();
    let t = std::thread::spawn(move || s2.serve(vec![listener]));
    let mut c = Client::connect(&addr, true);
    assert_ne!(c.flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(c.write(0, b"x"), Err(NBD_EPERM));
    assert_eq!(c.trim(0, 4096), Err(NBD_EPERM));
    assert_eq!(c.read(0, 1).unwrap(), vec![0]);
    c.disconnect();
    server.handle().shutdown();
    t.join().unwrap().unwrap();
    server.finish().unwrap();
}

#[test]
fn shutdown_answers_what_was_read_then_ends_connections() {
    let server = start(Arc::new(RamDisk::new(SIZE)), "", Transport::Unix);
    let mut c = Client::connect(&server.addr, false);
    c.write(4096, b"kept").unwrap();
    let handle = server.server.handle();
    handle.shutdown();
    assert!(handle.is_shutting_down());
    // The open connection is ended by the server.
    assert!(is_closed(&mut c.socket));
    let backend = server.server.export().backend().clone();
    server.stop();
    let mut b = [0u8; 4];
    backend.read_exact_at(&mut b, 4096).unwrap();
    assert_eq!(&b, b"kept");
}
