//! Crash consistency of SQLite on kxarray, tested with SQLite itself: a
//! writer process runs numbered transactions and logs each number after
//! its COMMIT returns; it is SIGKILLed at a random moment; then fresh
//! processes reopen the database on kxarray and on the unix VFS (in an
//! order that alternates, so each recovers the other's crash) and check
//! `PRAGMA integrity_check` = ok, the bookkeeping row agrees with the
//! rows, and the last logged transaction is present.
//!
//! ```text
//! cargo run --release -p kxarray-sqlite --example sqlite_crash -- --kills 200
//! cargo run --release -p kxarray-sqlite --example sqlite_crash -- --kills 5 --modes wal-normal
//! ```
//!
//! Modes: journal DELETE, TRUNCATE, PERSIST and WAL, each with
//! `synchronous` OFF, NORMAL and FULL, over a buffered and an O_DIRECT
//! backing file, with rusqlite as the writer; plus the stock `sqlite3`
//! shell as the writer (loading the extension) for WAL/NORMAL and
//! DELETE/FULL when the shell and `stdbuf` are installed.
//!
//! Multi-process modes (WAL/NORMAL and DELETE/FULL): `-unix-writer`, the
//! writer on the unix VFS and kxarray the first to reopen; `-beside`, a
//! second process on the other VFS holds the database open all along,
//! checking the bookkeeping in every read transaction while the writer
//! runs, and once the writer is killed it commits the next transaction
//! itself (recovering the hot journal, or writing after the dead writer's
//! frames) before the verifiers run. `-member-beside`: the writer and the
//! process beside are both members of the shared cache (kxarray, the
//! beside process holding every page it read in the frames the writer
//! changes); after the kill a unix-VFS process recovers the crash first on
//! even kills (rolling a hot journal back in the file, past the frames),
//! the member beside on odd ones.
//!
//! The same code runs from `tests/crash.rs` (a few kills per mode); the
//! child processes are this program (or the test binary) again, told their
//! role through the environment.

use clap::Parser;
use rand::{RngExt, SeedableRng};
use rusqlite::{Connection, OpenFlags};
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that makes this program a child.
pub(crate) const CHILD_ENV: &str = "KXARRAY_CRASH_CHILD";

/// One crash mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mode {
    /// delete, truncate, persist or wal.
    pub journal: &'static str,
    /// off, normal or full.
    pub sync: &'static str,
    /// O_DIRECT backing.
    pub direct: bool,
    /// The stock shell writes (else rusqlite).
    pub shell: bool,
    /// The writer's VFS: kxarray or unix.
    pub writer_vfs: &'static str,
    /// A process on the other VFS reads beside the writer and commits
    /// after the kill.
    pub beside: bool,
    /// The process beside is on kxarray too: a member of the shared cache
    /// beside the writer (see the module notes).
    pub member_beside: bool,
}

impl Mode {
    /// `wal-normal`, `delete-full-direct`, `wal-normal-shell`...
    pub(crate) fn name(&self) -> String {
        let mut s = format!("{}-{}", self.journal, self.sync);
        if self.direct {
            s.push_str("-direct");
        }
        if self.shell {
            s.push_str("-shell");
        }
        if self.writer_vfs == "unix" {
            s.push_str("-unix-writer");
        }
        if self.member_beside {
            s.push_str("-member-beside");
        } else if self.beside {
            s.push_str("-beside");
        }
        s
    }

    /// The VFS that is not the writer's.
    pub(crate) fn other_vfs(&self) -> &'static str {
        if self.writer_vfs == "unix" {
            "kxarray"
        } else {
            "unix"
        }
    }

    /// The single-process kxarray writer of the original modes.
    pub(crate) fn plain(
        journal: &'static str,
        sync: &'static str,
        direct: bool,
        shell: bool,
    ) -> Mode {
        Mode {
            journal,
            sync,
            direct,
            shell,
            writer_vfs: "kxarray",
            beside: false,
            member_beside: false,
        }
    }
}

