//! The `-shm` as untrusted input: any process that can write it can put
//! anything there. A kxarray process whose `-shm` another writer filled
//! with a `nBackfill` past `mxFrame`, a forged header (a checksum that
//! matches, an `mxFrame` no file indexes), or 2 GiB of garbage, runs a
//! checkpoint and a read under a 4 GiB address-space limit (`ulimit -v
//! 4194304`): they answer as the unix VFS does or with an error, never a
//! crash; the process maps no more of the `-shm` than SQLite asked for;
//! and the checkpoint lock is free for another process afterwards.
//! Before: a `Vec` of 16 GiB reserved (SIGABRT), every region of the 2 GiB
//! file mapped (65,438 mappings), a debug build's overflow unwinding with
//! the checkpoint lock held.

mod common;

use common::procs::{child, child_spec, hear, say, sidecar};
use common::{int, open};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The child entry: a kxarray process with the database open (`victim`).
#[test]
#[ignore = "a child process of the tests in this file, not a test"]
fn shm_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    assert_eq!(role, "victim");
    victim(&PathBuf::from(&args["db"]));
    std::process::exit(0);
}

/// Mappings of the `-shm` in this process.
fn shm_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with("-shm"))
        .count()
}

fn victim(db: &Path) {
    // ulimit -v 4194304 (KiB): 4 GiB of address space.
    let lim = libc::rlimit {
        rlim_cur: 4 << 30,
        rlim_max: 4 << 30,
    };
    // SAFETY: a valid rlimit for this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
    let c = open(db, "").unwrap();
    c.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    c.execute("INSERT INTO t(pad) VALUES (randomblob(3000))", [])
        .unwrap();
    assert!(int(&c, "SELECT count(*) FROM t") > 0);
    say(&format!("ready {}", shm_mappings()));
    assert_eq!(hear().as_deref(), Some("go"));
    let before = shm_mappings();
    let ckpt = c
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
        .map_or_else(|e| format!("error({e})"), |b| format!("ok({b})"));
    let read = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
        .map_or_else(|e| format!("error({e})"), |n| format!("ok({n})"));
    say(&format!(
        "done ckpt={ckpt} read={read} maps={before}->{}",
        shm_mappings()
    ));
    assert_eq!(hear().as_deref(), Some("quit"));
}

/// A WAL database with a few hundred rows, its WAL checkpointed.
fn make_db(path: &Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(x INTEGER PRIMARY KEY, pad BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
         INSERT INTO t SELECT i, randomblob(3000) FROM n;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
}

/// SQLite's header checksum (`walChecksumBytes`, native order) over 40
/// bytes.
fn checksum(words: &[u32; 10]) -> [u32; 2] {
    let (mut s1, mut s2) = (0u32, 0u32);
    for p in words.chunks_exact(2) {
        s1 = s1.wrapping_add(p[0]).wrapping_add(s2);
        s2 = s2.wrapping_add(p[1]).wrapping_add(s1);
    }
    [s1, s2]
}

fn word(f: &std::fs::File, i: u64) -> u32 {
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, i * 4).unwrap();
    u32::from_ne_bytes(b)
}

fn put(f: &std::fs::File, i: u64, v: u32) {
    f.write_all_at(&v.to_ne_bytes(), i * 4).unwrap();
}

/// Both header copies with `mxFrame` = `mx` and a checksum that matches
/// (what a writer who knows the format can forge).
fn forge_header(f: &std::fs::File, mx: u32) {
    let mut h = [0u32; 12];
    for (i, w) in h.iter_mut().enumerate() {
        *w = word(f, i as u64);
    }
    h[4] = mx;
    let c = checksum(h[..10].try_into().unwrap());
    h[10] = c[0];
    h[11] = c[1];
    for copy in 0..2 {
        for (i, &w) in h.iter().enumerate() {
            put(f, copy * 12 + i as u64, w);
        }
    }
}

/// Whether another process holds a lock on `-shm` byte `at` (POSIX
/// `F_GETLK`, which sees OFD locks too).
fn locked(shm: &std::fs::File, at: i64) -> bool {
    // SAFETY: an all-zero `flock` is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = at;
    fl.l_len = 1;
    // SAFETY: a valid descriptor and `flock`.
    let rc = unsafe { libc::fcntl(shm.as_raw_fd(), libc::F_GETLK, &mut fl) };
    assert_eq!(rc, 0);
    fl.l_type != libc::F_UNLCK as libc::c_short
}

/// One case: the victim opens and reads, `spoil` writes the `-shm`, the
/// victim checkpoints and reads.
fn run(name: &str, spoil: impl FnOnce(&std::fs::File)) {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join(format!("{name}.db"));
    make_db(&db);
    let mut v = child("shm_child", "victim", &[("db", db.display().to_string())]);
    let ready = v.at_line();
    assert!(ready.starts_with("ready "), "{name}: {ready}");
    let shm = OpenOptions::new()
        .read(true)
        .write(true)
        .open(sidecar(&db, "-shm"))
        .unwrap();
    spoil(&shm);
    v.send("go\n");
    let done = v.at_line();
    // "done ckpt=… read=… maps=a->b"
    let maps = done.rsplit("maps=").next().unwrap();
    let (before, after) = maps.split_once("->").unwrap();
    let (before, after): (usize, usize) = (before.parse().unwrap(), after.parse().unwrap());
    assert!(
        after <= before + 2 && after <= 8,
        "{name}: the process mapped the -shm {after} times ({done})"
    );
    // WAL_CKPT_LOCK: byte 120 + 1 of the -shm.
    assert!(
        !locked(&shm, 121),
        "{name}: the checkpoint lock is held ({done})"
    );
    v.send("quit\n");
    let (ok, rest) = v.wait();
    assert!(
        ok,
        "{name}: the victim did not exit cleanly: {done} {rest:?}"
    );
    // Another process checkpoints (the unix VFS).
    let other = rusqlite::Connection::open(&db).unwrap();
    let busy: i64 = other
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(0))
        .unwrap_or(0);
    assert_eq!(busy, 0, "{name}: another process's checkpoint was busy");
}

#[test]
fn a_backfill_past_the_last_frame_is_survived() {
    run("backfill", |shm| put(shm, 24, u32::MAX));
}

#[test]
fn a_forged_header_is_survived() {
    run("forged", |shm| {
        forge_header(shm, 0xFFFF_FFF0);
        put(shm, 24, 0xFFFF_FFF0);
    });
}

/// The header kept (its salts are the ones the victim knows) and the rest
/// garbage: page-number arrays of 0x01 bytes in a 2 GiB file, `nBackfill`
/// 0x7FFFFFFF.
#[test]
fn a_two_gib_shm_of_garbage_is_survived() {
    run("garbage", |shm| {
        shm.set_len(2 << 30).unwrap(); // sparse: no disk needed
        shm.write_all_at(&vec![1u8; (256 << 10) - 136], 136)
            .unwrap();
        put(shm, 24, 0x7FFF_FFFF);
    });
}
