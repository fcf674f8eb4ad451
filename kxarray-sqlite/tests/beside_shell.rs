//! The stock `sqlite3` shell on its default (unix) VFS, spawned as a
//! process and driven statement by statement, beside this process using
//! the database through kxarray (and beside a second kxarray process: the
//! shell with the extension loaded), as a user would open a live database
//! while the application runs. Without `sqlite3` (`apt-get install -y
//! sqlite3`; CI installs it) each reports itself ignored, with the reason.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::bank;
use common::procs::{is_busy, Shell};
use common::{int, open};
use rusqlite::Connection;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

macro_rules! need_shell {
    () => {
        harness::require(harness::tool("sqlite3", "sqlite3"));
    };
}

fn kx_uri(db: &Path, params: &str) -> String {
    format!("file:{}?vfs=kxarray{params}", db.display())
}

/// Three processes take turns: this one (kxarray), the shell on the unix
/// VFS and the shell with kxarray loaded. Each reads the counter the
/// previous one wrote and writes the next value, and adds a row of 3 KB;
/// each must see every other's commit at its next transaction.
fn see_each_others_commits(journal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("turns.db");
    let kx = open(&p, "").unwrap();
    kx.busy_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        common::text(&kx, &format!("PRAGMA journal_mode={journal}")),
        journal
    );
    kx.execute_batch(
        "CREATE TABLE c(id INTEGER PRIMARY KEY, v INTEGER);
         CREATE TABLE rows(id INTEGER PRIMARY KEY, who TEXT, b BLOB);
         INSERT INTO c VALUES (1, 0);",
    )
    .unwrap();
    let mut unix = Shell::unix(&p, 10_000);
    let mut kxsh = Shell::kxarray(&kx_uri(&p, ""), 10_000);
    let mut v = 0;
    for round in 0..15 {
        // the unix shell
        let got = unix.one("SELECT v FROM c WHERE id = 1;");
        assert_eq!(got, v.to_string(), "the unix shell, round {round}");
        assert_eq!(
            unix.one("SELECT count(*) FROM rows;"),
            (3 * round).to_string()
        );
        v += 1;
        unix.ok(&format!(
            "BEGIN; UPDATE c SET v = {v} WHERE id = 1; INSERT INTO rows(who, b) VALUES ('unix', randomblob(3000)); COMMIT;"
        ));
        // the kxarray shell
        assert_eq!(
            kxsh.one("SELECT v FROM c WHERE id = 1;"),
            v.to_string(),
            "the kxarray shell, round {round}"
        );
        assert_eq!(
            kxsh.one("SELECT count(*) FROM rows;"),
            (3 * round + 1).to_string()
        );
        v += 1;
        kxsh.ok(&format!(
            "BEGIN; UPDATE c SET v = {v} WHERE id = 1; INSERT INTO rows(who, b) VALUES ('kxsh', randomblob(3000)); COMMIT;"
        ));
        // this process (its statement cache and page cache warm)
        assert_eq!(
            int(&kx, "SELECT v FROM c WHERE id = 1"),
            v,
            "this process, round {round}"
        );
        assert_eq!(int(&kx, "SELECT count(*) FROM rows"), 3 * round + 2);
        let tx = kx.unchecked_transaction().unwrap();
        let seen: i64 = tx
            .query_row("SELECT v FROM c WHERE id = 1", [], |r| r.get(0))
            .unwrap();
        v = seen + 1;
        tx.execute("UPDATE c SET v = ?1 WHERE id = 1", [v]).unwrap();
        tx.execute(
            "INSERT INTO rows(who, b) VALUES ('kx', randomblob(3000))",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    assert_eq!(unix.one("SELECT v FROM c;"), v.to_string());
    assert_eq!(unix.one("PRAGMA integrity_check;"), "ok");
    assert_eq!(
        unix.one(
            "SELECT group_concat(n) FROM (SELECT count(*) n FROM rows GROUP BY who ORDER BY who);"
        ),
        "15,15,15"
    );
    assert!(unix.quit() && kxsh.quit());
    assert_eq!(common::text(&kx, "PRAGMA integrity_check"), "ok");
}

fn the_shell_and_kxarray_see_each_others_commits_wal() {
    need_shell!();
    see_each_others_commits("wal");
}

fn the_shell_and_kxarray_see_each_others_commits_delete() {
    need_shell!();
    see_each_others_commits("delete");
}

/// A count of `t` in this process, which must not wait or fail.
fn count_now(kx: &Connection) -> i64 {
    kx.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("a reader in this process was refused: {e}"))
}

