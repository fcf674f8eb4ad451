//! The page cache's miss path on the I/O engine, one measurement per run
//! (the script `scripts/readahead-bench.sh` interleaves runs with real fio
//! on the same file):
//! - `--mode seq`: cold sequential 4 KiB `read_at` from one thread through
//!   a cache (256 MiB by default) over an `O_DIRECT` [`FileBackend`]: the
//!   readahead windows are the only reads ahead; prints MB/s;
//! - `--mode rand`: random 4 KiB reads through the async API
//!   ([`CachedFile::read_owned`]), `--threads` threads each keeping
//!   `--qd` futures in flight on a tiny executor of its own; prints IOPS.
//!
//! "Cold" means the file is dropped from the kernel's page cache first
//! (`posix_fadvise(DONTNEED)`) and the cache is new.
//!
//! ```text
//! cargo run --release --example readahead_bench -- --mode seq --file /var/tmp/kx-ra-bench.dat --size 2g
//! cargo run --release --example readahead_bench -- --mode rand --threads 2 --qd 32 --seconds 5
//! ```

use clap::Parser;
use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, CachedFile, PageCache, ReadFuture};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

#[path = "support/bench_file.rs"]
mod bench_file;
use bench_file::{drop_kernel_cache, make_file, parse_size, xorshift};

#[derive(Parser, Debug)]
struct Args {
    /// `seq` or `rand`.
    #[arg(long, default_value = "seq")]
    mode: String,
    /// The file (made when shorter than --size), on a filesystem that
    /// allows O_DIRECT.
    #[arg(long, default_value = "/var/tmp/kx-ra-bench.dat")]
    file: PathBuf,
    /// Its size (k, m, g suffixes).
    #[arg(long, default_value = "2g")]
    size: String,
    /// The cache's capacity.
    #[arg(long, default_value = "256m")]
    cache: String,
    /// The readahead window's maximum (0: the backend's default).
    #[arg(long, default_value = "0")]
    ra: String,
    /// The cache's largest folio order (0: its default, 64 KiB folios).
    #[arg(long, default_value_t = 0)]
    order: u32,
    /// Read size in bytes.
    #[arg(long, default_value_t = 4096)]
    bs: usize,
    /// rand: threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// rand: reads in flight per thread.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// rand: seconds; seq: at most this long (0: the whole file).
    #[arg(long, default_value_t = 0.0)]
    seconds: f64,
    /// Buffered backend instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Only create the file and exit.
    #[arg(long)]
    make_only: bool,
}

fn open(args: &Args) -> (PageCache, CachedFile) {
    let mut config = CacheConfig::default()
        .capacity(parse_size(&args.cache))
        .flusher(false);
    if args.order > 0 {
        config = config.max_folio_order(args.order);
    }
    let cache = PageCache::new(config);
    let b = if args.buffered {
        FileBackend::create(&args.file).unwrap()
    } else {
        FileBackend::create_direct(&args.file).unwrap()
    };
    let f = cache.open(b).unwrap();
    let ra = parse_size(&args.ra);
    if ra > 0 {
        f.set_readahead_max(ra);
    }
    (cache, f)
}

fn seq(args: &Args, size: u64) {
    drop_kernel_cache(&args.file);
    let (cache, f) = open(args);
    let mut buf = vec![0u8; args.bs];
    let limit = (args.seconds > 0.0).then(|| Duration::from_secs_f64(args.seconds));
    let t = Instant::now();
    let mut pos = 0u64;
    let mut sum = 0u64;
    while pos < size {
        let n = f.read_at(&mut buf, pos).unwrap();
        if n == 0 {
            break;
        }
        sum = sum.wrapping_add(buf[0] as u64);
        pos += n as u64;
        if pos.is_multiple_of(64 << 20) && limit.is_some_and(|l| t.elapsed() > l) {
            break;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let s = cache.stats();
    println!(
        "seq MB/s {:.1} bytes {} secs {:.3} ra_max {} misses {} readahead_pages {} (check {})",
        pos as f64 / secs / 1e6,
        pos,
        secs,
        f.readahead_max(),
        s.misses,
        s.readahead_pages,
        sum % 7
    );
}

/// A slot's waker: marks the slot ready and unparks its thread.
struct SlotWaker {
    ready: AtomicBool,
    thread: std::thread::Thread,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.ready.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

fn rand(args: &Args, size: u64) {
    drop_kernel_cache(&args.file);
    let (cache, f) = open(args);
    let pages = size / 4096;
    let dur = Duration::from_secs_f64(if args.seconds > 0.0 {
        args.seconds
    } else {
        5.0
    });
    let bs = args.bs;
    let t0 = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..args.threads)
            .map(|ti| {
                let f = &f;
                s.spawn(move || {
                    let mut x = 0x1234_5678u64 + ti as u64 * 7919;
                    let mut next = || {
                        x = xorshift(x);
                        (x % pages) * 4096
                    };
                    type Fut = Pin<Box<ReadFuture<Vec<u8>>>>;
                    let mut slots: Vec<(Fut, Arc<SlotWaker>)> = (0..args.qd)
                        .map(|_| {
                            let w = Arc::new(SlotWaker {
                                ready: AtomicBool::new(true),
                                thread: std::thread::current(),
                            });
                            (Box::pin(f.read_owned(next(), vec![0u8; bs])), w)
                        })
                        .collect();
                    let mut done = 0u64;
                    let end = Instant::now() + dur;
                    while Instant::now() < end {
                        let mut progressed = false;
                        for (fut, w) in slots.iter_mut() {
                            if !w.ready.swap(false, Ordering::AcqRel) {
                                continue;
                            }
                            let waker = Waker::from(Arc::clone(w));
                            let mut cx = Context::from_waker(&waker);
                            // Ready ones are replaced at once (a hit is
                            // ready on its first poll).
                            while let Poll::Ready((n, buf)) = fut.as_mut().poll(&mut cx) {
                                n.unwrap();
                                done += 1;
                                progressed = true;
                                *fut = Box::pin(f.read_owned(next(), buf));
                            }
                        }
                        if !progressed {
                            std::thread::park_timeout(Duration::from_millis(10));
                        }
                    }
                    // Drop the futures in flight (their reads complete
                    // into the cache).
                    drop(slots);
                    done
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let secs = t0.elapsed().as_secs_f64();
    let s = cache.stats();
    println!(
        "rand IOPS {:.0} reads {} secs {:.3} threads {} qd {} hits {} misses {}",
        total as f64 / secs,
        total,
        secs,
        args.threads,
        args.qd,
        s.hits,
        s.misses
    );
}

fn main() {
    let args = Args::parse();
    let size = parse_size(&args.size);
    make_file(&args.file, size);
    if args.make_only {
        return;
    }
    match args.mode.as_str() {
        "seq" => seq(&args, size),
        "rand" => rand(&args, size),
        m => panic!("--mode {m}: seq or rand"),
    }
}
