//! Stock `sqlite3` shells in one memory cgroup through the VFS with
//! default settings: five each scanning its own database three times, and
//! eight sharing one database in WAL mode, each scanning it three times
//! and writing a few rows.
//!
//! Before the shared budget each process sized its cache from the cgroup
//! alone: 256 MiB each (a quarter of 512 MiB raised to the 256 MiB floor),
//! five or eight of them in a 512 MiB cgroup, and the OOM killer took
//! some. The tests pass when no process is killed (none exits on a
//! signal, the cgroup counts no OOM kill) and every answer is right.
//!
//! They need root and a memory cgroup they can make: a child of the test's
//! own cgroup v1 memory directory (`/sys/fs/cgroup/memory/...`), or on
//! cgroup v2 a child of the root with the memory controller enabled;
//! elsewhere (and without the `sqlite3` shell) they report themselves
//! ignored, with the reason.
//! `KX_BUDGET_TEST_MB` changes the size of each of the five databases
//! (default 300 MB), `KX_BUDGET_TEST_SHARED_MB` the eight's one database
//! (default 150 MB), and `KX_BUDGET_TEST_PARAMS` adds URI parameters to
//! every open: `KX_BUDGET_TEST_PARAMS=kx_budget=0` shows what the tests
//! guard against (processes killed, the tests fail).

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::load_arg;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LIMIT: u64 = 512 << 20;
const PROCESSES: usize = 5;
/// Processes sharing one database.
const SHARING: usize = 8;
const SCANS: usize = 3;
/// Bytes of each row's blob (four rows to a 4 KiB page).
const BLOB: u64 = 1000;

