//! SQLite on kxarray beside the tools a SQLite user already runs: another
//! process on the same database (the stock shell on the unix VFS), a
//! read-only open, a symlinked name, a checkpoint whose write-back fails, a
//! second connection's commit, and closes racing opens. Each test is one
//! way the VFS once lost or hid a commit. Without `sqlite3` (or `strace`)
//! the tests that need it report themselves ignored, with the reason (CI
//! installs both).

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::{int, load_arg, open, run_shell, text};
use rusqlite::{Connection, ErrorCode, OpenFlags};
use std::path::Path;

macro_rules! need_shell {
    () => {
        harness::require(harness::tool("sqlite3", "sqlite3"));
    };
}

/// Run the default VFS's shell on `db` with `sql`; its stdout.
fn unix_shell(db: &Path, sql: &str) -> String {
    let (ok, out, err) = run_shell(&[db.to_str().unwrap()], sql, &[]);
    assert!(ok, "{err}");
    out
}

/// A shell script that loads the extension and opens `uri` through it.
fn kx_script(uri: &str, body: &str) -> String {
    format!(".load {}\n.open '{uri}'\n{body}", load_arg())
}

/// SQLite reads the header at open without a lock; another process then
/// commits; the kxarray connection's first statements must see that commit
/// (not the page 1 it cached at open) and must not write over it.
fn a_commit_of_another_process_between_open_and_first_lock_is_seen() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.db");
    unix_shell(&p, "CREATE TABLE t(x); INSERT INTO t VALUES(1);");
    let other = format!(
        "sqlite3 {} \"CREATE TABLE u(y); INSERT INTO u VALUES(42);\" </dev/null",
        p.display()
    );
    let script = kx_script(
        &format!("file:{}?vfs=kxarray", p.display()),
        &format!(
            ".shell {other}\nSELECT count(*) FROM sqlite_schema WHERE name='u';\n\
             INSERT INTO t VALUES(2);\nSELECT y FROM u;\n"
        ),
    );
    let (ok, out, err) = run_shell(&[], &script, &[]);
    assert!(ok, "{err}");
    assert_eq!(out, "1\n42\n", "{err}");
    // the other process's table survived the kxarray connection's write
    assert_eq!(
        unix_shell(
            &p,
            "SELECT y FROM u; SELECT count(*) FROM t; PRAGMA integrity_check;"
        ),
        "42\n2\nok\n"
    );
}

/// A read-only kxarray open of a WAL database, and a writer on the unix
/// VFS in another process while it reads: as beside a unix-VFS reader, the
/// writer commits (a WAL reader never blocks a writer), and the reader's
/// next transaction sees that commit, never a stale snapshot beside a
/// commit that happened. (When the VFS held one lock for a connection's
/// whole life, the writer got "database is locked".)
fn a_read_only_open_reads_beside_wal_writers() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ro.db");
    unix_shell(
        &p,
        "PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES(1),(2);",
    );
    let writer = format!(
        "sqlite3 {} \"INSERT INTO t VALUES(3);\" </dev/null",
        p.display()
    );
    let script = kx_script(
        &format!("file:{}?vfs=kxarray&mode=ro", p.display()),
        &format!("SELECT count(*) FROM t;\n.shell {writer}\nSELECT count(*) FROM t;\n"),
    );
    let (ok, out, err) = run_shell(&[], &script, &[]);
    assert!(ok, "{err}");
    let seen: Vec<&str> = out.lines().collect();
    assert_eq!(seen[0], "2", "{out}");
    let in_file = unix_shell(&p, "SELECT count(*) FROM t;");
    // what the reader saw last is what the file holds
    assert_eq!(format!("{}\n", seen[1]), in_file, "{out} {err}");
    assert_eq!(in_file, "3\n");
    assert!(!err.contains("database is locked"), "{err}");

    // the other way round: a unix-VFS connection holds the WAL database
    // open, and a read-only kxarray open in another process reads it, then
    // the unix-VFS connection writes
    let reader = format!(
        "sqlite3 -cmd '.load {}' -cmd \".open 'file:{}?vfs=kxarray&mode=ro'\" -cmd \"SELECT count(*) FROM t;\" </dev/null",
        load_arg(),
        p.display()
    );
    let (ok, out, err) = run_shell(
        &[p.to_str().unwrap()],
        &format!(
            "SELECT count(*) FROM t;\n.shell {reader}\nINSERT INTO t VALUES(4);\n\
             .shell {reader}\n"
        ),
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "3\n3\n4\n", "{err}");
    assert!(!err.contains("database is locked"), "{err}");
}