/// Every mode.
pub(crate) fn all_modes() -> Vec<Mode> {
    let mut v = Vec::new();
    for direct in [false, true] {
        for journal in ["delete", "truncate", "persist", "wal"] {
            for sync in ["off", "normal", "full"] {
                v.push(Mode::plain(journal, sync, direct, false));
            }
        }
    }
    for (journal, sync, direct) in [
        ("wal", "normal", false),
        ("delete", "full", false),
        ("wal", "normal", true),
    ] {
        v.push(Mode::plain(journal, sync, direct, true));
    }
    for (journal, sync) in [("wal", "normal"), ("delete", "full")] {
        for (writer_vfs, beside) in [("unix", false), ("kxarray", true), ("unix", true)] {
            v.push(Mode {
                writer_vfs,
                beside,
                ..Mode::plain(journal, sync, false, false)
            });
        }
        v.push(Mode {
            beside: true,
            member_beside: true,
            ..Mode::plain(journal, sync, false, false)
        });
    }
    v
}

/// Kills on one database before the next starts afresh.
const KILLS_PER_DATABASE: u32 = 50;

/// The outcome of one mode.
#[derive(Debug, Default, Clone)]
pub(crate) struct Outcome {
    /// The mode's name.
    pub mode: String,
    /// Kills done.
    pub kills: u32,
    /// Transactions logged as committed over all runs.
    pub logged: u64,
    /// Transactions found in the database beyond the last logged one
    /// (committed, killed before the log line): allowed.
    pub unlogged: u64,
    /// Failures (each a message).
    pub failures: Vec<String>,
    /// Why the mode was skipped, if it was.
    pub skipped: Option<String>,
}

/// The command that starts a child: this program, or the test binary with
/// the arguments that run its child entry.
#[derive(Clone, Debug)]
pub(crate) struct ChildCmd {
    /// Program and arguments.
    pub argv: Vec<OsString>,
    /// Extra environment of the writer (not of the verifiers).
    pub writer_env: Vec<(String, String)>,
}

impl ChildCmd {
    fn command(&self, role: &str, args: &str) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..])
            .env(CHILD_ENV, format!("{role};{args}"))
            .stdin(Stdio::null());
        if role == "writer" {
            c.envs(self.writer_env.iter().map(|(k, v)| (k, v)));
        }
        c
    }
}

fn kx_uri(db: &Path, direct: bool) -> String {
    format!(
        "file:{}?vfs=kxarray&kx_direct={}&kx_cache=256m",
        db.display(),
        u8::from(direct)
    )
}

fn open_db(db: &Path, vfs: &str, direct: bool) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI;
    let c = if vfs == "kxarray" {
        kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false).expect("register");
        Connection::open_with_flags(kx_uri(db, direct), flags)?
    } else {
        Connection::open_with_flags(db, flags)?
    };
    c.busy_timeout(Duration::from_secs(10))?;
    Ok(c)
}

const SCHEMA: &str = "BEGIN IMMEDIATE;
    CREATE TABLE IF NOT EXISTS t(n INTEGER PRIMARY KEY, pad BLOB);
    CREATE TABLE IF NOT EXISTS churn(k INTEGER PRIMARY KEY, pad BLOB);
    CREATE TABLE IF NOT EXISTS meta(id INTEGER PRIMARY KEY, total INTEGER, count INTEGER);
    INSERT OR IGNORE INTO meta VALUES (1, 0, 0);
    COMMIT;";

/// The SQL of transaction `n` (the same for rusqlite and the shell).
fn txn_sql(n: u64) -> String {
    format!("BEGIN IMMEDIATE;\n{}COMMIT;\n", txn_body(n))
}

