//! Scans and bulk reads that pass the cache by: a full scan of a database
//! four times the cache, twice, between point selects of a small hot
//! table, reads the scan's pages straight into SQLite's buffers (counted
//! by `PRAGMA kx_stats`'s `passthrough_pages`), keeps the hot table's pages
//! cached, and returns the right answers; `PRAGMA integrity_check` of a
//! database that fits passes it by too (SQLite says it reads each page
//! once), where a scan of it is cached.

mod common;

use common::{int, open, stat, text};
use rusqlite::Connection;
use std::path::Path;

/// The cache's capacity for this process: the first open sets it.
const CACHE: u64 = 4 << 20;
const PARAMS: &str = "kx_cache=4194304&kx_budget=0&kx_pressure=0&kx_shared=0";

/// A database with a small `hot` table and a `big` one of `big_rows`
/// rows of 1000 bytes (about `big_rows` KB), made and closed (its pages
/// leave the cache with its last handle), then opened again with SQLite's
/// own cache kept tiny so that its reads reach the VFS.
fn make(path: &Path, big_rows: u64) -> Connection {
    let db = open(path, PARAMS).unwrap();
    db.execute_batch(&format!(
        "PRAGMA page_size=4096;
         CREATE TABLE hot(k INTEGER PRIMARY KEY, v TEXT);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<200)
         INSERT INTO hot SELECT x, printf('hot-%d', x) FROM c;
         CREATE TABLE big(a INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{big_rows})
         INSERT INTO big SELECT x, randomblob(1000) FROM c;"
    ))
    .unwrap();
    drop(db);
    let db = open(path, PARAMS).unwrap();
    db.execute_batch("PRAGMA cache_size=10").unwrap();
    db
}

/// Point selects over the whole hot table; the cache's hits and misses
/// they cost.
fn hot_round(db: &Connection) -> (u64, u64) {
    let (h, m) = (stat(db, "hits"), stat(db, "misses"));
    for k in (1..=200).step_by(7) {
        assert_eq!(
            text(db, &format!("SELECT v FROM hot WHERE k = {k}")),
            format!("hot-{k}")
        );
    }
    (stat(db, "hits") - h, stat(db, "misses") - m)
}

#[test]
fn a_scan_four_times_the_cache_passes_it_by_and_the_hot_table_stays() {
    let dir = tempfile::tempdir().unwrap();
    let rows = 4 * CACHE / 1000;
    let db = make(&dir.path().join("big.db"), rows);
    let len = std::fs::metadata(dir.path().join("big.db")).unwrap().len();
    assert!(len > 4 * CACHE, "{len}");
    assert_eq!(stat(&db, "capacity"), CACHE);
    hot_round(&db);
    hot_round(&db);
    let passed0 = stat(&db, "passthrough_pages");
    let bytes0 = stat(&db, "passthrough_bytes");
    let mut hot = (0, 0);
    for _ in 0..2 {
        let sum = int(&db, "SELECT sum(length(b)) FROM big");
        assert_eq!(sum as u64, rows * 1000);
        let (h, m) = hot_round(&db);
        hot = (hot.0 + h, hot.1 + m);
    }
    let passed = stat(&db, "passthrough_pages") - passed0;
    let bytes = stat(&db, "passthrough_bytes") - bytes0;
    // Each scan reads the big table's leaves (about a page per 3.9 rows):
    // nearly all of them passed by.
    let leaves = rows / 4;
    assert!(
        passed >= 2 * leaves * 9 / 10,
        "{passed} pages passed by, {leaves} leaves"
    );
    assert!(
        bytes >= passed * 4096 / 2,
        "{bytes} bytes for {passed} pages"
    );
    assert_eq!(hot.1, 0, "the hot table's pages stayed cached: {hot:?}");
    assert!(stat(&db, "cached_pages") * 4096 <= CACHE);
    assert_eq!(text(&db, "PRAGMA integrity_check"), "ok");

    // integrity_check of a database that fits in the cache (but is larger
    // than a quarter of it) passes the cache by; a scan of it is cached.
    let small = make(&dir.path().join("small.db"), CACHE / 2 / 1000);
    let mut last_misses = u64::MAX;
    let passed0 = stat(&small, "passthrough_pages");
    assert_eq!(text(&small, "PRAGMA integrity_check"), "ok");
    let passed = stat(&small, "passthrough_pages") - passed0;
    let pages = std::fs::metadata(dir.path().join("small.db"))
        .unwrap()
        .len()
        / 4096;
    assert!(
        passed >= pages / 2,
        "integrity_check: {passed} of {pages} pages passed by"
    );
    let passed0 = stat(&small, "passthrough_pages");
    for _ in 0..2 {
        let misses = stat(&small, "misses");
        let sum = int(&small, "SELECT sum(length(b)) FROM big");
        assert_eq!(sum as u64, CACHE / 2 / 1000 * 1000);
        last_misses = stat(&small, "misses") - misses;
    }
    assert_eq!(
        stat(&small, "passthrough_pages"),
        passed0,
        "a scan of a file that fits is cached"
    );
    assert!(
        last_misses < pages / 10,
        "the second scan hits: {last_misses} misses"
    );
}
