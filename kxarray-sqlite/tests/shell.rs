//! The stock `sqlite3` shell with the VFS: as a loadable extension, with
//! `LD_PRELOAD`, and on databases written through kxarray. Without the
//! shell (`apt-get install -y sqlite3`; CI installs it) each test reports
//! itself ignored, with the reason.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::{load_arg, open, run_shell};
use std::process::Command;

macro_rules! need_shell {
    () => {
        harness::require(harness::tool("sqlite3", "sqlite3"));
    };
}

/// The shared library references no SQLite symbol, so it loads into a
/// shell whose SQLite exports none; its entry points are exported.
fn cdylib_needs_no_sqlite_symbol() {
    let lib = common::cdylib();
    let nm = harness::require(harness::tool("nm", "binutils"));
    let out = Command::new(&nm)
        .args(["-D", "--undefined-only"])
        .arg(&lib)
        .output()
        .unwrap();
    let undefined = String::from_utf8_lossy(&out.stdout);
    let sqlite: Vec<_> = undefined
        .lines()
        .filter(|l| l.contains("sqlite3"))
        .collect();
    assert!(sqlite.is_empty(), "{sqlite:?}");
    let out = Command::new(&nm)
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .unwrap();
    let defined = String::from_utf8_lossy(&out.stdout);
    assert!(defined.contains("sqlite3_kxarraysqlite_init"));
    assert!(defined.contains("sqlite3_extension_init"));
}

fn shell_loads_the_extension_wal_and_rollback() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    for mode in ["wal", "delete", "truncate", "persist"] {
        let db = dir.path().join(format!("{mode}.db"));
        let script = format!(
            ".load {}\n.open 'file:{}?vfs=kxarray'\n.vfsname\nPRAGMA journal_mode={mode};\n\
             CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);\n\
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<20000)\n\
             INSERT INTO t SELECT x, randomblob(200) FROM c;\n\
             DELETE FROM t WHERE a % 5 = 0;\n\
             SELECT count(*) FROM t;\nPRAGMA integrity_check;\nPRAGMA kx_settings;\n",
            load_arg(),
            db.display()
        );
        let (ok, out, err) = run_shell(&[], &script, &[]);
        assert!(ok, "{err}");
        // The VFS's lines (the I/O engine's choice...) go to SQLite's log,
        // not to the standard error of the user's shell.
        assert!(!err.contains("kxarray"), "the shell's stderr: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "kxarray", "{out}");
        assert_eq!(lines[1], mode);
        assert_eq!(lines[2], "16000");
        assert_eq!(lines[3], "ok");
        assert!(lines[4].starts_with("capacity="), "{out}");
        // the default VFS reads the same database, intact
        let (ok, out, err) = run_shell(
            &[db.to_str().unwrap()],
            "PRAGMA integrity_check; SELECT count(*) FROM t;",
            &[],
        );
        assert!(ok, "{err}");
        assert_eq!(out, "ok\n16000\n");
    }
}

fn dump_through_kxarray_equals_dump_on_the_default_vfs() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dump.db");
    {
        let db = open(&p, "").unwrap();
        db.execute_batch(
            "PRAGMA journal_mode=wal;
             CREATE TABLE k(id INTEGER PRIMARY KEY, name TEXT, v REAL, b BLOB);
             CREATE INDEX k_name ON k(name);
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<3000)
             INSERT INTO k SELECT x, 'n' || (x * 7919 % 1000), x / 3.0, randomblob(x % 64) FROM c;
             UPDATE k SET name = NULL WHERE id % 11 = 0;
             CREATE VIEW kv AS SELECT name, count(*) FROM k GROUP BY name;",
        )
        .unwrap();
        // leave the last transactions in the WAL, not checkpointed
        db.execute_batch("PRAGMA wal_autocheckpoint=0; DELETE FROM k WHERE id % 13 = 0;")
            .unwrap();
    }
    let (ok, plain, err) = run_shell(&[p.to_str().unwrap()], ".dump\n", &[]);
    assert!(ok, "{err}");
    let script = format!(
        ".load {}\n.open 'file:{}?vfs=kxarray'\n.dump\n",
        load_arg(),
        p.display()
    );
    let (ok, kx, err) = run_shell(&[], &script, &[]);
    assert!(ok, "{err}");
    assert!(plain.contains("CREATE TABLE k") && plain.lines().count() > 2500);
    assert_eq!(plain, kx);
}

