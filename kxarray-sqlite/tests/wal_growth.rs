//! A WAL grown ahead of its frames and written through, and a checkpoint
//! that reads each frame once and writes each page through (a bulk load's
//! path): what stays out of the cache, and that the files it leaves (a WAL
//! padded with zeros, as after a crash) are ordinary SQLite files.
//! Its own test binary: it reads the process-wide cache's counters.
//! The WAL is grown ahead and cached with `kx_locking=exclusive` (one
//! process owns the database); in the default shared mode it is read and
//! written with `pread`/`pwrite` like the unix VFS's (other processes
//! write it too), which `tests/multiprocess_core.rs` covers.

mod common;

use common::{int, open, stat, text};
use rusqlite::Connection;
use std::path::Path;

const ROWS: i64 = 8000;

/// The tests read the process-wide cache's counters: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn load(db: &Connection) {
    db.execute_batch(
        "PRAGMA journal_mode=wal; PRAGMA synchronous=normal; PRAGMA wal_autocheckpoint=0;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL, n INTEGER);",
    )
    .unwrap();
    let tx = db.unchecked_transaction().unwrap();
    {
        let mut st = tx
            .prepare("INSERT INTO t(v, n) VALUES (randomblob(300), ?1)")
            .unwrap();
        for i in 0..ROWS {
            st.execute([i]).unwrap();
        }
    }
    tx.commit().unwrap();
}

fn wal_len(db: &Path) -> u64 {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    std::fs::metadata(p).map_or(0, |m| m.len())
}

fn copy_with_wal(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    let (mut a, mut b) = (from.as_os_str().to_owned(), to.as_os_str().to_owned());
    a.push("-wal");
    b.push("-wal");
    std::fs::copy(a, b).unwrap();
}

fn unix_count(p: &Path) -> i64 {
    let db = Connection::open(p).unwrap();
    assert_eq!(text(&db, "PRAGMA integrity_check"), "ok");
    int(&db, "SELECT count(*) FROM t")
}

#[test]
fn a_bulk_load_stays_out_of_the_cache_and_leaves_ordinary_files() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bulk.db");
    let db = open(&p, "kx_direct=0&kx_locking=exclusive").unwrap();
    let cached_before = stat(&db, "cached_pages");
    load(&db);
    // The frames went to the file from SQLite's buffer: none of the WAL's
    // pages are cached (an append through the cache cached every one).
    let wal = wal_len(&p);
    let frames = wal as i64 / 4120;
    assert!(frames > 400, "a WAL of {wal} bytes");
    let cached = stat(&db, "cached_pages") - cached_before;
    assert!(
        cached < 16,
        "{cached} pages cached by a load of {frames} frames"
    );
    assert_eq!(wal % 4096, 0, "the WAL file is grown by whole pages");

    // As after a crash here: the database and its padded WAL, copied,
    // open on the unix VFS with every committed row.
    let copy = dir.path().join("copy.db");
    copy_with_wal(&p, &copy);
    assert_eq!(unix_count(&copy), ROWS);

    // The checkpoint reads each frame once, straight from the file, and
    // writes each page through: the database's pages are not cached either.
    let uncached = stat(&db, "uncached_reads");
    assert_eq!(int(&db, "PRAGMA wal_checkpoint(TRUNCATE)"), 0, "not busy");
    let read_once = stat(&db, "uncached_reads") - uncached;
    assert!(read_once as i64 > frames / 2, "{read_once} of {frames}");
    let cached = stat(&db, "cached_pages") - cached_before;
    assert!(cached < 16, "{cached} pages cached by the checkpoint");
    assert_eq!(wal_len(&p), 0, "TRUNCATE leaves an empty WAL");
    assert_eq!(stat(&db, "dirty_bytes"), 0);
    assert_eq!(text(&db, "PRAGMA integrity_check"), "ok");
    assert_eq!(int(&db, "SELECT count(*) FROM t"), ROWS);
    assert_eq!(int(&db, "SELECT sum(n) FROM t"), ROWS * (ROWS - 1) / 2);
    // More rows after the checkpoint: appended over the truncated WAL.
    db.execute("INSERT INTO t(v) VALUES (x'01')", []).unwrap();
    drop(db);
    assert_eq!(unix_count(&p), ROWS + 1);
}

#[test]
fn a_wal_left_unaligned_by_another_vfs_is_read_and_appended_to() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("unix.db");
    {
        // The unix VFS leaves a WAL of 32 + n * 4120 bytes (a crash is
        // simulated by copying it while the connection is open).
        let db = Connection::open(&p).unwrap();
        load(&db);
        let copy = dir.path().join("left.db");
        copy_with_wal(&p, &copy);
        assert_ne!(wal_len(&copy) % 4096, 0);
    }
    let left = dir.path().join("left.db");
    let db = open(&left, "kx_direct=0&kx_locking=exclusive").unwrap();
    assert_eq!(int(&db, "SELECT count(*) FROM t"), ROWS);
    db.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    for i in 0..50 {
        db.execute("INSERT INTO t(v) VALUES (?1)", [i]).unwrap();
    }
    assert_eq!(wal_len(&left) % 4096, 0, "padded to a page at open");
    let copy = dir.path().join("again.db");
    copy_with_wal(&left, &copy);
    assert_eq!(unix_count(&copy), ROWS + 50);
    drop(db);
    assert_eq!(unix_count(&left), ROWS + 50);
}

#[test]
fn readers_see_every_frame_while_a_writer_appends_and_checkpoints() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("race.db");
    let db = open(&p, "kx_direct=0").unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=wal; PRAGMA wal_autocheckpoint=64;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .unwrap();
    // Each row's text is a function of its id: a reader checks every row
    // it sees, whether it came from a frame (written through, read through
    // the cache or straight from the file) or from the database.
    const ROW: &str = "INSERT INTO t(v) VALUES (printf('%.*c', 700, char(65 + (?1 % 26))))";
    const BAD: &str =
        "SELECT count(*), coalesce(max(id), 0) FROM t WHERE v <> printf('%.*c', 700, char(65 + (id % 26)))";
    let writer = {
        let p = p.clone();
        std::thread::spawn(move || {
            let w = open(&p, "kx_direct=0").unwrap();
            w.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
            for i in 1..=1500i64 {
                w.execute(ROW, [i]).unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let r = open(&p, "kx_direct=0").unwrap();
                r.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
                let mut last = 0;
                for _ in 0..60 {
                    let n = int(&r, "SELECT count(*) FROM t");
                    assert!(n >= last, "a snapshot only grows");
                    last = n;
                    let (bad, id): (i64, i64) = r
                        .query_row(BAD, [], |x| Ok((x.get(0)?, x.get(1)?)))
                        .unwrap();
                    assert_eq!(bad, 0, "row {id} read wrong");
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(int(&db, "SELECT count(*) FROM t"), 1500);
    assert_eq!(
        int(
            &db,
            "SELECT count(*) FROM t WHERE v <> printf('%.*c', 700, char(65 + (id % 26)))"
        ),
        0
    );
    drop(db);
    assert_eq!(unix_count(&p), 1500);
}
