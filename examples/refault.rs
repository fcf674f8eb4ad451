//! The fio job of Kairui Song's `__filemap_add_folio` series (the kernel's
//! change that `add_folio` follows), in user space: random 4 KiB cached reads from a file
//! whose page cache is capped below the file size, so most misses refault
//! over a shadow entry.
//!
//! ```text
//! cargo run --release --example refault -- --seconds 3            # optimised vs legacy
//! cargo run --release --example refault -- --seconds 3 --thp      # the THP split case
//! cargo run --release --example refault -- --seconds 3 --legacy   # legacy only
//! ```
//!
//! A real temporary file (`--file-mib`, default 128) with deterministic
//! contents is created in `std::env::temp_dir()` and removed at the end.
//! By default misses copy the page from a RAM image of that file (`--backend
//! ram`, the analog of the series' `brd` RAM disk, so the page cache and not a
//! syscall dominates a miss); `--backend file` `pread`s it from the file.
//! `--threads` readers (default 4) each pick a random page; a read looks the
//! folio up lock-free (`lookup`); on a miss it reads the page, builds an
//! order-0 folio, adds it (`add_folio_stats`, or `add_folio_legacy_stats`
//! with `--legacy`), and if the cache holds more than `--cache-pct` (default
//! 50) percent of the file it evicts a random folio of the ones it added,
//! leaving a shadow that packs a global eviction counter. Every read's bytes
//! are checked against the file's pattern; any mismatch makes the exit code
//! non-zero.
//!
//! `--thp` first populates the whole cache with order-9 folios and evicts
//! them (order-9 shadows over the whole file), so the first order-0 miss in
//! each 2 MiB region must split a THP-sized shadow, as in the series' THP test.
//!
//! Without `--legacy` both algorithms run for `--seconds` each, in the same
//! process, on separate address spaces, in alternating slices of about
//! 0.5 s (pairs ordered optimised-legacy, then legacy-optimised), so load
//! from other processes hits both alike; the gain in IOPS is printed at the
//! end.
//!
//! The command line is `clap`, latencies go into an `hdrhistogram`, the
//! random pages and the file's pattern come from `rand` (seeded, so runs are
//! repeatable). The legacy-vs-one-walk comparison stays on bare
//! `AddressSpace`s, because the library's `PageCache` always adds folios
//! with the one-walk `add_folio` (the legacy algorithm exists only as
//! `filemap::legacy`); a last run (`--no-pagecache` skips it) puts the same
//! job through the library's `PageCache` at the same capacity, with its
//! two-list reclaim and shadows, and verifies every read the same way.

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use kxarray::backend::{Backend as KxBackend, FileBackend, RamDisk};
use kxarray::filemap::legacy::add_folio_legacy_stats;
use kxarray::filemap::{AddError, AddStats, AddressSpace, Folio, Shadow, ShadowFields, PAGE_SIZE};
use kxarray::pagecache::{CacheConfig, PageCache};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WORDS: usize = PAGE_SIZE / 8;
const K_PAGE: u64 = 0x9e37_79b9_7f4a_7c15;

/// The file's contents: word `j` of page `p` is `p * K_PAGE ^ table[j]`.
struct Pattern {
    table: Vec<u64>,
}

impl Pattern {
    fn new() -> Pattern {
        let mut rng = SmallRng::seed_from_u64(0x243f_6a88_85a3_08d3);
        let table = (0..WORDS).map(|_| rng.random()).collect();
        Pattern { table }
    }
    fn fill(&self, page: u64, out: &mut [u8]) {
        let pk = page.wrapping_mul(K_PAGE);
        for (w, t) in out.chunks_exact_mut(8).zip(&self.table) {
            w.copy_from_slice(&(pk ^ t).to_le_bytes());
        }
    }
    /// Whether `buf` holds exactly page `page`.
    fn check(&self, page: u64, buf: &[u8]) -> bool {
        let pk = page.wrapping_mul(K_PAGE);
        let mut acc = 0u64;
        for (w, t) in buf.chunks_exact(8).zip(&self.table) {
            acc |= u64::from_le_bytes(w.try_into().unwrap()) ^ t ^ pk;
        }
        acc == 0 && buf.len() == PAGE_SIZE
    }
}

