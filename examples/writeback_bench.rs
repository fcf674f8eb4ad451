//! Writeback throughput against a plain `pwrite` loop of the same bytes:
//! dirty `--size` bytes in the cache (every page, or `--stride` pages out
//! of two: one run per dirty extent), then time `write_back` of the whole
//! file (the writes reach the backend, no fsync), against the same extents
//! written with `pwrite` from a buffer to a second file (the kernel's
//! buffered write, the anchor). Buffered by default, `--direct` for
//! `O_DIRECT` below the cache and for the anchor; rounds interleave the
//! two; the summary quotes medians and the ratio.
//!
//! ```text
//! cargo run --release --example writeback_bench -- --size 256m --rounds 5
//! cargo run --release --example writeback_bench -- --size 256m --stride 16 --rounds 5
//! ```

use clap::Parser;
use kxarray::backend::{Backend, FileBackend};
use kxarray::pagecache::{CacheConfig, PageCache};
use std::path::PathBuf;
use std::time::Instant;

#[path = "support/bench_file.rs"]
mod bench_file;
use bench_file::parse_size;

#[derive(Parser, Debug)]
struct Args {
    /// Where the two files go (a filesystem that allows O_DIRECT for
    /// --direct).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Bytes dirtied: a number of MiB with an `m` suffix, or of GiB with `g`.
    #[arg(long, default_value = "256m")]
    size: String,
    /// Dirty extents of this many pages with as many clean pages between
    /// (0: every page dirty, one extent).
    #[arg(long, default_value_t = 0)]
    stride: u64,
    /// Rounds, each running both rows.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// O_DIRECT below the cache and for the anchor.
    #[arg(long)]
    direct: bool,
}

fn open(path: &std::path::Path, direct: bool) -> FileBackend {
    let _ = std::fs::remove_file(path);
    if direct {
        FileBackend::create_direct(path).expect("O_DIRECT")
    } else {
        FileBackend::create(path).expect("create")
    }
}

fn main() {
    let a = Args::parse();
    let size = parse_size(&a.size);
    let page = 4096u64;
    // The dirty extents: (offset, length).
    let extents: Vec<(u64, u64)> = if a.stride == 0 {
        vec![(0, size)]
    } else {
        let ext = a.stride * page;
        (0..size / ext).map(|i| (2 * i * ext, ext)).collect()
    };
    let span = extents.iter().map(|&(o, n)| o + n).max().unwrap_or(0);
    let chunk = vec![0x5au8; 1 << 20];
    let (kx_path, raw_path) = (a.dir.join("kx-wb-bench.kx"), a.dir.join("kx-wb-bench.raw"));
    let mut rows: Vec<(&str, Vec<f64>)> =
        vec![("kxarray write_back", vec![]), ("pwrite loop", vec![])];
    for r in 0..a.rounds {
        for k in 0..2 {
            let which = (k + r) % 2;
            let mbps = if which == 0 {
                let cache = PageCache::new(
                    CacheConfig::default()
                        .capacity(span + (64 << 20))
                        .flusher(false)
                        .dirty_bytes(span + (32 << 20))
                        .dirty_background_bytes(span + (16 << 20)),
                );
                let f = cache.open(open(&kx_path, a.direct)).unwrap();
                for &(o, n) in &extents {
                    let mut at = 0;
                    while at < n {
                        let m = (n - at).min(chunk.len() as u64) as usize;
                        f.write_at(&chunk[..m], o + at).unwrap();
                        at += m as u64;
                    }
                }
                // Every byte still dirty: no throttled writer wrote any back.
                assert_eq!(cache.stats().dirty_bytes, size, "raise the dirty limits");
                let t = Instant::now();
                f.write_back(0..u64::MAX).unwrap();
                let s = t.elapsed().as_secs_f64();
                assert_eq!(cache.stats().dirty_bytes, 0);
                size as f64 / s / 1e6
            } else {
                let b = open(&raw_path, a.direct);
                let buf = kxarray::aio::AlignedBuf::new(1 << 20);
                let t = Instant::now();
                for &(o, n) in &extents {
                    let mut at = 0;
                    while at < n {
                        let m = (n - at).min(buf.len() as u64) as usize;
                        b.write_all_at(&buf[..m], o + at).unwrap();
                        at += m as u64;
                    }
                }
                size as f64 / t.elapsed().as_secs_f64() / 1e6
            };
            rows[which].1.push(mbps);
        }
    }
    let _ = std::fs::remove_file(&kx_path);
    let _ = std::fs::remove_file(&raw_path);
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let anchor = med(&mut rows[1].1.clone());
    println!(
        "{} MiB in {} extent(s), {}, {} rounds",
        size >> 20,
        extents.len(),
        if a.direct { "O_DIRECT" } else { "buffered" },
        a.rounds
    );
    for (name, v) in &mut rows {
        let m = med(v);
        println!(
            "{name:20} median {m:8.0} MB/s  x pwrite {:.2}  (range {:.0}-{:.0})",
            m / anchor,
            v[0],
            v[v.len() - 1]
        );
    }
}
