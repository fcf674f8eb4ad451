//! Several processes on one database, mixing the kxarray VFS and the unix
//! VFS (rusqlite's bundled SQLite with and without `vfs=kxarray`), each a
//! child process running this test binary again: the bank-transfer
//! invariant (`common/bank.rs`) in WAL and DELETE modes. Every process
//! opens the database and reads it before any starts transferring, so they
//! all hold it open at once; then they transfer concurrently, each checking
//! the total in every read transaction; at the end the log of transfers
//! must match what each process committed and every balance.

mod common;

use common::bank;
use common::procs::{child, child_spec, hear, is_busy, open_vfs, say, Proc};
use rand::SeedableRng;
use std::time::{Duration, Instant};

/// The child entry: roles run in this binary, started by `common::procs::child`.
#[test]
#[ignore = "a child process of the multi-process tests, not a test"]
fn mp_child() {
    let Some((role, args)) = child_spec() else {
        return;
    };
    let get = |k: &str| args.get(k).cloned().unwrap_or_default();
    let db = std::path::PathBuf::from(get("db"));
    let code = match role.as_str() {
        "bank" => match bank_child(&db, &get("vfs"), &get("params"), &args) {
            Ok(rep) => {
                say(&format!(
                    "done {} {} {}",
                    rep.committed, rep.reads, rep.busy
                ));
                0
            }
            Err(e) => {
                say(&format!("error {e}"));
                1
            }
        },
        "verify" => {
            let workers: Vec<(i64, i64)> = get("workers")
                .split(',')
                .filter_map(|p| p.split_once(':'))
                .map(|(w, k)| (w.parse().unwrap(), k.parse().unwrap()))
                .collect();
            let r = open_vfs(&db, &get("vfs"), "")
                .map_err(|e| e.to_string())
                .and_then(|c| bank::verify(&c, &workers));
            match r {
                Ok(()) => {
                    say("ok");
                    0
                }
                Err(e) => {
                    say(&format!("error {e}"));
                    1
                }
            }
        }
        other => {
            say(&format!("error unknown role {other}"));
            2
        }
    };
    std::process::exit(code);
}

