//! SQLite on the shared page cache, across processes: the processes on
//! one database are members of one region and share its pages; a commit
//! by one is in the frames every other reads, without a drop; a unix-VFS
//! writer's commits are seen by every member at its next transaction; and
//! a member killed in the middle of a transaction leaves no page of it to
//! anyone, whoever rolls the transaction back (a member, through the
//! frames, or a unix-VFS process, in the file directly).
//!
//! Each test's processes are children of this binary (roles in
//! `shared_cache_child`) or the unix VFS in this process; none of them
//! shares a connection across `fork`.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::procs::{child, child_spec, hear, open_vfs, say};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Rows of the table the tests change, about 1 KiB each (so a change of
/// every row dirties hundreds of pages and spills from a small cache).
const ROWS: i64 = 2000;

fn make(db: &Path, journal: &str) {
    let c = Connection::open(db).unwrap();
    let mode: String = c
        .query_row(&format!("PRAGMA journal_mode={journal}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, journal);
    c.execute_batch(&format!(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER NOT NULL, pad BLOB);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{ROWS})
         INSERT INTO t SELECT x, 1, randomblob(1000) FROM c;"
    ))
    .unwrap();
}

/// `sum(v)` and `PRAGMA integrity_check` through `c`.
fn look(c: &Connection) -> (i64, String) {
    let sum = c
        .query_row("SELECT sum(v) FROM t", [], |r| r.get(0))
        .unwrap();
    let ok = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    (sum, ok)
}

/// One counter of `PRAGMA kx_stats`.
fn stat(c: &Connection, name: &str) -> u64 {
    common::stat(c, name)
}

/// The child entry. Roles:
/// - `spill`: on kxarray, change every row inside a transaction with a
///   cache too small to hold it (SQLite writes the changed pages to the
///   database file before the commit, after syncing the journal), say
///   `spilled`, then wait to be killed;
/// - `reader`: on kxarray, answer each line read with `sum integrity
///   hits misses member_skips full_drops` of a fresh read transaction;
/// - `member-first`: on kxarray, open (recovering a hot journal through the
///   frames) and say what `look` answers.
fn shared_cache_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    let db = PathBuf::from(&args["db"]);
    let c = open_vfs(&db, "kxarray", "").unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    match role.as_str() {
        "spill" => {
            c.execute_batch("PRAGMA cache_size=8; BEGIN; UPDATE t SET v = v + 1000000;")
                .unwrap();
            assert!(
                stat(&c, "shared_files") == 1,
                "the database is in the shared cache"
            );
            say("spilled");
            std::thread::sleep(Duration::from_secs(3600));
        }
        "reader" => {
            say(&format!("ready {}", stat(&c, "shared_files")));
            while let Some(line) = hear() {
                if line == "quit" {
                    break;
                }
                let (sum, ok) = look(&c);
                say(&format!(
                    "{sum} {ok} {} {} {} {}",
                    stat(&c, "hits"),
                    stat(&c, "misses"),
                    stat(&c, "coherence_member_skips"),
                    stat(&c, "coherence_full_drops")
                ));
            }
        }
        "member-first" => {
            let (sum, ok) = look(&c);
            say(&format!("{sum} {ok}"));
        }
        _ => panic!("unknown role {role}"),
    }
}

/// A reader child's answer: (sum, integrity, hits, misses, skips, drops).
fn ask(p: &mut common::procs::Proc) -> (i64, String, u64, u64, u64, u64) {
    p.send("look\n");
    let l = p.at_line();
    let f: Vec<&str> = l.split(' ').collect();
    assert_eq!(f.len(), 6, "{l}");
    let n = |i: usize| f[i].parse::<u64>().unwrap();
    (
        f[0].parse().unwrap(),
        f[1].to_string(),
        n(2),
        n(3),
        n(4),
        n(5),
    )
}

/// A member killed with its transaction's pages in the shared frames
/// (dirty: spilled by SQLite before the commit), its hot journal rolled
/// back by a unix-VFS process (`unix_first`) or by a member: the member
/// that held the database open all along, a new member, and the file
/// itself (after any writeback the region's recovery could make) all hold
/// the committed state.
fn a_killed_writers_pages_reach_no_one(unix_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("spill.db");
    make(&db, "delete");
    let arg = || vec![("db", db.display().to_string())];
    // A member with every page cached beside the writer.
    let mut reader = child("shared_cache_child", "reader", &arg());
    assert_eq!(reader.at_line(), "ready 1", "the reader is a member");
    let (sum, ok, ..) = ask(&mut reader);
    assert_eq!((sum, ok.as_str()), (ROWS, "ok"));
    let mut writer = child("shared_cache_child", "spill", &arg());
    assert_eq!(writer.at_line(), "spilled");
    writer.kill();
    let journal = common::procs::sidecar(&db, "-journal");
    assert!(journal.exists(), "the writer died with a hot journal");
    if unix_first {
        // the unix VFS rolls the journal back in the file itself
        let u = Connection::open(&db).unwrap();
        assert_eq!(look(&u), (ROWS, "ok".to_string()), "unix, first");
        drop(u);
        assert!(!journal.exists(), "the unix VFS rolled the journal back");
    } else {
        let mut m = child("shared_cache_child", "member-first", &arg());
        assert_eq!(m.at_line(), format!("{ROWS} ok"), "a new member, first");
        assert!(m.wait().0);
    }
    // The member that had the database open all along.
    let (sum, ok, ..) = ask(&mut reader);
    assert_eq!((sum, ok.as_str()), (ROWS, "ok"), "the member beside");
    // A new member, then the file after the flusher's interval (a dead
    // member's dirty frames adopted and written back would land by then).
    let mut m = child("shared_cache_child", "member-first", &arg());
    assert_eq!(m.at_line(), format!("{ROWS} ok"), "a new member, after");
    assert!(m.wait().0);
    std::thread::sleep(Duration::from_millis(1500));
    let (sum, ok, ..) = ask(&mut reader);
    assert_eq!((sum, ok.as_str()), (ROWS, "ok"), "the member beside, later");
    reader.send("quit\n");
    assert!(reader.wait().0);
    let u = Connection::open(&db).unwrap();
    assert_eq!(look(&u), (ROWS, "ok".to_string()), "the file, at the end");
}

