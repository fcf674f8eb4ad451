//! The `READ`s a worker takes together are served by one batch read
//! (`Export::with_read_many`): pipelined reads reach the batch reader in
//! groups, each reply keeps its cookie and its own error, a write between
//! reads keeps its order, and a panicking batch read fails its group only.

mod common;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{random_bytes, start_config, Client, Transport};
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray_nbd::batch::{read_each, ReadMany};
use kxarray_nbd::proto::*;
use kxarray_nbd::{Config, Export};

const SIZE: u64 = 16 << 20;

/// A batch reader over a RAM disk that records its groups, fails the
/// reads starting at `fail_at`, panics on a group holding `panic_at`, and
/// sleeps in its first call (so the requests sent meanwhile pile up and
/// make the next group).
#[derive(Debug)]
struct Recording {
    disk: Arc<RamDisk>,
    fail_at: u64,
    panic_at: u64,
    groups: Mutex<Vec<usize>>,
}

impl ReadMany for Recording {
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        let first = {
            let mut g = self.groups.lock().unwrap();
            g.push(reqs.len());
            g.len() == 1
        };
        if first {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            reqs.iter().all(|(o, _)| *o != self.panic_at),
            "a batch reader panicking on purpose"
        );
        let mut out = read_each(&*self.disk, reqs);
        for ((o, _), r) in reqs.iter().zip(out.iter_mut()) {
            if *o == self.fail_at {
                *r = Err(io::Error::other("injected read error"));
            }
        }
        out
    }
}

fn server(workers: usize, fail_at: u64, panic_at: u64) -> (common::Running, Arc<Recording>) {
    let disk = Arc::new(RamDisk::new(SIZE));
    let rec = Arc::new(Recording {
        disk: disk.clone(),
        fail_at,
        panic_at,
        groups: Mutex::new(Vec::new()),
    });
    let export = Export::new("", disk).unwrap().with_read_many(rec.clone());
    assert!(export.batches_reads());
    (
        start_config(export, Config::new(workers), Transport::Unix),
        rec,
    )
}

/// 48 reads sent before any reply is read reach the batch reader in
/// groups (one worker: the first group's sleep lets the rest pile up);
/// every reply has its cookie and its block's bytes, and the one read the
/// reader fails gets `NBD_EIO` alone.
#[test]
fn pipelined_reads_are_served_in_groups_with_errors_per_request() {
    for structured in [false, true] {
        for workers in [1, 4] {
            let (server, rec) = server(workers, 5 * 4096, u64::MAX);
            let mut c = Client::connect(&server.addr, structured);
            let blocks: Vec<Vec<u8>> = (0..48).map(|_| random_bytes(4096)).collect();
            for (i, b) in blocks.iter().enumerate() {
                c.write(i as u64 * 4096, b).unwrap();
            }
            let mut sent = HashMap::new();
            for i in 0..48u64 {
                sent.insert(c.send(NBD_CMD_READ, 0, i * 4096, 4096, &[]), i as usize);
            }
            for _ in 0..48 {
                let (cookie, out) = c.recv();
                let i = sent.remove(&cookie).expect("a known cookie, once");
                if i == 5 {
                    assert_eq!(out, Err(NBD_EIO), "structured={structured}");
                } else {
                    assert_eq!(out.unwrap(), blocks[i], "block {i}");
                }
            }
            let groups = rec.groups.lock().unwrap().clone();
            assert_eq!(groups.iter().sum::<usize>(), 48, "{groups:?}");
            if workers == 1 {
                assert!(
                    groups.iter().any(|&g| g > 1),
                    "no read was batched: {groups:?}"
                );
            }
            c.disconnect();
            server.stop();
        }
    }
}

