//! N processes reading one file at random through kxarray: each its own
//! private cache, or one region shared by all (`--mode shared`). The
//! benchmark behind docs/shared-cache.md's multi-process rows, beside fio's
//! `psync` and `mmap` engines with `--numjobs` (processes) on the same
//! file (`scripts/shared-bench.sh` runs them interleaved).
//!
//! ```text
//! cargo run --release --example shared_readers -- --file /tmp/f --procs 4 --seconds 10 --mode shared
//! ```
//!
//! Prints one line: the mode, processes, total reads per second, and the
//! sum of the processes' proportional set sizes (PSS) at the end.

use clap::Parser;
use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, PageCache, SharedConfig};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(
    about = "N processes reading one file at random through kxarray (private caches or one shared region)"
)]
struct Args {
    /// The file to read (made with random bytes if missing, `--size` long).
    #[arg(long)]
    file: std::path::PathBuf,
    /// Its size when it is made.
    #[arg(long, default_value = "2g", value_parser = parse_size)]
    size: u64,
    /// Reader processes.
    #[arg(long, default_value_t = 1)]
    procs: usize,
    /// Seconds each reads for (after `--warm` passes).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// `shared` (one region) or `private` (a cache per process).
    #[arg(long, default_value = "shared")]
    mode: String,
    /// Cache capacity (the region's, or each process's).
    #[arg(long, default_value = "2560m", value_parser = parse_size)]
    capacity: u64,
    /// Block size of a read.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Read the whole file once first (in process 0 only), so the region is warm.
    #[arg(long)]
    warm: bool,
    /// Reads per process instead of `--seconds` (for instruction counts).
    #[arg(long)]
    reads: Option<u64>,
    /// The region's directory (shared mode; default: the user's own).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// A new process's first pass: one process reads the whole file into
    /// the region (shared mode) and stays; then a
    /// fresh process opens the file and reads every block once in a
    /// shuffled order, then again in another (its warm rate). Prints both
    /// rates; the first includes the new process's cache set-up and open.
    #[arg(long)]
    first_pass: bool,
    /// Internal: this process is reader `N`.
    #[arg(long, hide = true)]
    child: Option<usize>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim().to_ascii_lowercase();
    let (n, m) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    n.parse::<u64>()
        .map(|n| n * m)
        .map_err(|e| format!("{s}: {e}"))
}

fn cache(a: &Args) -> PageCache {
    let mut c = CacheConfig::default().capacity(a.capacity).flusher(false);
    if a.mode == "shared" {
        let mut s = SharedConfig {
            max_bytes: Some(a.capacity),
            ..SharedConfig::default()
        };
        if let Some(d) = &a.dir {
            s.dir = Some(d.clone());
        }
        c = c.shared_with(s);
    }
    PageCache::new(c)
}

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Read every block of `f` once, in the order `i * step mod blocks`
/// (`step` coprime with `blocks`, so each block once); returns reads
/// per second.
fn pass(f: &kxarray::pagecache::CachedFile, bs: u64, step: u64, t: Instant) -> f64 {
    let blocks = f.len() / bs;
    let mut buf = vec![0u8; bs as usize];
    let mut i = 0u64;
    for _ in 0..blocks {
        i = (i + step) % blocks;
        f.read_at(&mut buf, i * bs).unwrap();
    }
    blocks as f64 / t.elapsed().as_secs_f64()
}