/// Where misses read from: the temporary file (`pread`), or a RAM copy of
/// it, the analog of the series' `brd` RAM disk, so the page cache rather
/// than the syscall dominates a miss.
enum Backend {
    File(File),
    Ram(Vec<u8>),
}

impl Backend {
    fn read(&self, buf: &mut [u8], page: u64) {
        let off = page * PAGE_SIZE as u64;
        match self {
            Backend::File(f) => f.read_exact_at(buf, off).unwrap(),
            Backend::Ram(v) => {
                let off = off as usize;
                buf.copy_from_slice(&v[off..off + buf.len()]);
            }
        }
    }
}

/// The temporary file; removed on drop.
struct TempFile {
    path: PathBuf,
    file: File,
}

impl TempFile {
    fn create(pages: u64, pat: &Pattern) -> std::io::Result<TempFile> {
        let path = std::env::temp_dir().join(format!("kxarray-refault-{}.img", std::process::id()));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let t = TempFile {
            path,
            file: file.try_clone()?,
        };
        let mut chunk = vec![0u8; 256 * PAGE_SIZE];
        let mut p = 0u64;
        while p < pages {
            let n = (pages - p).min(256) as usize;
            for (i, page) in chunk[..n * PAGE_SIZE]
                .chunks_exact_mut(PAGE_SIZE)
                .enumerate()
            {
                pat.fill(p + i as u64, page);
            }
            file.write_all(&chunk[..n * PAGE_SIZE])?;
            p += n as u64;
        }
        file.flush()?;
        Ok(t)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Optimised,
    Legacy,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Optimised => "optimised",
            Mode::Legacy => "legacy",
        }
    }
}

/// The `__filemap_add_folio` series' fio job in user space: random cached 4 KiB reads through a
/// page cache smaller than the file, one-walk `add_folio` against the
/// legacy algorithm.
#[derive(Parser, Debug)]
#[command(about)]
struct Config {
    /// Seconds per mode.
    #[arg(long, default_value_t = 5.0, value_parser = positive_f64)]
    seconds: f64,
    /// Reader threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: u64,
    /// Run the legacy algorithm only.
    #[arg(long)]
    legacy: bool,
    /// First populate and evict order-9 folios (the series' THP case).
    #[arg(long)]
    thp: bool,
    /// Size of the temporary file in MiB.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(4..=1 << 20))]
    file_mib: u64,
    /// Page cache cap, in percent of the file.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=99))]
    cache_pct: u64,
    /// Where misses read from.
    #[arg(long, value_enum, default_value_t = BackendKind::Ram)]
    backend: BackendKind,
    /// Skip the last run, the same job through the library's `PageCache`.
    #[arg(long)]
    no_pagecache: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// A RAM copy of the file (the series' brd device).
    Ram,
    /// `pread` from the temporary file.
    File,
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s}: expected a positive number")),
    }
}

/// What one thread (or a whole run) counted.
struct Tally {
    reads: u64,
    hits: u64,
    adds: u64,
    refaults: u64,
    /// Refaults whose distance (evictions since) was below the cache size.
    workingset: u64,
    races: u64,
    split_adds: u64,
    evictions: u64,
    mismatches: u64,
    stats: AddStats,
    hist: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            reads: 0,
            hits: 0,
            adds: 0,
            refaults: 0,
            workingset: 0,
            races: 0,
            split_adds: 0,
            evictions: 0,
            mismatches: 0,
            stats: AddStats::default(),
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
        }
    }
    fn merge(&mut self, o: &Tally) {
        self.reads += o.reads;
        self.hits += o.hits;
        self.adds += o.adds;
        self.refaults += o.refaults;
        self.workingset += o.workingset;
        self.races += o.races;
        self.split_adds += o.split_adds;
        self.evictions += o.evictions;
        self.mismatches += o.mismatches;
        self.stats += o.stats;
        self.hist
            .add(&o.hist)
            .expect("histograms of the same precision merge");
    }
}

