//! The I/O engine against fio on the same file: random 4 KiB `O_DIRECT`
//! reads at a queue depth per thread, from 1 and 2 threads, through
//! `kxarray::aio` (io_uring and the thread pool) and the synchronous
//! `FileBackend::read_at`, against `fio --ioengine=io_uring --iodepth=N
//! --direct=1` and `fio --ioengine=psync --direct=1`. Rounds interleave
//! every configuration (the machine is shared and noisy); the summary
//! quotes medians and ratios.
//!
//! ```text
//! cargo run --release --example aio_bench -- --file /var/tmp/kx-aio.dat --size 2g --seconds 4 --rounds 3
//! ```
//!
//! Without fio on the PATH the fio rows are left out.

use clap::Parser;
use kxarray::aio::{AlignedBuf, Completion, EngineChoice, IoEngine, IoSettings};
use kxarray::backend::{Backend, FileBackend};
use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/bench_file.rs"]
mod bench_file;
use bench_file::{make_file, parse_size, xorshift};

#[derive(Parser, Debug)]
struct Args {
    /// The file to read (made, filled with non-zero bytes, when shorter
    /// than --size); on a filesystem that allows O_DIRECT.
    #[arg(long, default_value = "/var/tmp/kx-aio-bench.dat")]
    file: PathBuf,
    /// Its size: a number with an optional k, m or g suffix.
    #[arg(long, default_value = "2g")]
    size: String,
    /// Seconds per configuration and round.
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Rounds (each runs every configuration once, in a rotated order).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Reads in flight per thread.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Thread counts to run, comma-separated.
    #[arg(long, default_value = "1,2")]
    threads: String,
}

/// Random block-aligned offsets.
struct Offsets(u64, u64);
impl Offsets {
    fn next(&mut self) -> u64 {
        self.0 = xorshift(self.0);
        (self.0 % self.1) * 4096
    }
}

