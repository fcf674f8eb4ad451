//! A cache left over its capacity does not stay over:
//! `set_capacity` evicts down whenever the cache is over the capacity it
//! sets (the same value again, after pins that held it over were let go,
//! or after a failed writeback once the backend recovered), and so does
//! the next miss.

mod pagecache_common;

use kxarray::backend::RamDisk;
use kxarray::pagecache::{CacheConfig, PageCache, WRITEBACK_RETRY_MAX};
use pagecache_common::MemBackend;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

/// An 8 MiB cache holding 4 MiB of clean pages, every one pinned by a
/// zero-copy reference, shrunk to 1 MiB: the pins hold it over.
fn pinned_over() -> (
    PageCache,
    kxarray::pagecache::CachedFile,
    Vec<kxarray::pagecache::FolioRef>,
) {
    let cache = PageCache::new(CacheConfig::default().capacity(8 * MIB).flusher(false));
    let f = cache.open(RamDisk::new(8 * MIB)).unwrap();
    let pins: Vec<_> = (0..4 * MIB / PAGE)
        .map(|p| f.read_folio(p).unwrap())
        .collect();
    cache.set_capacity(MIB).unwrap();
    let s = cache.stats();
    assert!(s.cached_bytes >= 4 * MIB, "the pins held it over: {s:?}");
    (cache, f, pins)
}

#[test]
fn set_capacity_with_the_current_value_evicts_what_pins_held_over() {
    let (cache, f, pins) = pinned_over();
    drop(pins);
    let mut b = [0u8; 1];
    for _ in 0..100 {
        f.read_at(&mut b, 0).unwrap(); // hits evict nothing
    }
    cache.set_capacity(MIB).unwrap();
    let s = cache.stats();
    assert!(s.cached_bytes <= MIB, "{s:?}");
}

#[test]
fn the_next_miss_after_pins_held_the_cache_over_evicts_down() {
    let (cache, f, pins) = pinned_over();
    drop(pins);
    let mut b = [0u8; 1];
    f.read_at(&mut b, 6 * MIB).unwrap(); // a miss
    let s = cache.stats();
    assert!(s.cached_bytes <= MIB, "{s:?}");
}

/// A 64 MiB cache with 4 MiB dirty over a backend whose writes fail,
/// shrunk to one page: the dirty pages cannot go. The backend recovers
/// and the folios' backoff passes.
fn failed_over() -> (PageCache, Arc<MemBackend>, kxarray::pagecache::CachedFile) {
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(64 * MIB)
            .dirty_bytes(32 * MIB)
            .dirty_background_bytes(32 * MIB)
            .flusher(false),
    );
    let b = Arc::new(MemBackend::new());
    b.data.lock().unwrap().resize((8 * MIB) as usize, 0);
    let f = cache.open(Arc::clone(&b)).unwrap();
    b.fail_all.store(true, Ordering::Relaxed);
    for p in 0..4 * MIB / PAGE {
        f.write_at(&[p as u8; PAGE as usize], p * PAGE).unwrap();
    }
    cache.set_capacity(PAGE).unwrap();
    let s = cache.stats();
    assert!(s.cached_bytes >= 4 * MIB, "the dirty pages stayed: {s:?}");
    b.fail_all.store(false, Ordering::Relaxed);
    // The folios that failed wait for their retry time before the cache's
    // own writeback tries them again.
    std::thread::sleep(WRITEBACK_RETRY_MAX);
    (cache, b, f)
}

fn all_written(b: &MemBackend) {
    let d = b.contents();
    for p in 0..4 * MIB / PAGE {
        let at = (p * PAGE) as usize;
        assert!(
            d[at..at + PAGE as usize].iter().all(|&x| x == p as u8),
            "page {p}"
        );
    }
}

#[test]
fn set_capacity_with_the_current_value_evicts_what_a_failed_writeback_held_over() {
    let (cache, b, f) = failed_over();
    cache.set_capacity(PAGE).unwrap();
    let s = cache.stats();
    assert!(s.cached_bytes <= PAGE, "{s:?}");
    all_written(&b);
    assert!(f.sync().is_err(), "the failures, reported once");
    f.sync().unwrap();
}

#[test]
fn the_next_miss_after_a_failed_writeback_evicts_down() {
    let (cache, b, f) = failed_over();
    let mut x = [0u8; 1];
    f.read_at(&mut x, 6 * MIB).unwrap(); // a miss
    let s = cache.stats();
    assert!(s.cached_bytes <= PAGE, "{s:?}");
    all_written(&b);
}
