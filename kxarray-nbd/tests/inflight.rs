//! A connection's reads kept in flight (`kxarray_nbd::pipeline`): each
//! answered as it completes, out of order, with its own cookie, data and
//! error; a write waits for the reads before it; a client leaving with
//! reads in flight ends its connection cleanly; a real cached file served
//! this way reads what was written.

mod common;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{random_bytes, start_config, Client, Transport};
use kxarray::aio::{Completer, Completion};
use kxarray::backend::{Backend, FileBackend, RamDisk, ReadBuf};
use kxarray::pagecache::{CacheConfig, PageCache};
use kxarray_nbd::batch::{read_each, ReadInFlight, ReadMany};
use kxarray_nbd::proto::*;
use kxarray_nbd::{Config, Export};

const SIZE: u64 = 16 << 20;

/// A reader over a RAM disk whose reads stay in flight until the test
/// releases them: each read is held (its offset and completer) until
/// `release` completes the held ones in the order given, reading the disk
/// then (so a write executed meanwhile would show). Reads at `fail_at`
/// complete with an error.
#[derive(Debug)]
struct Held {
    disk: Arc<RamDisk>,
    fail_at: u64,
    held: Mutex<Vec<(u64, Completer<ReadBuf>)>>,
    arrived: Condvar,
}

impl Held {
    fn new(disk: Arc<RamDisk>, fail_at: u64) -> Arc<Self> {
        Arc::new(Self {
            disk,
            fail_at,
            held: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
        })
    }

    /// Wait until `n` reads are held.
    fn wait_held(&self, n: usize) {
        let end = Instant::now() + Duration::from_secs(10);
        let mut h = self.held.lock().unwrap();
        while h.len() < n {
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{} reads held, {n} expected", h.len());
            h = self.arrived.wait_timeout(h, left).unwrap().0;
        }
    }

    /// Complete the held reads, last held first; their offsets in that
    /// order.
    fn release_reversed(&self) -> Vec<u64> {
        let mut order = Vec::new();
        while let Some(off) = self.release_last() {
            order.push(off);
        }
        order
    }

    /// Complete the read held last; its offset.
    fn release_last(&self) -> Option<u64> {
        let (off, mut c) = self.held.lock().unwrap().pop()?;
        if off == self.fail_at {
            c.complete(Err(io::Error::other("injected read error")));
        } else {
            let r = self.disk.read_at(c.buf_mut().as_mut_slice(), off);
            c.complete(r);
        }
        Some(off)
    }
}

impl ReadMany for Held {
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        read_each(&*self.disk, reqs)
    }

    fn start_reads(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<ReadInFlight> {
        let mut h = self.held.lock().unwrap();
        let futs = reqs
            .into_iter()
            .map(|(off, buf)| {
                let (c, done): (Completion<ReadBuf>, _) = Completion::pair(buf);
                h.push((off, done));
                Box::pin(c) as ReadInFlight
            })
            .collect();
        self.arrived.notify_all();
        futs
    }

    fn reads_in_flight(&self) -> bool {
        true
    }
}

fn server(held: &Arc<Held>, in_flight: bool) -> common::Running {
    let export = Export::new("", held.disk.clone())
        .unwrap()
        .with_read_many(held.clone());
    assert!(export.reads_in_flight());
    start_config(
        export,
        Config::new(4).in_flight_reads(in_flight),
        Transport::Unix,
    )
}

/// A RAM disk with a random block at `at`, its held reader, the block, and
/// a server (reads in flight or not).
fn fixture(at: u64, in_flight: bool) -> (Arc<RamDisk>, Arc<Held>, Vec<u8>, common::Running) {
    let disk = Arc::new(RamDisk::new(SIZE));
    let held = Held::new(disk.clone(), u64::MAX);
    let data = random_bytes(4096);
    disk.write_all_at(&data, at).unwrap();
    let server = server(&held, in_flight);
    (disk, held, data, server)
}

