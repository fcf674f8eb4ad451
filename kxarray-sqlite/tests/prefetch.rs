//! The prefetch of a scan's B-tree children over `O_DIRECT` (`kx_prefetch`):
//! a table filled in random key order has its leaves scattered through
//! the file, where readahead cannot follow a scan; with the prefetch, the
//! scan's leaves are read before it asks for them. Its own test binary: it
//! reads the process-wide cache's counters.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::{int, open, stat};

fn a_scan_of_scattered_leaves_is_read_ahead_of_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    harness::require(harness::direct_io(dir.path()));
    let p = dir.path().join("scattered.db");
    {
        let db = rusqlite::Connection::open(&p).unwrap();
        db.execute_batch(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 150000)
             INSERT INTO t SELECT (x * 7919) % 1000003, randomblob(300) FROM c;",
        )
        .unwrap();
    }
    // Each open starts with none of the file cached (the last close of a
    // file drops its pages); the same scan, without and with the prefetch.
    let mut misses = Vec::new();
    for prefetch in [0, 1] {
        let db = open(&p, &format!("kx_direct=1&kx_prefetch={prefetch}")).unwrap();
        let before = stat(&db, "misses");
        assert_eq!(
            int(&db, "SELECT count(*) FROM t WHERE length(v) = 300"),
            150000
        );
        misses.push(stat(&db, "misses") - before);
    }
    // Without it every scattered leaf is a miss the scan waits for; with
    // it most were submitted before the scan got to them.
    assert!(
        misses[1] * 3 < misses[0],
        "misses without and with the prefetch: {misses:?}"
    );
}

harness::main!(
    tests: [
        a_scan_of_scattered_leaves_is_read_ahead_of_it,
    ],
);