/// Two connections of one process, one through a symlink: one database,
/// one WAL, named after the real file.
fn a_symlinked_name_reaches_the_same_database_and_wal() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink("real.db", &link).unwrap();
    let script = kx_script(
        &format!("file:{}?vfs=kxarray", real.display()),
        &format!(
            "PRAGMA journal_mode=WAL;\nCREATE TABLE t(x);\nINSERT INTO t VALUES(1);\n\
             .connection 1\n.open 'file:{}?vfs=kxarray'\nINSERT INTO t VALUES(2);\n\
             SELECT count(*) FROM t;\n.shell ls {}\n.connection 0\nSELECT count(*) FROM t;\n",
            link.display(),
            dir.path().display()
        ),
    );
    let (ok, out, err) = run_shell(&[], &script, &[]);
    assert!(ok, "{err}");
    assert_eq!(
        out, "wal\n2\nlink.db\nreal.db\nreal.db-shm\nreal.db-wal\n2\n",
        "{err}"
    );
    assert!(!dir.path().join("link.db-wal").exists());
    assert!(!dir.path().join("link.db-shm").exists());
    assert_eq!(
        unix_shell(&real, "SELECT count(*) FROM t; PRAGMA integrity_check;"),
        "2\nok\n"
    );
}

/// Under `synchronous=OFF` SQLite ignores a failed write-back after the
/// checkpoint at close and deletes the WAL: the VFS must keep the WAL
/// while its database's pages are not in the file. `ulimit -f` makes the
/// database's writes past 1 MiB fail (`EFBIG`) while the WAL still fits.
fn a_failed_checkpoint_write_back_keeps_the_wal() {
    need_shell!();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ckpt.db");
    unix_shell(
        &p,
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<150)
         INSERT INTO t SELECT x, randomblob(3000) FROM c;",
    );
    assert!(std::fs::metadata(&p).unwrap().len() < 1 << 20);
    let script = kx_script(
        &format!("file:{}?vfs=kxarray", p.display()),
        "PRAGMA synchronous=OFF;\n\
         WITH RECURSIVE c(x) AS (SELECT 151 UNION ALL SELECT x+1 FROM c WHERE x<300)\n\
         INSERT INTO t SELECT x, randomblob(3000) FROM c;\nSELECT count(*) FROM t;\n",
    );
    let script_file = dir.path().join("script.sql");
    std::fs::write(&script_file, script).unwrap();
    // SIGXFSZ ignored: the writes fail with EFBIG instead of killing
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f 1024; sqlite3 < {}",
            script_file.display()
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, "300\n", "{}", String::from_utf8_lossy(&out.stderr));
    // every committed row is still there, from the database or its WAL
    assert_eq!(
        unix_shell(&p, "SELECT count(*) FROM t; PRAGMA integrity_check;"),
        "300\nok\n"
    );
}

