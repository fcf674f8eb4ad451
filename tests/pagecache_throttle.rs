//! Dirty throttling: with a slow backend and several writers the dirty
//! bytes never pass the limit plus the documented slack (each writer's
//! ratelimit pages and one folio), throttled writers do pause, and no pause
//! passes the cap; the ratelimited mode reads the global count once per
//! `ratelimit_pages` pages, the global-read mode once per page.

mod pagecache_common;

use kxarray::backend::Backend;
use kxarray::pagecache::{CacheConfig, PageCache, ThrottleMode, MAX_PAUSE};
use pagecache_common::MemBackend;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A backend that takes `len / bytes_per_sec` for every write.
#[derive(Debug)]
struct Slow {
    inner: Arc<MemBackend>,
    bytes_per_sec: u64,
}

impl Backend for Slow {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        std::thread::sleep(Duration::from_secs_f64(
            buf.len() as f64 / self.bytes_per_sec as f64,
        ));
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

const WRITERS: u64 = 3;
const PER_WRITER: u64 = 4 << 20;
const RATELIMIT: u64 = 32;

#[test]
fn writers_stay_under_the_limit_plus_slack_and_pauses_are_capped() {
    let cap = 16u64 << 20;
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(cap)
            .ratelimit_pages(RATELIMIT),
    );
    let limit = cache.config().dirty_bytes;
    assert_eq!(limit, cap / 5);
    let inner = Arc::new(MemBackend::new());
    *inner.data.lock().unwrap() = vec![0; (WRITERS * PER_WRITER) as usize];
    let file = cache
        .open(Slow {
            inner: Arc::clone(&inner),
            bytes_per_sec: 24 << 20,
        })
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let max_dirty = Arc::new(AtomicU64::new(0));
    let monitor = {
        let (cache, done, max_dirty) = (cache.clone(), Arc::clone(&done), Arc::clone(&max_dirty));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                max_dirty.fetch_max(cache.stats().dirty_bytes, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let file = file.clone();
            std::thread::spawn(move || {
                let buf = vec![w as u8 + 1; 4096];
                for i in 0..PER_WRITER / 4096 {
                    file.write_at(&buf, w * PER_WRITER + i * 4096).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    file.sync().unwrap();
    let s = cache.stats();
    let slack = WRITERS * (RATELIMIT * 4096 + 4096);
    let seen = max_dirty.load(Ordering::Relaxed);
    assert!(
        seen > limit / 2,
        "the test never got near the limit: {seen}"
    );
    assert!(
        seen <= limit + slack,
        "dirty {seen} > limit {limit} + slack {slack}"
    );
    assert!(s.throttled > 0 && s.pauses > 0, "{s:?}");
    // The pause asked for is at most MAX_PAUSE; allow the OS 50 ms to
    // wake the sleeper on this loaded 2-core machine.
    assert!(
        s.max_pause_ns <= (MAX_PAUSE + Duration::from_millis(50)).as_nanos() as u64,
        "{s:?}"
    );
    let data = inner.contents();
    for w in 0..WRITERS {
        let r = (w * PER_WRITER) as usize..((w + 1) * PER_WRITER) as usize;
        assert!(data[r].iter().all(|&b| b == w as u8 + 1), "writer {w}");
    }
}

#[test]
fn ratelimited_reads_the_global_count_once_per_ratelimit_pages() {
    for (mode, lo, hi) in [
        (
            ThrottleMode::Ratelimited,
            256 / RATELIMIT - 1,
            256 / RATELIMIT,
        ),
        (ThrottleMode::GlobalRead, 256, 256),
    ] {
        let cache = PageCache::new(
            CacheConfig::default()
                .capacity(64 << 20)
                .flusher(false)
                .throttle_mode(mode),
        );
        let file = cache.open(MemBackend::new()).unwrap();
        // A fresh thread: its ratelimit count starts at zero.
        let f = file.clone();
        std::thread::spawn(move || {
            for i in 0..256u64 {
                f.write_at(&[1u8; 4096], i * 4096).unwrap();
            }
        })
        .join()
        .unwrap();
        let reads = cache.stats().dirty_global_reads;
        assert!((lo..=hi).contains(&reads), "{mode:?}: {reads} reads");
        assert_eq!(cache.stats().throttled, 0, "1 MiB is under the limit");
    }
}
