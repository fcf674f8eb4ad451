//! The server binary against hostile and careless clients, measured from
//! outside: a client silent in the handshake, a WRITE announcing more than
//! the maximum payload, READ replies nobody reads (the server's resident
//! memory, from /proc), SIGTERM with the socket path deleted and with a
//! client that stopped reading, and hundreds of idle connections (the
//! server's threads and memory). `KXARRAY_NBD_TEST_BIN=path` runs them
//! against another build of the server.

mod common;

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use common::process::{spawn_tcp, spawn_unix, Process};
use common::{greet, open, Client};
use kxarray_nbd::proto::*;
use kxarray_nbd::Socket;

const MIB: u64 = 1 << 20;

/// Whether the server closes `s` within `limit` (end of stream or a
/// reset; bytes it sends meanwhile are skipped). `false` on timeout.
fn closed_within(s: &Socket, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match (&*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

#[test]
fn a_client_stalling_in_the_handshake_is_closed_at_the_deadline() {
    // The deadline from the environment (as --handshake-timeout 1).
    let p = spawn_unix(
        &["--size", "16M"],
        &[("KXARRAY_NBD_HANDSHAKE_TIMEOUT", "1")],
    );
    let start = Instant::now();
    // Silent after the greeting.
    let (silent, _) = greet(&p.addr);
    // Client flags, then half an option header.
    let mut half = open(&p.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    half.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    // A trickle: an option header one byte every 150 ms (each read is
    // quick; the whole handshake is what the deadline bounds).
    let trickle = open(&p.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    let writer = trickle.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        let header = OptionHeader {
            option: NBD_OPT_LIST,
            length: 0,
        }
        .encode();
        for b in header {
            if (&writer).write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    for (name, s) in [("silent", &silent), ("half", &half), ("trickle", &trickle)] {
        assert!(
            closed_within(s, Duration::from_secs(4)),
            "{name}: not closed 4 s after connecting with a 1 s handshake deadline"
        );
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    t.join().unwrap();
    // The server still serves.
    let mut c = Client::connect(&p.addr, true);
    c.write(0, b"after").unwrap();
    assert_eq!(c.read(0, 5).unwrap(), b"after");
}

#[test]
fn a_write_above_the_maximum_payload_is_refused_and_closes_the_connection() {
    let p = spawn_tcp(&["--size", "16M"], &[]);
    for structured in [false, true] {
        let mut c = Client::connect(&p.addr, structured);
        c.write(0, b"kept").unwrap();
        c.socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // 4 GiB announced, nothing sent.
        let cookie = c.send(NBD_CMD_WRITE, 0, 0, u32::MAX, &[]);
        let (got, out) = c.recv();
        assert_eq!((got, out), (cookie, Err(NBD_EINVAL)));
        assert!(
            closed_within(&c.socket, Duration::from_secs(2)),
            "connection left open after an oversized WRITE"
        );
    }
    let mut c = Client::connect(&p.addr, false);
    assert_eq!(c.read(0, 4).unwrap(), b"kept");
}

/// The most resident memory over `d` (sampled every 50 ms).
fn peak_rss(p: &Process, d: Duration) -> u64 {
    let end = Instant::now() + d;
    let mut peak = p.rss();
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        peak = peak.max(p.rss());
    }
    peak
}

/// `n` READs of 32 MiB sent, no reply read: the server's resident memory
/// may grow by `bound` at most (its per-connection budget plus the page
/// cache, not the replies).
fn unread_replies(args: &[&str], structured: bool, n: u64, bound: u64) -> u64 {
    unread_replies_of(args, structured, n, MAX_PAYLOAD, bound)
}

/// As [`unread_replies`], with READs of `len` bytes.
fn unread_replies_of(args: &[&str], structured: bool, n: u64, len: u32, bound: u64) -> u64 {
    let p = spawn_unix(args, &[]);
    let mut c = Client::connect(&p.addr, structured);
    c.write(0, &[1u8; 4096]).unwrap();
    assert_eq!(c.read(0, 4096).unwrap(), vec![1u8; 4096]);
    let before = p.rss();
    let mut offsets = std::collections::HashMap::new();
    for i in 0..n {
        let offset = (i % 8) * u64::from(len);
        offsets.insert(c.send(NBD_CMD_READ, 0, offset, len, &[]), offset);
    }
    let grown = peak_rss(&p, Duration::from_millis(1500)).saturating_sub(before);
    eprintln!(
        "{args:?}: +{:.1} MiB resident with {n} unread READs of {len} bytes",
        grown as f64 / MIB as f64
    );
    assert!(
        grown <= bound,
        "{args:?}: +{} MiB resident with {n} unread READs of {len} bytes (bound {} MiB)",
        grown / MIB,
        bound / MIB
    );
    // The replies are whole: the first two, read now. With several
    // workers they may come in any order: each is checked against the
    // offset its cookie asked for (only offset 0 holds the written page).
    c.socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    for i in 0..2 {
        let (cookie, out) = c.recv();
        let offset = offsets[&cookie];
        let data = out.expect("READ reply");
        assert_eq!(data.len(), len as usize);
        let first = if offset == 0 { 1u8 } else { 0 };
        assert!(
            data[..4096].iter().all(|&b| b == first),
            "reply {i} (offset {offset}): first page"
        );
        assert!(
            data[4096..].iter().all(|&b| b == 0),
            "reply {i} (offset {offset}): the rest"
        );
    }
    grown
}

#[test]
fn unread_read_replies_cost_the_server_a_bounded_memory() {
    // The RAM disk, one worker, simple replies: the budget is 34.25 MiB.
    unread_replies(&["--size", "256M"], false, 64, 48 * MIB);
    // A file through a 16 MiB page cache, four workers, structured
    // replies: 4 x 34 MiB of budget at most (the READs hold 1 MiB each),
    // plus the cache.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk");
    let file = file.to_str().unwrap();
    unread_replies(&cached_disk(file), true, 16, 64 * MIB);
}

/// A 256 MiB cached file at `file` behind a 16 MiB cache: the server's
/// arguments.
fn cached_disk(file: &str) -> [&str; 8] {
    [
        "--size",
        "256M",
        "--backend",
        "cached",
        "--file",
        file,
        "--cache-size",
        "16M",
    ]
}

/// Reads kept in flight (a cached file's connection) whose replies the
/// client does not read: 128 READs of almost 1 MiB (each short enough to
/// be kept in flight; as many request headers as the client's socket
/// takes without a reply read), 128 MiB of replies asked for, cost the
/// server its reply buffer and at most 1 MiB of reads in flight, plus the
/// cache.
#[test]
fn unread_replies_of_reads_in_flight_cost_a_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk");
    let file = file.to_str().unwrap();
    let len = (1 << 20) - 64;
    unread_replies_of(&cached_disk(file), true, 128, len, 48 * MIB);
}

#[test]
fn sigterm_ends_the_server_within_5_s_after_its_socket_path_was_deleted() {
    let mut p = spawn_unix(&["--size", "16M"], &[]);
    let mut c = Client::connect(&p.addr, true);
    c.write(0, b"kept").unwrap();
    let path = p.path("nbd.sock");
    std::fs::remove_file(&path).unwrap();
    let start = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(Duration::from_secs(5));
    assert!(
        status.is_some(),
        "no exit 5 s after SIGTERM with the socket path deleted\n{}",
        p.stderr()
    );
    assert!(status.unwrap().success(), "{}", p.stderr());
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(closed_within(&c.socket, Duration::from_secs(1)));
}

#[test]
fn sigterm_ends_the_server_within_5_s_while_a_client_does_not_read_and_flushes_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk");
    let mut p = spawn_tcp(
        &[
            "--size",
            "256M",
            "--backend",
            "cached",
            "--file",
            file.to_str().unwrap(),
            // One worker: none other to see the read side's end and
            // close the socket under the one blocked writing.
            "--threads",
            "1",
        ],
        &[],
    );
    let mut c = Client::connect(&p.addr, false);
    let data = common::random_bytes(64 << 10);
    // Acknowledged, so in the page cache; on the disk only once flushed.
    c.write(4096, &data).unwrap();
    for i in 0..32u64 {
        c.send(
            NBD_CMD_READ,
            0,
            (i % 4) * u64::from(MAX_PAYLOAD),
            MAX_PAYLOAD,
            &[],
        );
    }
    // Let the workers fill the socket and block writing.
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(Duration::from_secs(5));
    assert!(
        status.is_some(),
        "no exit 5 s after SIGTERM with a client not reading\n{}",
        p.stderr()
    );
    assert!(status.unwrap().success(), "{}", p.stderr());
    assert!(start.elapsed() < Duration::from_secs(5));
    let on_disk = std::fs::read(&file).unwrap();
    assert!(
        on_disk[4096..4096 + data.len()] == data[..],
        "an acknowledged write was not flushed at shutdown"
    );
}

#[test]
fn idle_connections_hold_no_thread_and_little_memory() {
    const N: usize = 500;
    kxarray_nbd::raise_nofile_limit().unwrap();
    let p = spawn_unix(&["--size", "64M"], &[]);
    // A first client, so the pool and the allocator have started.
    let mut c = Client::connect(&p.addr, true);
    c.write(0, &[7u8; 4096]).unwrap();
    c.disconnect();
    std::thread::sleep(Duration::from_millis(200));
    let (rss0, threads0) = (p.rss(), p.threads());

    let mut conns = Vec::with_capacity(N);
    for i in 0..N {
        let mut c = Client::connect(&p.addr, i % 2 == 0);
        c.write(i as u64 * 4096, &[i as u8; 4096]).unwrap();
        conns.push(c);
    }
    // Served connections give their thread back once quiet.
    std::thread::sleep(Duration::from_millis(300));
    let (rss1, threads1) = (p.rss(), p.threads());
    let per_conn = rss1.saturating_sub(rss0) / N as u64;
    eprintln!(
        "{N} idle connections: {threads1} threads (before: {threads0}), \
         +{} KiB resident ({per_conn} bytes each)",
        rss1.saturating_sub(rss0) >> 10
    );
    assert!(
        threads1 <= threads0 + 8,
        "{N} idle connections hold {threads1} threads (before: {threads0})"
    );
    assert!(
        per_conn <= 24 << 10,
        "{N} idle connections cost {per_conn} bytes of resident memory each"
    );
    // A new client is served beside them, and so is an idle one.
    let mut c = Client::connect(&p.addr, true);
    assert_eq!(c.read(0, 4096).unwrap(), vec![0u8; 4096]);
    assert_eq!(c.read(7 * 4096, 4096).unwrap(), vec![7u8; 4096]);
    assert_eq!(conns[5].read(5 * 4096, 4096).unwrap(), vec![5u8; 4096]);
    c.disconnect();
    // Closed, they give their memory back.
    for c in conns {
        c.disconnect();
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss2 = p.rss();
    eprintln!(
        "after closing them: +{} KiB resident over the start",
        rss2.saturating_sub(rss0) >> 10
    );
    // What stays is the allocator's per-thread arenas (a few MiB whatever
    // the count), not the connections' memory.
    assert!(
        rss2.saturating_sub(rss0) <= 8 * MIB + rss1.saturating_sub(rss0) / 4,
        "memory kept after the connections closed: {} KiB -> {} KiB -> {} KiB",
        rss0 >> 10,
        rss1 >> 10,
        rss2 >> 10
    );
}