/// IOPS of `threads` threads keeping `qd` reads in flight each on `engine`.
fn engine_iops(
    engine: &IoEngine,
    file: &Arc<File>,
    blocks: u64,
    threads: usize,
    qd: usize,
    d: Duration,
) -> f64 {
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut offs = Offsets(0x9e37_79b9 + t as u64 * 7919, blocks);
                    let mut q: VecDeque<Completion<AlignedBuf>> = (0..qd)
                        .map(|_| engine.read(file, offs.next(), AlignedBuf::new(4096)))
                        .collect();
                    let (start, mut n) = (Instant::now(), 0u64);
                    while start.elapsed() < d {
                        let (r, buf) = q.pop_front().unwrap().wait();
                        assert_eq!(r.expect("read"), 4096);
                        n += 1;
                        q.push_back(engine.read(file, offs.next(), buf));
                    }
                    for c in q {
                        c.wait().0.unwrap();
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / d.as_secs_f64()
}

/// IOPS of `threads` threads of synchronous `read_at` on an O_DIRECT backend.
fn sync_iops(b: &FileBackend, blocks: u64, threads: usize, d: Duration) -> f64 {
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut offs = Offsets(0x51ed_2701 + t as u64 * 104_729, blocks);
                    let mut buf = AlignedBuf::new(4096);
                    let (start, mut n) = (Instant::now(), 0u64);
                    while start.elapsed() < d {
                        assert_eq!(b.read_at(&mut buf, offs.next()).unwrap(), 4096);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / d.as_secs_f64()
}

/// fio's read IOPS, or `None` without fio.
fn fio_iops(
    file: &Path,
    size: u64,
    engine: &str,
    qd: usize,
    jobs: usize,
    secs: f64,
) -> Option<f64> {
    let out = Command::new("fio")
        .args([
            "--name=kx",
            &format!("--filename={}", file.display()),
            &format!("--size={size}"),
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            &format!("--ioengine={engine}"),
            &format!("--iodepth={qd}"),
            &format!("--numjobs={jobs}"),
            &format!("--runtime={secs}"),
            "--time_based",
            "--group_reporting",
            "--readonly",
            "--output-format=json",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let json = String::from_utf8_lossy(&out.stdout);
    let read = json.find("\"read\"")?;
    let at = read + json[read..].find("\"iops\"")?;
    let rest = &json[at + 6..];
    let rest = rest.trim_start_matches([' ', ':']);
    let end = rest.find([',', '\n', '}'])?;
    rest[..end].trim().parse().ok()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args = Args::parse();
    let size = parse_size(&args.size);
    make_file(&args.file, size);
    let blocks = size / 4096;
    let d = Duration::from_secs_f64(args.seconds);
    let threads: Vec<usize> = args
        .threads
        .split(',')
        .map(|t| t.trim().parse().unwrap())
        .collect();
    let direct = Arc::new(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&args.file)
            .expect("O_DIRECT open (tmpfs refuses it: use a disk-backed --file)"),
    );
    let backend = FileBackend::create_direct(&args.file).unwrap();
    let uring = IoEngine::new(&IoSettings::default().engine(EngineChoice::Uring)).ok();
    let pool = IoEngine::new(&IoSettings::default().engine(EngineChoice::Threads)).unwrap();
    let have_fio = Command::new("fio").arg("--version").output().is_ok();
    println!(
        "# aio_bench: {} ({} MiB), random 4 KiB O_DIRECT reads, qd {} per thread, {} s x {} rounds",
        args.file.display(),
        size >> 20,
        args.qd,
        args.seconds,
        args.rounds
    );
    println!("# engines: {:?}; {:?}", uring, pool);
    let mut configs: Vec<String> = Vec::new();
    for &t in &threads {
        if uring.is_some() {
            configs.push(format!("kx-uring qd{} x{t}", args.qd));
        }
        configs.push(format!("kx-threads qd{} x{t}", args.qd));
        configs.push(format!("kx-read_at x{t}"));
        if have_fio {
            configs.push(format!("fio-io_uring qd{} x{t}", args.qd));
            configs.push(format!("fio-psync x{t}"));
        }
    }
    let mut results: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..args.rounds {
        let n = configs.len();
        for i in 0..n {
            let c = &configs[(i + round) % n];
            let t: usize = c.rsplit('x').next().unwrap().parse().unwrap();
            let iops = if c.starts_with("kx-uring") {
                engine_iops(uring.as_ref().unwrap(), &direct, blocks, t, args.qd, d)
            } else if c.starts_with("kx-threads") {
                engine_iops(&pool, &direct, blocks, t, args.qd, d)
            } else if c.starts_with("kx-read_at") {
                sync_iops(&backend, blocks, t, d)
            } else if c.starts_with("fio-io_uring") {
                fio_iops(&args.file, size, "io_uring", args.qd, t, args.seconds).unwrap_or(f64::NAN)
            } else {
                fio_iops(&args.file, size, "psync", 1, t, args.seconds).unwrap_or(f64::NAN)
            };
            println!("round {round} {c:<24} {:>9.0} IOPS", iops);
            results.entry(c.clone()).or_default().push(iops);
        }
    }
    println!("\n# medians over {} rounds", args.rounds);
    let med: BTreeMap<String, f64> = results
        .iter_mut()
        .map(|(k, v)| (k.clone(), median(v)))
        .collect();
    for (k, v) in &med {
        let all: Vec<String> = results[k]
            .iter()
            .map(|x| format!("{:.0}", x / 1000.0))
            .collect();
        println!("{k:<24} {:>9.0} IOPS  (rounds, k: {})", v, all.join(", "));
    }
    println!("\n# ratios");
    for &t in &threads {
        let fio_u = med.get(&format!("fio-io_uring qd{} x{t}", args.qd));
        let fio_p = med.get(&format!("fio-psync x{t}"));
        for (ours, anchor, an) in [
            (
                format!("kx-uring qd{} x{t}", args.qd),
                fio_u,
                "fio io_uring",
            ),
            (
                format!("kx-threads qd{} x{t}", args.qd),
                fio_u,
                "fio io_uring",
            ),
            (format!("kx-read_at x{t}"), fio_p, "fio psync"),
        ] {
            if let (Some(o), Some(a)) = (med.get(&ours), anchor) {
                println!("{ours:<24} / {an} x{t}: {:.2}", o / a);
            }
        }
    }
}