/// 32 reads sent at once are all in flight together; completed one at a
/// time in reverse order, each is answered as it completes (before the
/// next completes), with its cookie and its block's bytes, and the one the
/// reader fails gets `NBD_EIO` alone.
#[test]
fn replies_come_in_completion_order_with_their_cookies_and_errors() {
    for structured in [false, true] {
        let disk = Arc::new(RamDisk::new(SIZE));
        let held = Held::new(disk.clone(), 7 * 4096);
        let blocks: Vec<Vec<u8>> = (0..32).map(|_| random_bytes(4096)).collect();
        for (i, b) in blocks.iter().enumerate() {
            disk.write_all_at(b, i as u64 * 4096).unwrap();
        }
        let server = server(&held, true);
        let mut c = Client::connect(&server.addr, structured);
        let mut sent = HashMap::new();
        for i in 0..32u64 {
            sent.insert(c.send(NBD_CMD_READ, 0, i * 4096, 4096, &[]), i);
        }
        held.wait_held(32);
        for _ in 0..32 {
            let released = held.release_last().unwrap();
            let (cookie, out) = c.recv();
            let i = sent.remove(&cookie).expect("a known cookie, once");
            assert_eq!(i * 4096, released, "the reply of the read completed");
            if i == 7 {
                assert_eq!(out, Err(NBD_EIO), "structured={structured}");
            } else {
                assert_eq!(out.unwrap(), blocks[i as usize], "block {i}");
            }
        }
        c.disconnect();
        server.stop();
    }
}

/// With the reads in flight turned off, the same reader serves the reads
/// in batches (the workers' `read_many`): the setting is honoured.
#[test]
fn the_batch_workers_serve_when_reads_in_flight_are_off() {
    let (_disk, held, data, server) = fixture(4096, false);
    let mut c = Client::connect(&server.addr, true);
    assert_eq!(c.read(4096, 4096).unwrap(), data);
    assert!(held.held.lock().unwrap().is_empty(), "start_reads not used");
    c.disconnect();
    server.stop();
}

/// A write sent behind reads still in flight waits for them: the reads
/// see the old bytes (the reader reads the disk only when released), the
/// write is answered after them, and a read after it sees the new bytes.
#[test]
fn a_write_waits_for_the_reads_before_it() {
    let (disk, held, old, server) = fixture(0, true);
    let new = random_bytes(4096);
    let mut c = Client::connect(&server.addr, true);
    let r: Vec<u64> = (0..4)
        .map(|_| c.send(NBD_CMD_READ, 0, 0, 4096, &[]))
        .collect();
    let w = c.send(NBD_CMD_WRITE, 0, 0, 4096, &new);
    held.wait_held(4);
    // Give a wrong server time to execute the write first.
    std::thread::sleep(Duration::from_millis(100));
    let mut now = vec![0u8; 4096];
    disk.read_exact_at(&mut now, 0).unwrap();
    assert_eq!(now, old, "the write waited");
    held.release_reversed();
    let mut replies = Vec::new();
    for _ in 0..5 {
        replies.push(c.recv());
    }
    assert_eq!(replies.last().unwrap(), &(w, Ok(vec![])), "write last");
    for (cookie, out) in &replies[..4] {
        assert!(r.contains(cookie));
        assert_eq!(out.as_ref().unwrap(), &old);
    }
    // The read after the write is in flight too: release it.
    let r2 = c.send(NBD_CMD_READ, 0, 0, 4096, &[]);
    held.wait_held(1);
    held.release_reversed();
    assert_eq!(c.recv(), (r2, Ok(new)));
    c.disconnect();
    server.stop();
}

