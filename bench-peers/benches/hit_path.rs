//! The hit path: cached 4 KiB lookups per second on one thread, every page
//! resident, kxarray's zero-copy `read_folio_in` (borrowed under one epoch
//! guard per 64 lookups) and `read_folio` (an `Arc`-holding reference, one
//! pin per call) against `quick_cache` and `moka` `get` (which hand out a
//! clone of an `Arc` to the page) on the same keys in the same order, in
//! interleaved rounds, with ratios to the first row.
//!
//! ```text
//! cargo bench -p kxarray-bench-peers --bench hit_path
//! cargo bench -p kxarray-bench-peers --bench hit_path -- --rounds 20 --pages 16384
//! # instructions per lookup under callgrind: two runs, the difference
//! # divided by the difference in lookups cancels the setup
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/hit_path-<hash> --iters 1000000
//! ```
//!
//! `--iters N` runs only N kxarray `read_folio_in` lookups (after the same
//! setup) and prints nothing but a checksum, for instruction counting.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resident pages by default (4 MiB of 4 KiB pages, so the pages' first
/// lines stay in the CPU caches and the lookup itself is measured);
/// `--pages N` changes it.
const DEFAULT_PAGES: u64 = 1024;
const PAGE: usize = 4096;
/// Lookups per timed slice per cache.
const SLICE: usize = 1 << 20;

type Page = Arc<[u8; PAGE]>;

fn page(i: u64) -> Page {
    let mut p = [0u8; PAGE];
    p[..8].copy_from_slice(&i.to_le_bytes());
    Arc::new(p)
}

/// One contender: `lookups(keys)` reads every key once and returns a
/// checksum of the first byte of each page (so nothing is optimised out,
/// and the run checks every lookup hit).
trait Contender {
    fn name(&self) -> &'static str;
    fn lookups(&self, keys: &[u64]) -> u64;
}

struct Quick(quick_cache::sync::Cache<u64, Page>);
impl Contender for Quick {
    fn name(&self) -> &'static str {
        "quick_cache get"
    }
    fn lookups(&self, keys: &[u64]) -> u64 {
        let mut sum = 0u64;
        for &k in keys {
            let p = self.0.get(&k).expect("resident");
            sum = sum.wrapping_add(p[0] as u64);
        }
        sum
    }
}

struct Moka(moka::sync::Cache<u64, Page>);
impl Contender for Moka {
    fn name(&self) -> &'static str {
        "moka get"
    }
    fn lookups(&self, keys: &[u64]) -> u64 {
        let mut sum = 0u64;
        for &k in keys {
            let p = self.0.get(&k).expect("resident");
            sum = sum.wrapping_add(p[0] as u64);
        }
        sum
    }
}

fn expected(keys: &[u64]) -> u64 {
    keys.iter().fold(0u64, |s, &k| s.wrapping_add(k & 0xff))
}

fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let pages: u64 = arg("--pages").unwrap_or(DEFAULT_PAGES).max(1);
    let mut keys: Vec<u64> = (0..pages).collect();
    keys.shuffle(&mut StdRng::seed_from_u64(7));
    let keys: Vec<u64> = keys.iter().cycle().take(SLICE).copied().collect();
    let want = expected(&keys);

    if let Some(iters) = arg::<u64>("--iters") {
        let kx = kx::Kx::new(pages).expect("kxarray page cache");
        let mut sum = 0u64;
        let mut left = iters;
        while left > 0 {
            let n = left.min(keys.len() as u64) as usize;
            sum = sum.wrapping_add(kx.lookups(&keys[..n]));
            left -= n as u64;
        }
        println!("kxarray: {iters} lookups, checksum {sum}");
        return;
    }

    let rounds: usize = arg("--rounds").unwrap_or(10);
    let mut contenders: Vec<Box<dyn Contender>> = Vec::new();
    match (kx::Kx::new(pages), kx::Kx::new(pages)) {
        (Ok(k), Ok(k2)) => {
            contenders.push(Box::new(k));
            contenders.push(Box::new(kx::KxRef(k2)));
        }
        (Err(e), _) | (_, Err(e)) => eprintln!("kxarray page cache unavailable: {e}"),
    }
    let q = quick_cache::sync::Cache::new(pages as usize * 2);
    let m = moka::sync::Cache::new(pages * 2);
    for i in 0..pages {
        q.insert(i, page(i));
        m.insert(i, page(i));
    }
    m.run_pending_tasks();
    contenders.push(Box::new(Quick(q)));
    contenders.push(Box::new(Moka(m)));

    // Warm-up round, and a check that every contender hit every key.
    for c in &contenders {
        assert_eq!(c.lookups(&keys), want, "{}: a lookup missed", c.name());
    }
    let mut time = vec![Duration::ZERO; contenders.len()];
    for r in 0..rounds {
        // Rotate who goes first, so drift on a shared machine hits all alike.
        for j in 0..contenders.len() {
            let i = (j + r) % contenders.len();
            let t0 = Instant::now();
            let s = contenders[i].lookups(black_box(&keys));
            time[i] += t0.elapsed();
            assert_eq!(s, want, "{}: a lookup missed", contenders[i].name());
        }
    }
    let total = (rounds * keys.len()) as f64;
    let rate: Vec<f64> = time.iter().map(|t| total / t.as_secs_f64()).collect();
    println!(
        "hit path, 1 thread, {pages} resident 4 KiB pages, {rounds} interleaved rounds of {} lookups",
        keys.len()
    );
    println!("| contender | lookups/s | ns/lookup | kxarray ratio |");
    println!("|---|---:|---:|---:|");
    for (i, c) in contenders.iter().enumerate() {
        println!(
            "| {} | {:.2}M | {:.1} | {} |",
            c.name(),
            rate[i] / 1e6,
            1e9 / rate[i],
            if contenders[0].name().starts_with("kxarray") {
                format!("{:.2}x", rate[0] / rate[i])
            } else {
                "-".into()
            }
        );
    }
}

/// The kxarray page cache as a contender: a file over a `RamDisk` whose
/// page `i` starts with `i`, every page read once into a cache twice as
/// large, then zero-copy `read_folio` lookups.
mod kx {
    use kxarray::backend::{Backend, RamDisk};
    use kxarray::pagecache::{CacheConfig, CachedFile, PageCache};

    pub struct Kx {
        // Field order: the file before the cache that holds it.
        file: CachedFile,
        _cache: PageCache,
    }

    impl Kx {
        pub fn new(pages: u64) -> std::io::Result<Kx> {
            let disk = RamDisk::new(pages * 4096);
            let mut p = vec![0u8; 4096];
            for i in 0..pages {
                p[..8].copy_from_slice(&i.to_le_bytes());
                disk.write_all_at(&p, i * 4096)?;
            }
            let cache = PageCache::new(
                CacheConfig::default()
                    .capacity(pages * 2 * 4096)
                    .flusher(false),
            );
            let file = cache.open(disk)?;
            for i in 0..pages {
                file.read_folio(i)?;
            }
            Ok(Kx {
                file,
                _cache: cache,
            })
        }
    }

    impl super::Contender for Kx {
        fn name(&self) -> &'static str {
            "kxarray read_folio_in"
        }
        /// Zero-copy borrows under one epoch guard per `BATCH` lookups (an
        /// engine parsing a batch of pages pins once for it).
        fn lookups(&self, keys: &[u64]) -> u64 {
            let mut sum = 0u64;
            for batch in keys.chunks(BATCH) {
                let guard = kxarray::pin();
                for &k in batch {
                    let f = self.file.read_folio_in(k, &guard).expect("resident");
                    sum = sum.wrapping_add(f.page(k)[0] as u64);
                }
            }
            sum
        }
    }

    /// Lookups per pinned guard in `read_folio_in`.
    pub const BATCH: usize = 64;

    /// The same cache through `read_folio` (an `Arc`-holding `FolioRef`,
    /// one pin per call).
    pub struct KxRef(pub Kx);

    impl super::Contender for KxRef {
        fn name(&self) -> &'static str {
            "kxarray read_folio"
        }
        fn lookups(&self, keys: &[u64]) -> u64 {
            let mut sum = 0u64;
            for &k in keys {
                let f = self.0.file.read_folio(k).expect("resident");
                sum = sum.wrapping_add(f.page(k)[0] as u64);
            }
            sum
        }
    }
}
