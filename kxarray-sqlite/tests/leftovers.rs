//! Files left beside a WAL database where other implementations broke: a
//! `-shm` and `-wal` left by a SIGKILLed process (on either VFS), an empty
//! WAL beside a leftover `-shm` (turso #8536), a `-shm` of garbage, and a
//! `-shm` the process may not write (`readonly_shm`, beside a live writer
//! and alone). Each case is copied twice; one copy is opened through the
//! unix VFS, the other through kxarray, and kxarray must do what the unix
//! VFS does: the same rows, integrity, and the same WAL-index header in
//! the `-shm`, which a unix-VFS process then reads beside it. Nothing
//! committed is lost.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::procs::{child, child_as, child_spec, hear, open_vfs, say, shm_header, sidecar, Proc};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROWS_PER_TXN: i64 = 40;
const TXNS: i64 = 12;

/// The child entry: roles `hold` (write, say what was committed, then wait
/// for commands or a SIGKILL) and `read` (say what a fresh open reads).
fn leftovers_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    let db = PathBuf::from(&args["db"]);
    let vfs = args["vfs"].clone();
    let params = args.get("params").cloned().unwrap_or_default();
    match role.as_str() {
        "hold" => {
            let c = open_vfs(&db, &vfs, "").unwrap();
            c.busy_timeout(Duration::from_secs(10)).unwrap();
            c.execute_batch(
                "PRAGMA journal_mode=wal; PRAGMA wal_autocheckpoint=0; PRAGMA synchronous=NORMAL;
                 CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);",
            )
            .unwrap();
            for k in 0..TXNS {
                c.execute_batch(&format!(
                    "BEGIN;
                     WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {ROWS_PER_TXN})
                     INSERT INTO t(v, pad) SELECT {k} * 1000 + i, randomblob(300) FROM g;
                     UPDATE t SET v = v + 1 WHERE id % 7 = {};
                     COMMIT;",
                    k % 7
                ))
                .unwrap();
            }
            if let Some(mode) = args.get("checkpoint") {
                let (busy, _, _): (i64, i64, i64) = c
                    .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .unwrap();
                assert_eq!(busy, 0);
            }
            say(&format!("ready {}", state(&c).unwrap()));
            // commands until killed
            while let Some(cmd) = hear() {
                if cmd == "commit" {
                    c.execute("INSERT INTO t(v, pad) VALUES (-1, randomblob(300))", [])
                        .unwrap();
                    say(&format!("committed {}", state(&c).unwrap()));
                }
            }
        }
        "read" => {
            let r = open_vfs(&db, &vfs, &params).and_then(|c| {
                c.busy_timeout(Duration::from_secs(10))?;
                state(&c)
            });
            match r {
                Ok(s) => say(&format!("read {s}")),
                Err(e) => say(&format!("error {e}")),
            }
        }
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

/// What a reader sees: "rows sum integrity".
fn state(c: &Connection) -> rusqlite::Result<String> {
    let (n, s): (i64, i64) =
        c.query_row("SELECT count(*), coalesce(sum(v), 0) FROM t", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let ic: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    Ok(format!("{n} {s} {ic}"))
}

/// A writer on `vfs` that commits the rows (and runs `checkpoint`, if
/// any), says what it committed, and is SIGKILLed holding the database
/// open; what it said.
fn leave_behind(db: &Path, vfs: &str, checkpoint: Option<&str>) -> String {
    let mut args = vec![("db", db.display().to_string()), ("vfs", vfs.to_string())];
    if let Some(c) = checkpoint {
        args.push(("checkpoint", c.to_string()));
    }
    let mut p = child("leftovers_child", "hold", &args);
    let line = p.at_line();
    let committed = line
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("the writer on {vfs}: {line} {:?}", p.seen))
        .to_string();
    p.kill();
    assert!(committed.ends_with(" ok"), "{committed}");
    committed
}

/// Copy `db` and whichever of its `-wal` and `-shm` exist into `to`.
fn copy_set(db: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let dst = to.join(db.file_name().unwrap());
    std::fs::copy(db, &dst).unwrap();
    for s in ["-wal", "-shm"] {
        if sidecar(db, s).exists() {
            std::fs::copy(sidecar(db, s), sidecar(&dst, s)).unwrap();
        }
    }
    dst
}

/// A unix-VFS process's fresh look at `db` ("read <state>" or "error ...").
fn other_process_reads(db: &Path, params: &str) -> String {
    let mut p: Proc = child(
        "leftovers_child",
        "read",
        &[
            ("db", db.display().to_string()),
            ("vfs", "unix".into()),
            ("params", params.into()),
        ],
    );
    let line = p.at_line();
    assert!(p.wait().0);
    line
}

