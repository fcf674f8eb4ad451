//! Helpers the integration tests share: registration, opening through the
//! VFS, the stock shell and the built shared library.

#![allow(dead_code)]

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Register the VFS with the bundled SQLite (idempotent).
pub fn setup() {
    kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false).unwrap();
}

/// Open `path` through kxarray with extra URI parameters (`"kx_fetch=0"`...).
pub fn open(path: &Path, params: &str) -> rusqlite::Result<Connection> {
    setup();
    let mut uri = format!("file:{}?vfs=kxarray", path.display());
    if !params.is_empty() {
        uri.push('&');
        uri.push_str(params);
    }
    Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_URI,
    )
}

/// One string from a query.
pub fn text(db: &Connection, sql: &str) -> String {
    db.query_row(sql, [], |r| r.get::<_, String>(0)).unwrap()
}

/// One integer from a query.
pub fn int(db: &Connection, sql: &str) -> i64 {
    db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap()
}

/// The value of `name=` in `PRAGMA kx_stats`.
pub fn stat(db: &Connection, name: &str) -> u64 {
    let s = text(db, "PRAGMA kx_stats");
    s.split(' ')
        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("{name} not in {s}"))
        .parse()
        .unwrap()
}

/// The `sqlite3` shell, if installed (else the caller prints SKIPPED).
pub fn shell() -> Option<PathBuf> {
    let out = Command::new("sqlite3").arg("--version").output().ok()?;
    out.status.success().then(|| PathBuf::from("sqlite3"))
}

/// The cdylib built beside this test binary (target/<profile>/).
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap(); // deps/ -> <profile>/
    let p = dir.join("libkxarray_sqlite.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// The extension path as `.load` takes it (no suffix).
pub fn load_arg() -> String {
    let p = cdylib();
    p.with_extension("").display().to_string()
}

/// Run the stock shell with `script` on stdin and `args`; (status ok,
/// stdout, stderr).
pub fn run_shell(args: &[&str], script: &str, env: &[(&str, &str)]) -> (bool, String, String) {
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
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