/// One address space under test, with what its threads own.
struct Cache {
    mode: Mode,
    space: AddressSpace,
    /// The global eviction clock packed into shadows.
    clock: AtomicU64,
    /// Folios each thread added (its eviction candidates), kept across phases.
    owned: Vec<Mutex<Vec<Arc<Folio>>>>,
    tally: Tally,
    elapsed: Duration,
}

fn shadow(eviction: u64) -> Shadow {
    Shadow::pack(ShadowFields {
        eviction,
        memcg: 0,
        node: 0,
        workingset: false,
    })
    .unwrap()
}

impl Cache {
    fn new(mode: Mode, threads: usize) -> Cache {
        Cache {
            mode,
            space: AddressSpace::new(),
            clock: AtomicU64::new(0),
            owned: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
            tally: Tally::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// The series' THP pre-phase: every 2 MiB of the file cached as an
    /// order-9 folio, then reclaimed, leaving order-9 shadows.
    fn populate_thp(&self, pages: u64, file: &Backend) {
        let mut buf = vec![0u8; PAGE_SIZE << 9];
        for base in (0..pages & !511).step_by(512) {
            let f = Arc::new(Folio::new(base, 9).unwrap());
            file.read(&mut buf, base);
            f.fill(&buf);
            self.space.add_folio(&f).unwrap();
            let e = self.clock.fetch_add(1, Ordering::Relaxed);
            assert!(self.space.remove_folio(&f, Some(shadow(e))));
        }
        assert_eq!(self.space.nr_pages(), 0);
    }

    #[inline]
    fn add(&self, f: &Arc<Folio>, st: &mut AddStats) -> Result<Option<Shadow>, AddError> {
        match self.mode {
            Mode::Optimised => self.space.add_folio_stats(f, st),
            Mode::Legacy => add_folio_legacy_stats(&self.space, f, st),
        }
    }

    /// One reader thread until `stop`.
    #[allow(clippy::too_many_arguments)]
    fn reader(
        &self,
        id: usize,
        seed: u64,
        pages: u64,
        cap: u64,
        file: &Backend,
        pat: &Pattern,
        stop: &AtomicBool,
    ) -> Tally {
        let mut t = Tally::new();
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut owned = self.owned[id].lock().unwrap();
        let mut buf = vec![0u8; PAGE_SIZE];
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..32 {
                let idx = rng.random_range(0..pages);
                let t0 = Instant::now();
                loop {
                    if let Some(f) = self.space.lookup(idx) {
                        let n = f.read((idx - f.index()) as usize * PAGE_SIZE, &mut buf);
                        if n != PAGE_SIZE {
                            t.mismatches += 1;
                        }
                        t.hits += 1;
                        break;
                    }
                    // miss: read the page, add it, maybe evict
                    let mut page = vec![0u8; PAGE_SIZE];
                    file.read(&mut page, idx);
                    let f = Arc::new(Folio::new(idx, 0).unwrap());
                    f.fill(&page);
                    let mut st = AddStats::default();
                    let r = self.add(&f, &mut st);
                    t.stats += st;
                    match r {
                        Ok(old) => {
                            t.adds += 1;
                            if st.nodes > 0 {
                                t.split_adds += 1;
                            }
                            if let Some(s) = old {
                                t.refaults += 1;
                                let now = self.clock.load(Ordering::Relaxed);
                                if now.wrapping_sub(s.unpack().eviction) < cap {
                                    t.workingset += 1;
                                }
                            }
                            f.read(0, &mut buf);
                            owned.push(f);
                            if self.space.nr_pages() > cap && !owned.is_empty() {
                                let i = rng.random_range(0..owned.len());
                                let victim = owned.swap_remove(i);
                                let e = self.clock.fetch_add(1, Ordering::Relaxed);
                                if self.space.remove_folio(&victim, Some(shadow(e))) {
                                    t.evictions += 1;
                                }
                            }
                            break;
                        }
                        Err(AddError::Exists) => {
                            // another reader added it first: look it up again
                            t.races += 1;
                        }
                        Err(e) => panic!("add_folio: {e}"),
                    }
                }
                t.hist.saturating_record(t0.elapsed().as_nanos() as u64);
                t.reads += 1;
                if !pat.check(idx, &buf) {
                    t.mismatches += 1;
                }
            }
        }
        t
    }

    /// Run `threads` readers for `dur`, adding to this cache's tally.
    #[allow(clippy::too_many_arguments)] // one call site; the parameters are the run's knobs
    fn phase(
        &mut self,
        cfg: &Config,
        phase: u64,
        pages: u64,
        cap: u64,
        file: &Backend,
        pat: &Pattern,
        dur: Duration,
    ) {
        let stop = AtomicBool::new(false);
        let this = &*self;
        let start = Instant::now();
        let tallies: Vec<Tally> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..cfg.threads as usize)
                .map(|id| {
                    let stop = &stop;
                    let seed = 0x5eed_0000 + (phase << 8) + id as u64;
                    s.spawn(move || this.reader(id, seed, pages, cap, file, pat, stop))
                })
                .collect();
            std::thread::sleep(dur);
            stop.store(true, Ordering::Relaxed);
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        self.elapsed += start.elapsed();
        for t in &tallies {
            self.tally.merge(t);
        }
    }

