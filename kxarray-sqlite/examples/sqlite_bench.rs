//! One benchmark run of SQLite on a chosen VFS configuration: a workload
//! over a prepared database (reads) or a fresh one (writes), printing one
//! tab-separated result line. `kxarray-sqlite/scripts/sqlite-bench.sh`
//! runs every configuration and workload interleaved over rounds, each run
//! in its own process (so each kxarray run has its own fresh cache), and
//! prints the table with ratios.
//!
//! ```text
//! cargo run --release -p kxarray-sqlite --example sqlite_bench -- prepare --db /tmp/b.db --rows 400000
//! cargo run --release -p kxarray-sqlite --example sqlite_bench -- run --db /tmp/b.db --config kx --workload point-uniform
//! ```
//!
//! Configurations: `unix` (the unix VFS, kernel page cache warm), `unix-mmap`
//! (unix with `mmap_size` covering the database), `unix-excl` and
//! `unix-mmap-excl` (the same with `PRAGMA locking_mode=EXCLUSIVE`: no
//! `fcntl` lock calls per transaction, what a single-process application
//! would choose; one connection only, since the first connection keeps the
//! database locked), `kx` (kxarray on the
//! shared cache, the default), `kx-private` (kxarray with the process's
//! own cache, `kx_shared=0`), `kx-direct` (kxarray over O_DIRECT: the only cache),
//! `kx-fetch` (kxarray with zero-copy xFetch, `mmap_size` covering the
//! database, private cache), `kx-excl` (kx with `PRAGMA locking_mode=EXCLUSIVE`, against
//! `unix-excl`; one connection only), `floor` (unix with SQLite's own page cache holding the whole
//! database). Every run warms its caches with a full scan first.
//!
//! Workloads: `point-uniform`, `point-zipf` (s = 0.99, hot keys scattered),
//! `range` (100-row range scans), `scan` (full scans), `mix` (90% point
//! selects, 10% single-row updates, WAL at synchronous=NORMAL), each on
//! `--threads` connections on as many threads; and on a fresh database:
//! `commit-full` (single-row commits, rollback journal, synchronous=FULL),
//! `commit-wal` (single-row commits, WAL, synchronous=NORMAL), `bulk` (one
//! transaction loading 200,000 rows).

#[path = "bench_support/mp.rs"]
mod mp;

use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use rand::{RngExt, SeedableRng};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "One SQLite benchmark run on the unix VFS or kxarray")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the read benchmark's database (WAL mode; rows of 400 bytes).
    Prepare {
        #[arg(long)]
        db: PathBuf,
        /// Rows (400,000 rows are about 180 MB).
        #[arg(long, default_value_t = 400_000)]
        rows: u64,
    },
    /// One measured run; prints one tab-separated line.
    Run {
        #[arg(long)]
        db: PathBuf,
        /// unix, unix-mmap, unix-excl, unix-mmap-excl, kx, kx-direct,
        /// kx-fetch, kx-excl or floor.
        #[arg(long)]
        config: String,
        /// point-uniform, point-zipf, range, scan, mix, commit-full,
        /// commit-wal or bulk.
        #[arg(long)]
        workload: String,
        /// Connections, each on its own thread.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Seconds to measure (read workloads).
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Operations for the write workloads (commits; rows for bulk).
        #[arg(long)]
        ops: Option<u64>,
        /// Drop the file's pages from the kernel's page cache first
        /// (posix_fadvise DONTNEED), as for the O_DIRECT check.
        #[arg(long)]
        drop_kernel_cache: bool,
        /// Start an idle thread first. A process with a second thread
        /// loses glibc's single-thread fast paths (SQLite's mutexes and
        /// `malloc` without atomics); kxarray's VFS always has threads
        /// (the I/O engine's reapers, the pressure monitor), so this puts
        /// the unix VFS on the same footing.
        #[arg(long)]
        idle_thread: bool,
    },
    /// Multi-process, WAL: one writer process and `--readers` reader
    /// processes on a prepared database; prints one line (config, mp-wal,
    /// readers, kx_cache, commits/s, reads/s).
    Mp {
        #[arg(long)]
        db: PathBuf,
        /// unix or kx.
        #[arg(long)]
        config: String,
        #[arg(long, default_value_t = 3)]
        readers: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Each kxarray process's cache (`kx_cache`).
        #[arg(long, default_value = "64m")]
        kx_cache: String,
        /// The writer's VFS, when not `--config`'s (unix or kx).
        #[arg(long)]
        writer_config: Option<String>,
        /// Start an idle thread in every child first, as `run
        /// --idle-thread` does: unix-VFS children on the kxarray
        /// children's footing (a process with a second thread).
        #[arg(long)]
        idle_thread: bool,
    },
    /// Multi-process, rollback journal: `--procs` processes moving money
    /// between accounts (BEGIN IMMEDIATE, two SELECTs, two UPDATEs,
    /// COMMIT), on a database made afresh; prints one line (config, bank,
    /// procs, kx_cache, commits/s, total right).
    Bank {
        #[arg(long)]
        db: PathBuf,
        /// unix, kx or kx-private.
        #[arg(long)]
        config: String,
        #[arg(long, default_value_t = 4)]
        procs: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value = "64m")]
        kx_cache: String,
    },
    /// A child process of `mp` and `coherence` (not for direct use).
    #[command(hide = true)]
    MpChild {
        #[arg(long)]
        db: PathBuf,
        #[arg(long)]
        config: String,
        /// writer, reader or committer.
        #[arg(long)]
        role: String,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value = "64m")]
        kx_cache: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        idle_thread: bool,
    },
    /// The coherence cost: a kxarray reader's dropped pages, misses and
    /// pages read per one-row commit of another process; prints markdown
    /// rows.
    Coherence {
        #[arg(long)]
        db: PathBuf,
        /// wal or delete.
        #[arg(long, default_value = "wal")]
        journal: String,
        #[arg(long, default_value_t = 20_000)]
        rows: u64,
        #[arg(long, default_value_t = 20)]
        rounds: u32,
    },
}

