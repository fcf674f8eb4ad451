//! Hit ratio of the kxarray page cache against `quick_cache`, `moka` and a
//! plain LRU (the `lru` crate, the floor), side by side in one run, at the
//! same capacity in pages, on seeded synthetic traces:
//!
//! - zipf 0.99 and zipf 1.0 over 1M pages, caches of 1% and 10%;
//! - a loop over 1.25x the capacity (LRU gets 0%, the optimum is 80%),
//!   the first (cold) pass not counted;
//! - a hot set mixed with a one-pass scan twice the capacity.
//!
//! ```text
//! cargo bench -p kxarray-bench-peers --bench hit_ratio
//! cargo bench -p kxarray-bench-peers --bench hit_ratio -- --quick   # shorter traces
//! ```
//!
//! Every trace's page numbers go through a fixed bijection of the page space
//! (an odd multiplier modulo 2^20), so no trace has sequential runs: the page
//! cache's readahead never fires and every cache sees the same single-page
//! requests. The kxarray cache runs over a `RamDisk` (4 KiB pages, order-0
//! folios); its hits and misses come from its own counters, and the run
//! checks that they add up to the trace length.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::Zipf;
use std::num::NonZeroUsize;
use std::time::Instant;

/// The page space of every trace: 2^20 pages (4 GiB of 4 KiB pages).
const SPACE_BITS: u32 = 20;
const SPACE: u64 = 1 << SPACE_BITS;
const PAGE: u64 = 4096;

/// A fixed bijection of `0..SPACE`: no two logical pages share a page, and
/// logically adjacent pages land far apart.
fn scramble(x: u64) -> u64 {
    (x.wrapping_mul(0x9E37_79B1) ^ 0x5_A5A5) & (SPACE - 1)
}

/// One named trace and the capacity (in pages) it is run at.
struct Trace {
    name: String,
    capacity: u64,
    pages: Vec<u64>,
    /// Leading accesses that warm the cache and are not counted (the loop's
    /// first, cold pass: the 80% optimum is a steady-state figure).
    warmup: usize,
}

/// `len` accesses drawn from zipf(`s`) over `n` pages.
fn zipf(n: u64, s: f64, len: usize, capacity: u64, seed: u64) -> Trace {
    let mut rng = StdRng::seed_from_u64(seed);
    let z = Zipf::new(n as f64, s).expect("valid zipf parameters");
    let pages = (0..len)
        .map(|_| scramble(rng.sample(z) as u64 - 1))
        .collect();
    Trace {
        name: format!(
            "zipf {s:.2}, {}k pages, cache {:.0}%",
            n / 1000,
            capacity as f64 * 100.0 / n as f64
        ),
        capacity,
        pages,
        warmup: 0,
    }
}

/// `rounds` passes over the same `1.25 * capacity` pages in the same order.
fn looping(capacity: u64, rounds: usize) -> Trace {
    let n = capacity * 5 / 4;
    let mut pages = Vec::with_capacity(n as usize * rounds);
    for _ in 0..rounds {
        pages.extend((0..n).map(scramble));
    }
    Trace {
        name: format!("loop over 1.25x capacity, {rounds} rounds, first uncounted"),
        capacity,
        pages,
        warmup: n as usize,
    }
}

/// A hot set of `0.6 * capacity` pages, read uniformly; after a warm-up of
/// four passes' worth of hot reads, half of the reads go to a one-pass scan
/// of `2 * capacity` never-repeated pages, then the hot reads go on alone
/// for two more passes' worth. A scan-resistant cache keeps the hot set
/// through the scan; LRU lets the scan flush it.
fn hot_scan(capacity: u64, seed: u64) -> Trace {
    let mut rng = StdRng::seed_from_u64(seed);
    let hot = capacity * 3 / 5;
    let scan = capacity * 2;
    let mut pages = Vec::new();
    for _ in 0..hot * 4 {
        pages.push(scramble(rng.random_range(0..hot)));
    }
    let mut next_scan = 0;
    while next_scan < scan {
        if rng.random_bool(0.5) {
            pages.push(scramble(rng.random_range(0..hot)));
        } else {
            pages.push(scramble(hot + next_scan));
            next_scan += 1;
        }
    }
    for _ in 0..hot * 2 {
        pages.push(scramble(rng.random_range(0..hot)));
    }
    Trace {
        name: "hot set 0.6x + one-pass scan 2x capacity".into(),
        capacity,
        pages,
        warmup: 0,
    }
}

/// The outcome of one cache on one trace.
struct Outcome {
    hits: u64,
    accesses: u64,
    secs: f64,
}

impl Outcome {
    fn ratio(&self) -> f64 {
        100.0 * self.hits as f64 / self.accesses.max(1) as f64
    }
}

/// Runs `access` (which returns whether the page was a hit) over the trace.
fn run(trace: &Trace, mut access: impl FnMut(u64) -> bool) -> Outcome {
    let t0 = Instant::now();
    for &p in &trace.pages[..trace.warmup] {
        access(p);
    }
    let counted = &trace.pages[trace.warmup..];
    let hits = counted.iter().filter(|&&p| access(p)).count() as u64;
    Outcome {
        hits,
        accesses: counted.len() as u64,
        secs: t0.elapsed().as_secs_f64(),
    }
}

fn plain_lru(trace: &Trace) -> Outcome {
    let mut c = lru::LruCache::new(NonZeroUsize::new(trace.capacity as usize).unwrap());
    run(trace, |p| {
        if c.get(&p).is_some() {
            true
        } else {
            c.put(p, ());
            false
        }
    })
}

