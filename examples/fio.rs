//! A fio-like job runner over the library's page cache: buffered reads and
//! writes of `--bs` blocks through a [`PageCache`] smaller than the file,
//! with fio-style IOPS, bandwidth and latency percentiles, the cache's
//! counters, and a verify pass.
//!
//! ```text
//! cargo run --release --example fio                      # a short mixed job on a temp file
//! cargo run --release --example fio -- --rw randread --bs 4k --size 256m --cache-size 128m --numjobs 2 --runtime 5
//! cargo run --release --example fio -- --rw write --fsync 64 --filename /tmp/test.img
//! cargo run --release --example fio -- --backend ram --rw randrw --rwmixread 50
//! cargo run --release --example fio -- --rw randwrite --bs 4k --size 64M --fsync 1 --folio-size 64k --compare 3
//! ```
//!
//! Writes allocate folios of `--folio-size` bytes whose dirty state is kept
//! per `--block-size` block; `--whole-folio` keeps it per folio instead (the
//! baseline of seed 004). Every write job prints `write amplification: X`,
//! the bytes the cache wrote to the backend (up to the final sync) per
//! byte the job wrote. `--compare N` runs the job N times in block mode and
//! N times in whole-folio mode, interleaved, and prints both side by side.
//!
//! The file (a temporary file by default, `--filename` for a real one, or a
//! [`RamDisk`] with `--backend ram`) is first laid out directly on the
//! backend with a stamp in every block, then opened through a cold cache.
//! Job `j` of `--numjobs` owns the `j`-th slice of the file, so it knows the
//! stamp every one of its blocks must carry: every read during the run is
//! checked against it, and after the run the file is synced, its cached
//! folios dropped (`invalidate`), and every block read back from the
//! backend and checked again. A stamp names its block and the generation of
//! the write that made it, so a torn, misplaced, stale or lost block is
//! caught. Any mismatch or I/O error makes the exit code non-zero.
//!
//! The progress bar (`indicatif`) is drawn only when stdout is a terminal
//! and `--quiet` is not given.

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use kxarray::backend::{Backend, FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, CacheStats, CachedFile, FileOptions, PageCache};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fio-like runner over a kxarray page cache.
#[derive(Parser, Debug, Clone)]
#[command(about, long_about = None)]
struct Args {
    /// I/O pattern.
    #[arg(long, value_enum, default_value_t = Rw::Randrw)]
    rw: Rw,
    /// Percentage of reads in a randrw job.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,
    /// Block size (bytes; k/m/g suffixes), a multiple of 8, at least 16.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// File size (k/m/g suffixes); rounded down to whole blocks per job.
    #[arg(long, default_value = "64m", value_parser = parse_size)]
    size: u64,
    /// Concurrent jobs (threads), each on its own slice of the file.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    numjobs: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 3.0, value_parser = parse_secs)]
    runtime: f64,
    /// Sync the file after every N writes of a job (0: never).
    #[arg(long, default_value_t = 0)]
    fsync: u64,
    /// Page cache capacity (k/m/g suffixes).
    #[arg(long, default_value = "32m", value_parser = parse_size)]
    cache_size: u64,
    /// Largest folio order readahead may allocate.
    #[arg(long, default_value_t = 4)]
    max_folio_order: u32,
    /// Where the file lives.
    #[arg(long, value_enum, default_value_t = BackendKind::File)]
    backend: BackendKind,
    /// A real file to use (created or overwritten) instead of a temporary
    /// one; only with `--backend file`.
    #[arg(long)]
    filename: Option<PathBuf>,
    /// Bytes of the folios writes allocate (4k..2m, a power of two).
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    folio_size: u64,
    /// Bytes per block of dirty/uptodate state (512..4k, a power of two).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    block_size: u64,
    /// Track dirty state per folio, not per block (the baseline).
    #[arg(long)]
    whole_folio: bool,
    /// Run the job N times per mode, block and whole-folio interleaved, and
    /// print the two side by side.
    #[arg(long, default_value_t = 0)]
    compare: u32,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Rw {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random mixed reads and writes (`--rwmixread`).
    Randrw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// A file (`pread`/`pwrite`).
    File,
    /// The crate's RAM disk.
    Ram,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").or(t.strip_suffix('b')).unwrap_or(&t);
    let (num, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s}: not a size"))?;
    n.checked_mul(1 << shift)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s}: size out of range"))
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('s').parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s}: expected a positive number of seconds")),
    }
}