/// A memory cgroup made for the test, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v1: bool,
    /// One test's cgroup at a time: each test has the machine to itself
    /// (and its own cgroup name).
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cgroup {
    /// A cgroup limited to `limit` bytes, or why none could be made.
    fn make(limit: u64) -> Result<Cgroup, String> {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let name = format!("kxarray-budget-test-{}", std::process::id());
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        // cgroup v1: a child of this process's memory cgroup.
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        if v1_root.join("memory.limit_in_bytes").exists() {
            let own = cgroup
                .lines()
                .find_map(|l| {
                    let mut p = l.splitn(3, ':');
                    let (_, c, path) = (p.next()?, p.next()?, p.next()?);
                    c.split(',')
                        .any(|c| c == "memory")
                        .then(|| path.to_string())
                })
                .unwrap_or_else(|| "/".into());
            let mut parent = v1_root.join(own.trim_start_matches('/'));
            if !parent.is_dir() {
                parent = v1_root.to_path_buf();
            }
            let dir = parent.join(&name);
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let c = Cgroup {
                dir,
                v1: true,
                _serial: serial,
            };
            c.write("memory.limit_in_bytes", &limit.to_string())?;
            return Ok(c);
        }
        // cgroup v2: a child of the root, with memory enabled there.
        let v2_root = Path::new("/sys/fs/cgroup");
        let subtree = std::fs::read_to_string(v2_root.join("cgroup.subtree_control"))
            .map_err(|e| format!("no cgroup v1 memory controller, no cgroup v2: {e}"))?;
        if !subtree.split_whitespace().any(|c| c == "memory") {
            return Err("the cgroup v2 root does not delegate the memory controller".into());
        }
        let dir = v2_root.join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let c = Cgroup {
            dir,
            v1: false,
            _serial: serial,
        };
        c.write("memory.max", &limit.to_string())?;
        c.write("memory.swap.max", "0").ok();
        Ok(c)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let p = self.dir.join(file);
        std::fs::write(&p, value).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// OOM kills the kernel counted in the cgroup.
    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v1 {
            ("memory.oom_control", "oom_kill ")
        } else {
            ("memory.events", "oom_kill ")
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The shells have exited; an empty cgroup can be removed (the
        // kernel may need a moment to let go of it).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// A database of `rows` rows of a `BLOB`-byte blob in table `t` and an
/// empty table `w(p, r)` for writes, made with the default VFS outside the
/// cgroup; in WAL mode if `wal`.
fn make_database(path: &Path, rows: u64, wal: bool) {
    let script = format!(
        "PRAGMA page_size=4096; PRAGMA journal_mode=off; PRAGMA synchronous=off;\n\
         CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{rows})\n\
         INSERT INTO t SELECT x, randomblob({BLOB}) FROM c;\n\
         CREATE TABLE w(p INTEGER, r INTEGER);\n{}",
        if wal {
            "PRAGMA journal_mode=wal;\n"
        } else {
            ""
        }
    );
    let mut child = Command::new("sqlite3")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// An environment variable's number, or `default`.
fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The shell's lines that load the extension and open `db` through the
/// VFS (with `KX_BUDGET_TEST_PARAMS`, if set).
fn open_lines(db: &Path) -> String {
    let extra = std::env::var("KX_BUDGET_TEST_PARAMS")
        .map(|p| format!("&{p}"))
        .unwrap_or_default();
    format!(
        ".load {}\n.open 'file:{}?vfs=kxarray{extra}'\n",
        load_arg(),
        db.display()
    )
}

/// A stock shell that joins `cg` before it execs `sqlite3`; stdin, stdout
/// and stderr piped.
fn spawn_in(cg: &Cgroup) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg("echo $$ > \"$1/cgroup.procs\" && exec sqlite3")
        .arg("sh")
        .arg(&cg.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The value of `name=` in a `kx_stats` text, if there.
fn field(text: &str, name: &str) -> Option<u64> {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

/// Whether a line of the shell's output is one of `kx_stats`'s
/// (`name=value`, a size followed by its MiB), not a query's answer.
fn is_stat(line: &str) -> bool {
    line.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// The cgroup the test runs in; the test skips without the shell or a
/// memory cgroup it can make.
fn cgroup_or_skip() -> Cgroup {
    harness::require(harness::tool("sqlite3", "sqlite3"));
    match Cgroup::make(LIMIT) {
        Ok(c) => c,
        Err(why) => harness::skip_now(format!("no memory cgroup could be made ({why})")),
    }
}

fn five_shells_in_a_small_cgroup_are_not_killed() {
    let cg = cgroup_or_skip();
    let mb = env_number("KX_BUDGET_TEST_MB", 300);
    let rows = mb * 1_000_000 / BLOB;
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("db0.db");
    make_database(&first, rows, false);
    let dbs: Vec<PathBuf> = (0..PROCESSES)
        .map(|i| {
            let p = dir.path().join(format!("db{i}.db"));
            if i > 0 {
                std::fs::copy(&first, &p).unwrap();
            }
            p
        })
        .collect();
    let expected = format!("{rows}|{}|{}", rows * BLOB, rows * (rows + 1) / 2);

    let started = std::time::Instant::now();
    let children: Vec<_> = dbs
        .iter()
        .map(|db| {
            let mut script = open_lines(db);
            for _ in 0..SCANS {
                script.push_str("SELECT count(*), sum(length(b)), sum(a) FROM t;\n");
            }
            script.push_str("PRAGMA kx_stats;\n");
            let mut child = spawn_in(&cg);
            child
                .stdin
                .take()
                .unwrap()
                .write_all(script.as_bytes())
                .unwrap();
            child
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let wall = started.elapsed();
    let kills = cg.oom_kills();
    let mut failures = Vec::new();
    for (i, out) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let answers: Vec<&str> = stdout.lines().take(SCANS).collect();
        let stats: Vec<&str> = stdout.lines().skip(SCANS).filter(|l| is_stat(l)).collect();
        let stats = stats.join(" ");
        eprintln!("process {i}: {:?}; {stats}", out.status);
        if !out.status.success() {
            failures.push(format!("process {i}: {:?}, stderr {stderr:?}", out.status));
        } else if answers != vec![expected.as_str(); SCANS] {
            failures.push(format!(
                "process {i}: answers {answers:?}, expected {expected}"
            ));
        }
    }
    eprintln!("five processes, {mb} MB each, {SCANS} scans: {wall:?}, OOM kills {kills}");
    assert_eq!(kills, 0, "the cgroup counted OOM kills; {failures:?}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Eight shells on ONE database in WAL mode (shared locking: a real
/// `-shm`, SQLite's locks, each process's cache kept coherent), in the
/// 512 MiB cgroup. The database (150 MB) is sized so that eight
/// caches at the un-budgeted default (256 MiB each, each holding the
/// whole database after a scan: 1.2 GB) exceed the limit; with
/// `KX_BUDGET_TEST_PARAMS=kx_budget=0` the kernel kills some.
///
/// Each process scans once and commits a row, then waits at a barrier
/// (it touches a file; the test sends the rest of its input once all
/// eight have, or died), so all eight have the database open and their
/// caches filled at once. Then each must see all eight first rows (the
/// others' commits through its own cache), scans twice more with a
/// commit after each, and sees its own three rows. Afterwards the
/// database holds 24 rows and passes `PRAGMA integrity_check`.
fn eight_shells_sharing_one_database_in_a_small_cgroup_are_not_killed() {
    let cg = cgroup_or_skip();
    let mb = env_number("KX_BUDGET_TEST_SHARED_MB", 150);
    let rows = mb * 1_000_000 / BLOB;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    make_database(&db, rows, true);
    let scan = "SELECT 'scan', count(*), sum(length(b)), sum(a) FROM t;\n";
    let expected = format!("scan|{rows}|{}|{}", rows * BLOB, rows * (rows + 1) / 2);
    let ready = |i: usize| dir.path().join(format!("ready-{i}"));

    let started = std::time::Instant::now();
    let mut children: Vec<_> = (0..SHARING)
        .map(|i| {
            // `.timeout` after `.open`: it sets the open connection's busy
            // timeout (the writers take turns).
            let script = format!(
                "{}.timeout 60000\n{scan}INSERT INTO w VALUES({i}, 1);\n.shell touch '{}'\n",
                open_lines(&db),
                ready(i).display()
            );
            let mut child = spawn_in(&cg);
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(script.as_bytes()).unwrap();
            (child, Some(stdin))
        })
        .collect();
    // The barrier: every process has scanned and committed, or has exited
    // (killed: the assertions below say so). A bound against a hang only.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        let mut waiting = 0;
        for (i, (c, _)) in children.iter_mut().enumerate() {
            if !ready(i).exists() && c.try_wait().unwrap().is_none() {
                waiting += 1;
            }
        }
        if waiting == 0 || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for (i, (_, stdin)) in children.iter_mut().enumerate() {
        let rest = format!(
            "SELECT 'seen', count(DISTINCT p) FROM w WHERE r = 1;\nPRAGMA kx_stats;\n\
             {scan}INSERT INTO w VALUES({i}, 2);\n{scan}INSERT INTO w VALUES({i}, 3);\n\
             SELECT 'own', count(*) FROM w WHERE p = {i};\n"
        );
        // A killed process's pipe is closed: its failure is counted below.
        let _ = stdin.take().unwrap().write_all(rest.as_bytes());
    }
    let outputs: Vec<_> = children
        .into_iter()
        .map(|(c, _)| c.wait_with_output().unwrap())
        .collect();
    let wall = started.elapsed();
    let kills = cg.oom_kills();
    let want: Vec<String> = vec![
        expected.clone(),
        format!("seen|{SHARING}"),
        expected.clone(),
        expected.clone(),
        format!("own|{SCANS}"),
    ];
    let mut failures = Vec::new();
    let mut keys = Vec::new();
    for (i, out) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let answers: Vec<&str> = stdout.lines().filter(|l| !is_stat(l)).collect();
        let stats: Vec<&str> = stdout.lines().filter(|l| is_stat(l)).collect();
        let stats = stats.join(" ");
        eprintln!(
            "process {i}: {:?}; after the barrier capacity={:?} budget_share={:?} budget_members={:?}",
            out.status,
            field(&stats, "capacity"),
            field(&stats, "budget_share"),
            field(&stats, "budget_members")
        );
        keys.push(
            stats
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("budget_key="))
                .map(str::to_owned),
        );
        if !out.status.success() || !stderr.is_empty() {
            failures.push(format!("process {i}: {:?}, stderr {stderr:?}", out.status));
        } else if answers != want {
            failures.push(format!(
                "process {i}: answers {answers:?}, expected {want:?}"
            ));
        }
    }
    eprintln!(
        "eight processes, one {mb} MB database, {SCANS} scans and commits each: {wall:?}, \
         OOM kills {kills}"
    );
    assert_eq!(kills, 0, "the cgroup counted OOM kills; {failures:?}");
    assert!(failures.is_empty(), "{failures:#?}");
    // One budget: every cache registered under the test's cgroup (the
    // limited one), none sized alone.
    let cg_name = cg.dir.file_name().unwrap().to_str().unwrap();
    assert!(
        keys.iter().all(|k| k.as_deref() == keys[0].as_deref()
            && k.as_deref()
                .is_some_and(|k| k.starts_with("cgroup-") && k.ends_with(cg_name))),
        "{keys:?}"
    );
    // Every commit is in the file, whole (read with the unix VFS).
    let (ok, out, err) = common::run_shell(
        &[db.to_str().unwrap()],
        "SELECT count(*), count(DISTINCT p) FROM w;\nPRAGMA integrity_check;\n",
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(out, format!("{}|{SHARING}\nok\n", SHARING * SCANS));
}

/// The VFS joins the budget by default (`kx_settings` says `budget=1`,
/// `kx_stats` has the `budget_*` fields, the cache's capacity is its
/// share); `kx_budget=0` opts out (a fixed capacity, no fields).
fn the_vfs_joins_by_default_and_kx_budget_0_opts_out() {
    harness::require(harness::tool("sqlite3", "sqlite3"));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let run = |params: &str| {
        let script = format!(
            ".load {}\n.open 'file:{}?vfs=kxarray{params}'\nCREATE TABLE IF NOT EXISTS t(a);\n\
             PRAGMA kx_settings;\nPRAGMA kx_stats;\n",
            load_arg(),
            db.display()
        );
        let (ok, out, err) = common::run_shell(&[], &script, &[]);
        assert!(ok, "{err}");
        out
    };
    let on = run("&kx_cache=64m");
    assert_eq!(field(&on, "budget"), Some(1), "{on}");
    let share = field(&on, "budget_share").expect("budget_share in kx_stats");
    assert!(share > 0 && share <= 64 << 20, "{on}");
    assert!(field(&on, "capacity").is_some_and(|c| c <= share), "{on}");
    assert_eq!(
        field(&on, "cache"),
        Some(64 << 20),
        "kx_settings shows what was asked"
    );
    let off = run("&kx_cache=64m&kx_budget=0");
    assert_eq!(field(&off, "budget"), Some(0), "{off}");
    assert!(!off.contains("budget_share"), "{off}");
    assert_eq!(field(&off, "capacity"), Some(64 << 20), "{off}");
}

harness::main!(
    tests: [
        five_shells_in_a_small_cgroup_are_not_killed,
        eight_shells_sharing_one_database_in_a_small_cgroup_are_not_killed,
        the_vfs_joins_by_default_and_kx_budget_0_opts_out,
    ],
);