/// WAL mode: whichever process holds an open write transaction (this one
/// on kxarray, the unix shell, the kxarray shell), readers in the other two
/// read at once, with no busy timeout, the last committed state; a second
/// writer is refused (writers still exclude each other).
fn a_wal_reader_is_never_blocked_by_a_writer_in_another_process() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("readers.db");
    let kx = open(&p, "").unwrap();
    kx.busy_timeout(Duration::ZERO).unwrap();
    kx.execute_batch(
        "PRAGMA journal_mode=wal; CREATE TABLE t(x, b BLOB);
         INSERT INTO t VALUES (1, randomblob(100));",
    )
    .unwrap();
    let mut unix = Shell::unix(&p, 0);
    let mut kxsh = Shell::kxarray(&kx_uri(&p, ""), 0);
    let big_insert = "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 300) INSERT INTO t SELECT i, randomblob(500) FROM g;";
    let mut n = 1;

    // 1. this process writes
    kx.execute_batch(&format!("BEGIN IMMEDIATE; {big_insert}"))
        .unwrap();
    assert_eq!(unix.one("SELECT count(*) FROM t;"), n.to_string());
    assert_eq!(kxsh.one("SELECT count(*) FROM t;"), n.to_string());
    let refused = unix.run("INSERT INTO t VALUES (0, NULL);");
    assert!(
        refused.iter().any(|l| l.contains("database is locked")),
        "{refused:?}"
    );
    kx.execute_batch("COMMIT").unwrap();
    n += 300;
    assert_eq!(unix.one("SELECT count(*) FROM t;"), n.to_string());
    assert_eq!(kxsh.one("SELECT count(*) FROM t;"), n.to_string());

    // 2. the unix shell writes
    unix.ok(&format!("BEGIN IMMEDIATE; {big_insert}"));
    assert_eq!(count_now(&kx), n);
    assert_eq!(kxsh.one("SELECT count(*) FROM t;"), n.to_string());
    let e = kx
        .execute("INSERT INTO t VALUES (0, NULL)", [])
        .unwrap_err();
    assert!(is_busy(&e), "{e}");
    unix.ok("COMMIT;");
    n += 300;
    assert_eq!(count_now(&kx), n);
    assert_eq!(kxsh.one("SELECT count(*) FROM t;"), n.to_string());

    // 3. the kxarray shell writes
    kxsh.ok(&format!("BEGIN IMMEDIATE; {big_insert}"));
    assert_eq!(count_now(&kx), n);
    assert_eq!(unix.one("SELECT count(*) FROM t;"), n.to_string());
    let e = kx
        .execute("INSERT INTO t VALUES (0, NULL)", [])
        .unwrap_err();
    assert!(is_busy(&e), "{e}");
    kxsh.ok("COMMIT;");
    n += 300;
    assert_eq!(count_now(&kx), n);
    assert_eq!(unix.one("SELECT count(*) FROM t;"), n.to_string());
    assert_eq!(unix.one("PRAGMA integrity_check;"), "ok");
    // (the shells exit with status 1 after the refusals above)
    unix.quit();
    kxsh.quit();
}