/// A client that leaves with reads in flight: its connection ends once
/// they complete (nothing left open, nothing panics), and the server
/// serves the next client.
#[test]
fn a_client_leaving_with_reads_in_flight_ends_its_connection() {
    let (_disk, held, data, server) = fixture(8192, true);
    let mut c = Client::connect(&server.addr, false);
    for i in 0..16u64 {
        c.send(NBD_CMD_READ, 0, i * 4096, 4096, &[]);
    }
    held.wait_held(16);
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(server.server.connections(), 1, "waits for its reads");
    held.release_reversed();
    let end = Instant::now() + Duration::from_secs(10);
    while server.server.connections() > 0 {
        assert!(Instant::now() < end, "the connection did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = Client::connect(&server.addr, true);
    let r = c.send(NBD_CMD_READ, 0, 8192, 4096, &[]);
    held.wait_held(1);
    held.release_reversed();
    assert_eq!(c.recv(), (r, Ok(data)));
    c.disconnect();
    server.stop();
}

/// A cached file over a file backend, served with its reads in flight
/// (`CachedFile::read_owned_many`): pipelined reads of every size the
/// batch path takes, unaligned ones, reads past the end and writes among
/// them, every reply as written.
#[test]
fn a_cached_file_serves_pipelined_reads_in_flight() {
    let f = tempfile::tempfile().unwrap();
    let cache = PageCache::new(CacheConfig::default().capacity(2 << 20));
    let file = Arc::new(cache.open(FileBackend::from_file(f)).unwrap());
    file.set_len(SIZE).unwrap();
    let mut data = random_bytes(SIZE as usize);
    file.write_all_at(&data, 0).unwrap();
    file.flush().unwrap();
    let export = Export::new("", file.clone())
        .unwrap()
        .with_read_many(file.clone());
    assert!(export.reads_in_flight());
    let server = start_config(export, Config::new(4), Transport::Tcp);
    let mut c = Client::connect(&server.addr, true);
    for round in 0..4u64 {
        let mut sent = HashMap::new();
        for i in 0..200u64 {
            let off = (i * 7919 + round * 104_729) % (SIZE - (1 << 17));
            let len = [4096u32, 512, 65_536, 131_072, 100][(i % 5) as usize];
            sent.insert(c.send(NBD_CMD_READ, 0, off, len, &[]), (off, len));
        }
        let past = c.send(NBD_CMD_READ, 0, SIZE - 4096, 8192, &[]);
        let block = random_bytes(4096);
        let at = round * 1_000_003 % (SIZE - 4096);
        let w = c.send(NBD_CMD_WRITE, 0, at, 4096, &block);
        let mut wrote = false;
        for _ in 0..202 {
            let (cookie, out) = c.recv();
            if cookie == past {
                assert_eq!(out, Err(NBD_EINVAL));
                continue;
            }
            if cookie == w {
                assert_eq!(out, Ok(vec![]));
                wrote = true;
                continue;
            }
            assert!(!wrote, "a read sent before the write was answered after it");
            let (off, len) = sent.remove(&cookie).expect("a known cookie, once");
            let (o, n) = (off as usize, len as usize);
            assert!(out.unwrap() == data[o..o + n], "{len} bytes at {off}");
        }
        data[at as usize..at as usize + 4096].copy_from_slice(&block);
        assert_eq!(c.read(at, 4096).unwrap(), block);
    }
    c.disconnect();
    server.stop();
}

/// A reader whose `start_reads` panics when a batch holds offset 4096.
#[derive(Debug)]
struct Panicky(Arc<RamDisk>);

impl ReadMany for Panicky {
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        read_each(&*self.0, reqs)
    }

    fn start_reads(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<ReadInFlight> {
        assert!(
            reqs.iter().all(|(o, _)| *o != 4096),
            "a reader panicking on purpose"
        );
        reqs.into_iter()
            .map(|(off, mut buf)| {
                let r = self.0.read_at(buf.as_mut_slice(), off);
                Box::pin(std::future::ready((r, buf))) as ReadInFlight
            })
            .collect()
    }

    fn reads_in_flight(&self) -> bool {
        true
    }
}

/// Reads whose start panics get `NBD_EIO`; the connection lives and the
/// next reads are served.
#[test]
fn a_panicking_start_fails_its_reads_only() {
    let disk = Arc::new(RamDisk::new(SIZE));
    let data = random_bytes(8192);
    disk.write_all_at(&data, 0).unwrap();
    let export = Export::new("", disk.clone())
        .unwrap()
        .with_read_many(Arc::new(Panicky(disk)));
    let server = start_config(export, Config::new(4), Transport::Unix);
    let mut c = Client::connect(&server.addr, true);
    assert_eq!(c.read(4096, 4096), Err(NBD_EIO));
    assert_eq!(c.read(0, 4096).unwrap(), data[..4096]);
    assert_eq!(c.read(4096, 4096), Err(NBD_EIO));
    c.disconnect();
    server.stop();
}