/// The WAL is created by one connection and committed to by another: the
/// second syncs the directory at its first sync too (the unix VFS's
/// DIRSYNC on every create-open of a journal or WAL). Counted with strace,
/// after a marker between the two connections' work.
fn every_create_open_of_a_wal_syncs_its_directory() {
    need_shell!();
    harness::require(harness::tool("strace", "strace"));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dir.db");
    // a name the log shows between the first connection's commits and the
    // second's (cat opens it and fails)
    let marker = dir.path().join("second-connection-starts");
    let script = kx_script(
        &format!("file:{}?vfs=kxarray", p.display()),
        &format!(
            "PRAGMA journal_mode=WAL;\nPRAGMA synchronous=FULL;\nCREATE TABLE t(x);\n\
             INSERT INTO t VALUES(1);\n.shell cat {} 2>/dev/null || true\n.connection 1\n\
             .open 'file:{}?vfs=kxarray'\nPRAGMA synchronous=FULL;\nINSERT INTO t VALUES(2);\n",
            marker.display(),
            p.display()
        ),
    );
    let script_file = dir.path().join("script.sql");
    std::fs::write(&script_file, script).unwrap();
    let log = dir.path().join("strace.log");
    let out = std::process::Command::new("strace")
        .args(["-f", "-e", "trace=openat,fsync", "-o"])
        .arg(&log)
        .arg("sh")
        .arg("-c")
        .arg(format!("sqlite3 < {}", script_file.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(&log).unwrap();
    let dir_name = format!("\"{}\"", dir.path().display());
    // descriptors opened on the directory, then fsyncs of them
    let mut dir_fds = std::collections::HashSet::new();
    let mut dir_syncs = 0;
    let marker = marker.display().to_string();
    let second = log
        .split_once(&marker)
        .unwrap_or_else(|| panic!("no marker in:\n{log}"))
        .1;
    for line in second.lines() {
        if line.contains("openat(") && line.contains(&dir_name) {
            if let Some(fd) = line
                .rsplit("= ")
                .next()
                .and_then(|f| f.trim().parse::<i32>().ok())
            {
                dir_fds.insert(fd);
            }
        } else if let Some(rest) = line.split("fsync(").nth(1) {
            let fd: i32 = rest.split(')').next().unwrap().parse().unwrap();
            if dir_fds.remove(&fd) {
                dir_syncs += 1;
            }
        }
    }
    assert!(
        dir_syncs >= 1,
        "the second connection's WAL synced its directory {dir_syncs} times:\n{second}"
    );
    assert_eq!(unix_shell(&p, "SELECT count(*) FROM t;"), "2\n");
}

/// The raw file object of a connection's main database.
fn main_file(db: &Connection) -> *mut rusqlite::ffi::sqlite3_file {
    let mut f: *mut rusqlite::ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: FILE_POINTER takes a sqlite3_file** it fills.
    let rc = unsafe {
        common::file_control(
            db,
            rusqlite::ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut f).cast(),
        )
    };
    assert_eq!(rc, 0);
    assert!(!f.is_null());
    f
}

/// The I/O methods of an open file, called directly (what SQLite's pager
/// does), each as a safe call with its result code.
struct Methods {
    f: *mut rusqlite::ffi::sqlite3_file,
    m: &'static rusqlite::ffi::sqlite3_io_methods,
}

impl Methods {
    /// The methods of `db`'s main database file (used while `db` lives).
    fn of(db: &Connection) -> Methods {
        let f = main_file(db);
        // SAFETY: `f` is the connection's open file object.
        let methods = unsafe { (*f).pMethods };
        // SAFETY: an open file's methods table, which lives in the VFS's
        // static data for ever.
        let m = unsafe { &*methods };
        Methods { f, m }
    }

    fn write(&self, data: &[u8], off: i64) -> i32 {
        // SAFETY: the file's own method with `data.len()` readable bytes.
        unsafe { self.m.xWrite.unwrap()(self.f, data.as_ptr().cast(), data.len() as i32, off) }
    }

    fn lock(&self, level: i32) -> i32 {
        // SAFETY: the file's own method.
        unsafe { self.m.xLock.unwrap()(self.f, level) }
    }

    fn fetch(&self, off: i64, amt: i32) -> *mut std::os::raw::c_void {
        let mut p = std::ptr::null_mut();
        // SAFETY: the file's own method with a writable out-pointer.
        let rc = unsafe { self.m.xFetch.unwrap()(self.f, off, amt, &mut p) };
        assert_eq!(rc, 0);
        p
    }

    fn unfetch(&self, off: i64, p: *mut std::os::raw::c_void) -> i32 {
        // SAFETY: the file's own method, with a pointer its xFetch gave (or
        // null).
        unsafe { self.m.xUnfetch.unwrap()(self.f, off, p) }
    }

    fn set_mmap_size(&self, mut n: i64) -> i32 {
        // SAFETY: MMAP_SIZE takes a sqlite3_int64*.
        unsafe {
            self.m.xFileControl.unwrap()(
                self.f,
                rusqlite::ffi::SQLITE_FCNTL_MMAP_SIZE,
                (&raw mut n).cast(),
            )
        }
    }
}

/// Byte `off` of the folio buffer fetched pointer `p` points into.
///
/// # Safety
/// - `p` came from `xFetch` and its reference is still held, and `p + off`
///   lies in the same folio buffer.
unsafe fn byte_at(p: *mut std::os::raw::c_void, off: usize) -> u8 {
    debug_assert!(!p.is_null());
    // SAFETY: per the caller, `p + off` is in the same buffer.
    let at = unsafe { p.cast::<u8>().add(off) };
    // SAFETY: per the caller, live memory.
    unsafe { *at }
}

/// Two fetches of one page from two buffers (a copy-on-write between
/// them); unfetching the first must release the first's reference, not the
/// second's: the second cursor still reads through its pointer, so a later
/// write must copy rather than change those bytes in place.
fn unfetch_releases_the_reference_of_its_own_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fetch.db");
    let db = open(&p, "kx_shared=0").unwrap();
    let m = Methods::of(&db);
    let page = |b: u8| vec![b; 1024];
    // the locks SQLite holds when it writes and fetches (a handle that
    // never locks is a shim's chunk, served from the file: `lockless`)
    for level in [1, 2, 4] {
        assert_eq!(m.lock(level), 0);
    }
    assert_eq!(m.write(&page(1).repeat(8), 0), 0);
    assert_eq!(m.set_mmap_size(1 << 20), 0);
    let p1 = m.fetch(0, 1024);
    assert!(!p1.is_null());
    // another page of the same 4 KiB folio changes: the pinned buffer is
    // copied
    assert_eq!(m.write(&page(2), 1024), 0);
    let p2 = m.fetch(0, 1024);
    assert!(!p2.is_null());
    assert_ne!(p1, p2, "a copy-on-write was expected between the fetches");
    // SAFETY: both references are held; offset 1024 is in their 4 KiB
    // folio buffers.
    let b1 = unsafe { byte_at(p1, 1024) };
    // SAFETY: as above.
    let b2 = unsafe { byte_at(p2, 1024) };
    assert_eq!((b1, b2), (1, 2));
    // the first cursor lets go of its page
    assert_eq!(m.unfetch(0, p1), 0);
    // a write to the folio while the second still holds it
    assert_eq!(m.write(&page(3), 1024), 0);
    // SAFETY: the second reference is held (the VFS's contract; the old
    // VFS broke it, and the buffer is then still the folio's own, written
    // in place, so the read is of live memory either way).
    let after = unsafe { byte_at(p2, 1024) };
    assert_eq!(
        after, 2,
        "the second reference was released by the first unfetch"
    );
    assert_eq!(m.unfetch(0, p2), 0);
    assert_eq!(m.unfetch(0, std::ptr::null_mut()), 0);
    // SAFETY: the file's own method, back to no lock.
    assert_eq!(unsafe { m.m.xUnlock.unwrap()(m.f, 0) }, 0);
}