/// Open a copy of the files through each VFS with `params`; both must
/// read the same (rows, sum, integrity, or the same error), and, when
/// `compare_shm`, leave the same WAL-index header in their `-shm`, which a
/// unix-VFS process then uses beside the kxarray connection. The state
/// kxarray read.
fn open_like_unix(db: &Path, params: &str, compare_shm: bool, case: &str) -> String {
    let base = db.parent().unwrap();
    let a = copy_set(db, &base.join(format!("{case}-unix")));
    let b = copy_set(db, &base.join(format!("{case}-kx")));
    let ua = open_vfs(&a, "unix", params).and_then(|c| state(&c).map(|s| (c, s)));
    let kb = open_vfs(&b, "kxarray", params).and_then(|c| state(&c).map(|s| (c, s)));
    let (u, k) = match (ua, kb) {
        (Ok(u), Ok(k)) => (u, k),
        (Err(e), Err(f)) => {
            assert_eq!(
                e.sqlite_error_code(),
                f.sqlite_error_code(),
                "{case}: unix: {e}, kxarray: {f}"
            );
            return format!("error {f}");
        }
        (u, k) => panic!(
            "{case}: unix: {:?}, kxarray: {:?}",
            u.map(|x| x.1),
            k.map(|x| x.1)
        ),
    };
    assert_eq!(k.1, u.1, "{case}: kxarray read otherwise than unix");
    if compare_shm {
        let (hu, hk) = (
            shm_header(&sidecar(&a, "-shm")),
            shm_header(&sidecar(&b, "-shm")),
        );
        assert!(hu.is_some(), "{case}: no WAL index in the unix copy's -shm");
        assert_eq!(hk, hu, "{case}: the -shm's WAL-index header differs");
    }
    // a unix-VFS process opens the kxarray copy while kxarray has it open
    assert_eq!(
        other_process_reads(&b, params),
        format!("read {}", k.1),
        "{case}: a unix-VFS process beside the kxarray connection"
    );
    drop((u, k.0));
    k.1
}

fn a_shm_and_wal_left_by_a_sigkilled_process_open_as_on_the_unix_vfs() {
    let dir = tempfile::tempdir().unwrap();
    for vfs in ["kxarray", "unix"] {
        let db = dir.path().join(format!("killed-{vfs}.db"));
        let committed = leave_behind(&db, vfs, None);
        assert!(std::fs::metadata(sidecar(&db, "-wal")).unwrap().len() > 0);
        assert!(
            shm_header(&sidecar(&db, "-shm")).is_some(),
            "a writer on {vfs} left no -shm with a WAL index"
        );
        let got = open_like_unix(&db, "", true, &format!("killed-{vfs}"));
        assert_eq!(
            got, committed,
            "{vfs}: not what the killed writer committed"
        );
    }
}

/// turso #8536, and its neighbours: the WAL empty (checkpointed and
/// truncated by the writer before it was killed), the WAL emptied after
/// the -shm recorded frames (all checkpointed), the WAL gone.
fn an_empty_wal_beside_a_leftover_shm_opens_as_on_the_unix_vfs() {
    let dir = tempfile::tempdir().unwrap();
    for vfs in ["kxarray", "unix"] {
        let db = dir.path().join(format!("truncated-{vfs}.db"));
        let committed = leave_behind(&db, vfs, Some("TRUNCATE"));
        assert_eq!(std::fs::metadata(sidecar(&db, "-wal")).unwrap().len(), 0);
        let got = open_like_unix(&db, "", true, &format!("truncated-{vfs}"));
        assert_eq!(got, committed);

        let db = dir.path().join(format!("emptied-{vfs}.db"));
        let committed = leave_behind(&db, vfs, Some("PASSIVE"));
        let h = shm_header(&sidecar(&db, "-shm")).expect("a -shm");
        assert!(h[4] > 0 && h[9] == h[4], "frames, all backfilled: {h:?}");
        std::fs::File::options()
            .write(true)
            .open(sidecar(&db, "-wal"))
            .unwrap()
            .set_len(0)
            .unwrap();
        let got = open_like_unix(&db, "", true, &format!("emptied-{vfs}"));
        assert_eq!(got, committed);

        let db = dir.path().join(format!("nowal-{vfs}.db"));
        let committed = leave_behind(&db, vfs, Some("PASSIVE"));
        std::fs::remove_file(sidecar(&db, "-wal")).unwrap();
        let got = open_like_unix(&db, "", true, &format!("nowal-{vfs}"));
        assert_eq!(got, committed);
    }
}

/// A -shm of random bytes (as long as the real one, and shorter than its
/// header), and of zeros, beside a WAL whose frames are not checkpointed:
/// the first opener rebuilds the index from the WAL.
fn a_shm_of_garbage_opens_as_on_the_unix_vfs() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("garbage.db");
    let committed = leave_behind(&db, "unix", None);
    let shm = sidecar(&db, "-shm");
    let len = std::fs::metadata(&shm).unwrap().len() as usize;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(3);
    let random: Vec<u8> = (0..len).map(|_| rand::RngExt::random(&mut rng)).collect();
    let cases: [(&str, Vec<u8>); 3] = [
        ("random", random.clone()),
        ("short", random[..100].to_vec()),
        ("zeros", vec![0; len]),
    ];
    for (case, bytes) in cases {
        std::fs::write(&shm, &bytes).unwrap();
        let got = open_like_unix(&db, "", true, case);
        assert_eq!(got, committed, "{case}");
    }
}

