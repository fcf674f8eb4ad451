//! Seed 003's table on this machine: buffered writes of sizes from half to
//! twice the dirty limit into a backend throttled to a fixed bandwidth,
//! with the global dirty count read once per `ratelimit_pages` pages
//! (`balance_dirty_pages_ratelimited`) against read on every dirtied page.
//!
//! ```text
//! cargo run --release --example dirty_throttle                # 256 MiB cache, 3 rounds
//! cargo run --release --example dirty_throttle -- --quick     # CI: 32 MiB cache, 1 round
//! ```
//!
//! Each cell is the median of `--rounds` runs, the two modes interleaved
//! (which goes first alternates from round to round). A run opens a fresh cache
//! of `--cache-size` (background threshold 10%, limit 20%) over a RAM disk
//! that admits `--bandwidth` MiB/s of writes, then `--jobs` threads write
//! their share of the size sequentially in `--bs` writes. MiB/s is the size
//! over the time until the last writer returns (no final sync, as fio's
//! buffered default). The pause column is the p99.9 latency of a single
//! write call (it includes any throttling pause), and the largest single
//! pause the cache recorded.

use clap::Parser;
use hdrhistogram::Histogram;
use kxarray::backend::{Backend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache, ThrottleMode};
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Seed 003's table: ratelimited vs global-read dirty throttling.
#[derive(Parser, Debug)]
struct Args {
    /// Page cache capacity in MiB (the dirty limit is 20% of it).
    #[arg(long, default_value_t = 256)]
    cache_mib: u64,
    /// Backend write bandwidth in MiB/s.
    #[arg(long, default_value_t = 400)]
    bandwidth: u64,
    /// Writer threads.
    #[arg(long, default_value_t = 2)]
    jobs: u64,
    /// Bytes per write.
    #[arg(long, default_value_t = 4096)]
    bs: usize,
    /// Runs per cell (median).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// CI size: a 32 MiB cache, one round.
    #[arg(long)]
    quick: bool,
}

/// A RAM disk admitting `bw` bytes per second of writes.
#[derive(Debug)]
struct Throttled {
    inner: RamDisk,
    bw: f64,
    next_free: Mutex<Instant>,
}

impl Backend for Throttled {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let due = {
            let mut n = self.next_free.lock().unwrap();
            let start = (*n).max(Instant::now());
            *n = start + Duration::from_secs_f64(buf.len() as f64 / self.bw);
            *n
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

struct Cell {
    mib_s: f64,
    p999_ms: f64,
    max_pause_ms: f64,
}

fn one(a: &Args, cap: u64, size: u64, mode: ThrottleMode) -> io::Result<Cell> {
    let cache = PageCache::new(CacheConfig::default().capacity(cap).throttle_mode(mode));
    let backend = Throttled {
        inner: RamDisk::new(size),
        bw: (a.bandwidth << 20) as f64,
        next_free: Mutex::new(Instant::now()),
    };
    let file = cache.open(backend)?;
    let per = size / a.jobs / a.bs as u64 * a.bs as u64;
    let start = Instant::now();
    let hists: Vec<io::Result<Histogram<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.jobs)
            .map(|j| {
                let file = &file;
                s.spawn(move || {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                        .expect("valid bounds");
                    let buf = vec![j as u8 + 1; a.bs];
                    let mut off = j * per;
                    while off < (j + 1) * per {
                        let t0 = Instant::now();
                        file.write_at(&buf, off)?;
                        h.saturating_record(t0.elapsed().as_nanos() as u64);
                        off += a.bs as u64;
                    }
                    Ok(h)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a writer panicked"))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    for h in hists {
        all.add(h?).expect("same bounds");
    }
    let st = cache.stats();
    let cell = Cell {
        mib_s: (per * a.jobs) as f64 / secs / (1 << 20) as f64,
        p999_ms: all.value_at_quantile(0.999) as f64 / 1e6,
        max_pause_ms: st.max_pause_ns as f64 / 1e6,
    };
    drop(file); // writes the rest back (not timed)
    Ok(cell)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> io::Result<()> {
    let mut a = Args::parse();
    if a.quick {
        a.cache_mib = 32;
        a.rounds = 1;
    }
    if a.jobs == 0 || a.bs == 0 || a.rounds == 0 || a.bandwidth == 0 || a.cache_mib == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--jobs, --bs, --rounds, --bandwidth and --cache-mib must be positive",
        ));
    }
    let cap = a.cache_mib << 20;
    let limit = cap / 5;
    println!(
        "dirty throttling (seed 003): cache {} MiB, dirty limit {} MiB (background {} MiB), backend {} MiB/s, {} writer(s) of {} B, median of {}",
        a.cache_mib,
        limit >> 20,
        (cap / 10) >> 20,
        a.bandwidth,
        a.jobs,
        a.bs,
        a.rounds
    );
    println!();
    println!("| size | × limit | ratelimited MiB/s | global read MiB/s | difference | p99.9 write ms (rl / gr) | max pause ms (rl / gr) |");
    println!("|---|---|---|---|---|---|---|");
    for frac in [0.5, 0.75, 1.0, 1.25, 1.5, 2.0] {
        let size = ((limit as f64 * frac) as u64).max(a.bs as u64 * a.jobs);
        let mut cells: [Vec<Cell>; 2] = [Vec::new(), Vec::new()];
        for round in 0..a.rounds {
            // Alternate which mode goes first, so neither always runs on
            // the heap and page state the other left.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for m in order {
                let mode = [ThrottleMode::Ratelimited, ThrottleMode::GlobalRead][m];
                cells[m].push(one(&a, cap, size, mode)?);
            }
        }
        let med = |m: usize, f: fn(&Cell) -> f64| median(cells[m].iter().map(f).collect());
        let (rl, gr) = (med(0, |c| c.mib_s), med(1, |c| c.mib_s));
        println!(
            "| {} MiB | {frac:.2} | {rl:.1} | {gr:.1} | {:+.1} ({:+.1}%) | {:.2} / {:.2} | {:.1} / {:.1} |",
            size >> 20,
            rl - gr,
            100.0 * (rl / gr - 1.0),
            med(0, |c| c.p999_ms),
            med(1, |c| c.p999_ms),
            med(0, |c| c.max_pause_ms),
            med(1, |c| c.max_pause_ms),
        );
    }
    Ok(())
}