    fn iops(&self) -> f64 {
        self.tally.reads as f64 / self.elapsed.as_secs_f64()
    }

    fn report(&self, cfg: &Config) {
        let t = &self.tally;
        let secs = self.elapsed.as_secs_f64();
        let iops = self.iops();
        let bw = iops * PAGE_SIZE as f64 / (1 << 20) as f64;
        let io_gib = t.reads as f64 * PAGE_SIZE as f64 / (1u64 << 30) as f64;
        let k = |x: f64| {
            if x >= 1e6 {
                format!("{:.2}M", x / 1e6)
            } else if x >= 1e3 {
                format!("{:.1}k", x / 1e3)
            } else {
                format!("{x:.0}")
            }
        };
        let adds = t.adds.max(1) as f64;
        println!(
            "cached ({}): (groupid=0, jobs={}): rw=randread, bs=4KiB, thp={}",
            self.mode.name(),
            cfg.threads,
            cfg.thp as u8
        );
        println!(
            "  read: IOPS={}, BW={:.0}MiB/s ({:.0}MB/s)({:.2}GiB/{}msec)",
            k(iops),
            bw,
            iops * PAGE_SIZE as f64 / 1e6,
            io_gib,
            (secs * 1000.0) as u64
        );
        println!(
            "    clat (nsec): 50.00th=[{}], 90.00th=[{}], 99.00th=[{}], 99.90th=[{}], 99.99th=[{}]",
            t.hist.value_at_quantile(0.5),
            t.hist.value_at_quantile(0.9),
            t.hist.value_at_quantile(0.99),
            t.hist.value_at_quantile(0.9990000000000001),
            t.hist.value_at_quantile(0.9998999999999999)
        );
        println!(
            "  cache: hits={} ({:.1}%), misses/adds={}, refaults seen={} ({:.1}% of adds; workingset {}), evictions={}, EEXIST races={}",
            t.hits,
            100.0 * t.hits as f64 / t.reads.max(1) as f64,
            t.adds,
            t.refaults,
            100.0 * t.refaults as f64 / adds,
            t.workingset,
            t.evictions,
            t.races
        );
        println!(
            "  add_folio: {:.3} walks/add, {:.4} nodes/add, {:.4} relocks/add, adds that allocated nodes (splits, new leaves)={}",
            t.stats.walks as f64 / adds,
            t.stats.nodes as f64 / adds,
            t.stats.relocks as f64 / adds,
            t.split_adds
        );
        println!(
            "  verify: {} reads checked, {} mismatches",
            t.reads, t.mismatches
        );
    }
}

