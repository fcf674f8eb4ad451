//! The background reclaimer (the kernel's `kswapd`): a thread the cache
//! owns that evicts ahead of the readers, so that a miss adds its folio
//! without reclaiming on its own time.
//!
//! Watermarks, in pages below the capacity (the kernel's zone watermarks,
//! turned around: the cache counts pages used, not pages free): a *gap* of
//! a 64th of the capacity, at most [`MAX_GAP`] pages. A miss that leaves
//! the cache above `capacity - gap / 2` (the low watermark) wakes the
//! thread, which evicts in the reclaim's batches down to `capacity - gap`
//! (the high watermark); a miss that finds the cache over its capacity
//! still reclaims itself (direct reclaim, as before: the thread fell
//! behind, or there is none). Dirty victims are left to the flusher (it is
//! woken) and to direct reclaim, which writes them back.
//!
//! Owns the thread and its wake-up event. Invariants: the thread holds
//! only a weak reference to the cache, so it never keeps it alive;
//! dropping the [`Kswapd`] sets the event and joins the thread; a wake-up
//! asked for while the thread is at work is not lost (the event's pending
//! request); the thread sleeps on the event when the cache is under its
//! low watermark (no timer wakes it but a long one), and rests
//! [`BACKOFF`] after a pass that evicted nothing (a cache full of dirty or
//! pinned folios does not keep it busy); before it sleeps it
//! drives the grace periods of the buffers it retired, so their frames do
//! not wait in its deferred lists while it sleeps. A cache smaller than
//! [`MIN_PAGES`] pages reclaims in its readers only (a gap there would be
//! less than a reclaim batch).