const ROW_BYTES: usize = 400;

fn kx_register() {
    kxarray_sqlite::register(kxarray_sqlite::Api::linked::<()>(), false).expect("register");
}

/// Open `db` in configuration `config`.
fn open(db: &Path, config: &str, db_bytes: u64) -> Connection {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = match config {
        "unix" | "unix-mmap" | "unix-excl" | "unix-mmap-excl" | "floor" => {
            Connection::open_with_flags(db, flags)
        }
        "kx" | "kx-private" | "kx-direct" | "kx-fetch" | "kx-excl" => {
            kx_register();
            let direct = u8::from(config == "kx-direct");
            let fetch = u8::from(config == "kx-fetch");
            // kx: the shared cache (the default); the others keep the
            // pages in the process's own cache (kx-direct and kx-fetch
            // need it; kx-excl is kx under PRAGMA locking_mode=EXCLUSIVE)
            let shared = u8::from(config == "kx" || config == "kx-excl");
            Connection::open_with_flags(
                format!(
                    "file:{}?vfs=kxarray&kx_direct={direct}&kx_fetch={fetch}&kx_shared={shared}",
                    db.display()
                ),
                flags,
            )
        }
        other => panic!("unknown config {other}"),
    }
    .expect("open");
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    if config.ends_with("-excl") {
        c.execute_batch("PRAGMA locking_mode=EXCLUSIVE;").unwrap();
    }
    let map = if matches!(config, "unix-mmap" | "unix-mmap-excl" | "kx-fetch") {
        db_bytes * 2 + (64 << 20)
    } else {
        0
    };
    c.execute_batch(&format!("PRAGMA mmap_size={map};"))
        .unwrap();
    if config == "floor" {
        let kib = db_bytes / 1024 * 5 / 4 + 1024;
        c.execute_batch(&format!("PRAGMA cache_size=-{kib};"))
            .unwrap();
    }
    c
}

fn prepare(db: &Path, rows: u64) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    let c = Connection::open(db).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=wal; PRAGMA synchronous=normal;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);",
    )
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    {
        let mut st = tx
            .prepare("INSERT INTO t(id, v) VALUES (?1, randomblob(?2))")
            .unwrap();
        for id in 1..=rows {
            st.execute(rusqlite::params![id as i64, ROW_BYTES as i64])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
}

/// Zipfian ranks over `n` keys (s = 0.99) by inverse CDF, scattered over
/// the key space by a multiplicative permutation so hot keys do not share
/// pages.
struct Zipf {
    cdf: Vec<f64>,
    n: u64,
}

impl Zipf {
    fn new(n: u64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / (k as f64).powf(0.99);
            cdf.push(sum);
        }
        for x in &mut cdf {
            *x /= sum;
        }
        Zipf { cdf, n }
    }
    fn key(&self, u: f64) -> u64 {
        let rank = self.cdf.partition_point(|&c| c < u) as u64;
        // 2654435761 is odd, so multiplication permutes 0..2^32; fold into
        // 0..n.
        (rank.wrapping_mul(2_654_435_761) % self.n) + 1
    }
}