/// The same job through the library's `PageCache` (one-walk `add_folio`,
/// two-list reclaim with shadows instead of random eviction) over a
/// `RamDisk` holding the file's pattern (or the file itself with `--backend
/// file`), at the same capacity, for `--seconds`: what the whole cache costs
/// on top of the bare address space. Returns the number of mismatching reads.
fn pagecache_run(
    cfg: &Config,
    pages: u64,
    cap: u64,
    pat: &Pattern,
    tmp: &TempFile,
) -> std::io::Result<u64> {
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(cap * PAGE_SIZE as u64)
            .flusher(false),
    );
    let file = if cfg.backend == BackendKind::Ram {
        let disk = RamDisk::new(pages * PAGE_SIZE as u64);
        let mut page = vec![0u8; PAGE_SIZE];
        for p in 0..pages {
            pat.fill(p, &mut page);
            KxBackend::write_all_at(&disk, &page, p * PAGE_SIZE as u64)?;
        }
        cache.open(disk)?
    } else {
        cache.open(FileBackend::from_file(tmp.file.try_clone()?))?
    };
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let results: Vec<std::io::Result<(u64, u64, Histogram<u64>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.threads)
            .map(|id| {
                let (file, stop) = (&file, &stop);
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(0x5eed_f00d + id);
                    let mut hist =
                        Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
                    let (mut reads, mut bad) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..32 {
                            let idx = rng.random_range(0..pages);
                            let t0 = Instant::now();
                            let f = file.read_folio(idx)?;
                            hist.saturating_record(t0.elapsed().as_nanos() as u64);
                            if !pat.check(idx, f.page(idx)) {
                                bad += 1;
                            }
                            reads += 1;
                        }
                    }
                    Ok((reads, bad, hist))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(cfg.seconds));
        stop.store(true, Ordering::Relaxed);
        hs.into_iter()
            .map(|h| h.join().expect("reader panicked"))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let (mut reads, mut bad) = (0u64, 0u64);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    for r in results {
        let (n, b, h) = r?;
        reads += n;
        bad += b;
        hist.add(&h).expect("same bounds");
    }
    let st = cache.stats();
    let iops = reads as f64 / secs;
    println!(
        "cached (library PageCache, one-walk add_folio, two-list reclaim): (groupid=0, jobs={}): rw=randread, bs=4KiB",
        cfg.threads
    );
    println!(
        "  read: IOPS={:.1}k, BW={:.0}MiB/s ({}msec)",
        iops / 1e3,
        iops * PAGE_SIZE as f64 / (1 << 20) as f64,
        (secs * 1000.0) as u64
    );
    println!(
        "    clat (nsec): 50.00th=[{}], 90.00th=[{}], 99.00th=[{}], 99.90th=[{}], 99.99th=[{}]",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.9),
        hist.value_at_quantile(0.99),
        hist.value_at_quantile(0.999),
        hist.value_at_quantile(0.9999)
    );
    println!(
        "  cache: hits={} ({:.1}%), misses={}, refaults={}, activations={}, evictions={}, shadows={}",
        st.hits,
        100.0 * st.hit_ratio(),
        st.misses,
        st.refaults,
        st.activations,
        st.evictions,
        st.shadows
    );
    println!("  verify: {reads} reads checked, {bad} mismatches");
    Ok(bad)
}

