//! A pre-fork server on the shared cache (gunicorn `--preload`): a parent
//! opens a WAL database through the VFS and reads it, then forks four
//! workers that each open the database afresh (members of the shared
//! cache of their own: SQLite's rule against carrying a connection across
//! `fork` kept) and serve writes and reads over TCP on 127.0.0.1. One
//! worker is SIGKILLed half-way; the clients go on with the others. Every
//! write a worker acknowledged is in the database afterwards, read by the
//! unix VFS, and its integrity is ok.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use common::procs::{child, child_spec, hear, open_vfs, say};
use rusqlite::Connection;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const CLIENTS: usize = 4;
const REQUESTS: usize = 100;

/// One worker: its own connection, then requests until killed. `W <n>`
/// inserts row `n` and answers `ok <n>` once committed; `R` answers the
/// row count.
fn serve(db: &Path, listener: &TcpListener) -> ! {
    let c = open_vfs(db, "kxarray", "").unwrap();
    c.busy_timeout(Duration::from_secs(20)).unwrap();
    // (a WAL commit survives a process's death at NORMAL; the test kills
    // processes, not the machine)
    c.execute_batch("PRAGMA synchronous=NORMAL").unwrap();
    loop {
        let Ok((s, _)) = listener.accept() else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let mut out = s.try_clone().unwrap();
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { break };
            let reply = if let Some(n) = line.strip_prefix("W ") {
                let n: i64 = n.parse().unwrap_or(-1);
                match c.execute("INSERT INTO acks(n, pad) VALUES (?1, randomblob(200))", [n]) {
                    Ok(_) => format!("ok {n}"),
                    Err(e) => format!("error {e}"),
                }
            } else {
                let k: i64 = c
                    .query_row("SELECT count(*) FROM acks", [], |r| r.get(0))
                    .unwrap_or(-1);
                format!("count {k}")
            };
            if writeln!(out, "{reply}").is_err() {
                break;
            }
        }
    }
}

/// The child entry: `server` opens the database, reads it, binds, forks
/// the workers, says `port <p> pids <a,b,c,d>`, and on `stop` kills them.
fn prefork_server_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    assert_eq!(role, "server");
    let db = PathBuf::from(&args["db"]);
    let c = open_vfs(&db, "kxarray", "").unwrap();
    let rows: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 4000);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut pids = Vec::new();
    for _ in 0..WORKERS {
        // SAFETY: the child serves and never returns; it does not use the
        // parent's connection (it opens its own).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&db, &listener)));
            // SAFETY: leaving without the parent's exit handlers.
            unsafe { libc::_exit(i32::from(r.is_err()) * 101) };
        }
        pids.push(pid);
    }
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    say(&format!("port {port} pids {}", list.join(",")));
    while let Some(l) = hear() {
        if let Some(p) = l.strip_prefix("kill ") {
            let p: i32 = p.parse().unwrap();
            // SAFETY: a worker of ours.
            unsafe { libc::kill(p, libc::SIGKILL) };
            say("killed");
        } else if l == "stop" {
            break;
        }
    }
    for p in pids {
        // SAFETY: a worker of ours.
        unsafe { libc::kill(p, libc::SIGKILL) };
        // SAFETY: reaping that child; no status is written (null).
        unsafe { libc::waitpid(p, std::ptr::null_mut(), 0) };
    }
    say("stopped");
    drop(c);
}

/// Client `id`'s requests: `W` of its numbers, each on a connection it
/// opens again after any error; the numbers acknowledged.
fn client(port: u16, id: usize, deadline: Instant) -> Vec<i64> {
    let mut acked = Vec::new();
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    for i in 0..REQUESTS {
        let n = (id * REQUESTS + i) as i64;
        loop {
            assert!(Instant::now() < deadline, "client {id}: out of time at {n}");
            if conn.is_none() {
                let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let r = BufReader::new(s.try_clone().unwrap());
                conn = Some((s, r));
            }
            let (s, r) = conn.as_mut().unwrap();
            let mut line = String::new();
            if writeln!(s, "W {n}").is_ok() && r.read_line(&mut line).is_ok_and(|k| k > 0) {
                let line = line.trim_end();
                if line == format!("ok {n}") {
                    acked.push(n);
                    break;
                }
                // a busy database: the request is retried on another
                // connection (its row may be there unacknowledged)
            }
            conn = None;
        }
    }
    acked
}

fn pre_fork_workers_share_the_cache_and_lose_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("server.db");
    {
        let c = Connection::open(&db).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=wal;
             CREATE TABLE t(id INTEGER PRIMARY KEY, pad BLOB);
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<4000)
             INSERT INTO t SELECT x, randomblob(1000) FROM c;
             CREATE TABLE acks(id INTEGER PRIMARY KEY, n INTEGER NOT NULL, pad BLOB);",
        )
        .unwrap();
    }
    let mut server = child(
        "prefork_server_child",
        "server",
        &[("db", db.display().to_string())],
    );
    let hello = server.at_line();
    let f: Vec<&str> = hello.split(' ').collect();
    assert_eq!(f[0], "port", "{hello}");
    let port: u16 = f[1].parse().unwrap();
    let pids: Vec<i32> = f[3].split(',').map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), WORKERS);
    let deadline = Instant::now() + Duration::from_secs(120);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| std::thread::spawn(move || client(port, id, deadline)))
        .collect();
    // half-way, a worker dies at whatever instruction it is at
    let start = Instant::now();
    loop {
        let c = Connection::open(&db).unwrap();
        c.busy_timeout(Duration::from_secs(10)).unwrap();
        let k: i64 = c
            .query_row("SELECT count(*) FROM acks", [], |r| r.get(0))
            .unwrap();
        if k as usize >= CLIENTS * REQUESTS / 2 || start.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    server.send(&format!("kill {}\n", pids[0]));
    assert_eq!(server.at_line(), "killed");
    let mut acked: Vec<i64> = Vec::new();
    for c in clients {
        acked.extend(c.join().unwrap());
    }
    server.send("stop\n");
    assert_eq!(server.at_line(), "stopped");
    assert!(server.wait().0);
    assert_eq!(
        acked.len(),
        CLIENTS * REQUESTS,
        "every request acknowledged in the end"
    );
    let u = Connection::open(&db).unwrap();
    let ok: String = u
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let mut st = u.prepare("SELECT 1 FROM acks WHERE n = ?1").unwrap();
    let missing: Vec<i64> = acked
        .iter()
        .copied()
        .filter(|&n| !st.exists([n]).unwrap())
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged, not in the database: {missing:?}"
    );
}

harness::main!(
    tests: [pre_fork_workers_share_the_cache_and_lose_no_acknowledged_write],
    children: [prefork_server_child],
);
