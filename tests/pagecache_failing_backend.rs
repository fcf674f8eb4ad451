//! A failing backend under a shrink: a 64 MiB cache
//! holding 16 MiB of dirty data whose backend fails every write (`EIO`)
//! is shrunk to one page, then written to. Writers must finish (a bounded
//! join is the hang detector, not a speed target), the backend must not
//! be stormed with retries (each page's write attempts are bounded by the
//! per-folio backoff), the cache must not grow past the documented bound
//! (writes over it get the backend's error), and nothing whose write
//! returned `Ok` may be lost once the backend recovers. Run with and
//! without the flusher, and with a healthy file beside the failing one.

mod pagecache_common;

use kxarray::backend::Backend;
use kxarray::pagecache::{
    CacheConfig, CachedFile, PageCache, STUCK_PAUSES, WRITEBACK_RETRY_MAX, WRITEBACK_RETRY_MIN,
};
use pagecache_common::MemBackend;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
/// Dirty data in the cache when the shrink comes.
const DIRTY: u64 = 16 << 20;
/// The writes after the shrink (4 KiB each, past the dirty data).
const WRITES: u64 = 1024;
/// The hang detector: generous, far above what a working run takes.
const HANG: Duration = Duration::from_secs(60);

/// A backend whose writes fail with `EIO` while `failing` is set, counting
/// every write attempt per page it covers.
#[derive(Debug)]
struct Failing {
    inner: MemBackend,
    failing: AtomicBool,
    attempts: Vec<AtomicU32>,
}

impl Failing {
    fn new(pages: u64) -> Arc<Failing> {
        Arc::new(Failing {
            inner: MemBackend::new(),
            failing: AtomicBool::new(false),
            attempts: (0..pages).map(|_| AtomicU32::new(0)).collect(),
        })
    }
    fn max_attempts(&self) -> u32 {
        let max = self
            .attempts
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .max();
        max.unwrap_or(0)
    }
    fn reset_attempts(&self) {
        for a in &self.attempts {
            a.store(0, Ordering::Relaxed);
        }
    }
}

