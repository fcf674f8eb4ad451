//! The table on this machine: buffered writes of sizes from half to
//! twice the dirty limit into a backend throttled to a fixed bandwidth,
//! with the global dirty count read once per `ratelimit_pages` pages
//! (`balance_dirty_pages_ratelimited`) against read on every dirtied page.
//!
//! ```text
//! cargo run --release --example dirty_throttle                # 256 MiB cache, 32 rounds
//! cargo run --release --example dirty_throttle -- --quick     # CI: 32 MiB cache, 2 rounds
//! ```
//!
//! A run opens a fresh cache of `--cache-mib` (background threshold 10%,
//! limit 20%) over a RAM disk that admits `--bandwidth` MiB/s of writes,
//! then `--jobs` threads write their share of the size sequentially in
//! `--bs` writes. MiB/s is the size over the time until the last writer
//! returns (no final sync, as fio's buffered default); the rest is written
//! back unthrottled and untimed when the run ends.
//!
//! A round is one run of each mode, back to back (which goes first
//! alternates from round to round), so the two runs of a round share the
//! machine's load; one untimed round warms up first. Two tables compare
//! the modes on two measures: throughput, and the writers' CPU time per
//! MiB (`CLOCK_THREAD_CPUTIME_ID`: what a per-page global read costs the
//! writers, without the time they waited for a CPU). For each, per row:
//! each mode's median with the lowest and highest round; the ratio
//! ratelimited / global read of each round, its median and interquartile
//! range; how many rounds it was above 1; and a verdict from a two-sided
//! sign test over the rounds, naming a winner only when the split is
//! unlikely for a coin toss (p below 5% divided by the number of tests in
//! both tables, so the whole output has at most a 5% chance of one false
//! verdict), otherwise `within noise`. `--control` runs the ratelimited
//! mode in both columns (an A/A test): the spread and the verdicts when
//! there is no difference at all. The pause columns are the worst round's
//! p99.9 latency of a single write call (it includes any throttling pause)
//! and the largest single pause the cache recorded over all rounds; `gauge
//! reads` is the mean number of global dirty-count reads per run.

use clap::Parser;
use hdrhistogram::Histogram;
use kxarray::backend::{Backend, RamDisk};
use kxarray::pagecache::{CacheConfig, PageCache, ThrottleMode};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The table: ratelimited vs global-read dirty throttling.
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
    /// Rounds per row (one run of each mode per round).
    #[arg(long, default_value_t = 32)]
    rounds: usize,
    /// CI size: a 32 MiB cache, two rounds.
    #[arg(long)]
    quick: bool,
    /// A/A control: the ratelimited mode in both columns.
    #[arg(long)]
    control: bool,
    /// The rows: sizes as fractions of the dirty limit.
    #[arg(long, value_delimiter = ',', default_values_t = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0])]
    fractions: Vec<f64>,
}

/// A RAM disk admitting `bw` bytes per second of writes, until
/// `unthrottled` is set (the untimed write-back at the end of a run).
#[derive(Debug)]
struct Throttled {
    inner: RamDisk,
    bw: f64,
    next_free: Mutex<Instant>,
    unthrottled: Arc<AtomicBool>,
}