fn main() -> ExitCode {
    let cfg = Config::parse();
    let pages = cfg.file_mib * 256;
    let cap = pages * cfg.cache_pct / 100;
    let pat = Pattern::new();
    let t0 = Instant::now();
    let tmp = match TempFile::create(pages, &pat) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot create the temporary file: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "file {} ({} MiB, {} pages, written in {:.2}s), page cache cap {} pages ({}%), {} threads, {}s per mode{}",
        tmp.path.display(),
        cfg.file_mib,
        pages,
        t0.elapsed().as_secs_f64(),
        cap,
        cfg.cache_pct,
        cfg.threads,
        cfg.seconds,
        if cfg.thp { ", THP pre-phase (order-9 shadows)" } else { "" }
    );
    let backend = if cfg.backend == BackendKind::Ram {
        let mut v = vec![0u8; pages as usize * PAGE_SIZE];
        Backend::File(tmp.file.try_clone().expect("dup file")).read(&mut v, 0);
        Backend::Ram(v)
    } else {
        Backend::File(tmp.file.try_clone().expect("dup file"))
    };
    println!(
        "backend: {}",
        if cfg.backend == BackendKind::Ram {
            "ram (a RAM copy of the file, like the series' brd device)"
        } else {
            "file (pread)"
        }
    );
    let dur = Duration::from_secs_f64(cfg.seconds);
    let mut caches: Vec<Cache> = if cfg.legacy {
        vec![Cache::new(Mode::Legacy, cfg.threads as usize)]
    } else {
        vec![
            Cache::new(Mode::Optimised, cfg.threads as usize),
            Cache::new(Mode::Legacy, cfg.threads as usize),
        ]
    };
    if cfg.thp {
        for c in &caches {
            c.populate_thp(pages, &backend);
        }
    }
    if caches.len() == 1 {
        caches[0].phase(&cfg, 0, pages, cap, &backend, &pat, dur);
    } else {
        // Alternate slices of about 0.5 s per mode, in ABBA order, so that
        // load from other processes hits both modes alike.
        let pairs = ((cfg.seconds / 0.5).round() as u32).max(1);
        let slice = dur / pairs;
        let mut phase = 0u64;
        for p in 0..pairs {
            let order = if p % 2 == 0 { [0usize, 1] } else { [1, 0] };
            for which in order {
                caches[which].phase(&cfg, phase, pages, cap, &backend, &pat, slice);
                phase += 1;
            }
        }
    }
    let mut mismatches = 0;
    for c in &caches {
        c.report(&cfg);
        mismatches += c.tally.mismatches;
        if let Err(e) = c.space.pages().check_invariants() {
            eprintln!("{}: invariant broken: {e}", c.mode.name());
            mismatches += 1;
        }
    }
    if caches.len() == 2 {
        let (o, l) = (&caches[0], &caches[1]);
        println!(
            "gain optimised vs legacy: IOPS {:+.1}% ({:.0} vs {:.0}); walks/add {:.2} vs {:.2}; nodes/add {:.4} vs {:.4}",
            (o.iops() / l.iops() - 1.0) * 100.0,
            o.iops(),
            l.iops(),
            o.tally.stats.walks as f64 / o.tally.adds.max(1) as f64,
            l.tally.stats.walks as f64 / l.tally.adds.max(1) as f64,
            o.tally.stats.nodes as f64 / o.tally.adds.max(1) as f64,
            l.tally.stats.nodes as f64 / l.tally.adds.max(1) as f64,
        );
    }
    if !cfg.no_pagecache {
        match pagecache_run(&cfg, pages, cap, &pat, &tmp) {
            Ok(bad) => mismatches += bad,
            Err(e) => {
                eprintln!("pagecache run: {e}");
                mismatches += 1;
            }
        }
    }
    drop(tmp);
    println!("total {:.2}s", t0.elapsed().as_secs_f64());
    if mismatches > 0 {
        eprintln!("FAILED: {mismatches} mismatching reads");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