/// A read-write connection opened after a read-only one of the same file
/// in the same process writes (the inode they share is read-write).
fn a_read_write_open_after_a_read_only_one_can_write() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("modes.db");
    {
        let db = open(&p, "").unwrap();
        db.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES(1);")
            .unwrap();
    }
    common::setup();
    let ro = Connection::open_with_flags(
        format!("file:{}?vfs=kxarray", p.display()),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    assert_eq!(int(&ro, "SELECT count(*) FROM t"), 1);
    let rw = open(&p, "").unwrap();
    rw.execute("INSERT INTO t VALUES(2)", []).unwrap();
    assert_eq!(int(&rw, "SELECT count(*) FROM t"), 2);
    assert_eq!(int(&ro, "SELECT count(*) FROM t"), 2);
    // the read-only one still may not write
    let e = ro.execute("INSERT INTO t VALUES(3)", []).unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(ErrorCode::ReadOnly));
    // and a persist-mode journal probed read-only beside a writer
    rw.execute_batch("PRAGMA journal_mode=PERSIST").unwrap();
    for i in 0..20 {
        rw.execute("INSERT INTO t VALUES(?1)", [i]).unwrap();
        assert_eq!(int(&ro, "SELECT count(*) FROM t"), 3 + i);
    }
    assert_eq!(text(&rw, "PRAGMA integrity_check"), "ok");
}