/// A write between two reads of its block, and requests a batch does not
/// serve (past the end, a bad flag) among batched reads: each answered as
/// alone, in order for the write.
#[test]
fn writes_and_refused_reads_split_groups_and_keep_their_order() {
    for structured in [false, true] {
        let (server, rec) = server(1, u64::MAX, u64::MAX);
        let mut c = Client::connect(&server.addr, structured);
        let old = random_bytes(4096);
        let new = random_bytes(4096);
        c.write(0, &old).unwrap();
        // The first group sleeps: the rest arrive meanwhile.
        let warm = c.send(NBD_CMD_READ, 0, 8192, 4096, &[]);
        let r1 = c.send(NBD_CMD_READ, 0, 0, 4096, &[]);
        let past = c.send(NBD_CMD_READ, 0, SIZE - 4096, 8192, &[]);
        let bad = c.send(NBD_CMD_READ, NBD_CMD_FLAG_NO_HOLE, 0, 4096, &[]);
        let w = c.send(NBD_CMD_WRITE, 0, 0, 4096, &new);
        let r2 = c.send(NBD_CMD_READ, 0, 0, 4096, &[]);
        let mut got = HashMap::new();
        for _ in 0..6 {
            let (cookie, out) = c.recv();
            assert!(got.insert(cookie, out).is_none(), "two replies to {cookie}");
        }
        assert_eq!(got[&warm], Ok(vec![0; 4096]));
        assert_eq!(got[&r1], Ok(old.clone()));
        assert_eq!(got[&past], Err(NBD_EINVAL));
        assert_eq!(got[&bad], Err(NBD_EINVAL));
        assert_eq!(got[&w], Ok(vec![]));
        assert_eq!(
            got[&r2],
            Ok(new.clone()),
            "the read after the write sees it"
        );
        assert!(rec.groups.lock().unwrap().len() >= 2);
        c.disconnect();
        server.stop();
    }
}

/// A batch reader that panics fails its group with `NBD_EIO`; the
/// connection lives and the next reads are served.
#[test]
fn a_panicking_batch_read_fails_its_group_only() {
    let (server, _rec) = server(1, u64::MAX, 4096);
    let mut c = Client::connect(&server.addr, true);
    let data = random_bytes(8192);
    c.write(0, &data).unwrap();
    let a = c.send(NBD_CMD_READ, 0, 0, 4096, &[]);
    let b = c.send(NBD_CMD_READ, 0, 4096, 4096, &[]);
    let mut got = HashMap::new();
    for _ in 0..2 {
        let (cookie, out) = c.recv();
        got.insert(cookie, out);
    }
    assert_eq!(got[&b], Err(NBD_EIO));
    // `a` went alone (first group) or with `b`.
    assert!(got[&a] == Ok(data[..4096].to_vec()) || got[&a] == Err(NBD_EIO));
    assert_eq!(c.read(0, 4096).unwrap(), data[..4096]);
    c.disconnect();
    server.stop();
}

/// A file backend's submission side as the batch reader: many reads in
/// flight on the I/O engine, every byte as written.
#[test]
fn a_file_backend_serves_pipelined_reads_through_its_submission_side() {
    let file = Arc::new(FileBackend::from_file(tempfile::tempfile().unwrap()));
    file.set_len(SIZE).unwrap();
    let data = random_bytes(1 << 20);
    file.write_all_at(&data, 0).unwrap();
    let export = Export::new("", file.clone()).unwrap().with_read_many(file);
    let server = start_config(export, Config::new(4), Transport::Tcp);
    let mut c = Client::connect(&server.addr, true);
    let mut sent = HashMap::new();
    for i in 0..256u64 {
        let off = (i * 7919 % 255) * 4096 + i % 3 * 100;
        sent.insert(c.send(NBD_CMD_READ, 0, off, 4000, &[]), off as usize);
    }
    for _ in 0..256 {
        let (cookie, out) = c.recv();
        let off = sent.remove(&cookie).unwrap();
        assert!(out.unwrap() == data[off..off + 4000], "at {off}");
    }
    c.disconnect();
    server.stop();
}
