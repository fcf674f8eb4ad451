//! What the fio example prints: fio's unit style, the per-direction block
//! (IOPS, bandwidth, latency percentiles), the page cache's counters, and
//! the one-line `result:` summary scripts parse
//! (`scripts/vs-kernel.sh`). Owns the output format; computes nothing the
//! job did not measure.

use hdrhistogram::Histogram;
use kxarray::pagecache::CacheStats;

/// fio's unit style: 1.2k, 3.4M.
pub(crate) fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A byte count: exact KiB/MiB when whole, else two or one decimals.
pub(crate) fn bytes(x: u64) -> String {
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

/// One direction's block: `ios` I/Os of `total_bytes` in `secs`, and their
/// latencies when measured (`h` is empty with `--no-clat`).
pub(crate) fn print_dir(name: &str, ios: u64, h: &Histogram<u64>, total_bytes: u64, secs: f64) {
    if ios == 0 {
        return;
    }
    let secs = secs.max(1e-9);
    let msec = (secs * 1000.0).round() as u64;
    let iops = ios as f64 / secs;
    let bw = total_bytes as f64 / secs;
    println!(
        "  {name}: IOPS={}, BW={:.0}MiB/s ({:.0}MB/s)({}/{msec}msec)",
        si(iops),
        bw / (1 << 20) as f64,
        bw / 1e6,
        bytes(total_bytes)
    );
    if h.is_empty() {
        println!("    clat: not measured (--no-clat)");
        return;
    }
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

/// The page cache's counters.
pub(crate) fn print_stats(s: &CacheStats) {
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

/// A latency quantile in nanoseconds, or 0 when not measured.
pub(crate) fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}