/// The stamp of block `block` written by generation `gen`: word 0 is the
/// block number, word 1 the generation, every other word a mix of both.
fn stamp_word(block: u64, gen: u64) -> u64 {
    (block.rotate_left(24) ^ gen).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

fn stamp(buf: &mut [u8], block: u64, gen: u64) {
    let w = stamp_word(block, gen).to_le_bytes();
    buf[..8].copy_from_slice(&block.to_le_bytes());
    buf[8..16].copy_from_slice(&gen.to_le_bytes());
    for c in buf[16..].chunks_exact_mut(8) {
        c.copy_from_slice(&w);
    }
}

/// Whether `buf` is exactly the stamp of (`block`, `gen`); else a
/// description of what it holds.
fn check(buf: &[u8], block: u64, gen: u64) -> Result<(), String> {
    let word = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap());
    let w = stamp_word(block, gen);
    if word(0) == block && word(1) == gen && (2..buf.len() / 8).all(|i| word(i) == w) {
        Ok(())
    } else {
        Err(format!(
            "block {block}: want generation {gen}, found header (block {}, generation {}){}",
            word(0),
            word(1),
            if word(0) == block && word(1) == gen {
                " with a torn body"
            } else {
                ""
            }
        ))
    }
}

/// What one job measured.
struct JobResult {
    read: Histogram<u64>,
    write: Histogram<u64>,
    sync: Histogram<u64>,
    read_bytes: u64,
    write_bytes: u64,
    mismatches: Vec<String>,
    error: Option<io::Error>,
    /// The generation each block of the job's slice holds now.
    gens: Vec<u64>,
    first_block: u64,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds")
}

struct Job<'a> {
    args: &'a Args,
    file: &'a CachedFile,
    id: u64,
    first_block: u64,
    blocks: u64,
    stop: &'a AtomicBool,
    ops: &'a AtomicU64,
}

impl Job<'_> {
    fn run(&self) -> JobResult {
        let a = self.args;
        let bs = a.bs as usize;
        let mut r = JobResult {
            read: hist(),
            write: hist(),
            sync: hist(),
            read_bytes: 0,
            write_bytes: 0,
            mismatches: Vec::new(),
            error: None,
            gens: vec![0; self.blocks as usize],
            first_block: self.first_block,
        };
        let mut rng = SmallRng::seed_from_u64(a.seed.wrapping_mul(1000).wrapping_add(self.id));
        let mut buf = vec![0u8; bs];
        let mut next_seq = 0u64;
        let mut writes_since_sync = 0u64;
        let mut n = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            let (rel, write) = match a.rw {
                Rw::Read | Rw::Write => {
                    let b = next_seq;
                    next_seq = (next_seq + 1) % self.blocks;
                    (b, a.rw == Rw::Write)
                }
                Rw::Randread => (rng.random_range(0..self.blocks), false),
                Rw::Randwrite => (rng.random_range(0..self.blocks), true),
                Rw::Randrw => (
                    rng.random_range(0..self.blocks),
                    rng.random_range(0..100u8) >= a.rwmixread,
                ),
            };
            let block = self.first_block + rel;
            let off = block * a.bs;
            let res = if write {
                let gen = r.gens[rel as usize] + 1;
                stamp(&mut buf, block, gen);
                let t0 = Instant::now();
                let res = self.file.write_at(&buf, off);
                r.write.saturating_record(t0.elapsed().as_nanos() as u64);
                res.and_then(|w| {
                    if w == bs {
                        r.gens[rel as usize] = gen;
                        r.write_bytes += bs as u64;
                        Ok(())
                    } else {
                        Err(io::Error::new(io::ErrorKind::WriteZero, "short write"))
                    }
                })
            } else {
                let t0 = Instant::now();
                let res = self.file.read_at(&mut buf, off);
                r.read.saturating_record(t0.elapsed().as_nanos() as u64);
                res.and_then(|got| {
                    if got != bs {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("short read at {off}: {got} of {bs}"),
                        ));
                    }
                    r.read_bytes += bs as u64;
                    if let Err(e) = check(&buf, block, r.gens[rel as usize]) {
                        r.mismatches.push(format!("during the run: {e}"));
                    }
                    Ok(())
                })
            };
            if let Err(e) = res {
                r.error = Some(e);
                break;
            }
            if write && a.fsync > 0 {
                writes_since_sync += 1;
                if writes_since_sync == a.fsync {
                    writes_since_sync = 0;
                    let t0 = Instant::now();
                    if let Err(e) = self.file.sync() {
                        r.error = Some(e);
                        break;
                    }
                    r.sync.saturating_record(t0.elapsed().as_nanos() as u64);
                }
            }
            n += 1;
            if n.is_multiple_of(64) {
                self.ops.fetch_add(64, Ordering::Relaxed);
            }
        }
        r
    }
}

