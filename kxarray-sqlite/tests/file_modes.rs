//! The permissions and owner of the files SQLite creates beside a database
//! on kxarray are the unix VFS's (`os_unix.c`'s `findCreateFileMode`,
//! `robust_open`'s `fchmod`, `robustFchown`): a journal, WAL or `-shm`
//! gets exactly its database's mode whatever the umask (a 0600 database's
//! journal holds its page images; a 0666 database's WAL must be writable by
//! every user who may write the database) and, when run as root, its
//! database's owner; a `modeof=` URI parameter gives a new database that
//! file's mode.
//!
//! The umask is process-wide: this file holds one test, which sets it.

mod common;

use rusqlite::{Connection, OpenFlags};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// A file beside the database: its suffix (`-journal`...), mode, owner.
type Seen = BTreeMap<String, (u32, u32, u32)>;

/// The owner a root test gives its databases (any other than root's).
const OWNER: (u32, u32) = (4242, 4243);

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn open(db: &Path, vfs: &str) -> Connection {
    if vfs == "kxarray" {
        common::setup();
    }
    Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs).unwrap()
}

/// Every file beside `db` in its directory, as it is now, into `seen`.
fn look(db: &Path, seen: &mut Seen) {
    let name = db.file_name().unwrap().to_str().unwrap();
    for e in std::fs::read_dir(db.parent().unwrap()).unwrap() {
        let e = e.unwrap();
        let n = e.file_name().into_string().unwrap();
        if let Some(suffix) = n.strip_prefix(name).filter(|s| !s.is_empty()) {
            let m = e.metadata().unwrap();
            seen.insert(suffix.to_string(), (m.mode() & 0o777, m.uid(), m.gid()));
        }
    }
}

/// A database of `mode` (owned by [`OWNER`] when root) written through
/// `vfs` in journal mode `jm`: the files seen beside it during a write
/// transaction and after its commit.
fn files_of(dir: &Path, vfs: &str, mode: u32, jm: &str) -> Seen {
    let dir = dir.join(format!("{vfs}-{jm}-{mode:o}"));
    std::fs::create_dir(&dir).unwrap();
    let db = dir.join("t.db");
    {
        let c = Connection::open(&db).unwrap();
        c.execute_batch("CREATE TABLE t(x)").unwrap();
    }
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(mode)).unwrap();
    if is_root() {
        std::os::unix::fs::chown(&db, Some(OWNER.0), Some(OWNER.1)).unwrap();
    }
    let mut seen = Seen::new();
    let c = open(&db, vfs);
    let got: String = c
        .query_row(&format!("PRAGMA journal_mode={jm}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(got, jm);
    c.execute_batch("BEGIN; INSERT INTO t VALUES (randomblob(5000));")
        .unwrap();
    look(&db, &mut seen);
    c.execute_batch("COMMIT").unwrap();
    look(&db, &mut seen);
    drop(c);
    seen
}

#[test]
fn journals_wals_and_shm_files_take_the_database_s_mode_and_owner() {
    common::setup();
    for umask in [0o022, 0o077] {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: umask cannot fail; this test is alone in its process.
        let before = unsafe { libc::umask(umask) };
        for mode in [0o600, 0o640, 0o664, 0o666] {
            for jm in ["delete", "truncate", "persist", "memory", "wal", "off"] {
                let unix = files_of(dir.path(), "unix", mode, jm);
                let kx = files_of(dir.path(), "kxarray", mode, jm);
                let case = format!("umask {umask:03o}, a {mode:o} database, journal_mode={jm}");
                assert_eq!(kx, unix, "{case}: kxarray's files against unix's");
                let expect: &[&str] = match jm {
                    "delete" | "truncate" | "persist" => &["-journal"],
                    "wal" => &["-wal", "-shm"],
                    _ => &[],
                };
                let names: Vec<&str> = kx.keys().map(String::as_str).collect();
                let mut want = expect.to_vec();
                want.sort_unstable();
                assert_eq!(names, want, "{case}: the files beside the database");
                for (suffix, (m, uid, gid)) in &kx {
                    assert_eq!(*m, mode, "{case}: {suffix} has mode {m:o}");
                    if is_root() {
                        assert_eq!((*uid, *gid), OWNER, "{case}: {suffix}'s owner");
                    }
                }
            }
        }
        // `modeof=`: a new database takes the named file's mode.
        let model = dir.path().join(format!("model-{umask:o}"));
        std::fs::write(&model, b"").unwrap();
        std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o640)).unwrap();
        let mut modes = Vec::new();
        for vfs in ["unix", "kxarray"] {
            let db = dir.path().join(format!("modeof-{vfs}-{umask:o}.db"));
            let uri = format!("file:{}?modeof={}", db.display(), model.display());
            let c = Connection::open_with_flags_and_vfs(
                uri,
                OpenFlags::default() | OpenFlags::SQLITE_OPEN_URI,
                vfs,
            )
            .unwrap();
            c.execute_batch("CREATE TABLE t(x)").unwrap();
            modes.push(std::fs::metadata(&db).unwrap().mode() & 0o777);
        }
        assert_eq!(modes, [0o640, 0o640], "modeof= under umask {umask:03o}");
        // SAFETY: as above.
        unsafe { libc::umask(before) };
    }
    if !is_root() {
        println!("not root: owners not checked");
    }
}