use super::stats::bump;
use super::CacheInner;
use crate::sync::{Event, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// The largest gap between the capacity and the background reclaimer's
/// target: 2 MiB of pages.
pub(crate) const MAX_GAP: u64 = 512;

/// The smallest capacity, in pages, with a background reclaimer at work
/// (8 MiB: a 64th of it is one reclaim batch).
pub(crate) const MIN_PAGES: u64 = 2048;

/// How long the thread sleeps without a request before it looks whether
/// its cache is gone (dropping the handle wakes it at once anyway).
const IDLE: Duration = Duration::from_secs(60);

/// How long the thread rests after a pass that evicted nothing.
const BACKOFF: Duration = Duration::from_millis(10);

/// The background reclaimer's handle.
pub(crate) struct Kswapd {
    event: Arc<Event>,
    thread: Option<JoinHandle<()>>,
}

/// The gap below a capacity of `cap` pages (see the module notes).
#[inline]
fn gap(cap: u64) -> u64 {
    (cap / 64).min(MAX_GAP)
}

impl CacheInner {
    /// The cached-page count above which a miss wakes the background
    /// reclaimer (`u64::MAX`: none runs, or the cache is too small for
    /// one).
    #[inline]
    pub(crate) fn kswapd_wake_mark(&self) -> u64 {
        let cap = self.capacity_pages();
        if self.kswapd_event.get().is_none() || cap < MIN_PAGES {
            return u64::MAX;
        }
        cap - gap(cap) / 2
    }

    /// Wake the background reclaimer (a single load while a request is
    /// already pending).
    #[inline]
    pub(crate) fn kick_kswapd(&self) {
        if let Some(e) = self.kswapd_event.get() {
            e.kick();
        }
    }

    /// Evict down to the high watermark (`balance_pgdat`); returns the
    /// pages evicted. Stops early when a pass evicts nothing (everything
    /// left is dirty, pinned or in use).
    pub(crate) fn balance(&self) -> u64 {
        let mut total = 0;
        loop {
            let cap = self.capacity_pages();
            if cap < MIN_PAGES {
                break;
            }
            let target = cap - gap(cap);
            if self.nr_cached.load(Ordering::Relaxed) <= target {
                break;
            }
            let (dirty, evicted) = self.scan(target, false);
            if !dirty.is_empty() {
                self.kick_flusher();
            }
            total += evicted;
            if evicted == 0 {
                break;
            }
        }
        if total > 0 {
            let dropped = self.workingset.shrink();
            bump(&self.counters.shadow_nodes_reclaimed, dropped);
        }
        total
    }
}

impl Kswapd {
    pub(crate) fn start(cache: &Arc<CacheInner>) -> Kswapd {
        let event = Arc::new(Event::new());
        let _ = cache.kswapd_event.set(Arc::clone(&event));
        let weak = Arc::downgrade(cache);
        let ev = Arc::clone(&event);
        let thread = std::thread::Builder::new()
            .name("kxarray-kswapd".into())
            .spawn(move || run(weak, ev))
            .ok();
        Kswapd { event, thread }
    }
}

fn run(cache: Weak<CacheInner>, event: Arc<Event>) {
    loop {
        if event.wait_timeout(IDLE) {
            return;
        }
        let Some(cache) = cache.upgrade() else {
            return;
        };
        // Requests from here on ask for another pass.
        event.take();
        if cache.balance() > 0 {
            // The evicted buffers wait for grace periods: drive them now
            // (this thread's deferred frees, then its light limbo), or
            // their frames stay out of the readers' reach while it sleeps.
            crate::pin().flush();
            crate::lightpin::reclaim();
        } else if cache.nr_cached.load(Ordering::Relaxed) > cache.kswapd_wake_mark() {
            // Nothing evictable (dirty, in use or pinned) and still above
            // the low watermark: back off instead of answering every
            // miss's wake-up with another fruitless pass (the kernel's
            // `kswapd_failures`). Requests made meanwhile are dropped.
            drop(cache);
            std::thread::sleep(BACKOFF);
            event.take();
        }
    }
}

impl Drop for Kswapd {
    fn drop(&mut self) {
        self.event.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::backend::RamDisk;
    use crate::pagecache::{Advice, CacheConfig, PageCache};
    use std::time::{Duration, Instant};

    const PAGE: u64 = 4096;

    /// A cache of `cap` pages of order-0 folios without a flusher, the
    /// reclaimer `on` or off, and a file twice its size advised random (a
    /// read of page 0 would otherwise start a readahead window).
    fn cache(cap: u64, on: bool) -> (PageCache, crate::pagecache::CachedFile) {
        let c = PageCache::new(
            CacheConfig::default()
                .capacity(cap * PAGE)
                .max_folio_order(0)
                .flusher(false)
                .background_reclaim(on),
        );
        let f = c.open(RamDisk::new(2 * cap * PAGE)).unwrap();
        f.advise(0, 0, Advice::Random).unwrap();
        (c, f)
    }

    /// A cache filled to just under its capacity (no miss ever finds it
    /// over, so no miss reclaims): the background reclaimer, woken past
    /// the low watermark, evicts down to the high one by itself (the
    /// reader goes on adding meanwhile, so the cache ends between the two),
    /// and the pages it evicted are counted as its own. Without the thread
    /// the cache would stay full.
    #[test]
    #[cfg_attr(miri, ignore = "a background thread and 4,000 misses")]
    fn evicts_ahead_of_the_readers_down_to_the_high_watermark() {
        let cap = 2 * super::MIN_PAGES; // gap: a 64th, 64 pages
        let (gap, low) = (cap / 64, cap - cap / 128);
        let (c, f) = cache(cap, true);
        let mut b = [0u8; 1];
        for page in 0..cap - 1 {
            f.read_at(&mut b, page * PAGE).unwrap();
        }
        // Until a snapshot finds the cache under the low watermark with its
        // counts settled: the reclaimer may still be in a pass, and a
        // snapshot taken inside one of its evictions sees the page gone but
        // not yet counted. A miss's reclaim or a lost page never settles,
        // and the assertions below report it at the deadline.
        let settled = |s: &crate::pagecache::CacheStats| {
            s.cached_pages <= low
                && s.evictions == s.background_evictions
                && s.cached_pages + s.evictions == cap - 1
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut s = c.stats();
        while !settled(&s) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            s = c.stats();
        }
        assert!(s.cached_pages <= low, "not under the low watermark: {s:?}");
        assert!(s.evictions >= gap / 2, "{s:?}");
        assert!(
            s.cached_pages + s.evictions == cap - 1,
            "pages lost or added: {s:?}"
        );
        assert_eq!(
            s.evictions, s.background_evictions,
            "a miss reclaimed: {s:?}"
        );
        // Each pass stops at the high watermark, at most a batch below.
        assert!(s.evictions <= (cap - 1) - (cap - gap) + 2 * 32, "{s:?}");
        // The readers' data is intact: the evicted pages read again.
        for page in 0..cap - 1 {
            assert_eq!(f.read_at(&mut b, page * PAGE).unwrap(), 1);
        }
    }

    /// Dirty folios are not the reclaimer's: a cache filled past its low
    /// watermark with writes (no flusher) keeps every byte, and evicts
    /// nothing in the background.
    #[test]
    #[cfg_attr(miri, ignore = "a background thread and 4,000 writes")]
    fn leaves_dirty_folios_alone() {
        let cap = 2 * super::MIN_PAGES;
        let c = PageCache::new(
            CacheConfig::default()
                .capacity(cap * PAGE)
                .max_folio_order(0)
                .dirty_bytes(cap * PAGE) // no throttling in the way
                .dirty_background_bytes(cap * PAGE)
                .flusher(false)
                .background_reclaim(true),
        );
        let f = c.open(RamDisk::new(2 * cap * PAGE)).unwrap();
        for page in 0..cap - 1 {
            f.write_at(&[page as u8 | 1; 4096], page * PAGE).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        let s = c.stats();
        assert_eq!((s.evictions, s.cached_pages), (0, cap - 1), "{s:?}");
        assert_eq!(s.dirty_bytes, (cap - 1) * PAGE);
        let mut b = [0u8; 4096];
        for page in 0..cap - 1 {
            f.read_at(&mut b, page * PAGE).unwrap();
            assert!(b.iter().all(|&x| x == page as u8 | 1), "page {page}");
        }
    }

    /// Switched off, or on a cache under 8 MiB: no thread evicts under the
    /// capacity.
    #[test]
    #[cfg_attr(miri, ignore = "4,000 misses")]
    fn off_or_small_evicts_only_over_capacity() {
        for (cap, on) in [(2 * super::MIN_PAGES, false), (super::MIN_PAGES - 1, true)] {
            let (c, f) = cache(cap, on);
            let mut b = [0u8; 1];
            for page in 0..cap {
                f.read_at(&mut b, page * PAGE).unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
            let s = c.stats();
            assert_eq!(
                (s.cached_pages, s.evictions),
                (cap, 0),
                "cap {cap}, on {on}"
            );
        }
    }
}
