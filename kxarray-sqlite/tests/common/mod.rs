//! Helpers the integration tests share: registration, opening through the
//! VFS, the stock shell and the built shared library.

#![allow(dead_code)]

pub(crate) mod bank;
pub(crate) mod procs;
pub(crate) mod split;

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Register the VFS with the bundled SQLite (idempotent).
pub(crate) fn setup() {
    kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false).unwrap();
}

/// Open `path` through kxarray with extra URI parameters (`"kx_fetch=0"`...).
pub(crate) fn open(path: &Path, params: &str) -> rusqlite::Result<Connection> {
    setup();
    let mut uri = format!("file:{}?vfs=kxarray", path.display());
    if !params.is_empty() {
        uri.push('&');
        uri.push_str(params);
    }
    Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
}

/// One string from a query.
pub(crate) fn text(db: &Connection, sql: &str) -> String {
    db.query_row(sql, [], |r| r.get::<_, String>(0)).unwrap()
}

/// One integer from a query.
pub(crate) fn int(db: &Connection, sql: &str) -> i64 {
    db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap()
}

/// The value of `name=` in `PRAGMA kx_stats`.
pub(crate) fn stat(db: &Connection, name: &str) -> u64 {
    let s = text(db, "PRAGMA kx_stats");
    s.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("{name} not in {s}"))
        .parse()
        .unwrap()
}

/// The `sqlite3` shell, if installed (else the caller skips).
pub(crate) fn shell() -> Option<PathBuf> {
    let out = Command::new("sqlite3").arg("--version").output().ok()?;
    out.status.success().then(|| PathBuf::from("sqlite3"))
}

/// The cdylib of this build: `cargo test` leaves it in `target/<profile>/deps/`
/// beside the test binary (a `cargo build` also copies it one level up).
pub(crate) fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [
        deps.join("libkxarray_sqlite.so"),
        deps.parent().unwrap().join("libkxarray_sqlite.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("the shared library is not built (looked for {candidates:?})"))
        .clone()
}

/// The extension path as `.load` takes it (no suffix).
pub(crate) fn load_arg() -> String {
    let p = cdylib();
    p.with_extension("").display().to_string()
}

/// Run the stock shell with `script` on stdin and `args`; (status ok,
/// stdout, stderr).
pub(crate) fn run_shell(
    args: &[&str],
    script: &str,
    env: &[(&str, &str)],
) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = Command::new("sqlite3");
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sqlite3_file_control(db, "main", op, arg)`'s result code.
///
/// # Safety
/// - `arg` points to the argument type SQLite documents for `op`.
pub(crate) unsafe fn file_control(db: &Connection, op: i32, arg: *mut std::os::raw::c_void) -> i32 {
    debug_assert!(!arg.is_null());
    // SAFETY: the raw handle is only passed to SQLite, while `db` lives.
    let h = unsafe { db.handle() };
    // SAFETY: a live connection handle; `arg` per the caller.
    unsafe { rusqlite::ffi::sqlite3_file_control(h, c"main".as_ptr(), op, arg) }
}

/// `SQLITE_FCNTL_VFSNAME` of the main database (what `.vfsname` prints).
pub(crate) fn vfsname(db: &Connection) -> String {
    let mut p: *mut std::os::raw::c_char = std::ptr::null_mut();
    // SAFETY: VFSNAME takes a char** it fills with a sqlite3_malloc'd string.
    let rc = unsafe { file_control(db, rusqlite::ffi::SQLITE_FCNTL_VFSNAME, (&raw mut p).cast()) };
    assert_eq!(rc, 0);
    assert!(!p.is_null());
    // SAFETY: a NUL-terminated string from SQLite.
    let s = unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .unwrap()
        .to_owned();
    // SAFETY: SQLite's allocation, freed once.
    unsafe { rusqlite::ffi::sqlite3_free(p.cast()) };
    s
}

/// The main database's size as its VFS's `xFileSize` reports it.
pub(crate) fn vfs_file_size(db: &Connection) -> i64 {
    let mut f: *mut rusqlite::ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: FILE_POINTER takes a sqlite3_file** it fills.
    let rc = unsafe {
        file_control(
            db,
            rusqlite::ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut f).cast(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: the open main database file.
    let methods = unsafe { (*f).pMethods };
    // SAFETY: its methods table, alive while the file is open.
    let size_fn = unsafe { (*methods).xFileSize }.unwrap();
    let mut size = 0i64;
    // SAFETY: the file's own method, with a writable i64.
    assert_eq!(unsafe { size_fn(f, &mut size) }, 0);
    size
}

/// Set an int file control (CHUNK_SIZE...).
pub(crate) fn file_control_int(db: &Connection, op: i32, mut v: std::os::raw::c_int) -> i32 {
    // SAFETY: the int-argument opcodes take an int*.
    unsafe { file_control(db, op, (&raw mut v).cast()) }
}

/// Set an i64 file control (SIZE_HINT...).
pub(crate) fn file_control_i64(db: &Connection, op: i32, mut v: i64) -> i32 {
    // SAFETY: the i64-argument opcodes take a sqlite3_int64*.
    unsafe { file_control(db, op, (&raw mut v).cast()) }
}
