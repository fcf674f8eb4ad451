//! A fio-like job runner over the library's page cache, and over the
//! kernel's, with one harness: buffered reads and writes of `--bs` blocks
//! with fio-style IOPS, bandwidth and latency percentiles, the cache's
//! counters, and a verify pass.
//!
//! ```text
//! cargo run --release --example fio                      # a short mixed job on a temp file
//! cargo run --release --example fio -- --rw randread --bs 4k --size 256m --cache-size 128m --numjobs 2 --runtime 5
//! cargo run --release --example fio -- --rw write --fsync 64 --filename /tmp/test.img
//! cargo run --release --example fio -- --backend ram --rw randrw --rwmixread 50
//! cargo run --release --example fio -- --rw randwrite --bs 4k --size 64M --fsync 1 --folio-size 64k --compare 3
//! # the same job through each engine (scripts/vs-kernel.sh runs the table):
//! cargo run --release --example fio -- --rw randread --size 256m --cache-size 512m --numjobs 1 --no-verify --engine psync
//! cargo run --release --example fio -- --rw randread --size 256m --cache-size 512m --numjobs 1 --no-verify --engine kxarray --zero-copy --touch
//! ```
//!
//! **Engines** (`--engine`): `kxarray` reads with `CachedFile::read_at` (a
//! copy out of the page cache; `--zero-copy`: `read_folio_in`, the folio's
//! bytes in place under an epoch guard pinned per read, or per batch of 64
//! reads with `--pin batch`) and writes with `write_at`; `psync` is
//! `pread(2)`/`pwrite(2)` on the file (each job opens its own descriptor,
//! as fio's jobs do); `mmap` is a `memcpy` out of and into a `MAP_SHARED`
//! mapping of the file (advised as fio's mmap engine advises it); `memcpy`
//! is the floor: a `memcpy` out of and into a plain heap buffer holding the
//! file's bytes; `null` moves nothing (the harness's own cost). Every engine
//! runs the same job loop (one copy per engine, monomorphized), the same
//! random stream, the same clock reads and latency histogram, the same
//! bookkeeping. After its read, every engine's bytes are shown to the
//! harness, which reads the block's first byte and, with `--touch`,
//! checksums every byte (a copying engine's copy, the zero-copy engine's
//! folio in place, under its borrow), so rows compare equal work.
//!
//! **Warm before timing.** After the layout, a warm-up pass reads the whole
//! file once through the engine (the page cache for `kxarray`, the
//! kernel's cache with `pread` for `psync`, every page of the mapping for
//! `mmap`: the kernel's cache and the page tables); the kernel's cache is
//! never dropped (fio's `--invalidate=0`). `--no-warm` skips the pass;
//! `--cold` skips it too and drops the file from the kernel's cache first
//! (`posix_fadvise(POSIX_FADV_DONTNEED)` after the layout is synced), so
//! every engine starts cold: the kxarray cache empty, the kernel's holding
//! none of the file. The clock starts when every job has built its engine.
//!
//! **Misses**: `--direct` puts an `O_DIRECT` `FileBackend`
//! below the kxarray cache (the only copy of a page in memory is the
//! cache's; the kernel reads nothing ahead); `--iodepth N` keeps N reads in
//! flight per job: the job hands N blocks at a time to the engine's batch
//! read, which for `kxarray` is the page cache's batch API (hits copied,
//! misses submitted together through the I/O engine; see
//! `engine::read_many`), and for the other engines N reads one after the
//! other (they are synchronous, as fio's psync); `--iodepth-api future`
//! keeps N `CachedFile::read_owned` futures in flight instead, each
//! replaced as it completes. Reads only. As fio does
//! by default (`fadvise_hint=1`), the kxarray file is advised `Random` for
//! random jobs and `Sequential` for sequential ones (`--no-fadvise-hint`:
//! not).
//!
//! ```text
//! # cold sequential 4 KiB reads through a 256 MiB cache over O_DIRECT (scripts/vs-kernel.sh cold):
//! cargo run --release --example fio -- --rw read --bs 4k --size 2g --cache-size 256m --numjobs 1 --direct --cold --no-verify --reuse-file --filename /var/tmp/f.img
//! # random 4 KiB misses, 2 jobs, 32 reads in flight each:
//! cargo run --release --example fio -- --rw randread --bs 4k --size 2g --cache-size 256m --numjobs 2 --direct --cold --iodepth 32 --no-verify --reuse-file --filename /var/tmp/f.img
//! ```
//!
//! Writes allocate folios of `--folio-size` bytes whose dirty state is kept
//! per `--block-size` block; `--whole-folio` keeps it per folio instead (the
//! baseline the per-block state is measured against). Every write job
//! prints `write amplification: X`, the bytes the cache wrote to the
//! backend (up to the final sync) per byte the job wrote: above 1 when
//! writeback writes more than was changed (whole folios for a few bytes),
//! below 1 when a block written several times reached the backend once. `--compare N` runs the job N times in block mode and
//! N times in whole-folio mode, interleaved, and prints both side by side.
//!
//! The file (a temporary file by default, `--filename` for a real one, or a
//! [`RamDisk`] with `--backend ram`) is first laid out directly on the
//! backend with a stamp in every block. Job `j` of `--numjobs` owns the
//! `j`-th slice of the file, so it knows the stamp every one of its blocks
//! must carry: every read during the run is checked against it, and after
//! the run the file is synced and every block read back and checked again
//! (for `kxarray` from the backend, after the cache's folios were dropped
//! with `invalidate`; for `psync` and `mmap` with `pread` after `fsync` or
//! `msync`; for `memcpy` from its buffer). A stamp names its block and the
//! generation of the write that made it, so a torn, misplaced, stale or
//! lost block is caught. Any mismatch or I/O error makes the exit code
//! non-zero. `--no-verify` (speed runs) checks nothing and writes a fixed
//! pattern; `--reuse-file` then skips the layout of a `--filename` that is
//! already big enough.
//!
//! `--ios N` ends each job after N I/Os instead of `--runtime`, so
//! instruction counts repeat (`valgrind --tool=callgrind`; see
//! `scripts/vs-kernel.sh`). The last line, `result: key=value ...`, is the
//! summary scripts parse.
//!
//! The progress bar (`indicatif`) is drawn only when stdout is a terminal
//! and `--quiet` is not given.