/// fio's unit style: 1.2k, 3.4M.
fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn bytes(x: u64) -> String {
    if x == 0 {
        return "0B".into();
    }
    if x < 1 << 30 && x.is_multiple_of(1 << 20) {
        return format!("{}MiB", x >> 20);
    }
    if x < 1 << 20 && x.is_multiple_of(1024) {
        return format!("{}KiB", x >> 10);
    }
    let x = x as f64;
    if x >= (1u64 << 30) as f64 {
        format!("{:.2}GiB", x / (1u64 << 30) as f64)
    } else if x >= (1 << 20) as f64 {
        format!("{:.1}MiB", x / (1 << 20) as f64)
    } else {
        format!("{:.1}KiB", x / 1024.0)
    }
}

fn print_dir(name: &str, h: &Histogram<u64>, total_bytes: u64, msec: u64) {
    if h.is_empty() {
        return;
    }
    let secs = msec.max(1) as f64 / 1000.0;
    let iops = h.len() as f64 / secs;
    let bw = total_bytes as f64 / secs;
    println!(
        "  {name}: IOPS={}, BW={:.0}MiB/s ({:.0}MB/s)({}/{msec}msec)",
        si(iops),
        bw / (1 << 20) as f64,
        bw / 1e6,
        bytes(total_bytes)
    );
    println!(
        "    clat (nsec): min={}, max={}, avg={:.0}, stdev={:.0}",
        h.min(),
        h.max(),
        h.mean(),
        h.stdev()
    );
    println!("    clat percentiles (nsec):");
    let q = |p: f64| h.value_at_quantile(p / 100.0);
    println!(
        "     |  1.00th=[{}], 5.00th=[{}], 10.00th=[{}], 50.00th=[{}], 90.00th=[{}],",
        q(1.0),
        q(5.0),
        q(10.0),
        q(50.0),
        q(90.0)
    );
    println!(
        "     | 99.00th=[{}], 99.50th=[{}], 99.90th=[{}], 99.99th=[{}]",
        q(99.0),
        q(99.5),
        q(99.9),
        q(99.99)
    );
}

fn print_stats(s: &CacheStats) {
    println!(
        "  cache: hits={} ({:.1}%), misses={}, refaults={}, activations={}, evictions={}, readahead pages={}",
        s.hits,
        100.0 * s.hit_ratio(),
        s.misses,
        s.refaults,
        s.activations,
        s.evictions,
        s.readahead_pages
    );
    println!(
        "  cache: cached pages={}, shadows={}, shadow nodes reclaimed={}, dirty={}, writeback={}, backend read={}, backend written={}",
        s.cached_pages,
        s.shadows,
        s.shadow_nodes_reclaimed,
        bytes(s.dirty_bytes),
        bytes(s.writeback_bytes),
        bytes(s.backend_read_bytes),
        bytes(s.backend_written_bytes)
    );
}

