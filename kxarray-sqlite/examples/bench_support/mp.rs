//! The multi-process rows of `sqlite_bench`, included by it:
//!
//! - `mp`: WAL mode, one writer process (single-row UPDATE commits,
//!   synchronous=NORMAL) and `--readers` reader processes (uniform point
//!   selects), all on one VFS (`unix` or `kx`, kxarray with a per-process
//!   cache of `--kx-cache`), started together and measured for the same
//!   seconds (`--writer-config` puts the writer on the other VFS); prints
//!   `config mp-wal readers kx_cache commits/s reads/s`, the readers'
//!   kxarray counters over the run (misses, full drops, pages dropped by
//!   coherence checks), and the CPU microseconds (user and system, every
//!   thread of the process) per commit of the writer and per read of the
//!   readers: what each operation cost, whatever share of the two cores
//!   the scheduler gave each process.
//! - `coherence`: the cost of another process's commit to a kxarray
//!   reader whose cache holds the whole database: rounds of (a unix-VFS
//!   process commits a one-row update, and in WAL mode checkpoints it;
//!   the reader scans the table again), with the reader's cache misses
//!   and the pages its coherence checks dropped per round (`kx_stats`).
//!
//! The children are this program again (`mp-child`), told their role on
//! the command line and started with "go" on stdin.

use rand::{RngExt, SeedableRng};
use rusqlite::{Connection, OpenFlags};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn open_mp(db: &Path, config: &str, kx_cache: &str) -> Connection {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = match config {
        "unix" => Connection::open_with_flags(db, flags),
        // kx: the shared cache (a region of `kx_cache` for every process
        // together); kx-private: each process's own cache of `kx_cache`;
        // both of a fixed size (no budget)
        "kx" | "kx-private" => {
            kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false).expect("register");
            let shared = u8::from(config == "kx");
            Connection::open_with_flags(
                format!(
                    "file:{}?vfs=kxarray&kx_cache={kx_cache}&kx_budget=0&kx_shared={shared}",
                    db.display()
                ),
                flags,
            )
        }
        other => panic!("unknown config {other}"),
    }
    .expect("open");
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c.execute_batch("PRAGMA synchronous=NORMAL;").unwrap();
    c
}

/// A child of `mp`: open, warm, say "ready", wait for "go", run `seconds`,
/// say "done <ops> <secs>".
pub(crate) fn mp_child(
    db: &Path,
    config: &str,
    role: &str,
    seconds: f64,
    kx_cache: &str,
    seed: u64,
) {
    let c = open_mp(db, config, kx_cache);
    let rows: i64 = c
        .query_row("SELECT max(id) FROM t", [], |r| r.get(0))
        .unwrap();
    let _: i64 = c
        .query_row("SELECT sum(length(v)) FROM t", [], |r| r.get(0))
        .unwrap();
    ready_then_go();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut point = c.prepare("SELECT length(v) FROM t WHERE id = ?1").unwrap();
    let mut update = c
        .prepare("UPDATE t SET v = randomblob(400) WHERE id = ?1")
        .unwrap();
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let mut ops = 0u64;
    let mut sink = 0i64;
    while t0.elapsed() < deadline {
        for _ in 0..16 {
            let id = rng.random_range(1..=rows);
            if role == "writer" {
                update.execute([id]).unwrap();
            } else {
                sink += point.query_row([id], |r| r.get::<_, i64>(0)).unwrap();
            }
            ops += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    assert!(role == "writer" || sink > 0);
    // kxarray's counters over the run's process (0 on the unix VFS)
    let k = |name: &str| {
        if config.starts_with("kx") {
            stat(&c, name)
        } else {
            0
        }
    };
    println!(
        "done {ops} {secs:.4} {} {} {} {cpu:.4} {} {}",
        k("misses"),
        k("coherence_full_drops"),
        k("coherence_pages_dropped"),
        k("coherence_partial_drops"),
        k("coherence_member_skips")
    );
    // alive until the parent has measured the memory every process holds
    until_told();
}

/// The proportional set size of process `pid` in bytes (its share of
/// every page it maps: a page mapped by four processes counts a quarter
/// in each), from `/proc/<pid>/smaps_rollup`.
fn pss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// Bytes of `path` in the kernel's page cache (`mincore` over a mapping
/// of it, as `fincore` counts).
pub(crate) fn kernel_cached(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return 0;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0) as usize;
    if len == 0 {
        return 0;
    }
    // SAFETY: a read-only shared mapping of a file we opened, unmapped
    // below; its bytes are never read, only its residency.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return 0;
    }
    let page = 4096usize;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `vec` has a byte per page of the mapping.
    let r = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, len) };
    if r != 0 {
        return 0;
    }
    vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64
}