/// `readonly_shm=1` (with `mode=ro`): what a process that may not write the
/// `-shm` does (as root, permissions would not stop it). Alone beside a
/// leftover `-shm`, kxarray reads what the unix VFS reads; beside a live
/// writer process, it reads the writer's commits as they come, and so does
/// a unix-VFS process beside it.
fn a_shm_this_process_may_not_write_reads_as_on_the_unix_vfs() {
    let ro = "mode=ro&readonly_shm=1";
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("left.db");
    let committed = leave_behind(&db, "unix", None);
    let got = open_like_unix(&db, ro, false, "readonly-left");
    assert_eq!(got, committed);

    for vfs in ["unix", "kxarray"] {
        let db = dir.path().join(format!("live-{vfs}.db"));
        let mut w = child(
            "leftovers_child",
            "hold",
            &[("db", db.display().to_string()), ("vfs", vfs.into())],
        );
        let first = w.at_line().strip_prefix("ready ").unwrap().to_string();
        let kx = open_vfs(&db, "kxarray", ro).unwrap();
        kx.busy_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(state(&kx).unwrap(), first, "writer on {vfs}");
        assert_eq!(other_process_reads(&db, ro), format!("read {first}"));
        for _ in 0..3 {
            w.send("commit\n");
            let now = w.at_line().strip_prefix("committed ").unwrap().to_string();
            assert_eq!(state(&kx).unwrap(), now, "writer on {vfs}");
            assert_eq!(other_process_reads(&db, ro), format!("read {now}"));
        }
        // a write through the read-only connection is refused
        let e = kx.execute("DELETE FROM t", []).unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::ReadOnly),
            "{e}"
        );
        drop(kx);
        w.kill();
    }
}

/// A `-shm` this process really cannot write: the readers run as another
/// user (`nobody`, when the test runs as root) or, when not root, the
/// `-shm` is made read-only (0444). They open with `mode=ro` (no URI
/// parameter): the unix VFS then maps the `-shm` read-only beside a live
/// writer, and reads the WAL itself once the writer is gone
/// (`SQLITE_READONLY_CANTINIT`); kxarray must read the same.
fn a_shm_this_process_cannot_write_reads_as_on_the_unix_vfs() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let other = root.then_some(65534u32);
    if root && !others_can_run_this_binary() {
        harness::skip_now(
            "running as root, and user nobody cannot reach this test binary \
             (a directory on its path is not world-executable)",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let read_as_other = |db: &Path, vfs: &str| -> String {
        let mut p = child_as(
            "leftovers_child",
            "read",
            &[
                ("db", db.display().to_string()),
                ("vfs", vfs.into()),
                ("params", "mode=ro".into()),
            ],
            other,
        );
        let line = p.at_line();
        assert!(p.wait().0);
        line
    };
    for vfs in ["unix", "kxarray"] {
        let db = dir.path().join(format!("unwritable-{vfs}.db"));
        let mut w = child(
            "leftovers_child",
            "hold",
            &[("db", db.display().to_string()), ("vfs", vfs.into())],
        );
        let first = w.at_line().strip_prefix("ready ").unwrap().to_string();
        let shm = sidecar(&db, "-shm");
        if !root {
            std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o444)).unwrap();
        }
        // beside the live writer
        for r in ["unix", "kxarray"] {
            assert_eq!(
                read_as_other(&db, r),
                format!("read {first}"),
                "a reader on {r} that cannot write the -shm, beside a writer on {vfs}"
            );
        }
        w.send("commit\n");
        let now = w.at_line().strip_prefix("committed ").unwrap().to_string();
        for r in ["unix", "kxarray"] {
            assert_eq!(
                read_as_other(&db, r),
                format!("read {now}"),
                "{r} beside {vfs}"
            );
        }
        // the writer gone, its -shm left
        w.kill();
        let unix = read_as_other(&db, "unix");
        assert_eq!(
            unix,
            format!("read {now}"),
            "the unix VFS after the writer on {vfs} died"
        );
        assert_eq!(
            read_as_other(&db, "kxarray"),
            unix,
            "after the writer on {vfs} died"
        );
    }
}

/// Whether a user other than the owner can execute this test binary: it
/// and every directory above it are world-executable.
fn others_can_run_this_binary() -> bool {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().all(|p| {
        p.as_os_str().is_empty()
            || std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
    })
}

harness::main!(
    tests: [
        a_shm_and_wal_left_by_a_sigkilled_process_open_as_on_the_unix_vfs,
        an_empty_wal_beside_a_leftover_shm_opens_as_on_the_unix_vfs,
        a_shm_of_garbage_opens_as_on_the_unix_vfs,
        a_shm_this_process_may_not_write_reads_as_on_the_unix_vfs,
        a_shm_this_process_cannot_write_reads_as_on_the_unix_vfs,
    ],
    children: [
        leftovers_child,
    ],
);