fn quick(trace: &Trace) -> Outcome {
    let c = quick_cache::sync::Cache::<u64, ()>::new(trace.capacity as usize);
    run(trace, |p| {
        if c.get(&p).is_some() {
            true
        } else {
            c.insert(p, ());
            false
        }
    })
}

fn moka(trace: &Trace) -> Outcome {
    let c = moka::sync::Cache::<u64, ()>::new(trace.capacity);
    run(trace, |p| {
        if c.get(&p).is_some() {
            true
        } else {
            c.insert(p, ());
            false
        }
    })
}

fn main() {
    let quick_mode = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; nothing else is taken.
    let zipf_len = if quick_mode { 1_000_000 } else { 4_000_000 };
    let n = 1_000_000;
    let loop_cap = 16_384;
    let mut traces = vec![
        zipf(n, 0.99, zipf_len, n / 100, 1),
        zipf(n, 0.99, zipf_len, n / 10, 2),
        zipf(n, 1.0, zipf_len, n / 100, 3),
        zipf(n, 1.0, zipf_len, n / 10, 4),
        looping(loop_cap, if quick_mode { 4 } else { 20 }),
        hot_scan(loop_cap, 5),
    ];
    println!(
        "hit ratio (%), same capacity in pages for every cache; {} accesses per zipf trace",
        zipf_len
    );
    println!(
        "| trace | capacity (pages) | counted accesses | kxarray PageCache | quick_cache | moka | plain LRU |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut misses_target = Vec::new();
    for t in traces.drain(..) {
        let kx = kx::run_trace(&t);
        let q = quick(&t);
        let m = moka(&t);
        let l = plain_lru(&t);
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            t.name,
            t.capacity,
            t.pages.len() - t.warmup,
            kx.as_ref()
                .map(|o| format!("{:.2}", o.ratio()))
                .unwrap_or_else(|e| format!("error: {e}")),
            q.ratio(),
            m.ratio(),
            l.ratio()
        );
        eprintln!(
            "  ({}: seconds kxarray {} quick_cache {:.2} moka {:.2} lru {:.2})",
            t.name,
            kx.as_ref()
                .map(|o| format!("{:.2}", o.secs))
                .unwrap_or_default(),
            q.secs,
            m.secs,
            l.secs
        );
        if let Ok(k) = &kx {
            let best_peer = q.ratio().max(m.ratio());
            if k.ratio() <= l.ratio() {
                misses_target.push(format!("{}: not ahead of plain LRU", t.name));
            }
            if t.name.starts_with("loop") && k.ratio() < 60.0 {
                misses_target.push(format!("{}: below 60% hits", t.name));
            }
            if t.name.starts_with("zipf") && k.ratio() < best_peer - 2.0 {
                misses_target.push(format!(
                    "{}: more than 2 points behind the best peer ({:.2})",
                    t.name, best_peer
                ));
            }
        }
    }
    if misses_target.is_empty() {
        println!("targets: all met (ahead of LRU everywhere, >= 60% on the loop, within 2 points of the best peer on zipf)");
    } else {
        println!("targets missed:");
        for m in misses_target {
            println!("  - {m}");
        }
    }
}

/// The kxarray page cache as a trace consumer: one file over a `RamDisk`
/// spanning the page space, a cache of `capacity` pages, no flusher (the
/// trace only reads), each access a zero-copy `read_folio`.
mod kx {
    use super::{Outcome, Trace, PAGE, SPACE};
    use kxarray::backend::RamDisk;
    use kxarray::pagecache::{CacheConfig, PageCache};
    use std::time::Instant;

    pub fn run_trace(trace: &Trace) -> std::io::Result<Outcome> {
        let cache = PageCache::new(
            CacheConfig::default()
                .capacity(trace.capacity * PAGE)
                .flusher(false),
        );
        let file = cache.open(RamDisk::new(SPACE * PAGE))?;
        let t0 = Instant::now();
        let mut sum = 0u64;
        for &p in &trace.pages[..trace.warmup] {
            let f = file.read_folio(p)?;
            sum = sum.wrapping_add(f.page(p).first().copied().unwrap_or(1) as u64);
        }
        let before = cache.stats();
        let counted = &trace.pages[trace.warmup..];
        // Per-pass hit ratios of a looping trace (its warm-up is one pass),
        // to show how fast the cache converges.
        let pass = if trace.warmup > 0 {
            trace.warmup
        } else {
            counted.len().max(1)
        };
        let mut passes = Vec::new();
        for chunk in counted.chunks(pass) {
            let h0 = cache.stats().hits;
            for &p in chunk {
                let f = file.read_folio(p)?;
                sum = sum.wrapping_add(f.page(p).first().copied().unwrap_or(1) as u64);
            }
            passes.push(format!(
                "{:.1}",
                100.0 * (cache.stats().hits - h0) as f64 / chunk.len() as f64
            ));
        }
        if trace.warmup > 0 {
            eprintln!(
                "  (kxarray per-pass hit % after the warm-up on {}: {})",
                trace.name,
                passes.join(" ")
            );
        }
        let secs = t0.elapsed().as_secs_f64();
        let s = cache.stats();
        let (hits, misses) = (s.hits - before.hits, s.misses - before.misses);
        if hits + misses != counted.len() as u64 || sum != 0 {
            return Err(std::io::Error::other(format!(
                "counters do not add up: {hits} hits + {misses} misses for {} accesses (checksum {sum})",
                counted.len()
            )));
        }
        if s.readahead_pages > 0 {
            eprintln!(
                "  (kxarray: {} readahead pages on {})",
                s.readahead_pages, trace.name
            );
        }
        Ok(Outcome {
            hits,
            accesses: counted.len() as u64,
            secs,
        })
    }
}