mod engine;
mod job;
mod report;
mod stamp;
mod store;

use clap::{Parser, ValueEnum};
use engine::PinMode;
use indicatif::{ProgressBar, ProgressStyle};
use job::{hist, process_cpu_ns, Job, JobResult, Rw, Spec};
use kxarray::pagecache::{CacheConfig, FileOptions};
use report::{bytes, print_dir, print_stats, quantile, si};
use stamp::check_piece;
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use store::{BackendKind, EngineKind, Setup, Store};

/// A fio-like job runner over kxarray's page cache (or the kernel's):
/// buffered random or sequential reads and writes of --bs blocks on a
/// temporary file (or --filename), with IOPS, latency percentiles, the
/// cache's counters and a verify pass.
#[derive(Parser, Debug, Clone)]
#[command(long_about = None)]
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
    /// End each job after N I/Os instead of after --runtime (reproducible
    /// instruction counts).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    ios: Option<u64>,
    /// Sync the file after every N writes of a job (0: never).
    #[arg(long, default_value_t = 0)]
    fsync: u64,
    /// How the jobs reach the file's bytes.
    #[arg(long, value_enum, default_value_t = EngineKind::Kxarray)]
    engine: EngineKind,
    /// With --engine kxarray: read with `read_folio_in` (the folio's bytes
    /// in place, no copy) instead of `read_at`.
    #[arg(long)]
    zero_copy: bool,
    /// With --zero-copy: pin the epoch guard per read (io) or once per 64
    /// reads (batch). Default: io.
    #[arg(long, value_enum)]
    pin: Option<PinMode>,
    /// Every engine checksums every byte it read (a copy, or the folio in
    /// place), so rows compare equal work.
    #[arg(long)]
    touch: bool,
    /// Check nothing (speed runs): reads are not checked, writes write a
    /// fixed pattern, no read-back after the run.
    #[arg(long)]
    no_verify: bool,
    /// No per-I/O clock reads and no latency histogram (for every engine
    /// alike): IOPS only.
    #[arg(long)]
    no_clat: bool,
    /// Start cold: skip the warm-up pass (the kxarray cache starts empty)
    /// and drop the file from the kernel's cache first
    /// (posix_fadvise DONTNEED).
    #[arg(long)]
    cold: bool,
    /// Skip the warm-up pass only (the kernel's cache keeps what it holds).
    #[arg(long)]
    no_warm: bool,
    /// kxarray: an O_DIRECT file backend below the cache (the kernel
    /// caches nothing and reads nothing ahead). Needs --backend file on a
    /// filesystem that takes O_DIRECT (not tmpfs).
    #[arg(long)]
    direct: bool,
    /// Reads in flight per job (--rw read|randread): blocks handed to the
    /// engine N at a time (kxarray: the page cache's batch read, misses
    /// submitted together; other engines: N synchronous reads).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    iodepth: u32,
    /// How a kxarray job keeps --iodepth reads in flight: `batch` hands
    /// N blocks at a time to CachedFile::read_many (all complete before the
    /// next N go); `future` keeps N CachedFile::read_owned futures in
    /// flight, each replaced as it completes (as fio's io_uring engine).
    #[arg(long, value_enum, default_value_t = IodepthApi::Batch)]
    iodepth_api: IodepthApi,
    /// kxarray: do not advise the file Random (random jobs) or Sequential
    /// (sequential ones) before the run, as fio does by default
    /// (fadvise_hint=1; --no-fadvise-hint is fio's fadvise_hint=0).
    #[arg(long)]
    no_fadvise_hint: bool,
    /// With --filename and --no-verify: use the file as it is when it
    /// already holds --size bytes (no layout).
    #[arg(long)]
    reuse_file: bool,
    /// Page cache capacity (k/m/g suffixes; at least one 4 KiB page).
    #[arg(long, default_value = "32m", value_parser = parse_cache_size)]
    cache_size: u64,
    /// kxarray: dirty bytes above which the flusher starts writing back
    /// (default: 10% of --cache-size).
    #[arg(long, value_parser = parse_size)]
    dirty_background: Option<u64>,
    /// kxarray: dirty bytes above which writers are throttled (default:
    /// 20% of --cache-size).
    #[arg(long, value_parser = parse_size)]
    dirty_limit: Option<u64>,
    /// kxarray: seconds after which the flusher writes dirty data back
    /// (default: the library's, 1 s). scripts/vs-kernel.sh passes the
    /// kernel's settings (vm.dirty_*), so both caches write back alike.
    #[arg(long, value_parser = parse_secs)]
    dirty_expire: Option<f64>,
    /// Largest folio order readahead may allocate.
    #[arg(long, default_value_t = 4)]
    max_folio_order: u32,
    /// kxarray: run the background reclaimer
    /// (`CacheConfig::background_reclaim`, off by default).
    #[arg(long)]
    background_reclaim: bool,
    /// Where the file lives (--engine kxarray).
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