/// A child's handshake: say "ready", then wait for the parent's "go".
fn ready_then_go() {
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
}

/// A child's end: flush what it said, stay alive until the parent's next
/// line (or its end).
fn until_told() {
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// A runtime directory of a run's own beside `db` (mode 0700, removed
/// when dropped): its shared cache and memory budget start empty and hold
/// the run's processes only.
fn runtime_dir(db: &Path) -> tempfile::TempDir {
    let parent = std::path::absolute(db).unwrap();
    tempfile::Builder::new()
        .prefix("xdg-")
        .tempdir_in(parent.parent().unwrap())
        .unwrap()
}

/// This process's CPU time so far (user and system, every thread).
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes the struct it is given, nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is a valid target.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn spawn_child(args: &[String], xdg: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("mp-child")
        .args(args)
        .env("XDG_RUNTIME_DIR", xdg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a child");
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn read_line(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut s = String::new();
    out.read_line(&mut s).unwrap();
    s.trim_end().to_string()
}

/// `mp`: one writer and `readers` reader processes; the result line.
pub(crate) fn mp(
    db: &Path,
    config: &str,
    writer_config: Option<&str>,
    readers: usize,
    seconds: f64,
    kx_cache: &str,
    idle_thread: bool,
) -> String {
    let dir = runtime_dir(db);
    let xdg = dir.path();
    let mut kids = Vec::new();
    for i in 0..=readers {
        let role = if i == 0 { "writer" } else { "reader" };
        let idle: &[String] = if idle_thread {
            &["--idle-thread".to_string()]
        } else {
            &[]
        };
        kids.push(spawn_child(
            &[
                "--db".into(),
                db.display().to_string(),
                "--config".into(),
                if i == 0 {
                    writer_config.unwrap_or(config).into()
                } else {
                    config.into()
                },
                "--role".into(),
                role.into(),
                "--seconds".into(),
                seconds.to_string(),
                "--kx-cache".into(),
                kx_cache.into(),
                "--seed".into(),
                (i as u64 + 11).to_string(),
            ]
            .iter()
            .chain(idle)
            .cloned()
            .collect::<Vec<_>>(),
            xdg,
        ));
    }
    for (_, out) in &mut kids {
        assert_eq!(read_line(out), "ready");
    }
    for (c, _) in &mut kids {
        c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let (mut commits, mut reads) = (0.0, 0.0);
    let mut counters = [0.0; 3];
    // operations per CPU second: the writer's, and the readers' together
    let (mut w_cpu, mut r_ops, mut r_cpu) = (0.0, 0.0, 0.0);
    let (mut partial, mut skips) = (0.0, 0.0);
    let mut done = Vec::new();
    for (i, (c, mut out)) in kids.into_iter().enumerate() {
        let line = read_line(&mut out);
        let v: Vec<f64> = line
            .strip_prefix("done ")
            .unwrap_or_else(|| panic!("child {i}: {line}"))
            .split(' ')
            .map(|x| x.parse().unwrap())
            .collect();
        let rate = v[0] / v[1];
        if i > 0 {
            for (c, x) in counters.iter_mut().zip(&v[2..5]) {
                *c += x;
            }
            r_ops += v[0];
            r_cpu += v[5];
            partial += v[6];
            skips += v[7];
        } else {
            w_cpu = v[5] / v[0];
        }
        if i == 0 {
            commits += rate;
        } else {
            reads += rate;
        }
        done.push(c);
    }
    // The memory the workload holds on the machine: every process's PSS
    // (the shared cache's region counted once, split among its members)
    // and the database's pages in the kernel's page cache.
    let pss_sum: u64 = done.iter().map(|c| pss(c.id())).sum();
    let kernel = kernel_cached(db);
    for mut c in done {
        let _ = c.stdin.as_mut().unwrap().write_all(b"exit\n");
        assert!(c.wait().unwrap().success());
    }
    eprintln!(
        "readers: {partial} partial drops, {skips} checks answered by the shared cache's stamps"
    );
    // the readers' kxarray counters: misses, full drops, pages dropped;
    // then CPU microseconds per commit and per read
    format!(
        "{config}\tmp-wal\t{readers}\t{kx_cache}\t{commits:.1}\t{reads:.1}\t{}\t{}\t{}\t{:.2}\t{:.3}\t{:.1}\t{:.1}",
        counters[0],
        counters[1],
        counters[2],
        w_cpu * 1e6,
        r_cpu / r_ops * 1e6,
        pss_sum as f64 / 1048576.0,
        kernel as f64 / 1048576.0
    )
}

fn stat(c: &Connection, name: &str) -> u64 {
    let s: String = c.query_row("PRAGMA kx_stats", [], |r| r.get(0)).unwrap();
    s.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("{name} not in {s}"))
        .parse()
        .unwrap()
}

/// `coherence`: per round, the pages the reader's coherence checks
/// dropped, its cache misses and the 4 KiB pages it read from the file
/// (median / largest over the rounds), as table rows: journal, event,
/// rounds, cached pages, dropped, misses, pages read.
pub(crate) fn coherence(db: &Path, journal: &str, rows: u64, rounds: u32) -> String {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(std::path::PathBuf::from(p));
    }
    {
        let c = Connection::open(db).unwrap();
        c.execute_batch(&format!(
            "PRAGMA journal_mode={journal}; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);
             WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {rows})
             INSERT INTO t SELECT i, randomblob(400) FROM g;"
        ))
        .unwrap();
    }
    // the writer: a unix-VFS connection in a process of its own (the
    // sqlite3 shell would do; this program is at hand)
    let mut writer = Command::new(std::env::current_exe().unwrap())
        .args([
            "mp-child",
            "--role",
            "committer",
            "--config",
            "unix",
            "--db",
        ])
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut wout = BufReader::new(writer.stdout.take().unwrap());
    let r = open_mp(db, "kx", "256m");
    let scan = |r: &Connection| -> i64 {
        r.query_row("SELECT sum(length(v)) FROM t", [], |x| x.get(0))
            .unwrap()
    };
    scan(&r);
    scan(&r);
    let pages = stat(&r, "cached_pages");
    let mut rows_out = Vec::new();
    let events: &[&str] = if journal == "wal" {
        &["commit", "commit+checkpoint"]
    } else {
        &["commit"]
    };
    for ev in events {
        let (mut misses, mut read, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..rounds {
            let m0 = stat(&r, "misses");
            let b0 = stat(&r, "backend_read_bytes");
            let d0 = stat(&r, "coherence_pages_dropped");
            let cmd = format!("{ev} {}\n", 1 + (u64::from(k) * 7919) % rows);
            writer
                .stdin
                .as_mut()
                .unwrap()
                .write_all(cmd.as_bytes())
                .unwrap();
            assert_eq!(read_line(&mut wout), "ok");
            scan(&r);
            misses.push(stat(&r, "misses") - m0);
            read.push((stat(&r, "backend_read_bytes") - b0) / 4096);
            dropped.push(stat(&r, "coherence_pages_dropped") - d0);
        }
        // median and largest of the rounds
        let mm = |v: &mut Vec<u64>| {
            v.sort_unstable();
            format!("{} / {}", v[v.len() / 2], v[v.len() - 1])
        };
        rows_out.push(format!(
            "| {journal} | {ev} | {rounds} | {pages} | {} | {} | {} |",
            mm(&mut dropped),
            mm(&mut misses),
            mm(&mut read),
        ));
    }
    drop(writer.stdin.take());
    let _ = writer.wait();
    rows_out.join("\n")
}

/// The committer child of `coherence`: per line "<event> <id>", a one-row
/// update of row `id` (and a PASSIVE checkpoint after "commit+checkpoint");
/// answers "ok".
pub(crate) fn committer(db: &Path) {
    let c = open_mp(db, "unix", "");
    c.execute_batch("PRAGMA wal_autocheckpoint=0;").unwrap();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let (ev, id) = line.split_once(' ').unwrap();
        let id: i64 = id.parse().unwrap();
        c.execute("UPDATE t SET v = randomblob(400) WHERE id = ?1", [id])
            .unwrap();
        if ev == "commit+checkpoint" {
            c.execute_batch("PRAGMA wal_checkpoint(PASSIVE);").unwrap();
        }
        println!("ok");
        std::io::stdout().flush().unwrap();
    }
}

/// Accounts of `bank` (each row 700 bytes: the accounts span pages).
const ACCOUNTS: i64 = 200;

/// `bank`: `procs` processes moving money between accounts in a
/// rollback-journal database made afresh at `db`; the result line
/// (`config bank procs kx_cache commits/s total_ok`).
pub(crate) fn bank(db: &Path, config: &str, procs: usize, seconds: f64, kx_cache: &str) -> String {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(Path::new(&p));
    }
    {
        let c = Connection::open(db).unwrap();
        c.execute_batch(&format!(
            "PRAGMA journal_mode=delete;
             CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, pad BLOB);
             WITH RECURSIVE a(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM a WHERE i < {ACCOUNTS})
             INSERT INTO accounts SELECT i, 1000, randomblob(700) FROM a;"
        ))
        .unwrap();
    }
    let dir = runtime_dir(db);
    let xdg = dir.path();
    let mut kids: Vec<_> = (0..procs)
        .map(|i| {
            spawn_child(
                &[
                    "--db".into(),
                    db.display().to_string(),
                    "--config".into(),
                    config.into(),
                    "--role".into(),
                    "transfer".into(),
                    "--seconds".into(),
                    seconds.to_string(),
                    "--kx-cache".into(),
                    kx_cache.into(),
                    "--seed".into(),
                    (i as u64 + 101).to_string(),
                ],
                xdg,
            )
        })
        .collect();
    for (_, out) in &mut kids {
        assert_eq!(read_line(out), "ready");
    }
    for (c, _) in &mut kids {
        c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let mut commits = 0.0;
    for (mut c, mut out) in kids {
        let line = read_line(&mut out);
        let v: Vec<f64> = line
            .strip_prefix("done ")
            .unwrap_or_else(|| panic!("{line}"))
            .split(' ')
            .map(|x| x.parse().unwrap())
            .collect();
        commits += v[0] / v[1];
        let _ = c.stdin.as_mut().unwrap().write_all(b"exit\n");
        assert!(c.wait().unwrap().success());
    }
    let c = Connection::open(db).unwrap();
    let total: i64 = c
        .query_row("SELECT sum(balance) FROM accounts", [], |r| r.get(0))
        .unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    format!(
        "{config}\tbank\t{procs}\t{kx_cache}\t{commits:.1}\t{}",
        u8::from(total == ACCOUNTS * 1000 && ok == "ok")
    )
}

