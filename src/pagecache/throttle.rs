//! Dirty throttling (`balance_dirty_pages`): the check writers make after
//! dirtying, against the cache-wide dirty gauge
//! ([`DirtyGauge`](super::stats::DirtyGauge), kept in sharded counters).
//!
//! Owns [`ThrottleMode`], the writeback bandwidth estimate, and the pause.
//!
//! What is throttled is the bytes not yet on the backend: dirty plus under
//! writeback (the kernel's `NR_FILE_DIRTY + NR_WRITEBACK`), so a slow
//! backend cannot let writers fill memory with bytes that writeback has
//! taken but not yet written. The background threshold looks at the dirty
//! bytes alone, as `wb_over_bg_thresh` does.
//!
//! A writer adds what it dirtied to a per-thread count and reads the whole
//! gauge (the sum of its shards) only when that count reaches
//! `ratelimit_pages` pages (the kernel's `ratelimit_pages`; 8 pages while
//! the limit is exceeded, as `dirty_exceeded` does), or on every dirtied
//! page in [`ThrottleMode::GlobalRead`]. Above the background threshold it
//! kicks the flusher; above the dirty limit it sleeps, each pause computed
//! from the measured writeback bandwidth and capped at [`MAX_PAUSE`], until
//! the gauge is at or below the limit again. With no flusher thread, a
//! throttled writer writes back itself instead. A writer stops waiting
//! when writeback fails ([`STUCK_PAUSES`] pauses without a byte reaching
//! the backend while writes failed or nothing was in flight, so at most
//! `STUCK_PAUSES × MAX_PAUSE` = 2 s per episode, or one pass of its own
//! that lowered nothing): a failing backend must not hang writers, and its
//! error reaches the next `sync`; a slow one makes them wait.
//!
//! A failing backend's bytes are left out: the bytes whose folio's last
//! write failed (`unwritable`, kept by `retry`) are not counted against
//! the dirty limit nor the background threshold, so they hold no writer
//! (of their file or another); instead, while they are above the dirty
//! limit, a write to a file whose writeback fails is refused with the
//! file's writeback error ([`CacheInner::check_unwritable`]), which bounds
//! the memory a failing backend holds (`docs/memory.md`).
//!
//! Invariants: the gauge's shards sum (wrapping) to the dirty bytes, since
//! every dirtying and cleaning is booked exactly once, and writeback books
//! bytes as under writeback before it lowers the dirty gauge; so, with `W`
//! writer threads, the bytes not on the backend (dirty plus under
//! writeback) stay below `limit + W × (ratelimit_pages pages + one folio)`
//! (each thread's dirtying since its last check, which saw them at or below
//! the limit) while writeback works; no single pause exceeds [`MAX_PAUSE`].
//! The per-thread count is shared by all caches a thread writes to.

use super::inode::FileShared;
use super::writeback::{self, Mode};
use super::CacheInner;
use crate::filemap::PAGE_SIZE;
use crate::sync::{AtomicU64, Ordering};
use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

/// The longest single pause of a throttled writer (the kernel's
/// `MAX_PAUSE`, `HZ / 5`).
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache, MAX_PAUSE};
/// use std::time::Duration;
///
/// // Throttle and flush above one dirty page, checking on every page.
/// let config = CacheConfig::default().dirty_bytes(4096).ratelimit_pages(1);
/// let cache = PageCache::new(config.dirty_background_bytes(4096));
/// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
/// file.write_at(&[1; 2 * 4096], 0).unwrap(); // pauses until the flusher catches up
/// let s = cache.stats();
/// assert!(s.throttled >= 1 && s.pauses >= 1);
/// assert!(Duration::from_nanos(s.max_pause_asked_ns) <= MAX_PAUSE);
/// assert!(s.dirty_bytes <= 4096 && s.backend_written_bytes >= 4096);
/// ```
pub const MAX_PAUSE: Duration = Duration::from_millis(200);
/// Shortest pause.
const MIN_PAUSE: Duration = Duration::from_millis(1);
/// Pages between checks while the limit is exceeded.
const EXCEEDED_RATELIMIT: u64 = 8;
/// Consecutive pauses without a byte reaching the backend (while writes
/// failed or none was in flight) after which a throttled writer gives up
/// waiting (writeback is failing; `sync` reports why): a failing backend
/// holds a writer at most `STUCK_PAUSES` pauses of at most [`MAX_PAUSE`]
/// each per throttle episode (2 s).
///
/// ```
/// use kxarray::pagecache::{MAX_PAUSE, STUCK_PAUSES};
/// assert_eq!(MAX_PAUSE * STUCK_PAUSES, std::time::Duration::from_secs(2));
/// ```
pub const STUCK_PAUSES: u32 = 10;