impl Backend for Throttled {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if !self.unthrottled.load(Ordering::Relaxed) {
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

/// One run's figures.
struct Run {
    mib_s: f64,
    /// Writer CPU time per MiB written, in ms (NaN where the kernel does
    /// not report it).
    cpu_ms_per_mib: f64,
    p999_ms: f64,
    max_pause_ms: f64,
    gauge_reads: u64,
}

fn one(a: &Args, cap: u64, size: u64, mode: ThrottleMode) -> io::Result<Run> {
    let cache = PageCache::new(CacheConfig::default().capacity(cap).throttle_mode(mode));
    let unthrottled = Arc::new(AtomicBool::new(false));
    let file = cache.open(Throttled {
        inner: RamDisk::new(size),
        bw: (a.bandwidth << 20) as f64,
        next_free: Mutex::new(Instant::now()),
        unthrottled: Arc::clone(&unthrottled),
    })?;
    let per = size / a.jobs / a.bs as u64 * a.bs as u64;
    let start = Instant::now();
    let hists: Vec<io::Result<(Histogram<u64>, Option<u64>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.jobs)
            .map(|j| {
                let file = &file;
                s.spawn(move || {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                        .expect("valid bounds");
                    let buf = vec![j as u8 + 1; a.bs];
                    let cpu0 = thread_cpu_ns();
                    let mut off = j * per;
                    while off < (j + 1) * per {
                        let t0 = Instant::now();
                        file.write_at(&buf, off)?;
                        h.saturating_record(t0.elapsed().as_nanos() as u64);
                        off += a.bs as u64;
                    }
                    let cpu = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
                    Ok((h, cpu))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a writer panicked"))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let mut cpu_ns = Some(0);
    for h in hists {
        let (h, cpu) = h?;
        all.add(h).expect("same bounds");
        cpu_ns = cpu_ns.zip(cpu).map(|(a, b)| a + b);
    }
    let mib = (per * a.jobs) as f64 / (1 << 20) as f64;
    let st = cache.stats();
    let run = Run {
        mib_s: mib / secs,
        cpu_ms_per_mib: cpu_ns.map_or(f64::NAN, |ns| ns as f64 / 1e6 / mib),
        p999_ms: all.value_at_quantile(0.999) as f64 / 1e6,
        max_pause_ms: st.max_pause_ns as f64 / 1e6,
        gauge_reads: st.dirty_global_reads,
    };
    // The rest is written back at full speed, untimed.
    unthrottled.store(true, Ordering::Relaxed);
    file.sync()?;
    Ok(run)
}

/// Time the calling thread has run on a CPU, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`): not counting time it waited for a CPU,
/// which on a shared machine is most of the noise in wall time.
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The `q` quantile of sorted `v`, interpolated between ranks (the median
/// of an even count is the mean of the two middle values).
fn quantile(v: &[f64], q: f64) -> f64 {
    let x = q * (v.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (x - lo as f64)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Two-sided exact sign test: the chance of a split at least as uneven
/// as `wins` of `n` if each round were a coin toss.
fn sign_test(wins: usize, n: usize) -> f64 {
    let k = wins.min(n - wins);
    let mut c = 1.0f64; // C(n, 0)
    let mut tail = 0.0;
    for i in 0..=k {
        if i > 0 {
            c = c * (n - i + 1) as f64 / i as f64;
        }
        tail += c;
    }
    (2.0 * tail / 2f64.powi(n as i32)).min(1.0)
}

fn main() -> io::Result<()> {
    let mut a = Args::parse();
    if a.quick {
        a.cache_mib = 32;
        a.rounds = 2;
    }
    if a.jobs == 0 || a.bs == 0 || a.rounds == 0 || a.bandwidth == 0 || a.cache_mib == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--jobs, --bs, --rounds, --bandwidth and --cache-mib must be positive",
        ));
    }
    if a.fractions.is_empty() || a.fractions.iter().any(|f| !(*f > 0.0 && *f <= 64.0)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--fractions must be in (0, 64]",
        ));
    }
    let cap = a.cache_mib << 20;
    let limit = cap / 5;
    println!(
        "dirty throttling: cache {} MiB, dirty limit {} MiB (background {} MiB), backend {} MiB/s, {} writer(s) of {} B, {} rounds{}",
        a.cache_mib,
        limit >> 20,
        (cap / 10) >> 20,
        a.bandwidth,
        a.jobs,
        a.bs,
        a.rounds,
        if a.control {
            "; CONTROL: both columns run the ratelimited mode"
        } else {
            ""
        }
    );
    println!();
    let (b, bb) = if a.control {
        ("ratelimited again", "rl2")
    } else {
        ("global read", "gr")
    };
    let modes = if a.control {
        [ThrottleMode::Ratelimited; 2]
    } else {
        [ThrottleMode::Ratelimited, ThrottleMode::GlobalRead]
    };
    let fracs = a.fractions.clone();
    // Two tests per row (throughput, CPU): 5% over the whole table.
    let alpha = 0.05 / (2 * fracs.len()) as f64;
    let size_of = |frac: f64| ((limit as f64 * frac) as u64).max(a.bs as u64 * a.jobs);
    // Warm up both modes (allocator, thread and page state), untimed.
    for mode in modes {
        one(&a, cap, size_of(fracs[0]), mode)?;
    }
    let mut rows = Vec::new();
    for &frac in &fracs {
        let size = size_of(frac);
        let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
        for round in 0..a.rounds {
            // Alternate which mode goes first, so neither always runs on
            // the heap and page state the other left.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for m in order {
                runs[m].push(one(&a, cap, size, modes[m])?);
            }
        }
        rows.push((frac, size, runs));
    }
    println!("Throughput (higher is better):");
    println!();
    println!("| size | × limit | ratelimited MiB/s, median (min..max) | {b} MiB/s, median (min..max) | rl / {bb} per round, median (IQR) | rl faster | verdict (sign test, p) |");
    println!("|---|---|---|---|---|---|---|");
    for (frac, size, runs) in &rows {
        let c = Compare::new(runs, |r| r.mib_s, alpha, ["rl faster", "rl slower"]);
        println!("| {} MiB | {frac:.2} | {} |", size >> 20, c.cells(0));
    }
    println!();
    println!("Writer CPU time per MiB written, and pauses (CPU: lower is better):");
    println!();
    println!("| size | × limit | ratelimited CPU ms/MiB, median (min..max) | {b} CPU ms/MiB, median (min..max) | rl / {bb} per round, median (IQR) | rl costlier | verdict (sign test, p) | p99.9 write ms, worst round (rl / {bb}) | max pause ms (rl / {bb}) | gauge reads per run (rl / {bb}) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (frac, size, runs) in &rows {
        let cpu = if runs.iter().flatten().any(|r| r.cpu_ms_per_mib.is_nan()) {
            "n/a | n/a | n/a | n/a | n/a".to_string()
        } else {
            Compare::new(
                runs,
                |r| r.cpu_ms_per_mib,
                alpha,
                ["rl costlier", "rl cheaper"],
            )
            .cells(2)
        };
        let worst = |m: usize, f: fn(&Run) -> f64| runs[m].iter().map(f).fold(0.0, f64::max);
        let reads =
            |m: usize| runs[m].iter().map(|r| r.gauge_reads).sum::<u64>() / runs[m].len() as u64;
        println!(
            "| {} MiB | {frac:.2} | {cpu} | {:.2} / {:.2} | {:.1} / {:.1} | {} / {} |",
            size >> 20,
            worst(0, |r| r.p999_ms),
            worst(1, |r| r.p999_ms),
            worst(0, |r| r.max_pause_ms),
            worst(1, |r| r.max_pause_ms),
            reads(0),
            reads(1),
        );
    }
    Ok(())
}

/// One metric of one row, the two modes compared round by round.
struct Compare {
    /// Each mode's values, sorted.
    by_mode: [Vec<f64>; 2],
    /// The per-round ratios first mode / second mode, sorted.
    ratios: Vec<f64>,
    /// Rounds where the ratio is above 1.
    above: usize,
    p: f64,
    verdict: &'static str,
}

impl Compare {
    /// `names`: the verdict when the ratio is significantly above 1, and
    /// when it is significantly below.
    fn new(runs: &[Vec<Run>; 2], f: fn(&Run) -> f64, alpha: f64, names: [&'static str; 2]) -> Self {
        let by_mode = [0, 1].map(|m| sorted(runs[m].iter().map(f).collect()));
        let ratios = sorted(
            runs[0]
                .iter()
                .zip(&runs[1])
                .map(|(x, y)| f(x) / f(y))
                .collect(),
        );
        let above = ratios.iter().filter(|&&x| x > 1.0).count();
        let below = ratios.iter().filter(|&&x| x < 1.0).count();
        let p = if above + below == 0 {
            1.0
        } else {
            sign_test(above, above + below)
        };
        let verdict = if p >= alpha {
            "within noise"
        } else if above > below {
            names[0]
        } else {
            names[1]
        };
        Compare {
            by_mode,
            ratios,
            above,
            p,
            verdict,
        }
    }

    /// The five cells: each mode's median (min..max), the ratio's median
    /// (IQR), rounds above 1, and the verdict; `digits` after the point.
    fn cells(&self, digits: usize) -> String {
        let m = |v: &[f64]| {
            format!(
                "{:.digits$} ({:.digits$}..{:.digits$})",
                quantile(v, 0.5),
                v[0],
                v[v.len() - 1]
            )
        };
        let r = &self.ratios;
        format!(
            "{} | {} | {:.3} ({:.3}..{:.3}) | {}/{} | {} (p={:.2}) |",
            m(&self.by_mode[0]),
            m(&self.by_mode[1]),
            quantile(r, 0.5),
            quantile(r, 0.25),
            quantile(r, 0.75),
            self.above,
            r.len(),
            self.verdict,
            self.p,
        )
        .trim_end_matches(" |")
        .to_string()
    }
}