impl Backend for Failing {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let first = offset / PAGE;
        let end = (offset + buf.len() as u64).div_ceil(PAGE);
        for p in first..end {
            if let Some(a) = self.attempts.get(p as usize) {
                a.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.failing.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
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

/// The byte page `p` holds after write generation `g`.
fn byte(p: u64, g: u8) -> u8 {
    (p as u8).wrapping_mul(31).wrapping_add(g)
}

/// A 64 MiB cache (dirty limits above 16 MiB, so the setup is not
/// throttled), one file on a failing backend holding 16 MiB dirty.
fn setup(flusher: bool) -> (PageCache, Arc<Failing>, CachedFile) {
    let config = CacheConfig::default()
        .capacity(64 << 20)
        .dirty_bytes(32 << 20)
        .dirty_background_bytes(24 << 20)
        .dirty_expire(Duration::from_millis(20))
        .flusher(flusher);
    let cache = PageCache::new(config);
    let b = Failing::new(DIRTY / PAGE + WRITES + 64);
    let file = cache.open(Arc::clone(&b)).unwrap();
    b.failing.store(true, Ordering::Relaxed);
    for p in 0..DIRTY / PAGE {
        file.write_at(&[byte(p, 1); PAGE as usize], p * PAGE)
            .unwrap();
    }
    if !flusher {
        assert_eq!(cache.stats().dirty_bytes, DIRTY);
    }
    (cache, b, file)
}

/// Run `f` on a thread and wait for it at most [`HANG`].
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {HANG:?}: hung"),
    }
}

/// The most write attempts one page may see in `elapsed` under the
/// documented per-folio backoff: one, then one after each wait, the waits
/// doubling from [`WRITEBACK_RETRY_MIN`] up to [`WRITEBACK_RETRY_MAX`].
/// `slack` attempts more are allowed on top. The cache's clock counts
/// whole milliseconds, so each wait may end up to 1 ms early.
fn attempt_bound(elapsed: Duration, slack: u32) -> u32 {
    let mut wait = WRITEBACK_RETRY_MIN;
    let mut spent = Duration::ZERO;
    let mut n = 1;
    while spent <= elapsed {
        spent += wait - Duration::from_millis(1);
        wait = (wait * 2).min(WRITEBACK_RETRY_MAX);
        n += 1;
    }
    n + slack
}

fn shrink_then_write(flusher: bool) {
    let (cache, b, file) = setup(flusher);
    let t0 = Instant::now();
    cache.set_capacity(PAGE).unwrap();
    let f = file.clone();
    let results = bounded("1,024 writes to the failing file", move || {
        (0..WRITES)
            .map(|i| {
                let p = DIRTY / PAGE + i;
                f.write_at(&[byte(p, 1); PAGE as usize], p * PAGE)
                    .map_err(|e| (e.kind(), e.raw_os_error(), e.to_string()))
            })
            .collect::<Vec<_>>()
    });
    let elapsed = t0.elapsed();
    let s = cache.stats();
    // No retry storm: every page was tried at most as the backoff allows.
    let most = b.max_attempts();
    let bound = attempt_bound(elapsed, 1);
    assert!(
        most <= bound,
        "a page was tried {most} times in {elapsed:?} (the backoff allows {bound}); {s:?}"
    );
    // Writes past the bound are refused with the backend's error.
    let eio = io::Error::from_raw_os_error(libc::EIO);
    let mut ok = 0u64;
    for r in &results {
        match r {
            Ok(n) => {
                assert_eq!(*n, PAGE as usize);
                ok += 1;
            }
            Err((kind, _, msg)) => {
                assert_eq!(*kind, eio.kind(), "{msg}");
                assert!(msg.contains(&eio.to_string()), "{msg}");
            }
        }
    }
    // The cache holds the dirty data it could not write, and what the
    // accepted writes added, bounded: it did not keep growing. The bound
    // (docs/memory.md): twice the dirty limit (scaled with the capacity)
    // plus the writer's slack, its ratelimit pages and one folio.
    let config = cache.config();
    let limit = config.dirty_bytes * cache.capacity() / config.capacity;
    let slack = (config.ratelimit_pages + 1) * PAGE;
    assert!(
        ok * PAGE <= 2 * limit + slack,
        "{ok} writes accepted while the backend failed; {s:?}"
    );
    assert!(
        s.cached_bytes <= DIRTY + ok * PAGE + cache.capacity(),
        "the cache grew past its dirty data: {s:?}"
    );
    assert!(s.writeback_errors > 0, "{s:?}");
    // The backend recovers: one sync writes everything, reports the
    // failures once, and nothing accepted is lost.
    b.failing.store(false, Ordering::Relaxed);
    let e = file.sync().unwrap_err();
    assert_eq!(e.kind(), eio.kind(), "{e}");
    file.sync().unwrap();
    let data = b.inner.contents();
    for (p, r) in (0..DIRTY / PAGE)
        .map(|p| (p, true))
        .chain((0..WRITES).map(|i| (DIRTY / PAGE + i, results[i as usize].is_ok())))
    {
        let at = (p * PAGE) as usize;
        let want = if r { byte(p, 1) } else { 0 };
        let got = data.get(at..at + PAGE as usize);
        assert!(
            got.is_some_and(|g| g.iter().all(|&x| x == want))
                || (!r && got.is_none_or(|g| g.iter().all(|&x| x == 0))),
            "page {p} lost (accepted: {r})"
        );
    }
    let s = cache.stats();
    assert_eq!((s.dirty_bytes, s.unwritable_bytes), (0, 0), "{s:?}");
}

/// Without the flusher: the writers write back
/// themselves (the throttle) and each miss's reclaim writes dirty victims
/// back (`pageout`): with a failing backend that was a retry storm (129
/// failed writes per page written) and the cache grew to many MiB.
#[test]
fn a_failing_backend_under_a_shrink_neither_storms_nor_grows_without_the_flusher() {
    shrink_then_write(false);
}

/// With the flusher: one throttle episode held a writer
/// for about 28 s and 1,024 writes did not finish in 20 s.
#[test]
fn a_failing_backend_under_a_shrink_does_not_hold_writers_with_the_flusher() {
    shrink_then_write(true);
}

/// A healthy file beside the failing one: its writers are throttled by
/// their own dirty bytes only (the failing file's unwritable bytes do not
/// hold them), every write succeeds and reaches its backend; the failing
/// backend sees each folio tried at most as its backoff allows, and the
/// file's retries spaced as one folio's are (reclaim, which writes dirty
/// victims one folio at a time, retried every one of them before).
#[test]
fn a_healthy_file_is_not_held_by_a_failing_one() {
    for flusher in [true, false] {
        let (cache, b, _file) = setup(flusher);
        cache.set_capacity(1 << 20).unwrap();
        let good = Failing::new(WRITES);
        let g = cache.open(Arc::clone(&good)).unwrap();
        let gg = g.clone();
        b.reset_attempts();
        let errors = cache.stats().writeback_errors;
        let t0 = Instant::now();
        bounded("writes to the healthy file", move || {
            for p in 0..WRITES {
                gg.write_at(&[byte(p, 2); PAGE as usize], p * PAGE).unwrap();
            }
        });
        let elapsed = t0.elapsed();
        let most = b.max_attempts();
        let bound = attempt_bound(elapsed, 0);
        assert!(
            most <= bound,
            "a failing page was tried {most} times in {elapsed:?} (allowed {bound})"
        );
        // And the file backs off as a whole: each folio's first try (one
        // per folio at most, reclaim writing them one by one), then
        // retrying passes spaced like one folio's tries, each of at most
        // one write per merged run (1 MiB) and one of reclaim's.
        let failed = cache.stats().writeback_errors - errors;
        let runs = u64::from(bound) * (DIRTY / (1 << 20) + 1);
        assert!(
            failed <= DIRTY / PAGE + runs,
            "flusher {flusher}: {failed} failed writes in {elapsed:?} \
             (the backoff allows {} first tries and {runs} retries)",
            DIRTY / PAGE
        );
        g.sync().unwrap();
        let data = good.inner.contents();
        for p in 0..WRITES {
            let at = (p * PAGE) as usize;
            assert!(data[at..at + PAGE as usize]
                .iter()
                .all(|&x| x == byte(p, 2)));
        }
        let s = cache.stats();
        assert!(
            s.cached_bytes <= DIRTY + cache.capacity(),
            "flusher {flusher}: {s:?}"
        );
    }
}

/// The flusher over a backend that keeps failing: it wakes every few
/// milliseconds (a 20 ms expiry) and finds the same dirty folios, but
/// tries each only as the backoff allows (before, every wake-up wrote
/// every folio again). A `sync` still tries at once and reports the error.
#[test]
fn the_flusher_backs_off_a_failing_backend() {
    let t0 = Instant::now();
    let (cache, b, file) = setup(true);
    // Long enough for the backoff to reach its cap.
    std::thread::sleep(WRITEBACK_RETRY_MAX + WRITEBACK_RETRY_MAX / 2);
    let elapsed = t0.elapsed();
    let most = b.max_attempts();
    let bound = attempt_bound(elapsed, 0);
    let s = cache.stats();
    assert!(most >= 1, "the flusher tried: {s:?}");
    assert!(
        most <= bound,
        "a page was tried {most} times in {elapsed:?} (the backoff allows {bound}); {s:?}"
    );
    assert!(
        s.unwritable_bytes > 0 && s.unwritable_bytes <= DIRTY,
        "{s:?}"
    );
    let before = b.max_attempts();
    assert!(file.sync().is_err(), "sync tries at once and reports");
    assert!(b.max_attempts() > before, "sync ignored the backoff");
    b.failing.store(false, Ordering::Relaxed);
    file.sync().unwrap();
    let s = cache.stats();
    assert_eq!((s.dirty_bytes, s.unwritable_bytes), (0, 0), "{s:?}");
}

/// Without a flusher and with no pressure on the capacity, nothing but the
/// writers retries a failed folio: once the backend recovers and the
/// folios' retry time has come, a refused writer's next write writes them
/// back and is accepted, without a `sync`.
#[test]
fn a_recovered_backend_takes_writes_again_without_a_sync() {
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(64 << 20)
            .dirty_bytes(64 << 10)
            .dirty_background_bytes(32 << 10)
            .flusher(false),
    );
    let b = Failing::new(64);
    let file = cache.open(Arc::clone(&b)).unwrap();
    b.failing.store(true, Ordering::Relaxed);
    let mut refused = None;
    for p in 0..64 {
        if let Err(e) = file.write_at(&[byte(p, 1); PAGE as usize], p * PAGE) {
            refused = Some(p);
            let eio = io::Error::from_raw_os_error(libc::EIO);
            assert_eq!(e.kind(), eio.kind(), "{e}");
            assert!(e.to_string().contains(&eio.to_string()), "{e}");
            break;
        }
    }
    let refused = refused.expect("writes past the bound are refused");
    assert!(refused > 0);
    b.failing.store(false, Ordering::Relaxed);
    std::thread::sleep(WRITEBACK_RETRY_MAX);
    file.write_at(&[byte(refused, 1); PAGE as usize], refused * PAGE)
        .unwrap();
    let s = cache.stats();
    assert_eq!(s.unwritable_bytes, 0, "{s:?}");
    let data = b.inner.contents();
    for p in 0..refused {
        let at = (p * PAGE) as usize;
        assert!(data[at..at + PAGE as usize]
            .iter()
            .all(|&x| x == byte(p, 1)));
    }
}

