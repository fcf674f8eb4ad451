//! The bank-transfer invariant: accounts whose balances always sum to the
//! same total, changed only by transfers that read two balances with SELECT
//! and write them back with UPDATE, the new values computed here, not in
//! SQL. A page served stale from some process's cache makes a transfer
//! start from an old balance, which creates or destroys money; the total,
//! checked in every read transaction, and the log of transfers, checked at
//! the end, catch it.

use super::procs::is_busy;
use rand::rngs::StdRng;
use rand::RngExt;
use rusqlite::{params, Connection};
use std::time::{Duration, Instant};

/// Accounts (each row about 700 bytes, so they span several pages).
pub(crate) const ACCOUNTS: i64 = 24;
/// Each account's opening balance.
pub(crate) const START: i64 = 1000;
/// The sum every read transaction must see.
pub(crate) const TOTAL: i64 = ACCOUNTS * START;

/// Create the tables in `journal` mode (through any VFS).
pub(crate) fn create(c: &Connection, journal: &str) {
    let mode: String = c
        .query_row(&format!("PRAGMA journal_mode={journal}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, journal);
    c.execute_batch(&format!(
        "BEGIN;
         CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, pad BLOB);
         CREATE TABLE transfers(id INTEGER PRIMARY KEY, worker INTEGER, seq INTEGER,
             src INTEGER, dst INTEGER, amount INTEGER, pad BLOB, UNIQUE(worker, seq));
         WITH RECURSIVE a(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM a WHERE i < {ACCOUNTS})
         INSERT INTO accounts SELECT i, {START}, randomblob(700) FROM a;
         COMMIT;"
    ))
    .unwrap();
}

/// One transfer attempt by `worker` as its transfer number `seq`: `Ok` if
/// it committed; an error (BUSY among them) leaves nothing behind.
pub(crate) fn transfer(
    c: &Connection,
    rng: &mut StdRng,
    worker: i64,
    seq: i64,
) -> rusqlite::Result<()> {
    let a = rng.random_range(1..=ACCOUNTS);
    let mut b = rng.random_range(1..ACCOUNTS);
    if b >= a {
        b += 1;
    }
    let amount = rng.random_range(1..=50i64);
    // half take the write lock first, half read under a read lock and
    // upgrade (which may be refused: BUSY, or BUSY_SNAPSHOT in WAL mode)
    c.execute_batch(if rng.random_bool(0.5) {
        "BEGIN IMMEDIATE"
    } else {
        "BEGIN"
    })?;
    let r = (|| {
        let balance = |id: i64| {
            c.query_row("SELECT balance FROM accounts WHERE id = ?1", [id], |r| {
                r.get::<_, i64>(0)
            })
        };
        let (ba, bb) = (balance(a)?, balance(b)?);
        let set = "UPDATE accounts SET balance = ?1 WHERE id = ?2";
        c.execute(set, params![ba - amount, a])?;
        c.execute(set, params![bb + amount, b])?;
        c.execute(
            "INSERT INTO transfers(worker, seq, src, dst, amount, pad)
             VALUES (?1, ?2, ?3, ?4, ?5, randomblob(100))",
            params![worker, seq, a, b, amount],
        )?;
        c.execute_batch("COMMIT")
    })();
    if r.is_err() && !c.is_autocommit() {
        let _ = c.execute_batch("ROLLBACK");
    }
    r
}

/// One read transaction: (sum of balances, accounts, transfers logged).
pub(crate) fn read(c: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    c.execute_batch("BEGIN")?;
    let r = (|| {
        let (sum, n): (i64, i64) =
            c.query_row("SELECT sum(balance), count(*) FROM accounts", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        let t: i64 = c.query_row("SELECT count(*) FROM transfers", [], |r| r.get(0))?;
        Ok((sum, n, t))
    })();
    let _ = c.execute_batch("COMMIT");
    r
}

/// What a worker did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Report {
    /// Transfers committed.
    pub(crate) committed: i64,
    /// Read transactions checked.
    pub(crate) reads: i64,
    /// Attempts refused with BUSY (retried).
    pub(crate) busy: i64,
}

/// Transfers as `worker` until `done(committed)` or `deadline`, a read
/// transaction checking the total after each, `pace` between them; every
/// BUSY retried. An error names the first broken check.
pub(crate) fn work(
    c: &Connection,
    worker: i64,
    rng: &mut StdRng,
    done: &dyn Fn(i64) -> bool,
    deadline: Instant,
    pace: Duration,
) -> Result<Report, String> {
    let mut rep = Report::default();
    let mut seen = 0;
    let mut last_err = String::new();
    while !done(rep.committed) {
        if Instant::now() > deadline {
            return Err(format!(
                "worker {worker}: only {} transfers before the deadline ({rep:?}; last refusal: {last_err})",
                rep.committed
            ));
        }
        match transfer(c, rng, worker, rep.committed) {
            Ok(()) => rep.committed += 1,
            Err(e) if is_busy(&e) => {
                rep.busy += 1;
                last_err = e.to_string();
                continue;
            }
            Err(e) => return Err(format!("worker {worker}: transfer: {e}")),
        }
        loop {
            match read(c) {
                Ok((sum, n, t)) => {
                    if sum != TOTAL || n != ACCOUNTS {
                        return Err(format!(
                            "worker {worker}: a read transaction saw {n} accounts summing to {sum}, not {TOTAL}"
                        ));
                    }
                    if t < seen || t < rep.committed {
                        return Err(format!(
                            "worker {worker}: {t} transfers logged, after {seen} were seen and {} committed here",
                            rep.committed
                        ));
                    }
                    seen = t;
                    rep.reads += 1;
                    break;
                }
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
                    rep.busy += 1;
                    last_err = e.to_string();
                }
                Err(e) => return Err(format!("worker {worker}: read: {e}")),
            }
        }
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
    }
    Ok(rep)
}

/// The end state: integrity, the total, each worker's transfers logged
/// exactly once each (`seq` 0..committed) and every balance equal to its
/// opening balance plus the logged transfers. `workers`: (worker,
/// committed).
pub(crate) fn verify(c: &Connection, workers: &[(i64, i64)]) -> Result<(), String> {
    let q = |sql: &str| -> Result<i64, String> {
        c.query_row(sql, [], |r| r.get::<_, i64>(0))
            .map_err(|e| format!("{sql}: {e}"))
    };
    let ic: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ic != "ok" {
        return Err(format!("integrity_check: {ic}"));
    }
    let sum = q("SELECT sum(balance) FROM accounts")?;
    if sum != TOTAL {
        return Err(format!("the balances sum to {sum}, not {TOTAL}"));
    }
    for &(w, k) in workers {
        let (n, lo, hi): (i64, i64, i64) = c
            .query_row(
                "SELECT count(*), coalesce(min(seq), -1), coalesce(max(seq), -1)
                 FROM transfers WHERE worker = ?1",
                [w],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(|e| e.to_string())?;
        if (n, lo, hi) != (k, if k > 0 { 0 } else { -1 }, k - 1) {
            return Err(format!(
                "worker {w} committed {k} transfers; the log holds {n} (seq {lo}..={hi})"
            ));
        }
    }
    let wrong = q(&format!(
        "SELECT count(*) FROM accounts a WHERE balance != {START}
           + (SELECT coalesce(sum(amount), 0) FROM transfers WHERE dst = a.id)
           - (SELECT coalesce(sum(amount), 0) FROM transfers WHERE src = a.id)"
    ))?;
    if wrong != 0 {
        return Err(format!(
            "{wrong} balances disagree with the log of transfers"
        ));
    }
    Ok(())
}