/// How `--iodepth` reads stay in flight (`--iodepth-api`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum IodepthApi {
    /// Batches of N through `CachedFile::read_many`.
    Batch,
    /// N `CachedFile::read_owned` futures, each replaced as it completes.
    Future,
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

/// A cache capacity, refused as the library refuses it (less than one
/// page).
fn parse_cache_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    CacheConfig::default()
        .capacity(n)
        .validate()
        .map_err(|e| e.to_string())?;
    Ok(n)
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('s').parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s}: expected a positive number of seconds")),
    }
}

impl Args {
    /// The engine's name in the output: kxarray, kxarray-zc (pin per I/O),
    /// kxarray-zc-batch, psync, mmap, memcpy, null.
    fn engine_name(&self) -> &'static str {
        match (self.engine, self.zero_copy, self.pin) {
            (EngineKind::Kxarray, false, _) => "kxarray",
            (EngineKind::Kxarray, true, Some(PinMode::Batch)) => "kxarray-zc-batch",
            (EngineKind::Kxarray, true, _) => "kxarray-zc",
            (EngineKind::Psync, ..) => "psync",
            (EngineKind::Mmap, ..) => "mmap",
            (EngineKind::Memcpy, ..) => "memcpy",
            (EngineKind::Null, ..) => "null",
        }
    }

    fn rw_name(&self) -> String {
        self.rw
            .to_possible_value()
            .expect("no skipped variants")
            .get_name()
            .to_string()
    }

    /// The kxarray cache's settings.
    fn cache_config(&self) -> CacheConfig {
        let mut c = CacheConfig::default()
            .capacity(self.cache_size)
            .max_folio_order(self.max_folio_order)
            .background_reclaim(self.background_reclaim);
        if let Some(b) = self.dirty_background {
            c = c.dirty_background_bytes(b);
        }
        if let Some(b) = self.dirty_limit {
            c = c.dirty_bytes(b);
        }
        if let Some(s) = self.dirty_expire {
            c = c.dirty_expire(Duration::from_secs_f64(s));
        }
        c
    }

    /// What every job does.
    fn spec(&self) -> Spec {
        Spec {
            rw: self.rw,
            rwmixread: self.rwmixread,
            bs: self.bs,
            fsync: self.fsync,
            seed: self.seed,
            ios: self.ios.unwrap_or(u64::MAX),
            verify: !self.no_verify,
            touch: self.touch,
            clat: !self.no_clat,
            iodepth: self.iodepth as usize,
            futures: self.iodepth_api == IodepthApi::Future,
        }
    }
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
    /// The `--touch` checksum of every block read (the tests compare it
    /// across engines).
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    sum: u64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `--compare N`: block mode and whole-folio mode, interleaved.
fn compare(a: &Args) -> io::Result<bool> {
    if a.engine != EngineKind::Kxarray {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--compare compares the page cache's dirty-state modes: only with --engine kxarray",
        ));
    }
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
        "\nper-block against whole-folio dirty state ({} rounds each, interleaved; medians):",
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

