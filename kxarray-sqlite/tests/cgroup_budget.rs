//! Five stock `sqlite3` shells in one memory cgroup, each scanning its own
//! database three times through the VFS with default settings (issue 37).
//!
//! Before the shared budget each process sized its cache from the cgroup
//! alone: 256 MiB each (a quarter of 512 MiB raised to the 256 MiB floor),
//! five of them in a 512 MiB cgroup, and the OOM killer took some. The
//! test passes when no process is killed (none exits on a signal, the
//! cgroup counts no OOM kill) and every answer is right.
//!
//! It needs root and a memory cgroup it can make: a child of the test's
//! own cgroup v1 memory directory (`/sys/fs/cgroup/memory/...`), or on
//! cgroup v2 a child of the root with the memory controller enabled;
//! elsewhere (and without the `sqlite3` shell) it prints SKIPPED.
//! `KX_BUDGET_TEST_MB` changes the size of each database (default 300 MB).

mod common;

use common::{load_arg, shell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LIMIT: u64 = 512 << 20;
const PROCESSES: usize = 5;
const SCANS: usize = 3;
/// Bytes of each row's blob (four rows to a 4 KiB page).
const BLOB: u64 = 1000;

/// A memory cgroup made for the test, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v1: bool,
}

impl Cgroup {
    /// A cgroup limited to `limit` bytes, or why none could be made.
    fn make(limit: u64) -> Result<Cgroup, String> {
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
            let c = Cgroup { dir, v1: true };
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
        let c = Cgroup { dir, v1: false };
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

/// A database of `rows` rows of a `BLOB`-byte blob, made with the default
/// VFS outside the cgroup.
fn make_database(path: &Path, rows: u64) {
    let script = format!(
        "PRAGMA page_size=4096; PRAGMA journal_mode=off; PRAGMA synchronous=off;\n\
         CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{rows})\n\
         INSERT INTO t SELECT x, randomblob({BLOB}) FROM c;\n"
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

#[test]
fn five_shells_in_a_small_cgroup_are_not_killed() {
    if shell().is_none() {
        eprintln!("SKIPPED: no sqlite3 shell (apt-get install -y sqlite3)");
        return;
    }
    let cg = match Cgroup::make(LIMIT) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED: no memory cgroup could be made ({why})");
            return;
        }
    };
    let mb: u64 = std::env::var("KX_BUDGET_TEST_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rows = mb * 1_000_000 / BLOB;
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("db0.db");
    make_database(&first, rows);
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
            let mut script = format!(
                ".load {}\n.open 'file:{}?vfs=kxarray'\n",
                load_arg(),
                db.display()
            );
            for _ in 0..SCANS {
                script.push_str("SELECT count(*), sum(length(b)), sum(a) FROM t;\n");
            }
            script.push_str("PRAGMA kx_stats;\n");
            // The shell joins the cgroup before it execs sqlite3.
            let mut child = Command::new("sh")
                .arg("-c")
                .arg("echo $$ > \"$1/cgroup.procs\" && exec sqlite3")
                .arg("sh")
                .arg(&cg.dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
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
        let stats = stdout.lines().nth(SCANS).unwrap_or("");
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

/// The VFS joins the budget by default (`kx_settings` says `budget=1`,
/// `kx_stats` has the `budget_*` fields, the cache's capacity is its
/// share); `kx_budget=0` opts out (a fixed capacity, no fields).
#[test]
fn the_vfs_joins_by_default_and_kx_budget_0_opts_out() {
    if shell().is_none() {
        eprintln!("SKIPPED: no sqlite3 shell (apt-get install -y sqlite3)");
        return;
    }
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
    let field = |text: &str, name: &str| -> Option<u64> {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let on = run("&kx_cache=64m");
    assert!(on.contains(" budget=1"), "{on}");
    let share = field(&on, "budget_share").expect("budget_share in kx_stats");
    assert!(share > 0 && share <= 64 << 20, "{on}");
    assert!(field(&on, "capacity").is_some_and(|c| c <= share), "{on}");
    assert_eq!(
        field(&on, "cache"),
        Some(64 << 20),
        "kx_settings shows what was asked"
    );
    let off = run("&kx_cache=64m&kx_budget=0");
    assert!(off.contains(" budget=0"), "{off}");
    assert!(!off.contains("budget_share"), "{off}");
    assert_eq!(field(&off, "capacity"), Some(64 << 20), "{off}");
}