/// Transaction `n`'s statements, without BEGIN and COMMIT.
fn txn_body(n: u64) -> String {
    let mut s = format!(
        "INSERT INTO t VALUES ({n}, randomblob({}));\n",
        100 + (n * 7919) % 3900
    );
    if n > 10 {
        // rewrite an older row (pages all over the file change)
        s.push_str(&format!(
            "UPDATE t SET pad = randomblob({}) WHERE n = {};\n",
            50 + (n * 104_729) % 2000,
            1 + (n * 31) % (n - 1)
        ));
    }
    if n.is_multiple_of(20) {
        // a bigger transaction: many pages, some freed again
        s.push_str(&format!(
            "WITH RECURSIVE g(k) AS (SELECT {} UNION ALL SELECT k + 1 FROM g WHERE k < {})\n\
             INSERT OR REPLACE INTO churn SELECT k, randomblob(500) FROM g;\n\
             DELETE FROM churn WHERE k % 3 = {};\n",
            (n % 1000) * 100,
            (n % 1000) * 100 + 150,
            n % 3
        ));
    }
    s.push_str(&format!(
        "UPDATE meta SET total = total + {n}, count = count + 1 WHERE id = 1;\n"
    ));
    s
}

/// The writer child (rusqlite): transactions from `start` for ever.
fn writer(db: &Path, vfs: &str, m: &Mode, log: &Path) -> Result<(), String> {
    let c = open_db(db, vfs, m.direct).map_err(|e| format!("open: {e}"))?;
    let j: String = c
        .query_row(&format!("PRAGMA journal_mode={}", m.journal), [], |r| {
            r.get(0)
        })
        .map_err(|e| format!("journal_mode: {e}"))?;
    if j != m.journal {
        return Err(format!("journal_mode is {j}, not {}", m.journal));
    }
    c.execute_batch(&format!("PRAGMA synchronous={};\n{SCHEMA}", m.sync))
        .map_err(|e| format!("schema: {e}"))?;
    let mut n = c
        .query_row("SELECT coalesce(max(n), 0) + 1 FROM t", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(|e| e.to_string())? as u64;
    let mut logf = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| e.to_string())?;
    loop {
        c.execute_batch(&txn_sql(n))
            .map_err(|e| format!("txn {n}: {e}"))?;
        // COMMIT returned: log it (one write(2), kept by the kernel
        // when this process is killed)
        logf.write_all(format!("committed {n}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        // Now and then an idle moment after a commit, so kills also land
        // between transactions, when nothing newer would write the last
        // one's deferred database pages back.
        if n.is_multiple_of(4) {
            std::thread::sleep(Duration::from_millis(1));
        }
        n += 1;
    }
}

/// The process beside the writer (on the other VFS): read transactions
/// checking the bookkeeping until a line (or the end) on stdin, then, the
/// writer dead, one transaction of its own, the next number, logged.
fn beside(db: &Path, vfs: &str, log: &Path) -> Result<String, String> {
    let c = open_db(db, vfs, false).map_err(|e| format!("open on {vfs}: {e}"))?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        stop2.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let has_tables = |c: &Connection| -> rusqlite::Result<bool> {
        c.query_row(
            "SELECT count(*) = 2 FROM sqlite_schema WHERE name IN ('t', 'meta')",
            [],
            |r| r.get(0),
        )
    };
    let (mut reads, mut seen, mut first) = (0u64, 0i64, None);
    println!("@@ready");
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        c.execute_batch("BEGIN").map_err(|e| e.to_string())?;
        let r = (|| -> rusqlite::Result<Option<(i64, i64, i64, i64)>> {
            if !has_tables(&c)? {
                return Ok(None);
            }
            let (count, total): (i64, i64) =
                c.query_row("SELECT count(*), coalesce(sum(n), 0) FROM t", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
            let (mt, mc): (i64, i64) =
                c.query_row("SELECT total, count FROM meta WHERE id = 1", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
            Ok(Some((count, total, mc, mt)))
        })();
        let _ = c.execute_batch("COMMIT");
        match r {
            Ok(Some((count, total, mc, mt))) => {
                if (count, total) != (mc, mt) || count < seen {
                    return Err(format!(
                        "on {vfs} beside the writer: rows {count} total {total}, meta {mc} {mt}, {seen} rows seen before"
                    ));
                }
                seen = count;
                reads += 1;
                // the first commit of the live writer seen here
                if *first.get_or_insert(count) < count {
                    first = Some(i64::MAX);
                    println!("@@advance");
                }
            }
            Ok(None) => {
                first.get_or_insert(0);
            }
            Err(e) => return Err(format!("a read on {vfs} beside the writer: {e}")),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // the writer is dead: this process recovers its crash and commits
    c.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| format!("BEGIN after the kill on {vfs}: {e}"))?;
    if !has_tables(&c).map_err(|e| e.to_string())? {
        c.execute_batch("ROLLBACK").map_err(|e| e.to_string())?;
        return Ok(format!("{reads} 0"));
    }
    let n = c
        .query_row("SELECT coalesce(max(n), 0) + 1 FROM t", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(|e| e.to_string())? as u64;
    c.execute_batch(&format!("{}COMMIT;", txn_body(n)))
        .map_err(|e| format!("transaction {n} on {vfs} after the kill: {e}"))?;
    let mut logf = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| e.to_string())?;
    logf.write_all(format!("committed {n}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(format!("{reads} {n}"))
}

/// Start the process beside the writer and wait until it has read.
fn start_beside(
    cmd: &ChildCmd,
    args: &str,
) -> Result<(std::process::Child, std::sync::mpsc::Receiver<String>), String> {
    let mut child = cmd
        .command("beside", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            if let Some((_, r)) = l.split_once("@@") {
                let _ = tx.send(r.to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(l) if l == "ready" => Ok((child, rx)),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("the process beside did not start: {other:?}"))
        }
    }
}

/// Tell the process beside that the writer is dead; what it reported.
fn finish_beside(
    mut child: std::process::Child,
    rx: &std::sync::mpsc::Receiver<String>,
) -> Result<String, String> {
    drop(child.stdin.take());
    let r = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l == "advance" => continue,
            r => break r,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    match r {
        Ok(l) => l.strip_prefix("beside ").map(str::to_string).ok_or(l),
        Err(e) => Err(format!("the process beside said nothing: {e}")),
    }
}

/// What a verifier found.
#[derive(Debug)]
struct Found {
    max_n: u64,
    present: bool,
}

/// The verifier child: integrity, bookkeeping, the last logged number.
fn verify(db: &Path, vfs: &str, direct: bool, last: u64) -> Result<Found, String> {
    let c = open_db(db, vfs, direct).map_err(|e| format!("open on {vfs}: {e}"))?;
    let ic: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| format!("integrity_check on {vfs}: {e}"))?;
    if ic != "ok" {
        return Err(format!("integrity_check on {vfs}: {ic}"));
    }
    let has_t: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name IN ('t', 'meta')",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if has_t < 2 {
        // killed before the schema committed
        return if last == 0 {
            Ok(Found {
                max_n: 0,
                present: true,
            })
        } else {
            Err(format!(
                "on {vfs}: the tables are gone but {last} was logged"
            ))
        };
    }
    let (count, total, max_n): (i64, i64, i64) = c
        .query_row(
            "SELECT count(*), coalesce(sum(n), 0), coalesce(max(n), 0) FROM t",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| e.to_string())?;
    let (mt, mc): (i64, i64) = c
        .query_row("SELECT total, count FROM meta WHERE id = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(|e| e.to_string())?;
    if (mt, mc) != (total, count) || count != max_n {
        return Err(format!(
            "on {vfs}: meta says total {mt} count {mc}, rows say total {total} count {count} max {max_n}"
        ));
    }
    let present = last == 0 || {
        let k: i64 = c
            .query_row("SELECT count(*) FROM t WHERE n = ?1", [last as i64], |r| {
                r.get(0)
            })
            .map_err(|e| e.to_string())?;
        k == 1
    };
    Ok(Found {
        max_n: max_n as u64,
        present,
    })
}

fn parse_child(spec: &str) -> (String, Vec<(String, String)>) {
    let (role, rest) = spec.split_once(';').unwrap_or((spec, ""));
    let kv = rest
        .split(';')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (role.to_string(), kv)
}

fn mode_from(kv: &[(String, String)]) -> (PathBuf, Mode, String, u64, PathBuf) {
    let get = |k: &str| {
        kv.iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    (
        PathBuf::from(get("db")),
        Mode::plain(
            leak(get("journal")),
            leak(get("sync")),
            get("direct") == "1",
            false,
        ),
        get("vfs"),
        get("last").parse().unwrap_or(0),
        PathBuf::from(get("log")),
    )
}

/// Run the child role the environment names, if any; the exit code.
pub(crate) fn child_main_from_env() -> Option<i32> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    let (role, kv) = parse_child(&spec);
    let (db, m, vfs, last, log) = mode_from(&kv);
    Some(match role.as_str() {
        "writer" => match writer(&db, &vfs, &m, &log) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("writer: {e}");
                2
            }
        },
        "verify" => match verify(&db, &vfs, m.direct, last) {
            Ok(f) => {
                println!("@@found {} {}", f.max_n, u8::from(f.present));
                0
            }
            Err(e) => {
                println!("@@error {e}");
                1
            }
        },
        "beside" => match beside(&db, &vfs, &log) {
            Ok(r) => {
                println!("@@beside {r}");
                0
            }
            Err(e) => {
                println!("@@error {e}");
                1
            }
        },
        other => {
            eprintln!("unknown child role {other}");
            2
        }
    })
}

/// The last number in a log file (0 if none).
fn last_logged(log: &Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("committed ")?.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

fn run_verify(cmd: &ChildCmd, db: &Path, m: &Mode, vfs: &str, last: u64) -> Result<Found, String> {
    let args = format!(
        "db={};journal={};sync={};direct={};vfs={vfs};last={last}",
        db.display(),
        m.journal,
        m.sync,
        u8::from(m.direct)
    );
    let out = cmd
        .command("verify", &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    // (a test harness may print before the child's line)
    let line = text
        .lines()
        .find_map(|l| l.split_once("@@").map(|(_, r)| r))
        .ok_or_else(|| {
            format!(
                "verifier said nothing: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    if let Some(e) = line.strip_prefix("error ") {
        return Err(e.to_string());
    }
    let mut it = line.split(' ').skip(1);
    let max_n = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let present = it.next() == Some("1");
    Ok(Found { max_n, present })
}

/// The shell's script for transactions `start..start + n`.
fn shell_script(lib: &Path, db: &Path, m: &Mode, start: u64, n: u64) -> String {
    let mut s = format!(
        ".load {}\n.open '{}'\n.bail on\nPRAGMA busy_timeout=10000;\nPRAGMA journal_mode={};\nPRAGMA synchronous={};\n{SCHEMA}\n",
        lib.with_extension("").display(),
        kx_uri(db, m.direct),
        m.journal,
        m.sync
    );
    for k in start..start + n {
        s.push_str(&txn_sql(k));
        s.push_str(&format!(".print committed {k}\n"));
    }
    s
}

/// Whether the stock shell and stdbuf are there.
fn have_shell() -> bool {
    let ok = |p: &str, a: &str| {
        Command::new(p)
            .arg(a)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    ok("sqlite3", "--version") && ok("stdbuf", "--version")
}

/// Run `kills` kill-and-check rounds of mode `m` in `dir`.
pub(crate) fn run_mode(
    cmd: &ChildCmd,
    lib: Option<&Path>,
    dir: &Path,
    m: &Mode,
    kills: u32,
    rng: &mut rand::rngs::StdRng,
    max_delay_ms: u64,
) -> Outcome {
    let mut out = Outcome {
        mode: m.name(),
        ..Outcome::default()
    };
    if m.shell {
        if !have_shell() {
            out.skipped = Some("no sqlite3 shell or stdbuf".into());
            return out;
        }
        if lib.is_none() {
            out.skipped = Some("the shared library is not built".into());
            return out;
        }
    }
    let db = dir.join(format!("{}.db", m.name()));
    let log = dir.join(format!("{}.log", m.name()));
    let fresh = || {
        for p in [&db, &log] {
            let _ = std::fs::remove_file(p);
        }
        for suffix in ["-wal", "-journal", "-shm"] {
            let mut s = db.clone().into_os_string();
            s.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(s));
        }
    };
    fresh();
    let mut found_max = 0u64;
    for k in 0..kills {
        if k > 0 && k % KILLS_PER_DATABASE == 0 {
            // A new database now and then: the checks read the whole
            // database twice per kill, and WAL modes commit fast enough to
            // grow it by hundreds of megabytes over 200 kills.
            fresh();
            found_max = 0;
        }
        let before = last_logged(&log);
        let args_on = |vfs: &str| {
            format!(
                "db={};journal={};sync={};direct={};vfs={vfs};log={}",
                db.display(),
                m.journal,
                m.sync,
                u8::from(m.direct),
                log.display()
            )
        };
        let args = args_on(m.writer_vfs);
        let beside_vfs = if m.member_beside {
            "kxarray"
        } else {
            m.other_vfs()
        };
        let beside = if m.beside {
            match start_beside(cmd, &args_on(beside_vfs)) {
                Ok(b) => Some(b),
                Err(e) => {
                    out.failures.push(format!("kill {k}: {e}"));
                    continue;
                }
            }
        } else {
            None
        };
        let script_path = dir.join(format!("{}.sql", m.name()));
        let mut child = if m.shell {
            let lib = lib.expect("checked above");
            std::fs::write(
                &script_path,
                shell_script(lib, &db, m, found_max + 1, 100_000),
            )
            .expect("write script");
            let logf = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("log");
            Command::new("stdbuf")
                .args(["-oL", "sqlite3", "-batch", "-init", "/dev/null"])
                .stdin(std::fs::File::open(&script_path).expect("script"))
                .stdout(logf)
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the shell")
        } else {
            cmd.command("writer", &args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the writer")
        };
        // Kill at a random moment: sometimes during start-up and
        // recovery, mostly mid-stream.
        // With a process beside, not before that process has seen one of
        // the writer's commits (they run side by side).
        let delay = rng.random_range(5..=max_delay_ms.max(6));
        let t0 = Instant::now();
        let mut exited = None;
        let mut waiting_beside = beside.is_some();
        while t0.elapsed() < Duration::from_millis(delay) || waiting_beside {
            if let Ok(Some(st)) = child.try_wait() {
                exited = Some(st);
                break;
            }
            if let Some((_, rx)) = &beside {
                match rx.try_recv() {
                    Ok(l) if l == "advance" => waiting_beside = false,
                    Ok(l) => {
                        out.failures
                            .push(format!("kill {k}: beside the writer: {l}"));
                        waiting_beside = false;
                    }
                    Err(_) if t0.elapsed() > Duration::from_secs(30) => {
                        out.failures.push(format!(
                            "kill {k}: in 30 s the process beside saw no commit of the writer"
                        ));
                        waiting_beside = false;
                    }
                    Err(_) => {}
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(st) = exited {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            out.failures.push(format!(
                "kill {k}: the writer exited by itself ({st}): {err}"
            ));
            if let Some((b, _)) = beside {
                let mut b = b;
                let _ = b.kill();
                let _ = b.wait();
            }
            continue;
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        out.kills += 1;
        let last_now = last_logged(&log);
        if m.member_beside && k % 2 == 0 {
            // a unix-VFS process recovers the crash first, in the file
            // past the frames; the member beside reads after it
            match run_verify(cmd, &db, m, "unix", last_now) {
                Ok(f) if !f.present || f.max_n < last_now => out.failures.push(format!(
                    "kill {k}: on unix, first: transaction {last_now} was logged as committed but the database ends at {}",
                    f.max_n
                )),
                Ok(_) => {}
                Err(e) => out.failures.push(format!("kill {k}: unix, first: {e}")),
            }
        }
        if let Some((b, rx)) = beside {
            // the process beside recovers the crash (or reads after the
            // unix process's recovery) and commits first
            if let Err(e) = finish_beside(b, &rx) {
                out.failures.push(format!("kill {k}: {e}"));
            }
        }
        let last = last_logged(&log);
        out.logged += last.saturating_sub(before);
        // Alternate which VFS recovers the crash first (the multi-process
        // modes: always the one the writer did not use).
        let order: [&str; 2] = if m.member_beside {
            ["unix", "kxarray"]
        } else if m.writer_vfs == "unix" || m.beside {
            [m.other_vfs(), m.writer_vfs]
        } else if k % 2 == 0 {
            ["kxarray", "unix"]
        } else {
            ["unix", "kxarray"]
        };
        let mut max_seen = 0;
        for vfs in order {
            match run_verify(cmd, &db, m, vfs, last) {
                Ok(f) if !f.present || f.max_n < last => out.failures.push(format!(
                    "kill {k}: on {vfs}: transaction {last} was logged as committed but the database ends at {}",
                    f.max_n
                )),
                Ok(f) => max_seen = max_seen.max(f.max_n),
                Err(e) => out.failures.push(format!("kill {k}: {e}")),
            }
        }
        out.unlogged += max_seen.saturating_sub(last);
        found_max = max_seen.max(last);
        if m.shell {
            // the next script starts after what the database has
            let _ = std::fs::remove_file(&script_path);
        }
    }
    out
}

/// The markdown table of outcomes.
pub(crate) fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::from("| mode | kills | commits logged | committed, not yet logged | failures |\n|---|---|---|---|---|\n");
    for o in outcomes {
        if let Some(why) = &o.skipped {
            s.push_str(&format!("| {} | SKIPPED: {why} | | | |\n", o.mode));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            o.mode,
            o.kills,
            o.logged,
            o.unlogged,
            o.failures.len()
        ));
    }
    s
}

/// The shared library of this build, next to a binary in
/// `target/<profile>/`, `deps/` or `examples/` (`cargo test` leaves it in
/// `deps/`, `cargo build` copies it to `target/<profile>/`).
pub(crate) fn find_cdylib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let profile = dir.parent()?;
    [
        dir.to_path_buf(),
        profile.to_path_buf(),
        profile.join("deps"),
    ]
    .into_iter()
    .map(|d| d.join("libkxarray_sqlite.so"))
    .find(|p| p.exists())
}

#[derive(Parser, Debug)]
#[command(
    about = "SIGKILL a SQLite writer on kxarray at random moments and check every committed transaction survives"
)]
struct Args {
    /// Kills per mode.
    #[arg(long, default_value_t = 20)]
    kills: u32,
    /// Only the modes whose name contains one of these (comma-separated:
    /// wal, delete-full, direct, shell...).
    #[arg(long)]
    modes: Option<String>,
    /// Longest delay before a kill, in milliseconds.
    #[arg(long, default_value_t = 400)]
    max_delay_ms: u64,
    /// Random seed (kill times).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the databases (default: a temporary one).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[allow(dead_code)]
fn main() {
    if let Some(code) = child_main_from_env() {
        std::process::exit(code);
    }
    let args = Args::parse();
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).expect("directory");
    let cmd = ChildCmd {
        argv: vec![std::env::current_exe()
            .expect("current_exe")
            .into_os_string()],
        writer_env: Vec::new(),
    };
    let lib = find_cdylib();
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut outcomes = Vec::new();
    for m in all_modes() {
        if let Some(f) = &args.modes {
            if !f.split(',').any(|p| m.name().contains(p)) {
                continue;
            }
        }
        let t0 = Instant::now();
        let o = run_mode(
            &cmd,
            lib.as_deref(),
            &dir,
            &m,
            args.kills,
            &mut rng,
            args.max_delay_ms,
        );
        eprintln!(
            "{}: {} kills, {} commits logged, {} failures ({:.1} s)",
            o.mode,
            o.kills,
            o.logged,
            o.failures.len(),
            t0.elapsed().as_secs_f64()
        );
        for f in &o.failures {
            eprintln!("  {f}");
        }
        outcomes.push(o);
    }
    println!("{}", table(&outcomes));
    if outcomes.iter().any(|o| !o.failures.is_empty()) {
        std::process::exit(1);
    }
}