/// Refuse flag combinations that cannot mean anything.
fn validate(a: &Args) -> io::Result<()> {
    let invalid = |m: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, m.to_string()));
    if a.bs < 16 || !a.bs.is_multiple_of(8) {
        return invalid(&format!(
            "--bs {}: must be a multiple of 8, at least 16",
            a.bs
        ));
    }
    if a.size / a.numjobs / a.bs == 0 {
        return invalid(&format!(
            "--size {} is smaller than --numjobs x --bs",
            a.size
        ));
    }
    if a.filename.is_some() && a.backend == BackendKind::Ram {
        return invalid("--filename needs --backend file");
    }
    if a.zero_copy && a.engine != EngineKind::Kxarray {
        return invalid("--zero-copy is a mode of --engine kxarray");
    }
    if a.pin.is_some() && !a.zero_copy {
        return invalid("--pin needs --zero-copy");
    }
    if matches!(a.engine, EngineKind::Psync | EngineKind::Mmap) && a.backend == BackendKind::Ram {
        return invalid("--engine psync and mmap work on a file: not with --backend ram");
    }
    if a.engine == EngineKind::Null && !a.no_verify {
        return invalid("--engine null moves no bytes: it needs --no-verify");
    }
    if a.direct && (a.engine != EngineKind::Kxarray || a.backend != BackendKind::File) {
        return invalid("--direct is a backend of --engine kxarray --backend file");
    }
    if a.iodepth > 1 && !matches!(a.rw, Rw::Read | Rw::Randread) {
        return invalid("--iodepth above 1 is for reads: --rw read or randread");
    }
    if a.iodepth > 1 && a.zero_copy {
        return invalid("--iodepth above 1 copies blocks out: not with --zero-copy");
    }
    if a.reuse_file && (a.filename.is_none() || !a.no_verify) {
        return invalid(
            "--reuse-file needs --filename and --no-verify (the file's stamps are not known)",
        );
    }
    Ok(())
}