/// How writers learn the cache's dirty bytes.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache, ThrottleMode};
///
/// let config = CacheConfig::default().flusher(false);
/// assert_eq!(config.throttle_mode, ThrottleMode::Ratelimited);
/// let global = PageCache::new(config.clone().throttle_mode(ThrottleMode::GlobalRead));
/// let file = global.open(RamDisk::new(1 << 20)).unwrap();
/// file.write_at(&[1; 8 * 4096], 0).unwrap();
/// assert_eq!(global.stats().dirty_global_reads, 8); // one per dirtied page
///
/// let limited = PageCache::new(config.ratelimit_pages(32));
/// let file = limited.open(RamDisk::new(1 << 20)).unwrap();
/// file.write_at(&[1; 8 * 4096], 0).unwrap();
/// assert_eq!(limited.stats().dirty_global_reads, 0); // fewer than 32 pages
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottleMode {
    /// Read the global gauge once per `ratelimit_pages` pages a thread
    /// dirties (the kernel's way).
    Ratelimited,
    /// Read the global gauge on every dirtied page (the comparison).
    GlobalRead,
}

thread_local! {
    /// Bytes this thread dirtied since its last check.
    static DIRTIED: Cell<u64> = const { Cell::new(0) };
}

/// Throttling state of one cache.
pub(crate) struct Throttle {
    /// Estimated writeback bandwidth, bytes per second (0: unknown).
    bw: AtomicU64,
    /// Whether the last check found the limit exceeded.
    exceeded: AtomicU64,
    pub(crate) throttled: AtomicU64,
    pub(crate) pauses: AtomicU64,
    pub(crate) pause_ns: AtomicU64,
    pub(crate) max_pause_ns: AtomicU64,
    pub(crate) max_pause_asked_ns: AtomicU64,
    pub(crate) global_reads: AtomicU64,
    /// Checks that found the dirty bytes above the background threshold.
    pub(crate) background_kicks: AtomicU64,
}

impl Throttle {
    pub(crate) fn new() -> Self {
        Throttle {
            bw: AtomicU64::new(0),
            exceeded: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            pause_ns: AtomicU64::new(0),
            max_pause_ns: AtomicU64::new(0),
            max_pause_asked_ns: AtomicU64::new(0),
            global_reads: AtomicU64::new(0),
            background_kicks: AtomicU64::new(0),
        }
    }

    /// Fold one backend write of `bytes` that took `took` into the
    /// bandwidth estimate (an average weighted 7:1 toward the past).
    pub(crate) fn note_writeback(&self, bytes: u64, took: Duration) {
        let sample = (bytes as f64 / took.as_secs_f64().max(1e-6)) as u64;
        let old = self.bw.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            (old / 8) * 7 + sample / 8
        };
        self.bw.store(new.max(1), Ordering::Relaxed);
    }

    fn pause_for(&self, over: u64) -> Duration {
        let bw = self.bw.load(Ordering::Relaxed);
        let d = if bw == 0 {
            Duration::from_millis(10)
        } else {
            Duration::from_secs_f64(over as f64 / bw as f64)
        };
        d.clamp(MIN_PAUSE, MAX_PAUSE)
    }
}

impl CacheInner {
    /// Bytes not yet on the backend that writeback can write: dirty and
    /// under writeback, less those whose folio's last write failed (a
    /// failing backend's bytes do not hold writers; the bound on them is
    /// [`check_unwritable`](CacheInner::check_unwritable)). The gauges are
    /// read one after the other, not at one moment: a pass moving bytes
    /// between them meanwhile makes the sum jump up or down by those bytes,
    /// so progress is never judged from it (see the pause loop).
    fn unwritten(&self) -> u64 {
        let c = &self.counters;
        (c.dirty_bytes.read() + c.writeback_bytes.load(Ordering::Relaxed))
            .saturating_sub(self.unwritable_bytes())
    }

    /// Dirty bytes writeback can write (the background threshold's
    /// measure): dirty, less those whose folio's last write failed.
    pub(crate) fn writable_dirty(&self) -> u64 {
        self.counters
            .dirty_bytes
            .read()
            .saturating_sub(self.unwritable_bytes())
    }

    /// The bound on what a failing backend leaves in memory: a write to
    /// `file` while some of its folios' last writes failed is refused,
    /// with the file's last writeback error, when the bytes the cache
    /// could not write (over every file) are above the dirty limit. So
    /// the bytes not on the backend stay below twice the dirty limit plus
    /// the writers' slack (the throttle's, for the bytes still thought
    /// writable, and this one's, for the bytes that turned out not to be).
    /// Once a failed folio's retry time has come, the file is written back
    /// (its folios due) before the write is refused, when the caller
    /// `may_wait`: a recovered backend takes writes again without a `sync`.
    ///
    /// # Errors
    /// The file's last writeback error (its kind and message), when the
    /// write is refused.
    pub(crate) fn check_unwritable(&self, file: &FileShared, may_wait: bool) -> io::Result<()> {
        let over =
            || file.backoff.is_failing() && self.unwritable_bytes() > self.dirty_bytes_limit();
        if !over() {
            return Ok(());
        }
        if may_wait && file.backoff.poke(self.now_ms()) {
            // A folio's retry time came: try again before refusing (with
            // no flusher and no reclaim, nothing else would, and a
            // recovered backend would refuse writes until a `sync`).
            let _ = writeback::writeback(file, 0, u64::MAX, Mode::Background);
            file.backoff.refresh();
        }
        if over() {
            return Err(file
                .errseq
                .current()
                .unwrap_or_else(|| io::Error::other("writeback of this file keeps failing")));
        }
        Ok(())
    }