/// A step coprime with `n` near `n` times the golden ratio's fraction.
fn coprime_step(n: u64, salt: u64) -> u64 {
    let mut s = ((n as f64 * 0.618_033_988_75) as u64 + salt).max(1);
    while gcd(s, n) != 1 {
        s += 1;
    }
    s
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The fresh process of `--first-pass`: both passes' rates.
fn first_pass(a: &Args) {
    use std::io::{Read, Write};
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut go = [0u8; 1];
    let _ = std::io::stdin().read(&mut go);
    let t = Instant::now();
    let cache = cache(a);
    let f = cache.open(FileBackend::create(&a.file).unwrap()).unwrap();
    let setup = t.elapsed().as_secs_f64() * 1e3;
    let blocks = f.len() / a.bs;
    let first = pass(&f, a.bs, coprime_step(blocks, 0), t);
    let warm = pass(&f, a.bs, coprime_step(blocks, 7919), Instant::now());
    println!("{first:.0} {warm:.0} {setup:.1}");
}

fn reader(a: &Args, id: usize) {
    if a.first_pass && id == 1 {
        first_pass(a);
        return;
    }
    let cache = cache(a);
    let f = cache.open(FileBackend::create(&a.file).unwrap()).unwrap();
    if a.mode == "shared" {
        assert!(f.is_shared(), "the file is not in the shared region");
    }
    let len = f.len();
    let blocks = len / a.bs;
    let mut buf = vec![0u8; a.bs as usize];
    if a.warm && (id == 0 || a.mode != "shared") {
        let mut off = 0;
        while off < len {
            f.read_at(&mut buf, off).unwrap();
            off += a.bs;
        }
    }
    // ready; then the parent's go: one byte on stdin
    use std::io::{Read, Write};
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut go = [0u8; 1];
    let _ = std::io::stdin().read(&mut go);
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (id as u64 * 0x1234_5678_9abc);
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut n = 0u64;
    while a.reads.map_or(Instant::now() < deadline, |r| n < r) {
        for _ in 0..256 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f.read_at(&mut buf, (x % blocks) * a.bs).unwrap();
        }
        n += 256;
    }
    let pss = pss_kib(std::process::id());
    println!("{n} {pss}");
}

/// Read a child's "ready" line (it holds its stdout; the rest is read at
/// its end).
fn wait_ready(k: &mut std::process::Child) {
    use std::io::Read;
    let out = k.stdout.as_mut().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    assert_eq!(line, b"ready", "a reader failed before it was ready");
}

fn main() {
    let a = Args::parse();
    if let Some(id) = a.child {
        reader(&a, id);
        return;
    }
    if !a.file.exists() {
        let mut f = std::fs::File::create(&a.file).unwrap();
        let mut x = 1u64;
        let chunk: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 56) as u8
            })
            .collect();
        use std::io::Write;
        for _ in 0..a.size >> 20 {
            f.write_all(&chunk).unwrap();
        }
    }
    let exe = std::env::current_exe().unwrap();
    if a.first_pass {
        // one reader that warms and holds the cache, one fresh process
        let spawn = |id: usize, extra: &[&str]| {
            let mut cmd = Command::new(&exe);
            cmd.args(std::env::args().skip(1))
                .args(extra)
                .args(["--child", &id.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            cmd.spawn().unwrap()
        };
        // private: the fresh process's cache starts empty whatever another
        // process holds, so the holder reads nothing (the kernel's cache
        // holds the file)
        let hold: &[&str] = if a.mode == "shared" {
            &["--warm", "--reads", "0"]
        } else {
            &["--reads", "0"]
        };
        let mut holder = spawn(0, hold);
        wait_ready(&mut holder);
        let mut fresh = spawn(1, &[]);
        wait_ready(&mut fresh);
        use std::io::Write;
        fresh.stdin.take().unwrap().write_all(b"g").unwrap();
        let out = fresh.wait_with_output().unwrap();
        holder.stdin.take().unwrap().write_all(b"g").unwrap();
        holder.wait().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        assert_eq!(v.len(), 3, "the fresh process failed: {text}");
        println!(
            "mode={} first_pass={:.0} warm={:.0} ratio={:.2} setup_ms={:.1}",
            a.mode,
            v[0],
            v[1],
            v[0] / v[1],
            v[2]
        );
        return;
    }
    let mut kids = Vec::new();
    for id in 0..a.procs {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args().skip(1))
            .args(["--child", &id.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut k = cmd.spawn().unwrap();
        if id == 0 {
            // the first warms the region (shared) before the others start
            wait_ready(&mut k);
        }
        kids.push(k);
    }
    let mut outs = Vec::new();
    for (i, k) in kids.iter_mut().enumerate() {
        if i > 0 {
            wait_ready(k);
        }
    }
    for k in &mut kids {
        use std::io::Write;
        k.stdin.take().unwrap().write_all(b"g").unwrap();
    }
    for k in kids {
        outs.push(k.wait_with_output().unwrap());
    }
    let (mut total, mut pss) = (0u64, 0u64);
    for out in outs {
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace();
        total += it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        pss += it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    println!(
        "mode={} procs={} iops={:.0} pss_mib={:.0}",
        a.mode,
        a.procs,
        total as f64 / a.seconds,
        pss as f64 / 1024.0
    );
}