/// Start the jobs together, stop them after `--runtime` (or let each do
/// `--ios`), and return when the clock started, the process's CPU time
/// from then until every job ended (nanoseconds; `None` if the clock
/// failed), and what each job measured.
fn run_jobs(
    a: &Args,
    store: &mut Store,
    per_job: u64,
    bar: &ProgressBar,
) -> (Instant, Option<u64>, Vec<JobResult>) {
    let spec = a.spec();
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let zero_copy = a.zero_copy.then(|| a.pin.unwrap_or(PinMode::Io));
    let seeds = store.seeds(a.numjobs, (per_job * a.bs) as usize, zero_copy);
    let runtime = Duration::from_secs_f64(a.runtime);
    // Every job builds its engine, then the clock starts.
    let ready = Barrier::new(seeds.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = seeds
            .into_iter()
            .enumerate()
            .map(|(id, seed)| {
                let job = Job {
                    spec: &spec,
                    id: id as u64,
                    first_block: id as u64 * per_job,
                    blocks: per_job,
                    stop: &stop,
                    ops: &ops,
                };
                let ready = &ready;
                s.spawn(move || seed.run(&job, ready))
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        let cpu0 = process_cpu_ns();
        if a.ios.is_none() {
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
        }
        let results = handles
            .into_iter()
            .map(|h| h.join().expect("a job panicked"))
            .collect();
        let cpu = process_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        (start, cpu, results)
    })
}

/// After the run: read every block back from where the store reads it
/// and check its stamp. Returns the mismatches.
fn read_back(a: &Args, store: &Store, size: u64, results: &[JobResult]) -> io::Result<Vec<String>> {
    let t1 = Instant::now();
    let from = store.before_read_back(size)?;
    let mut buf = vec![0u8; a.bs as usize];
    let mut mismatches = Vec::new();
    let mut checked = 0u64;
    for r in results {
        for (i, &gen) in r.gens.iter().enumerate() {
            let block = r.first_block + i as u64;
            match store.read_back(&mut buf, block * a.bs) {
                Ok(n) if n == buf.len() => {
                    if let Err(e) = check_piece(&buf, block, gen, 0) {
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
        "verify: {checked} blocks read back from {from} in {:.2}s: {} mismatches",
        t1.elapsed().as_secs_f64(),
        mismatches.len()
    );
    Ok(mismatches)
}

fn run(a: &Args) -> io::Result<Outcome> {
    validate(a)?;
    let per_job = a.size / a.numjobs / a.bs;
    let blocks = per_job * a.numjobs;
    let size = blocks * a.bs;
    println!(
        "fio (kxarray harness): engine={}{}{}, rw={}{}, bs={}, size={}, numjobs={}, iodepth={}, {}, fsync={}, verify={}, cache={}",
        a.engine_name(),
        if a.direct { " --direct" } else { "" },
        if a.touch { " --touch" } else { "" },
        a.rw_name(),
        if a.rw == Rw::Randrw {
            format!(" (rwmixread={})", a.rwmixread)
        } else {
            String::new()
        },
        bytes(a.bs),
        bytes(size),
        a.numjobs,
        a.iodepth,
        match a.ios {
            Some(n) => format!("ios={n} per job"),
            None => format!("runtime={}s", a.runtime),
        },
        a.fsync,
        if a.no_verify { "off" } else { "on" },
        bytes(a.cache_size),
    );
    if a.engine == EngineKind::Kxarray {
        let c = a.cache_config();
        println!(
            "folios: writes allocate {}, dirty state per {}; writeback from {} dirty, writers throttled from {}, expiry {:.1}s",
            bytes(a.folio_size),
            if a.whole_folio {
                "folio (--whole-folio)".to_string()
            } else {
                format!("{} block", bytes(a.block_size))
            },
            bytes(c.dirty_background_bytes),
            bytes(c.dirty_bytes),
            c.dirty_expire.as_secs_f64()
        );
    }
    let (mut store, where_, _temp) = Store::open(&Setup {
        engine: a.engine,
        backend: a.backend,
        filename: a.filename.as_deref(),
        reuse_file: a.reuse_file,
        blocks,
        bs: a.bs,
        random: a.rw.random(),
        cache: a.cache_config(),
        file_options: FileOptions::default()
            .block_size(u32::try_from(a.block_size).unwrap_or(0))
            .folio_size(a.folio_size)
            .whole_folio(a.whole_folio),
        direct: a.direct,
        cold: a.cold,
        fadvise_hint: !a.no_fadvise_hint,
    })?;
    println!("file: {where_}");
    if !a.cold && !a.no_warm {
        println!("{}", store.warm(size, a.bs)?);
    }

    let bar = if a.quiet || !io::stdout().is_terminal() || a.ios.is_some() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new((a.runtime * 1000.0) as u64);
        b.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:40} {msg}")
                .expect("a valid template"),
        );
        b
    };
    let before = store.cache().map(|c| c.stats());
    let (start, cpu_ns, results) = run_jobs(a, &mut store, per_job, &bar);
    bar.finish_and_clear();
    let secs = results
        .iter()
        .map(|r| r.end.saturating_duration_since(start))
        .max()
        .unwrap_or_default()
        .as_secs_f64();

    let mut read = hist();
    let mut write = hist();
    let mut sync = hist();
    let (mut reads, mut writes, mut rb, mut wb, mut sum) = (0, 0, 0, 0, 0u64);
    let mut ok = true;
    let mut mismatches = Vec::new();
    for r in &results {
        read.add(&r.read).expect("same bounds");
        write.add(&r.write).expect("same bounds");
        sync.add(&r.sync).expect("same bounds");
        reads += r.reads;
        writes += r.writes;
        rb += r.read_bytes;
        wb += r.write_bytes;
        sum = sum.wrapping_add(r.sum);
        mismatches.extend(r.mismatches.iter().cloned());
        if let Some(e) = &r.error {
            println!("job error: {e}");
            ok = false;
        }
    }
    println!(
        "{}: (groupid=0, jobs={}): err={}",
        a.engine_name(),
        a.numjobs,
        results.iter().filter(|r| r.error.is_some()).count()
    );
    print_dir("read", reads, &read, rb, secs);
    print_dir("write", writes, &write, wb, secs);
    if !sync.is_empty() {
        println!(
            "  sync: {} syncs, clat (usec): 50.00th=[{:.1}], 99.00th=[{:.1}], max=[{:.1}]",
            sync.len(),
            sync.value_at_quantile(0.5) as f64 / 1e3,
            sync.value_at_quantile(0.99) as f64 / 1e3,
            sync.max() as f64 / 1e3
        );
    }
    let cpu_per_io = cpu_ns.map_or(0.0, |c| c as f64 / (reads + writes).max(1) as f64);
    if let Some(c) = cpu_ns {
        println!(
            "  cpu: {:.3}s of the process over the timed part ({:.0}% of {} jobs x {:.3}s), {cpu_per_io:.0} ns per I/O",
            c as f64 / 1e9,
            100.0 * c as f64 / 1e9 / (secs.max(1e-9) * a.numjobs as f64),
            a.numjobs,
            secs
        );
    }
    if a.touch {
        println!("  touch: checksum of the bytes read {sum:#018x}");
    }
    if let (Some(cache), Some(before)) = (store.cache(), &before) {
        let s = cache.stats();
        println!(
            "  timed part: {} hits, {} misses",
            s.hits - before.hits,
            s.misses - before.misses
        );
        print_stats(&s);
    }

    // Sync (untimed, for every engine: the file is left clean), then
    // verify.
    if let Err(e) = store.sync() {
        println!("sync after the run failed: {e}");
        ok = false;
    }
    let mut wa = 0.0;
    if let (Some(cache), Some(before)) = (store.cache(), &before) {
        wa = (cache.stats().backend_written_bytes - before.backend_written_bytes) as f64
            / wb.max(1) as f64;
        if wb > 0 {
            let why = if wa < 1.0 {
                " (below 1: a block written several times before its writeback \
                 reached the backend once)"
            } else {
                ""
            };
            println!("write amplification: {wa:.2}{why}");
        }
    }
    if a.no_verify {
        println!("verify: off (--no-verify)");
    } else {
        mismatches.extend(read_back(a, &store, size, &results)?);
    }
    for m in mismatches.iter().take(10) {
        println!("  {m}");
    }
    ok &= mismatches.is_empty();
    println!("\nRun status group 0 (all jobs):");
    for (name, b) in [("READ", rb), ("WRITE", wb)] {
        if b > 0 {
            let bw = b as f64 / secs.max(1e-9);
            println!(
                "  {name}: bw={:.0}MiB/s ({:.0}MB/s), io={}, run={:.0}msec",
                bw / (1 << 20) as f64,
                bw / 1e6,
                bytes(b),
                secs * 1000.0
            );
        }
    }
    if !ok {
        println!("FAILED");
    }
    let per_sec = |n: u64| n as f64 / secs.max(1e-9);
    println!(
        "result: engine={} touch={} rw={} rwmixread={} bs={} size={} numjobs={} secs={:.3} reads={reads} writes={writes} read_iops={:.0} write_iops={:.0} iops={:.0} read_p50_ns={} read_p99_ns={} write_p50_ns={} cpu_ns_per_io={cpu_per_io:.1} ok={}",
        a.engine_name(),
        u8::from(a.touch),
        a.rw_name(),
        a.rwmixread,
        a.bs,
        size,
        a.numjobs,
        secs,
        per_sec(reads),
        per_sec(writes),
        per_sec(reads + writes),
        quantile(&read, 0.5),
        quantile(&read, 0.99),
        quantile(&write, 0.5),
        u8::from(ok)
    );
    Ok(Outcome {
        ok,
        write_iops: per_sec(writes),
        wa,
        sync_p50_us: quantile(&sync, 0.5) as f64 / 1e3,
        sum,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_size, Args};
    use clap::Parser;

    /// `--help` describes this program, not the crate; a cache of less
    /// than a page is refused on the command line.
    #[test]
    fn help_is_the_examples_and_a_tiny_cache_is_refused() {
        use clap::CommandFactory;
        let about = Args::command().get_about().unwrap().to_string();
        assert!(about.starts_with("A fio-like job runner"), "{about}");
        assert!(!about.contains(env!("CARGO_PKG_DESCRIPTION")), "{about}");
        for bad in ["100", "4095"] {
            let e = Args::try_parse_from(["fio", "--cache-size", bad]).unwrap_err();
            assert!(e.to_string().contains("less than one page"), "{e}");
        }
        assert!(Args::try_parse_from(["fio", "--cache-size", "4k"]).is_ok());
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

    /// Every engine runs a verified mixed job (reads checked in the run,
    /// every block read back after it) and agrees with the others on the
    /// bytes it read: the same seed and I/O count give the same checksum.
    #[test]
    fn every_engine_runs_a_verified_job_and_reads_the_same_bytes() {
        let base = [
            "fio",
            "--rw",
            "randrw",
            "--bs",
            "8k",
            "--size",
            "1m",
            "--numjobs",
            "2",
            "--ios",
            "2000",
            "--cache-size",
            "4m",
            "--touch",
            "--quiet",
        ];
        let mut sums = Vec::new();
        for extra in [
            &["--engine", "kxarray"][..],
            &["--engine", "kxarray", "--zero-copy"],
            &["--engine", "kxarray", "--zero-copy", "--pin", "batch"],
            &["--engine", "psync"],
            &["--engine", "mmap"],
            &["--engine", "memcpy"],
            &["--engine", "kxarray", "--backend", "ram", "--cold"],
        ] {
            let a = Args::try_parse_from(base.iter().chain(extra)).unwrap();
            let o = super::run(&a).unwrap();
            assert!(o.ok, "{extra:?} failed verification");
            sums.push((extra, o.sum));
        }
        assert_ne!(sums[0].1, 0);
        assert!(
            sums.iter().all(|s| s.1 == sums[0].1),
            "the engines read different bytes: {sums:?}"
        );
    }

    /// `--iodepth` batches, `--cold` and `--direct` read the same bytes as
    /// one read at a time on a warm cache, verified in the run and after.
    #[test]
    fn batched_cold_and_direct_reads_verify_and_agree() {
        let base = [
            "fio",
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--size",
            "2m",
            "--numjobs",
            "2",
            "--ios",
            "3000",
            "--cache-size",
            "1m",
            "--touch",
            "--quiet",
        ];
        let mut sums = Vec::new();
        for extra in [
            &[][..],
            &["--iodepth", "8"],
            &["--cold", "--iodepth", "32"],
            &["--engine", "psync", "--cold", "--iodepth", "4"],
            &["--cold", "--direct", "--iodepth", "16"],
            &["--cold", "--iodepth", "32", "--iodepth-api", "future"],
            &[
                "--cold",
                "--direct",
                "--iodepth",
                "8",
                "--iodepth-api",
                "future",
            ],
        ] {
            let a = Args::try_parse_from(base.iter().chain(extra)).unwrap();
            match super::run(&a) {
                Ok(o) => {
                    assert!(o.ok, "{extra:?} failed verification");
                    sums.push((extra, o.sum));
                }
                // A temporary directory on tmpfs refuses O_DIRECT.
                Err(e) if a.direct && e.kind() == std::io::ErrorKind::Unsupported => {
                    eprintln!("SKIPPED {extra:?}: {e}");
                }
                Err(e) => panic!("{extra:?}: {e}"),
            }
        }
        assert_ne!(sums[0].1, 0);
        assert!(
            sums.iter().all(|s| s.1 == sums[0].1),
            "the modes read different bytes: {sums:?}"
        );
    }

    #[test]
    fn meaningless_combinations_are_refused() {
        for bad in [
            &["fio", "--engine", "psync", "--zero-copy"][..],
            &["fio", "--engine", "null"],
            &["fio", "--engine", "mmap", "--backend", "ram"],
            &["fio", "--pin", "batch"],
            &["fio", "--reuse-file", "--no-verify"],
            &["fio", "--direct", "--engine", "psync"],
            &["fio", "--direct", "--backend", "ram"],
            &["fio", "--iodepth", "8", "--rw", "randrw"],
            &["fio", "--iodepth", "8", "--rw", "randread", "--zero-copy"],
        ] {
            let a = Args::try_parse_from(bad).unwrap();
            let e = super::validate(&a).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }
}
