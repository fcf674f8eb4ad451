//! What a SQLite user asks the VFS about a failure or about other
//! processes, answered as the unix VFS answers it:
//! - `sqlite3_system_errno()` after a failed open (`xGetLastError`: the
//!   thread's last errno, and its message);
//! - `SQLITE_FCNTL_LAST_ERRNO` after a failed write (the handle's errno);
//! - `SQLITE_FCNTL_EXTERNAL_READER`: whether another process holds a WAL
//!   read lock.

mod common;

use common::procs::{child, child_spec, hear, say};
use rusqlite::{ffi, Connection, OpenFlags};
use std::ffi::{CStr, CString};
use std::path::Path;

fn open(db: &Path, vfs: &str) -> Connection {
    if vfs == "kxarray" {
        common::setup();
    }
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs).unwrap()
}

/// `sqlite3_open_v2(path)` through `vfs`: its result code and
/// `sqlite3_system_errno()`.
fn open_errno(path: &str, vfs: &str) -> (i32, i32) {
    common::setup();
    let (p, v) = (CString::new(path).unwrap(), CString::new(vfs).unwrap());
    let mut db = std::ptr::null_mut();
    let flags = ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE;
    // SAFETY: NUL-terminated strings; `db` is set even on failure.
    let rc = unsafe { ffi::sqlite3_open_v2(p.as_ptr(), &mut db, flags, v.as_ptr()) };
    // SAFETY: the handle sqlite3_open_v2 returned.
    let errno = unsafe { ffi::sqlite3_system_errno(db) };
    // SAFETY: closed once.
    unsafe { ffi::sqlite3_close(db) };
    (rc, errno)
}

#[test]
fn a_failed_open_says_its_errno_and_why() {
    // capi3-3.3
    for vfs in ["unix", "kxarray"] {
        assert_eq!(
            open_errno("/bogus/path/test.db", vfs),
            (ffi::SQLITE_CANTOPEN, libc::ENOENT),
            "{vfs}"
        );
    }
    // the message behind it, through xGetLastError itself
    let _ = open_errno("/bogus/path/test.db", "kxarray");
    // SAFETY: a NUL-terminated name.
    let vfs = unsafe { ffi::sqlite3_vfs_find(c"kxarray".as_ptr()) };
    assert!(!vfs.is_null());
    let mut buf = [0 as std::os::raw::c_char; 256];
    // SAFETY: the registered VFS's own method, a buffer of 256 bytes.
    let get = unsafe { (*vfs).xGetLastError }.unwrap();
    // SAFETY: as above.
    let errno = unsafe { get(vfs, buf.len() as i32, buf.as_mut_ptr()) };
    assert_eq!(errno, libc::ENOENT);
    // SAFETY: NUL-terminated by xGetLastError.
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    assert!(msg.contains("/bogus/path/test.db"), "{msg}");
    // another thread has its own record
    let vfs = vfs as usize;
    std::thread::spawn(move || {
        // SAFETY: as above; a null buffer of no bytes.
        assert_eq!(unsafe { get(vfs as *mut _, 0, std::ptr::null_mut()) }, 0);
    })
    .join()
    .unwrap();
}

/// The children: `efbig` writes past a 256 KiB file size limit on each
/// VFS and reports what SQLite says; `reader` holds a WAL read
/// transaction open on `db` through `vfs` while told to.
#[test]
#[ignore = "a child process of the tests in this file"]
fn unix_parity_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    match role.as_str() {
        "efbig" => {
            let lim = libc::rlimit {
                rlim_cur: 256 << 10,
                rlim_max: libc::RLIM_INFINITY,
            };
            // SAFETY: plain system calls on this process.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            }
            // SAFETY: as above.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) }, 0);
            let dir = Path::new(&args["dir"]);
            for vfs in ["unix", "kxarray"] {
                let c = open(&dir.join(format!("{vfs}.db")), vfs);
                c.execute_batch(&format!("PRAGMA journal_mode={}", args["journal"]))
                    .unwrap();
                let e = c
                    .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(1000000));")
                    .unwrap_err();
                let code = e.sqlite_error().map_or(-1, |e| e.extended_code);
                // SAFETY: the raw handle is only passed to SQLite ...
                let h = unsafe { c.handle() };
                // SAFETY: ... while the connection lives.
                let sys = unsafe { ffi::sqlite3_system_errno(h) };
                let mut last = -1;
                // SAFETY: LAST_ERRNO takes an int*.
                let rc = unsafe {
                    common::file_control(&c, ffi::SQLITE_FCNTL_LAST_ERRNO, (&raw mut last).cast())
                };
                say(&format!("{vfs} {code} {sys} {rc} {last}"));
            }
        }
        "reader" => {
            let c = open(Path::new(&args["db"]), &args["vfs"]);
            while let Some(cmd) = hear() {
                match cmd.as_str() {
                    "begin" => {
                        c.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
                    }
                    "end" => c.execute_batch("COMMIT").unwrap(),
                    _ => panic!("{cmd}"),
                }
                say("done");
            }
        }
        r => panic!("unknown role {r}"),
    }
}

#[test]
fn a_failed_write_says_its_errno_as_on_unix() {
    for journal in ["delete", "wal"] {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            ("dir", dir.path().display().to_string()),
            ("journal", journal.to_string()),
        ];
        let mut p = child("unix_parity_child", "efbig", &args);
        let unix = p.at_line();
        let kx = p.at_line();
        let (ok, rest) = p.wait();
        assert!(ok, "{rest:?}");
        let fields = |l: &str| l.split(' ').skip(1).map(String::from).collect::<Vec<_>>();
        assert_eq!(
            fields(&kx),
            fields(&unix),
            "journal_mode={journal}: {unix} / {kx}"
        );
        // SQLITE_IOERR_WRITE or SQLITE_FULL, errno EFBIG, and the file
        // control answered
        let f = fields(&unix);
        assert_eq!(f[1], libc::EFBIG.to_string(), "{unix}");
        assert_eq!(f[2], "0", "{unix}");
    }
}

/// `SQLITE_FCNTL_EXTERNAL_READER` on a connection through `vfs` while a
/// reader process (through `reader`) holds a read transaction, and after.
fn external_reader(vfs: &str, reader: &str) -> (i32, i32, i32) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let c = open(&db, vfs);
    c.execute_batch("PRAGMA journal_mode=wal; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    let ask = |c: &Connection| {
        let mut v = -1;
        // SAFETY: EXTERNAL_READER takes an int*.
        let rc = unsafe {
            common::file_control(c, ffi::SQLITE_FCNTL_EXTERNAL_READER, (&raw mut v).cast())
        };
        assert_eq!(rc, 0, "{vfs}: EXTERNAL_READER answered");
        v
    };
    // this process's own read transaction is not external
    c.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
    let own = ask(&c);
    c.execute_batch("COMMIT").unwrap();
    let args = [
        ("db", db.display().to_string()),
        ("vfs", reader.to_string()),
    ];
    let mut p = child("unix_parity_child", "reader", &args);
    p.send("begin\n");
    assert_eq!(p.at_line(), "done");
    let during = ask(&c);
    p.send("end\n");
    assert_eq!(p.at_line(), "done");
    let after = ask(&c);
    (own, during, after)
}

#[test]
fn another_process_s_wal_reader_is_an_external_reader() {
    for vfs in ["unix", "kxarray"] {
        for reader in ["unix", "kxarray"] {
            assert_eq!(
                external_reader(vfs, reader),
                (0, 1, 0),
                "{vfs} beside a {reader} reader"
            );
        }
    }
}