/// A child of `bank`: transfers until `seconds` pass; says "done
/// <commits> <secs>", then waits for a line.
pub(crate) fn transfer_child(db: &Path, config: &str, seconds: f64, kx_cache: &str, seed: u64) {
    let c = open_mp(db, config, kx_cache);
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    let _: i64 = c
        .query_row("SELECT sum(length(pad)) FROM accounts", [], |r| r.get(0))
        .unwrap();
    ready_then_go();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let mut commits = 0u64;
    while t0.elapsed() < Duration::from_secs_f64(seconds) {
        let a = rng.random_range(1..=ACCOUNTS);
        let b = rng.random_range(1..=ACCOUNTS);
        if a == b {
            continue;
        }
        let r = (|| -> rusqlite::Result<()> {
            c.execute_batch("BEGIN IMMEDIATE")?;
            let ba: i64 = c.query_row("SELECT balance FROM accounts WHERE id = ?1", [a], |r| {
                r.get(0)
            })?;
            let bb: i64 = c.query_row("SELECT balance FROM accounts WHERE id = ?1", [b], |r| {
                r.get(0)
            })?;
            let amount = rng.random_range(0..=ba.clamp(0, 50));
            c.execute(
                "UPDATE accounts SET balance = ?1 WHERE id = ?2",
                [ba - amount, a],
            )?;
            c.execute(
                "UPDATE accounts SET balance = ?1 WHERE id = ?2",
                [bb + amount, b],
            )?;
            c.execute_batch("COMMIT")
        })();
        match r {
            Ok(()) => commits += 1,
            Err(_) => {
                let _ = c.execute_batch("ROLLBACK");
            }
        }
    }
    println!("done {commits} {:.4}", t0.elapsed().as_secs_f64());
    until_told();
}