/// The throttle: writers over the dirty limit of a
/// cache whose backend fails every write, with the flusher retrying: each
/// throttle episode ends after at most [`STUCK_PAUSES`] pauses without a
/// byte reaching the backend (the count of stuck pauses used to start over
/// whenever the dirty sum dipped, which it does as failed runs move back
/// from writeback to dirty, read at different moments). Writes past the
/// bound on unwritable bytes are refused with the backend's error.
#[test]
fn a_throttled_writer_over_a_failing_backend_gives_up_after_the_stuck_pauses() {
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(64 << 20)
            .dirty_bytes(256 << 10)
            .dirty_background_bytes(128 << 10)
            .dirty_expire(Duration::from_millis(20))
            .ratelimit_pages(8),
    );
    let b = Failing::new(1024);
    let file = cache.open(Arc::clone(&b)).unwrap();
    b.failing.store(true, Ordering::Relaxed);
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let f = file.clone();
            std::thread::spawn(move || {
                (0..256u64)
                    .map(|i| {
                        let p = w * 512 + i;
                        f.write_at(&[byte(p, 1); PAGE as usize], p * PAGE).is_ok()
                    })
                    .collect::<Vec<bool>>()
            })
        })
        .collect();
    let accepted = bounded("two writers over a failing backend", move || {
        writers
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    let s = cache.stats();
    assert!(
        s.pauses <= u64::from(STUCK_PAUSES) * s.throttled,
        "{} pauses in {} throttle episodes: {s:?}",
        s.pauses,
        s.throttled
    );
    b.failing.store(false, Ordering::Relaxed);
    assert!(file.sync().is_err(), "the failures, once");
    file.sync().unwrap();
    let data = b.inner.contents();
    for (w, acc) in accepted.iter().enumerate() {
        for (i, &ok) in acc.iter().enumerate() {
            let p = w as u64 * 512 + i as u64;
            let at = (p * PAGE) as usize;
            let want = if ok { byte(p, 1) } else { 0 };
            assert!(
                data.get(at..at + PAGE as usize)
                    .is_none_or(|g| g.iter().all(|&x| x == want))
                    && (!ok || data.len() >= at + PAGE as usize),
                "page {p} (accepted: {ok})"
            );
        }
    }
}