fn ld_preload_registers_the_vfs_in_an_unmodified_program() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pre.db");
    let lib = common::cdylib();
    let uri = format!("file:{}?vfs=kxarray&kx_cache=32m", p.display());
    let (ok, out, err) = run_shell(
        &[&uri],
        "CREATE TABLE t(x); INSERT INTO t VALUES (1),(2),(3);\n.vfsname\nSELECT sum(x) FROM t;\nPRAGMA kx_settings;\n",
        &[("LD_PRELOAD", lib.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    // The constructor's registration initialized SQLite before the shell's
    // own sqlite3_config calls, which the shell reports (harmless: its URI
    // setting is the library's default, and it loses only its log hook).
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| *l != "WARNING: attempt to configure SQLite after initialization.")
        .collect();
    assert_eq!(lines[0], "kxarray", "{out}");
    assert_eq!(lines[1], "6");
    let cache = format!("cache={} ", 32 << 20);
    assert!(lines.iter().any(|l| l.starts_with(&cache)), "{out}");
}

/// Beside a process that has the database open on
/// kxarray (default, shared locking), the stock shell on the unix VFS and a
/// second kxarray process read and write it, and each sees the others'
/// commits at its next transaction. (Before, both got "database is
/// locked".)
fn a_second_process_reads_and_writes_beside_an_open_database() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("owned.db");
    let db = open(&p, "").unwrap();
    db.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    assert_eq!(common::int(&db, "SELECT count(*) FROM t"), 1);
    // the unix VFS in another process
    let (ok, out, err) = run_shell(
        &[p.to_str().unwrap()],
        "SELECT count(*) FROM t;
INSERT INTO t VALUES (2);
",
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "1
"
    );
    assert_eq!(common::int(&db, "SELECT count(*) FROM t"), 2);
    // another kxarray process
    let script = format!(
        ".load {}
.open 'file:{}?vfs=kxarray'
SELECT count(*) FROM t;
INSERT INTO t VALUES (3);
",
        load_arg(),
        p.display()
    );
    let (ok, out, err) = run_shell(&[], &script, &[]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "2
"
    );
    assert_eq!(common::int(&db, "SELECT sum(x) FROM t"), 6);
    db.execute_batch("INSERT INTO t VALUES (4);").unwrap();
    let (ok, out, err) = run_shell(
        &[p.to_str().unwrap()],
        "SELECT sum(x) FROM t; PRAGMA integrity_check;
",
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "10
ok
"
    );
}

/// `kx_locking=exclusive`: one process owns the database (and its cache)
/// while it has it open; another process, on either VFS, gets "database
/// is locked", never a second cache.
fn with_kx_locking_exclusive_a_second_process_gets_busy() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("owned.db");
    let db = open(&p, "kx_locking=exclusive").unwrap();
    db.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    // this process holds the database (the OFD lock is taken at the first
    // read and kept while the file is open)
    assert_eq!(common::int(&db, "SELECT count(*) FROM t"), 1);
    // the unix VFS in another process: "database is locked"
    let (ok, _out, err) = run_shell(&[p.to_str().unwrap()], "SELECT count(*) FROM t;\n", &[]);
    assert!(!ok);
    assert!(err.contains("database is locked"), "{err}");
    // another kxarray process: the same, never a second cache
    let script = format!(
        ".load {}\n.open 'file:{}?vfs=kxarray'\nSELECT count(*) FROM t;\n",
        load_arg(),
        p.display()
    );
    let (ok, _out, err) = run_shell(&[], &script, &[]);
    assert!(!ok);
    assert!(err.contains("database is locked"), "{err}");
    drop(db);
    // once this process closes it, both work
    let (ok, out, err) = run_shell(&[], &script, &[]);
    assert!(ok, "{err}");
    assert_eq!(out, "1\n");
}

fn direct_mode_through_the_environment() {
    need_shell!();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    harness::require(harness::direct_io(dir.path()));
    let p = dir.path().join("direct.db");
    let script = format!(
        ".load {}\n.open 'file:{}?vfs=kxarray'\nPRAGMA journal_mode=wal;\nCREATE TABLE t(x);\n\
         INSERT INTO t SELECT value FROM generate_series(1, 1000);\nPRAGMA kx_settings;\n\
         PRAGMA integrity_check;\n",
        load_arg(),
        p.display()
    );
    let (ok, out, err) = run_shell(&[], &script, &[("KXARRAY_SQLITE_DIRECT", "1")]);
    assert!(ok, "{err}");
    assert!(out.contains("direct=1"), "{out}");
    assert!(out.ends_with("ok\n"), "{out}");
}

/// A failed open's reason is in SQLite's log, which the shell prints
/// after `.log stderr` (the README's settings section says so).
fn a_failed_open_says_why_after_log_stderr() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    for (params, says) in [
        ("kx_cache=abc", "kx_cache=\"abc\" is not a size"),
        (
            "kx_cahce=64m",
            "kx_cahce=\"64m\" is not a kxarray URI parameter",
        ),
    ] {
        let script = format!(
            ".log stderr\n.load {}\n.open 'file:{}?vfs=kxarray&{params}'\nCREATE TABLE t(a);\n",
            load_arg(),
            dir.path().join("e.db").display()
        );
        let (_, _, err) = run_shell(&[], &script, &[]);
        assert!(err.contains(says), "{params}: the shell's stderr: {err}");
    }
}

harness::main!(
    tests: [
        cdylib_needs_no_sqlite_symbol,
        shell_loads_the_extension_wal_and_rollback,
        dump_through_kxarray_equals_dump_on_the_default_vfs,
        ld_preload_registers_the_vfs_in_an_unmodified_program,
        a_second_process_reads_and_writes_beside_an_open_database,
        with_kx_locking_exclusive_a_second_process_gets_busy,
        direct_mode_through_the_environment,
        a_failed_open_says_why_after_log_stderr,
    ],
);