    /// `balance_dirty_pages_ratelimited`: book that this thread dirtied
    /// `newly` bytes, and check the global dirty bytes when the ratelimit
    /// (or, in [`ThrottleMode::GlobalRead`], every page) says so.
    pub(crate) fn balance_dirty_pages(&self, newly: u64) {
        if newly == 0 {
            return;
        }
        let cfg = &self.config;
        let dirty = match cfg.throttle_mode {
            ThrottleMode::GlobalRead => {
                // One global read per dirtied page, as the kernel did
                // before it ratelimited the reads.
                let pages = newly.div_ceil(PAGE_SIZE as u64);
                let mut d = 0;
                for _ in 0..pages {
                    d = self.unwritten();
                }
                self.throttle
                    .global_reads
                    .fetch_add(pages, Ordering::Relaxed);
                d
            }
            ThrottleMode::Ratelimited => {
                let every = if self.throttle.exceeded.load(Ordering::Relaxed) != 0 {
                    EXCEEDED_RATELIMIT
                } else {
                    cfg.ratelimit_pages.max(1)
                } * PAGE_SIZE as u64;
                // Loom replays models on reused OS threads, so a count
                // kept from an earlier run would change what this run
                // does: under loom every call starts from zero.
                let acc = if cfg!(loom) {
                    newly
                } else {
                    DIRTIED.with(|c| {
                        let v = c.get() + newly;
                        c.set(if v >= every { 0 } else { v });
                        v
                    })
                };
                if acc < every {
                    return;
                }
                self.throttle.global_reads.fetch_add(1, Ordering::Relaxed);
                self.unwritten()
            }
        };
        if self.writable_dirty() > self.dirty_background_bytes() {
            self.throttle
                .background_kicks
                .fetch_add(1, Ordering::Relaxed);
            self.kick_flusher();
        }
        let limit = self.dirty_bytes_limit();
        if dirty <= limit {
            if self.throttle.exceeded.load(Ordering::Relaxed) != 0 {
                self.throttle.exceeded.store(0, Ordering::Relaxed);
            }
            return;
        }
        self.throttle.exceeded.store(1, Ordering::Relaxed);
        self.throttle.throttled.fetch_add(1, Ordering::Relaxed);
        let mut dirty = dirty;
        let mut stuck = 0;
        while dirty > limit {
            if self.flusher_event.get().is_none() {
                // No flusher: the writer writes back itself.
                for f in self.files() {
                    let _ = writeback::writeback(&f, 0, u64::MAX, Mode::Background);
                }
                let now = self.unwritten();
                if now >= dirty {
                    return; // failing writeback: errors go to `sync`
                }
                dirty = now;
                continue;
            }
            let c = &self.counters;
            let written = c.backend_written_bytes.load(Ordering::Relaxed);
            let errors = c.writeback_errors.load(Ordering::Relaxed);
            self.kick_flusher();
            let pause = self.throttle.pause_for(dirty - limit);
            let t0 = Instant::now();
            std::thread::sleep(pause);
            let ns = t0.elapsed().as_nanos() as u64;
            let t = &self.throttle;
            t.pauses.fetch_add(1, Ordering::Relaxed);
            t.pause_ns.fetch_add(ns, Ordering::Relaxed);
            t.max_pause_ns.fetch_max(ns, Ordering::Relaxed);
            // at most 200 ms, so the cast is lossless
            t.max_pause_asked_ns
                .fetch_max(pause.as_nanos() as u64, Ordering::Relaxed);
            let now = self.unwritten();
            // Progress is bytes reaching the backend, never a lower sum
            // (`unwritten` reads its gauges at different moments, and a
            // failed run's bytes moving back to dirty made the sum dip,
            // so the count of stuck pauses kept starting over).
            let progress = c.backend_written_bytes.load(Ordering::Relaxed) > written;
            let failing = c.writeback_errors.load(Ordering::Relaxed) > errors
                || c.writeback_bytes.load(Ordering::Relaxed) == 0;
            stuck = if progress || !failing { 0 } else { stuck + 1 };
            if stuck >= STUCK_PAUSES {
                return; // writeback fails (or nothing moves): errors go to `sync`
            }
            dirty = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_is_capped() {
        let t = Throttle::new();
        assert_eq!(t.pause_for(1 << 20), Duration::from_millis(10));
        t.note_writeback(1 << 20, Duration::from_secs(1)); // 1 MiB/s
        assert_eq!(t.pause_for(1 << 30), MAX_PAUSE);
        assert_eq!(t.pause_for(1), MIN_PAUSE);
    }
}