/// A bank worker: open, read once, say "ready", wait for "go", transfer.
fn bank_child(
    db: &std::path::Path,
    vfs: &str,
    params: &str,
    args: &std::collections::HashMap<String, String>,
) -> Result<bank::Report, String> {
    let num = |k: &str| -> i64 { args.get(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let worker = num("worker");
    let target = num("transfers");
    let deadline = Instant::now() + Duration::from_secs(num("deadline_s") as u64);
    let c = open_vfs(db, vfs, params).map_err(|e| format!("open: {e}"))?;
    c.busy_timeout(Duration::from_millis(200))
        .map_err(|e| e.to_string())?;
    for pragma in args.get("pragmas").into_iter().flat_map(|p| p.split(';')) {
        if !pragma.is_empty() {
            loop {
                match c.query_row(&format!("PRAGMA {pragma}"), [], |_| Ok(())) {
                    Ok(()) | Err(rusqlite::Error::QueryReturnedNoRows) => break,
                    Err(e) if is_busy(&e) && Instant::now() < deadline => continue,
                    Err(e) => return Err(format!("PRAGMA {pragma}: {e}")),
                }
            }
        }
    }
    // read before the others start: every process has the database open
    loop {
        match bank::read(&c) {
            Ok((sum, _, _)) if sum == bank::TOTAL => break,
            Ok((sum, _, _)) => return Err(format!("the first read saw {sum}")),
            Err(e) if is_busy(&e) && Instant::now() < deadline => continue,
            Err(e) => return Err(format!("worker {worker}: the first read: {e}")),
        }
    }
    say("ready");
    if hear().as_deref() != Some("go") {
        return Err("no go".into());
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64 * 7919);
    let every = num("checkpoint_every");
    let ckpt = args.get("checkpoint").cloned().unwrap_or_default();
    let done = |k: i64| {
        // now and then a checkpoint of the kind asked for, from this
        // process (another process's cache must notice what it copies)
        if every > 0 && k > 0 && k % every == 0 && !ckpt.is_empty() {
            let _ = c.query_row(&format!("PRAGMA wal_checkpoint({ckpt})"), [], |_| Ok(()));
        }
        k >= target
    };
    bank::work(
        &c,
        worker,
        &mut rng,
        &done,
        deadline,
        Duration::from_micros(300),
    )
}

/// One worker process's configuration.
struct Worker {
    vfs: &'static str,
    params: &'static str,
    pragmas: &'static str,
    checkpoint: &'static str,
}

fn run_bank(journal: &str, transfers: i64) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bank.db");
    {
        // created on the unix VFS; this process touches the file with no
        // other VFS until every child has exited
        let c = rusqlite::Connection::open(&db).unwrap();
        bank::create(&c, journal);
    }
    let wal = journal == "wal";
    let workers = [
        Worker {
            vfs: "kxarray",
            params: "",
            pragmas: "",
            checkpoint: "",
        },
        Worker {
            vfs: "unix",
            params: "",
            pragmas: "wal_autocheckpoint=20",
            checkpoint: if wal { "TRUNCATE" } else { "" },
        },
        Worker {
            // zero-copy xFetch on kxarray, and checkpoints from here
            vfs: "kxarray",
            params: "kx_cache=8m",
            pragmas: "mmap_size=16777216;wal_autocheckpoint=10",
            checkpoint: if wal { "RESTART" } else { "" },
        },
        Worker {
            vfs: "unix",
            params: "",
            pragmas: "mmap_size=16777216",
            checkpoint: "",
        },
    ];
    let mut procs: Vec<Proc> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            child(
                "mp_child",
                "bank",
                &[
                    ("db", db.display().to_string()),
                    ("vfs", w.vfs.to_string()),
                    ("params", w.params.to_string()),
                    ("pragmas", format!("synchronous=OFF;{}", w.pragmas)),
                    ("checkpoint", w.checkpoint.to_string()),
                    ("checkpoint_every", "25".into()),
                    ("worker", (i + 1).to_string()),
                    ("transfers", transfers.to_string()),
                    ("deadline_s", "30".into()),
                ],
            )
        })
        .collect();
    for (i, p) in procs.iter_mut().enumerate() {
        let line = p.at_line();
        assert_eq!(
            line,
            "ready",
            "worker {} ({}) could not open and read beside the others: {line}",
            i + 1,
            workers[i].vfs
        );
    }
    for p in &mut procs {
        p.send("go\n");
    }
    let mut committed = Vec::new();
    let mut failures = Vec::new();
    for (i, mut p) in procs.into_iter().enumerate() {
        let line = p.at_line();
        let (ok, rest) = p.wait();
        match line.strip_prefix("done ") {
            Some(nums) if ok => {
                let v: Vec<i64> = nums.split(' ').map(|x| x.parse().unwrap()).collect();
                assert_eq!(v[0], transfers);
                assert!(v[1] >= transfers, "{line}");
                committed.push((i as i64 + 1, v[0]));
            }
            _ => failures.push(format!(
                "worker {} ({}): {line} {rest:?}",
                i + 1,
                workers[i].vfs
            )),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // each VFS checks the end state, one after the other
    let spec = committed
        .iter()
        .map(|(w, k)| format!("{w}:{k}"))
        .collect::<Vec<_>>()
        .join(",");
    for vfs in ["kxarray", "unix"] {
        let mut p = child(
            "mp_child",
            "verify",
            &[
                ("db", db.display().to_string()),
                ("vfs", vfs.into()),
                ("workers", spec.clone()),
            ],
        );
        let line = p.at_line();
        assert_eq!(line, "ok", "the end state on {vfs}");
        assert!(p.wait().0);
    }
    // the processes really ran side by side: in commit order the log
    // switches between workers many times (serialized processes would
    // switch once per worker)
    let c = rusqlite::Connection::open(&db).unwrap();
    bank::verify(&c, &committed).unwrap();
    let order: Vec<i64> = c
        .prepare("SELECT worker FROM transfers ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        switches >= 2 * workers.len(),
        "only {switches} switches between workers in {} transfers",
        order.len()
    );
}

/// Two kxarray processes (one with zero-copy fetch, a small cache and
/// frequent RESTART checkpoints) and two unix-VFS processes (one
/// truncating the WAL now and then), WAL mode.
#[test]
fn bank_transfers_across_four_processes_and_both_vfses_wal() {
    run_bank("wal", 1000);
}

/// The same in rollback-journal (DELETE) mode: every transaction's first
/// lock must drop what another process changed.
#[test]
fn bank_transfers_across_four_processes_and_both_vfses_delete() {
    run_bank("delete", 400);
}