/// turso #8975: a reader whose snapshot is a fully checkpointed database
/// (it reads the database file, no WAL frame) must still hold off another
/// process's checkpoint (SQLite's read mark 0), or the checkpoint copies
/// newer pages under it. Both ways: a kxarray reader (a process whose cache
/// of 1 MiB is smaller than the table, so it reads the file) beside a unix
/// writer that checkpoints, and a unix reader beside a kxarray writer.
fn a_reader_of_a_checkpointed_database_holds_off_other_processes_checkpoints() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    for kx_reads in [true, false] {
        let p = dir.path().join(format!("ckpt-{kx_reads}.db"));
        {
            let c = Connection::open(&p).unwrap();
            c.execute_batch(
                "PRAGMA journal_mode=wal; CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);
                 WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 2000)
                 INSERT INTO t SELECT i, 1, randomblob(1000) FROM g;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        }
        let (mut reader, mut writer_sh, writer_kx) = if kx_reads {
            (
                Shell::kxarray(&kx_uri(&p, "&kx_cache=1m"), 0),
                Some(Shell::unix(&p, 300)),
                None,
            )
        } else {
            let kx = open(&p, "").unwrap();
            kx.busy_timeout(Duration::from_millis(300)).unwrap();
            (Shell::unix(&p, 0), None, Some(kx))
        };
        let mut write = |sql: &str| -> Vec<String> {
            match (&mut writer_sh, &writer_kx) {
                (Some(sh), _) => sh.ok(sql),
                (None, Some(kx)) => {
                    let mut st = kx.prepare(sql).unwrap();
                    let cols = st.column_count();
                    let mut rows = st.query([]).unwrap();
                    let mut out = Vec::new();
                    while let Some(r) = rows.next().unwrap() {
                        let v: Vec<String> = (0..cols)
                            .map(|i| {
                                r.get::<_, rusqlite::types::Value>(i)
                                    .map(|v| format!("{v:?}"))
                                    .unwrap()
                            })
                            .collect();
                        out.push(v.join("|"));
                    }
                    out
                }
                _ => unreachable!(),
            }
        };
        reader.ok("BEGIN;");
        assert_eq!(reader.one("SELECT sum(v) FROM t;"), "2000");
        write("UPDATE t SET v = 2;");
        // may not finish (BUSY) while the reader is there; must not copy
        // the new pages into the file under it
        write("PRAGMA wal_checkpoint(TRUNCATE);");
        write("PRAGMA wal_checkpoint(PASSIVE);");
        assert_eq!(
            reader.one("SELECT sum(v), count(*) FROM t WHERE v = 1;"),
            "2000|2000",
            "kx_reads={kx_reads}: the snapshot changed under the reader"
        );
        reader.ok("COMMIT;");
        assert_eq!(reader.one("SELECT sum(v) FROM t;"), "4000");
        write("PRAGMA wal_checkpoint(TRUNCATE);");
        assert_eq!(reader.one("SELECT sum(v) FROM t;"), "4000");
        assert_eq!(reader.one("PRAGMA integrity_check;"), "ok");
        assert!(reader.quit());
    }
}

/// `.backup` from the unix shell while this process runs bank transfers
/// through kxarray: every copy is a consistent snapshot (integrity, the
/// total, a prefix of the transfers and balances that agree with it).
fn backup_while_writing(journal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("live.db");
    {
        let c = open(&p, "").unwrap();
        bank::create(&c, journal);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicI64::new(0));
    let writer = {
        let (p, stop, progress) = (p.clone(), Arc::clone(&stop), Arc::clone(&progress));
        std::thread::spawn(move || {
            let c = open(&p, "").unwrap();
            c.busy_timeout(Duration::from_millis(100)).unwrap();
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
            let done = |k: i64| {
                progress.store(k, Ordering::Relaxed);
                stop.load(Ordering::Relaxed)
            };
            bank::work(
                &c,
                1,
                &mut rng,
                &done,
                Instant::now() + Duration::from_secs(60),
                Duration::from_micros(500),
            )
        })
    };
    while progress.load(Ordering::Relaxed) < 20 && !writer.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = progress.load(Ordering::Relaxed);
    let mut sh = Shell::unix(&p, 10_000);
    let copies: Vec<_> = (0..5)
        .map(|i| dir.path().join(format!("copy{i}.db")))
        .collect();
    for c in &copies {
        sh.ok(&format!(".backup '{}'", c.display()));
    }
    assert!(sh.quit());
    let during = progress.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let rep = writer.join().unwrap().unwrap();
    assert!(
        during > 0,
        "the writer made no transfer while the shell backed up"
    );
    let mut sizes = Vec::new();
    for c in &copies {
        let db = Connection::open(c).unwrap();
        let k = int(&db, "SELECT count(*) FROM transfers");
        bank::verify(&db, &[(1, k)]).unwrap_or_else(|e| panic!("{}: {e}", c.display()));
        sizes.push(k);
    }
    assert!(
        sizes.iter().all(|&k| k >= before && k <= rep.committed),
        "{sizes:?} {before} {rep:?}"
    );
    let live = open(&p, "").unwrap();
    bank::verify(&live, &[(1, rep.committed)]).unwrap();
}

fn backup_from_the_shell_while_kxarray_writes_is_consistent_wal() {
    need_shell!();
    backup_while_writing("wal");
}

fn backup_from_the_shell_while_kxarray_writes_is_consistent_delete() {
    need_shell!();
    backup_while_writing("delete");
}

harness::main!(
    tests: [
        the_shell_and_kxarray_see_each_others_commits_wal,
        the_shell_and_kxarray_see_each_others_commits_delete,
        a_wal_reader_is_never_blocked_by_a_writer_in_another_process,
        a_reader_of_a_checkpointed_database_holds_off_other_processes_checkpoints,
        backup_from_the_shell_while_kxarray_writes_is_consistent_wal,
        backup_from_the_shell_while_kxarray_writes_is_consistent_delete,
    ],
);