/// One thread opens, writes and closes a database over and over while
/// another opens and reads it: the reader never meets a lock of the
/// process's own descriptors (a close used to take its inode out of the
/// table before the inode, which writes back, fsyncs and holds the OFD
/// lock, was gone; an open in between made a second inode whose first
/// lock conflicted with it). The reader may be told BUSY by the writer's
/// SQLite locks, which are legitimate; `lock_conflicts` counts only the
/// refusals of the OFD lock, which no other process could cause here.
fn a_close_never_makes_a_concurrent_open_busy() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("race.db");
    let before;
    {
        let db = open(&p, "").unwrap();
        db.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES(0);")
            .unwrap();
        before = common::stat(&db, "lock_conflicts");
    }
    let rounds = 150;
    let p2 = p.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..rounds {
            let db = open(&p2, "").unwrap();
            db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
            // unsynced data for the close to write back and fsync (the
            // window the race needs)
            db.execute_batch("PRAGMA synchronous=OFF").unwrap();
            db.execute("INSERT INTO t VALUES(randomblob(?1))", [4096 * 16 + i])
                .unwrap();
        }
    });
    let mut reads = 0;
    while !writer.is_finished() || reads < rounds {
        let db = open(&p, "").unwrap();
        db.busy_timeout(std::time::Duration::ZERO).unwrap();
        let _ = db.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0));
        reads += 1;
    }
    writer.join().unwrap();
    let db = open(&p, "").unwrap();
    assert_eq!(int(&db, "SELECT count(*) FROM t"), rounds + 1);
    let conflicts = common::stat(&db, "lock_conflicts") - before;
    assert_eq!(
        conflicts, 0,
        "{conflicts} of {reads} opens met the process's own OFD lock"
    );
}

/// `SQLITE_OPEN_NOFOLLOW` refuses a symlinked name, as on the unix VFS; a
/// name with `.` and `..` reaches the same database.
fn nofollow_and_dotted_names_as_the_unix_vfs() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    {
        let db = open(&real, "").unwrap();
        db.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES(7);")
            .unwrap();
    }
    std::os::unix::fs::symlink(&real, dir.path().join("link.db")).unwrap();
    common::setup();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    for vfs in ["unix", "kxarray"] {
        let e = Connection::open_with_flags(
            format!("file:{}/link.db?vfs={vfs}", dir.path().display()),
            flags,
        )
        .and_then(|c| c.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0)))
        .unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(ErrorCode::CannotOpen),
            "{vfs}: {e}"
        );
    }
    let dotted = format!("file:{}/./sub/../real.db?vfs=kxarray", dir.path().display());
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let a = Connection::open_with_flags(&dotted, flags).unwrap();
    let b = open(&real, "").unwrap();
    b.execute("INSERT INTO t VALUES(8)", []).unwrap();
    assert_eq!(int(&a, "SELECT count(*) FROM t"), 2);
    assert_eq!(
        a.path().unwrap(),
        real.canonicalize().unwrap().to_str().unwrap()
    );
}

harness::main!(
    tests: [
        a_commit_of_another_process_between_open_and_first_lock_is_seen,
        a_read_only_open_reads_beside_wal_writers,
        a_symlinked_name_reaches_the_same_database_and_wal,
        a_failed_checkpoint_write_back_keeps_the_wal,
        every_create_open_of_a_wal_syncs_its_directory,
        unfetch_releases_the_reference_of_its_own_pointer,
        a_read_write_open_after_a_read_only_one_can_write,
        a_close_never_makes_a_concurrent_open_busy,
        nofollow_and_dotted_names_as_the_unix_vfs,
    ],
);