fn a_killed_writers_pages_reach_no_one_rolled_back_by_unix() {
    a_killed_writers_pages_reach_no_one(true);
}

fn a_killed_writers_pages_reach_no_one_rolled_back_by_a_member() {
    a_killed_writers_pages_reach_no_one(false);
}

/// Two members and a unix-VFS writer, in both journal modes: every member
/// sees each of the unix process's commits at its next transaction; a
/// second member's reads are hits in the frames the first filled; and a
/// member's commit costs the other member no drop.
fn members_share_pages_and_see_every_writer() {
    for journal in ["delete", "wal"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("two.db");
        make(&db, journal);
        let arg = || vec![("db", db.display().to_string())];
        let mut a = child("shared_cache_child", "reader", &arg());
        assert_eq!(a.at_line(), "ready 1", "{journal}");
        let (sum, _, _, a_misses, ..) = ask(&mut a);
        assert_eq!(sum, ROWS, "{journal}");
        assert!(
            a_misses > 200,
            "{journal}: the first member filled the frames ({a_misses})"
        );
        let mut b = child("shared_cache_child", "reader", &arg());
        assert_eq!(b.at_line(), "ready 1", "{journal}");
        let (sum, _, b_hits, b_misses, ..) = ask(&mut b);
        assert_eq!(sum, ROWS, "{journal}");
        assert!(
            b_misses * 20 < b_hits,
            "{journal}: the second member read the first one's frames (hits {b_hits}, misses {b_misses})"
        );
        let u = Connection::open(&db).unwrap();
        u.busy_timeout(Duration::from_secs(10)).unwrap();
        for round in 1..=10i64 {
            u.execute("UPDATE t SET v = v + 1 WHERE id % 97 = ?1", [round])
                .unwrap();
            let changed: i64 = u
                .query_row("SELECT count(*) FROM t WHERE id % 97 = ?1", [round], |r| {
                    r.get(0)
                })
                .unwrap();
            let want: i64 = u
                .query_row("SELECT sum(v) FROM t", [], |r| r.get(0))
                .unwrap();
            assert!(changed > 0);
            for (name, m) in [("a", &mut a), ("b", &mut b)] {
                let (sum, ok, ..) = ask(m);
                assert_eq!(
                    (sum, ok.as_str()),
                    (want, "ok"),
                    "{journal}: member {name} after the unix commit {round}"
                );
            }
        }
        drop(u);
        // A member's commit: the other member's next transaction drops
        // nothing (its check finds the frames current).
        let (_, _, _, _, skips0, drops0) = ask(&mut b);
        let w = open_vfs(&db, "kxarray", "").unwrap();
        w.busy_timeout(Duration::from_secs(10)).unwrap();
        w.execute("UPDATE t SET v = v + 5 WHERE id = 7", [])
            .unwrap();
        if journal == "wal" {
            w.execute_batch("PRAGMA wal_checkpoint(PASSIVE)").unwrap();
        }
        let want: i64 = w
            .query_row("SELECT sum(v) FROM t", [], |r| r.get(0))
            .unwrap();
        drop(w);
        let (sum, _, _, _, skips1, drops1) = ask(&mut b);
        assert_eq!(sum, want, "{journal}: member b after a member's commit");
        assert_eq!(
            drops1, drops0,
            "{journal}: a member's commit cost b a full drop"
        );
        assert!(
            skips1 > skips0 || journal == "wal",
            "{journal}: b's check found the frames current ({skips0} -> {skips1})"
        );
        for m in [a, b] {
            let mut m = m;
            m.send("quit\n");
            assert!(m.wait().0);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while deadline > Instant::now() && common::procs::sidecar(&db, "-wal").exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

harness::main!(
    tests: [
        a_killed_writers_pages_reach_no_one_rolled_back_by_unix,
        a_killed_writers_pages_reach_no_one_rolled_back_by_a_member,
        members_share_pages_and_see_every_writer,
    ],
    children: [
        shared_cache_child,
    ],
);
