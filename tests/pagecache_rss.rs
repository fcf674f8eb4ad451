//! Resident memory honest to the capacity: the
//! process's resident set (`/proc/self/statm`) after filling a cache with
//! 4 KiB random reads, and another with 64 KiB sequential reads, stays within
//! the capacity plus the cache's own metadata estimate
//! (`CacheStats::metadata_bytes`) plus 8 MiB, measured from a baseline
//! taken before the cache is made; and a shrink with `set_capacity` gives
//! at least 90% of the difference back within one second.
//!
//! The backend is a sparse temporary file read through the kernel's cache
//! (whose pages are not in this process's resident set). One test per
//! capacity, serialized (the resident set is the whole process's): 64 MiB
//! and a shrink from 256 MiB to 64 MiB always; 1 GiB and a shrink from
//! 1 GiB to 64 MiB when asked for (ignored by default, too slow for a
//! debug build: `cargo test --release --test pagecache_rss -- --ignored`).
//! Linux only (`/proc`).

#![cfg(target_os = "linux")]

use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, PageCache};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
const ALLOWANCE: u64 = 8 * MIB;

/// The resident set in bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

fn sparse_file(len: u64) -> FileBackend {
    let f = tempfile::tempfile().unwrap();
    f.set_len(len).unwrap();
    FileBackend::from_file(f)
}

/// A permutation of `0..n` (a full-period LCG: `n` a power of two).
fn shuffled(n: u64) -> impl Iterator<Item = u64> {
    assert!(n.is_power_of_two());
    let mut x = 12345u64;
    (0..n).map(move |_| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            & (n - 1);
        x
    })
}

/// Check the resident set against the cache's capacity and metadata, plus
/// 8 MiB.
fn check(what: &str, cache: &PageCache, base: u64) {
    let s = cache.stats();
    let grew = rss().saturating_sub(base);
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 has no preconditions.
        let m = unsafe { libc::mallinfo2() };
        println!(
            "  heap: {:.1} MiB in use, {:.1} MiB free in the arenas, {:.1} MiB mapped",
            m.uordblks as f64 / MIB as f64,
            m.fordblks as f64 / MIB as f64,
            m.hblkhd as f64 / MIB as f64
        );
    }
    let f = kxarray::filemap::frame_stats();
    println!(
        "  frames: {} regions, {:.1} MiB in use, {:.1} MiB free; nodes: {} regions",
        f.regions,
        f.bytes_in_use as f64 / MIB as f64,
        f.bytes_free as f64 / MIB as f64,
        kxarray::node_cache::stats().regions
    );
    let bound = s.capacity_bytes + s.metadata_bytes + ALLOWANCE;
    println!(
        "{what}: resident +{:.1} MiB; capacity {} MiB, cached {:.1} MiB, metadata {:.2} MiB, free frames {:.2} MiB; bound {:.1} MiB",
        grew as f64 / MIB as f64,
        s.capacity_bytes / MIB,
        s.cached_bytes as f64 / MIB as f64,
        s.metadata_bytes as f64 / MIB as f64,
        s.frame_bytes_free as f64 / MIB as f64,
        bound as f64 / MIB as f64,
    );
    assert!(
        s.cached_bytes + MIB >= s.capacity_bytes,
        "{what}: the cache did not fill ({} of {} bytes)",
        s.cached_bytes,
        s.capacity_bytes
    );
    assert!(
        grew <= bound,
        "{what}: resident set grew {grew} bytes, more than capacity + metadata + 8 MiB = {bound}"
    );
}

/// Fill a fresh cache of `capacity` bytes from a file twice its size with
/// 4 KiB random reads (each page once, in a shuffled order), checking the
/// resident set; then the same with a fresh cache and 64 KiB sequential
/// reads (readahead's folios up to 64 KiB), from a new baseline.
fn fill(capacity: u64) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let len = 2 * capacity;
    let mut buf = vec![0u8; 64 << 10];
    {
        let base = rss();
        let cache = PageCache::new(CacheConfig::default().capacity(capacity));
        let file = cache.open(sparse_file(len)).unwrap();
        for p in shuffled(len / PAGE) {
            file.read_at(&mut buf[..PAGE as usize], p * PAGE).unwrap();
        }
        check(
            &format!("{} MiB, 4 KiB random", capacity / MIB),
            &cache,
            base,
        );
    }
    {
        let base = rss();
        // The scan must fill the cache (it would pass a cache smaller
        // than the file by).
        let config = CacheConfig::default().capacity(capacity).passthrough(false);
        let cache = PageCache::new(config);
        let file = cache.open(sparse_file(len)).unwrap();
        for off in (0..len).step_by(buf.len()) {
            file.read_at(&mut buf, off).unwrap();
        }
        check(
            &format!("{} MiB, 64 KiB sequential", capacity / MIB),
            &cache,
            base,
        );
    }
}

/// Fill a cache of `from` bytes, shrink it to `to`: within one second the
/// resident set drops by at least 90% of the difference.
fn shrink(from: u64, to: u64) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let base = rss();
    let cache = PageCache::new(CacheConfig::default().capacity(from));
    let file = cache.open(sparse_file(from)).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for off in (0..from).step_by(buf.len()) {
        file.read_at(&mut buf, off).unwrap();
    }
    check(&format!("{} MiB, filled", from / MIB), &cache, base);
    let before = rss();
    let want = (from - to) / 10 * 9;
    let t0 = Instant::now();
    cache.set_capacity(to).unwrap();
    let returned = loop {
        let returned = before.saturating_sub(rss());
        if returned >= want || t0.elapsed() > Duration::from_secs(1) {
            break returned;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t0.elapsed();
    println!(
        "shrink {} MiB -> {} MiB: {:.1} MiB returned in {:.0} ms (wanted {:.1} MiB)",
        from / MIB,
        to / MIB,
        returned as f64 / MIB as f64,
        took.as_secs_f64() * 1e3,
        want as f64 / MIB as f64
    );
    assert!(
        returned >= want,
        "shrinking {from} -> {to} returned {returned} bytes in {took:?}, wanted {want}"
    );
    check(&format!("{} MiB, after the shrink", to / MIB), &cache, base);
}

#[test]
fn resident_set_within_capacity_64m() {
    fill(64 * MIB);
}

#[test]
fn shrink_returns_memory_256m_to_64m() {
    shrink(256 * MIB, 64 * MIB);
}

#[test]
#[ignore = "1 GiB of cache, too slow for a debug build: \
            cargo test --release --test pagecache_rss -- --ignored"]
fn resident_set_within_capacity_1g() {
    fill(1 << 30);
    shrink(1 << 30, 64 * MIB);
}