/// Lay the file out directly on the backend (every block stamped with
/// generation 0), so the run starts on a cold cache.
fn lay_out(b: &dyn Backend, blocks: u64, bs: u64) -> io::Result<()> {
    let per = (1 << 20) / bs.min(1 << 20);
    let mut chunk = vec![0u8; (per * bs) as usize];
    let mut blk = 0;
    while blk < blocks {
        let n = per.min(blocks - blk);
        for (i, c) in chunk[..(n * bs) as usize]
            .chunks_exact_mut(bs as usize)
            .enumerate()
        {
            stamp(c, blk + i as u64, 0);
        }
        b.write_all_at(&chunk[..(n * bs) as usize], blk * bs)?;
        blk += n;
    }
    b.flush()
}

fn main() -> ExitCode {
    let a = Args::parse();
    let res = if a.compare > 0 {
        compare(&a)
    } else {
        run(&a).map(|o| o.ok)
    };
    match res {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fio: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What one run measured, for `--compare`.
struct Outcome {
    ok: bool,
    write_iops: f64,
    wa: f64,
    sync_p50_us: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `--compare N`: block mode and whole-folio mode, interleaved.
fn compare(a: &Args) -> io::Result<bool> {
    let mut rows: [Vec<Outcome>; 2] = [Vec::new(), Vec::new()];
    for round in 0..a.compare {
        for (m, whole) in [false, true].into_iter().enumerate() {
            let mut b = a.clone();
            b.whole_folio = whole;
            b.compare = 0;
            b.seed = a.seed + round as u64;
            println!(
                "\n=== round {} of {}, {} ===",
                round + 1,
                a.compare,
                if whole { "whole-folio" } else { "per-block" }
            );
            rows[m].push(run(&b)?);
        }
    }
    println!(
        "\nseed 004 side by side ({} rounds each, interleaved; medians):",
        a.compare
    );
    println!("| mode | write IOPS | write amplification | sync p50 (us) | IOPS per round |");
    println!("|---|---|---|---|---|");
    let mut med = [0.0; 2];
    for (m, name) in ["per-block", "whole-folio"].into_iter().enumerate() {
        let mut iops: Vec<f64> = rows[m].iter().map(|o| o.write_iops).collect();
        let per_round = iops.iter().map(|x| si(*x)).collect::<Vec<_>>().join(" / ");
        med[m] = median(&mut iops);
        let mut wa: Vec<f64> = rows[m].iter().map(|o| o.wa).collect();
        let mut sy: Vec<f64> = rows[m].iter().map(|o| o.sync_p50_us).collect();
        println!(
            "| {name} | {} | {:.2} | {:.1} | {per_round} |",
            si(med[m]),
            median(&mut wa),
            median(&mut sy)
        );
    }
    println!(
        "per-block / whole-folio IOPS: {:.2}x ({:+.0}%)",
        med[0] / med[1],
        100.0 * (med[0] / med[1] - 1.0)
    );
    Ok(rows.iter().flatten().all(|o| o.ok))
}

fn run(a: &Args) -> io::Result<Outcome> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if a.bs < 16 || !a.bs.is_multiple_of(8) {
        return Err(invalid(format!(
            "--bs {}: must be a multiple of 8, at least 16",
            a.bs
        )));
    }
    let per_job = a.size / a.numjobs / a.bs;
    if per_job == 0 {
        return Err(invalid(format!(
            "--size {} is smaller than --numjobs x --bs",
            a.size
        )));
    }
    if a.filename.is_some() && a.backend == BackendKind::Ram {
        return Err(invalid("--filename needs --backend file".into()));
    }
    let blocks = per_job * a.numjobs;
    let size = blocks * a.bs;
    let mut _temp = None;
    let (backend, where_): (Arc<dyn Backend>, String) = match a.backend {
        BackendKind::Ram => (Arc::new(RamDisk::new(size)), "ram disk".into()),
        BackendKind::File => {
            let (file, path) = match &a.filename {
                Some(p) => (
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(p)?,
                    p.display().to_string(),
                ),
                None => {
                    let t = tempfile::NamedTempFile::new()?;
                    let f = t.reopen()?;
                    let p = t.path().display().to_string();
                    _temp = Some(t);
                    (f, p)
                }
            };
            file.set_len(size)?;
            (Arc::new(FileBackend::from_file(file)), path)
        }
    };
    println!(
        "fio (kxarray page cache): rw={}{}, bs={}, size={}, numjobs={}, runtime={}s, fsync={}, cache={}, backend={where_}",
        a.rw.to_possible_value().expect("no skipped variants").get_name(),
        if a.rw == Rw::Randrw {
            format!(" (rwmixread={})", a.rwmixread)
        } else {
            String::new()
        },
        bytes(a.bs),
        bytes(size),
        a.numjobs,
        a.runtime,
        a.fsync,
        bytes(a.cache_size),
    );
    println!(
        "folios: writes allocate {}, dirty state per {}",
        bytes(a.folio_size),
        if a.whole_folio {
            "folio (--whole-folio)".to_string()
        } else {
            format!("{} block", bytes(a.block_size))
        }
    );
    let t0 = Instant::now();
    lay_out(&*backend, blocks, a.bs)?;
    println!(
        "laid out {} blocks in {:.2}s",
        blocks,
        t0.elapsed().as_secs_f64()
    );
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(a.cache_size)
            .max_folio_order(a.max_folio_order),
    );
    let opts = FileOptions::default()
        .block_size(u32::try_from(a.block_size).unwrap_or(0))
        .folio_size(a.folio_size)
        .whole_folio(a.whole_folio);
    let file = cache.open_with(backend, opts)?;
    let written_before = cache.stats().backend_written_bytes;

    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let bar = if a.quiet || !io::stdout().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new((a.runtime * 1000.0) as u64);
        b.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:40} {msg}")
                .expect("a valid template"),
        );
        b
    };
    let runtime = Duration::from_secs_f64(a.runtime);
    let start = Instant::now();
    let results: Vec<JobResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.numjobs)
            .map(|id| {
                let job = Job {
                    args: a,
                    file: &file,
                    id,
                    first_block: id * per_job,
                    blocks: per_job,
                    stop: &stop,
                    ops: &ops,
                };
                s.spawn(move || job.run())
            })
            .collect();
        let mut last = (Instant::now(), 0u64);
        while start.elapsed() < runtime && !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(
                Duration::from_millis(100).min(runtime.saturating_sub(start.elapsed())),
            );
            let now = (Instant::now(), ops.load(Ordering::Relaxed));
            let rate = (now.1 - last.1) as f64 / (now.0 - last.0).as_secs_f64().max(1e-9);
            bar.set_position(start.elapsed().as_millis() as u64);
            bar.set_message(format!("{} IOPS", si(rate)));
            last = now;
        }
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().expect("a job panicked"))
            .collect()
    });
    let msec = start.elapsed().as_millis() as u64;
    bar.finish_and_clear();

    let mut read = hist();
    let mut write = hist();
    let mut sync = hist();
    let (mut rb, mut wb) = (0, 0);
    let mut ok = true;
    let mut mismatches = Vec::new();
    for r in &results {
        read.add(&r.read).expect("same bounds");
        write.add(&r.write).expect("same bounds");
        sync.add(&r.sync).expect("same bounds");
        rb += r.read_bytes;
        wb += r.write_bytes;
        mismatches.extend(r.mismatches.iter().cloned());
        if let Some(e) = &r.error {
            println!("job error: {e}");
            ok = false;
        }
    }
    println!(
        "cached: (groupid=0, jobs={}): err={}",
        a.numjobs,
        results.iter().filter(|r| r.error.is_some()).count()
    );
    print_dir("read", &read, rb, msec);
    print_dir("write", &write, wb, msec);
    if !sync.is_empty() {
        println!(
            "  sync: {} syncs, clat (usec): 50.00th=[{:.1}], 99.00th=[{:.1}], max=[{:.1}]",
            sync.len(),
            sync.value_at_quantile(0.5) as f64 / 1e3,
            sync.value_at_quantile(0.99) as f64 / 1e3,
            sync.max() as f64 / 1e3
        );
    }
    print_stats(&cache.stats());

    // Verify: sync, drop the cached folios, read every block back from the
    // backend through the cache.
    let t1 = Instant::now();
    let synced = file.sync();
    if let Err(e) = &synced {
        println!("verify: sync failed: {e}");
        ok = false;
    }
    let wa = (cache.stats().backend_written_bytes - written_before) as f64 / wb.max(1) as f64;
    if wb > 0 {
        println!("write amplification: {wa:.2}");
    }
    let dropped = file.invalidate(0..size)?;
    let mut buf = vec![0u8; a.bs as usize];
    let mut checked = 0u64;
    for r in &results {
        for (i, &gen) in r.gens.iter().enumerate() {
            let block = r.first_block + i as u64;
            match file.read_at(&mut buf, block * a.bs) {
                Ok(n) if n == buf.len() => {
                    if let Err(e) = check(&buf, block, gen) {
                        mismatches.push(format!("after the run: {e}"));
                    }
                }
                Ok(n) => mismatches.push(format!("after the run: block {block}: short read {n}")),
                Err(e) => mismatches.push(format!("after the run: block {block}: {e}")),
            }
            checked += 1;
        }
    }
    println!(
        "verify: {checked} blocks read back from the backend after sync + invalidate ({dropped} pages dropped) in {:.2}s: {} mismatches",
        t1.elapsed().as_secs_f64(),
        mismatches.len()
    );
    for m in mismatches.iter().take(10) {
        println!("  {m}");
    }
    ok &= mismatches.is_empty();
    println!("\nRun status group 0 (all jobs):");
    for (name, h, b) in [("READ", &read, rb), ("WRITE", &write, wb)] {
        if !h.is_empty() {
            let bw = b as f64 / (msec.max(1) as f64 / 1000.0);
            println!(
                "  {name}: bw={:.0}MiB/s ({:.0}MB/s), io={}, run={msec}msec",
                bw / (1 << 20) as f64,
                bw / 1e6,
                bytes(b)
            );
        }
    }
    if !ok {
        println!("FAILED");
    }
    Ok(Outcome {
        ok,
        write_iops: write.len() as f64 / (msec.max(1) as f64 / 1000.0),
        wa,
        sync_p50_us: sync.value_at_quantile(0.5) as f64 / 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::{check, parse_size, stamp};

    #[test]
    fn verify_catches_stale_misplaced_and_torn_blocks() {
        let mut b = vec![0u8; 4096];
        stamp(&mut b, 7, 3);
        assert!(check(&b, 7, 3).is_ok());
        assert!(check(&b, 7, 2).is_err(), "a stale generation passes");
        assert!(check(&b, 8, 3).is_err(), "a misplaced block passes");
        let mut torn = b.clone();
        let mut other = vec![0u8; 4096];
        stamp(&mut other, 7, 4);
        torn[2048..].copy_from_slice(&other[2048..]);
        assert!(check(&torn, 7, 3).is_err(), "a torn block passes");
        assert!(check(&torn, 7, 4).is_err(), "a torn block passes");
        assert!(check(&[0u8; 4096], 0, 0).is_err(), "zeros pass");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("99999999999g").is_err());
        assert!(parse_size("x").is_err());
    }
}