struct Outcome {
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
}

fn rows_of(c: &Connection) -> u64 {
    c.query_row("SELECT max(id) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap() as u64
}

/// Read every page (and, for `floor`, load SQLite's own cache).
fn warm(c: &Connection) {
    let n: i64 = c
        .query_row("SELECT sum(length(v)) FROM t", [], |r| r.get(0))
        .unwrap();
    assert!(n > 0);
}

#[allow(clippy::too_many_arguments)] // one run's parameters, passed once
fn read_worker(
    db: &Path,
    config: &str,
    db_bytes: u64,
    workload: &str,
    seconds: f64,
    seed: u64,
    zipf: Option<Arc<Zipf>>,
    start: Arc<std::sync::Barrier>,
) -> Outcome {
    let c = open(db, config, db_bytes);
    if workload == "mix" {
        c.execute_batch("PRAGMA synchronous=normal;").unwrap();
    }
    warm(&c);
    let rows = rows_of(&c);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let mut point = c.prepare("SELECT length(v) FROM t WHERE id = ?1").unwrap();
    let mut range = c
        .prepare("SELECT sum(length(v)) FROM t WHERE id BETWEEN ?1 AND ?1 + 99")
        .unwrap();
    let mut scan = c.prepare("SELECT sum(length(v)) FROM t").unwrap();
    let mut update = c
        .prepare("UPDATE t SET v = randomblob(400) WHERE id = ?1")
        .unwrap();
    start.wait();
    let t0 = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let mut ops = 0u64;
    let mut sink = 0i64;
    while t0.elapsed() < deadline {
        // batches of operations between clock reads
        let batch = if workload == "scan" { 1 } else { 64 };
        for _ in 0..batch {
            let s = Instant::now();
            match workload {
                "point-uniform" => {
                    let id = rng.random_range(1..=rows) as i64;
                    sink += point.query_row([id], |r| r.get::<_, i64>(0)).unwrap();
                }
                "point-zipf" => {
                    let id = zipf.as_ref().unwrap().key(rng.random::<f64>()) as i64;
                    sink += point.query_row([id], |r| r.get::<_, i64>(0)).unwrap();
                }
                "range" => {
                    let id = rng.random_range(1..=rows.saturating_sub(99).max(1)) as i64;
                    sink += range.query_row([id], |r| r.get::<_, i64>(0)).unwrap();
                }
                "scan" => sink += scan.query_row([], |r| r.get::<_, i64>(0)).unwrap(),
                "mix" => {
                    let id = rng.random_range(1..=rows) as i64;
                    if rng.random_range(0..10) == 0 {
                        update.execute([id]).unwrap();
                    } else {
                        sink += point.query_row([id], |r| r.get::<_, i64>(0)).unwrap();
                    }
                }
                other => panic!("unknown workload {other}"),
            }
            hist.record(s.elapsed().as_nanos().max(1) as u64).unwrap();
            ops += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert!(sink > 0);
    Outcome { ops, secs, hist }
}

fn write_run(db: &Path, config: &str, workload: &str, ops: u64) -> Outcome {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    let c = open(db, config, 0);
    let setup = match workload {
        "commit-full" => "PRAGMA journal_mode=delete; PRAGMA synchronous=full;",
        "commit-wal" | "bulk" => "PRAGMA journal_mode=wal; PRAGMA synchronous=normal;",
        other => panic!("unknown workload {other}"),
    };
    c.execute_batch(setup).unwrap();
    c.execute_batch("CREATE TABLE w(id INTEGER PRIMARY KEY, v BLOB NOT NULL);")
        .unwrap();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let t0 = Instant::now();
    if workload == "bulk" {
        let tx = c.unchecked_transaction().unwrap();
        {
            let mut st = tx
                .prepare("INSERT INTO w(v) VALUES (randomblob(100))")
                .unwrap();
            for _ in 0..ops {
                st.execute([]).unwrap();
            }
        }
        tx.commit().unwrap();
        hist.record(t0.elapsed().as_nanos() as u64).unwrap();
    } else {
        let mut st = c
            .prepare("INSERT INTO w(v) VALUES (randomblob(100))")
            .unwrap();
        for _ in 0..ops {
            let s = Instant::now();
            st.execute([]).unwrap();
            hist.record(s.elapsed().as_nanos().max(1) as u64).unwrap();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(c);
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    Outcome { ops, secs, hist }
}

/// posix_fadvise(DONTNEED) over the whole file.
fn drop_kernel_cache(db: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::File::open(db) {
        // SAFETY: a valid descriptor; fadvise has no memory effects.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

fn main() {
    let args = Args::parse();
    match args.cmd {
        Cmd::Prepare { db, rows } => {
            let t0 = Instant::now();
            prepare(&db, rows);
            eprintln!(
                "prepared {} ({} rows, {} bytes) in {:.1} s",
                db.display(),
                rows,
                std::fs::metadata(&db).unwrap().len(),
                t0.elapsed().as_secs_f64()
            );
        }
        Cmd::Mp {
            db,
            config,
            readers,
            seconds,
            kx_cache,
            writer_config,
            idle_thread,
        } => println!(
            "{}",
            mp::mp(
                &db,
                &config,
                writer_config.as_deref(),
                readers,
                seconds,
                &kx_cache,
                idle_thread
            )
        ),
        Cmd::Bank {
            db,
            config,
            procs,
            seconds,
            kx_cache,
        } => println!("{}", mp::bank(&db, &config, procs, seconds, &kx_cache)),
        Cmd::MpChild {
            db,
            config,
            role,
            seconds,
            kx_cache,
            seed,
            idle_thread,
        } => {
            if idle_thread {
                std::thread::spawn(|| loop {
                    std::thread::park();
                });
            }
            if role == "committer" {
                mp::committer(&db);
            } else if role == "transfer" {
                mp::transfer_child(&db, &config, seconds, &kx_cache, seed);
            } else {
                mp::mp_child(&db, &config, &role, seconds, &kx_cache, seed);
            }
        }
        Cmd::Coherence {
            db,
            journal,
            rows,
            rounds,
        } => println!("{}", mp::coherence(&db, &journal, rows, rounds)),
        Cmd::Run {
            db,
            config,
            workload,
            threads,
            seconds,
            ops,
            drop_kernel_cache: drop,
            idle_thread,
        } => {
            if idle_thread {
                std::thread::spawn(|| loop {
                    std::thread::park();
                });
            }
            let is_write = matches!(workload.as_str(), "commit-full" | "commit-wal" | "bulk");
            let outcome = if is_write {
                let db = db.with_file_name(format!("write-{config}-{workload}.db"));
                let ops = ops.unwrap_or(match workload.as_str() {
                    "commit-full" => 500,
                    "commit-wal" => 20_000,
                    _ => 200_000,
                });
                write_run(&db, &config, &workload, ops)
            } else {
                if drop {
                    drop_kernel_cache(&db);
                }
                let db_bytes = std::fs::metadata(&db)
                    .expect("prepare the database first")
                    .len();
                let zipf = (workload == "point-zipf").then(|| {
                    let c =
                        Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
                    Arc::new(Zipf::new(rows_of(&c)))
                });
                let start = Arc::new(std::sync::Barrier::new(threads));
                let handles: Vec<_> = (0..threads)
                    .map(|i| {
                        let (db, config, workload) = (db.clone(), config.clone(), workload.clone());
                        let (zipf, start) = (zipf.clone(), Arc::clone(&start));
                        std::thread::spawn(move || {
                            read_worker(
                                &db,
                                &config,
                                db_bytes,
                                &workload,
                                seconds,
                                42 + i as u64,
                                zipf,
                                start,
                            )
                        })
                    })
                    .collect();
                let mut total = Outcome {
                    ops: 0,
                    secs: 0.0,
                    hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap(),
                };
                for h in handles {
                    let o = h.join().unwrap();
                    total.ops += o.ops;
                    total.secs = total.secs.max(o.secs);
                    total.hist.add(&o.hist).unwrap();
                }
                total
            };
            let stats = kxarray_sqlite::stats().unwrap_or_default();
            let pick = |k: &str| {
                stats
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .unwrap_or("-")
                    .to_string()
            };
            // config workload threads ops secs ops/s p50_us p99_us hits misses
            println!(
                "{config}\t{workload}\t{threads}\t{}\t{:.4}\t{:.1}\t{:.2}\t{:.2}\t{}\t{}",
                outcome.ops,
                outcome.secs,
                outcome.ops as f64 / outcome.secs,
                outcome.hist.value_at_quantile(0.5) as f64 / 1000.0,
                outcome.hist.value_at_quantile(0.99) as f64 / 1000.0,
                pick("hits"),
                pick("misses"),
            );
        }
    }
}
