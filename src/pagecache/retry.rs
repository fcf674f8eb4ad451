//! Per-folio writeback backoff: after a backend write of a folio fails,
//! the passes that write back on their own (the flusher, a throttled
//! writer without a flusher, reclaim's `pageout`, a shrink) leave that
//! folio alone until its retry time, which doubles with each consecutive
//! failure from [`WRITEBACK_RETRY_MIN`] up to [`WRITEBACK_RETRY_MAX`]. An
//! explicit writeback (`sync`, `sync_range`, `write_back`,
//! `writeback_all`) always tries: its caller asked, and gets the error.
//!
//! The file backs off too: after a pass with a failed write, no folio
//! that failed before is tried again until the file's own retry time
//! (the same doubling, per failed pass; a pass whose writes all succeed
//! resets it), so a backend that fails everything sees one retrying pass
//! per wait (reclaim's `pageout` of one folio included), not one retry
//! per folio; dirty folios never tried are always tried once.
//!
//! Owns `Backoff`, one per file: the failed folios (by index) with their
//! consecutive failures, retry time and the dirty bytes their failed write
//! left (the bytes the cache could not write), and the cache-wide gauge of
//! those bytes (`Counters::unwritable_bytes`), which throttling leaves out
//! (a failing backend must not hold writers) and which bounds what a
//! failing file may dirty (`CacheInner::check_unwritable`, in `throttle`).
//!
//! Invariants: the gauge is the sum of every live file's entries' bytes
//! (each entry adds its bytes when made or refreshed and takes them back
//! when removed: a successful write of the folio, or the folio leaving the
//! file); an entry exists only for a folio whose last write failed.

use super::CacheInner;
use crate::sync::{AtomicU64, Lock, Ordering};
use std::collections::HashMap;
use std::time::Duration;

/// The wait before the first retry of a folio whose write failed; each
/// further consecutive failure doubles it, up to [`WRITEBACK_RETRY_MAX`].
/// Only the cache's own writeback waits (the flusher, throttled writers,
/// reclaim, [`set_capacity`](super::PageCache::set_capacity)'s shrink);
/// `sync` always tries.
///
/// ```
/// use kxarray::pagecache::{WRITEBACK_RETRY_MAX, WRITEBACK_RETRY_MIN};
/// assert!(WRITEBACK_RETRY_MIN < WRITEBACK_RETRY_MAX);
/// ```
pub const WRITEBACK_RETRY_MIN: Duration = Duration::from_millis(10);
/// The longest wait between two tries of a folio whose writes keep
/// failing (see [`WRITEBACK_RETRY_MIN`]): a failing backend sees at most
/// one write per folio per this interval from the cache's own writeback.
pub const WRITEBACK_RETRY_MAX: Duration = Duration::from_secs(1);

/// One failed folio.
struct Entry {
    /// Consecutive failures.
    fails: u32,
    /// [`CacheInner::now_ms`] before which the cache's own writeback
    /// leaves the folio alone.
    retry_at: u64,
    /// Dirty bytes its failed write left (counted in the cache's gauge).
    bytes: u64,
}

/// A file's failed folios (see the module notes).
pub(crate) struct Backoff {
    entries: Lock<HashMap<u64, Entry>>,
    /// `entries.len()`, read without the lock by the passes' fast path.
    len: AtomicU64,
    /// The earliest retry time of the entries, as of the last
    /// [`refresh`](Backoff::refresh) (never later than the true one: a
    /// new entry's time is folded in at once).
    next: AtomicU64,
    /// When a refused writer last tried the file's due folios
    /// ([`poke`](Backoff::poke)).
    poked: AtomicU64,
    /// The file's own backoff: consecutive passes that failed without a
    /// write of the file succeeding, and the time before which no folio
    /// that failed before is tried again, whatever its own retry time (a
    /// failing backend sees one retrying pass per wait, not one retry per
    /// folio).
    gate_fails: AtomicU64,
    gate_at: AtomicU64,
}

/// The wait after `fails` consecutive failures (at least one).
fn wait_after(fails: u64) -> Duration {
    WRITEBACK_RETRY_MIN
        .saturating_mul(1 << (fails.max(1) - 1).min(20))
        .min(WRITEBACK_RETRY_MAX)
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            entries: Lock::new(HashMap::new()),
            len: AtomicU64::new(0),
            next: AtomicU64::new(0),
            poked: AtomicU64::new(0),
            gate_fails: AtomicU64::new(0),
            gate_at: AtomicU64::new(0),
        }
    }

    /// Whether some folio's last write failed.
    #[inline]
    pub(crate) fn is_failing(&self) -> bool {
        self.len.load(Ordering::Relaxed) != 0
    }

    /// Whether the cache's own writeback may try the folio at `index` at
    /// `now` (a [`CacheInner::now_ms`]).
    #[inline]
    pub(crate) fn ready(&self, index: u64, now: u64) -> bool {
        if !self.is_failing() {
            return true;
        }
        let gate = self.gate_at.load(Ordering::Relaxed);
        self.entries
            .lock()
            .get(&index)
            .is_none_or(|e| e.retry_at <= now && gate <= now)
    }

    /// A pass over the file ended: if one of its writes failed, close the
    /// gate for the folios that failed before (the wait doubling with each
    /// such pass); if its writes all succeeded, open it.
    pub(crate) fn pass_ended(&self, cache: &CacheInner, failed: bool, wrote: bool) {
        if failed {
            let fails = self.gate_fails.fetch_add(1, Ordering::Relaxed) + 1;
            let at = cache.now_ms() + wait_after(fails).as_millis() as u64;
            self.gate_at.store(at, Ordering::Relaxed);
        } else if wrote {
            self.gate_fails.store(0, Ordering::Relaxed);
            self.gate_at.store(0, Ordering::Relaxed);
        }
    }

    /// The earliest retry time of the entries now.
    fn next_entry(&self) -> u64 {
        let m = self.entries.lock();
        m.values().map(|e| e.retry_at).min().unwrap_or(0)
    }

    /// Whether some folio's retry time has come (as of the last
    /// [`refresh`](Backoff::refresh)).
    #[inline]
    pub(crate) fn due(&self, now: u64) -> bool {
        self.is_failing()
            && self.next.load(Ordering::Relaxed) <= now
            && self.gate_at.load(Ordering::Relaxed) <= now
    }

    /// Whether a refused writer should try the file's folios now: some
    /// folio's retry time came, and no writer did so in the last
    /// [`WRITEBACK_RETRY_MIN`] (so writers refused in a row do not each
    /// walk the file).
    pub(crate) fn poke(&self, now: u64) -> bool {
        if !self.due(now) {
            return false;
        }
        let last = self.poked.load(Ordering::Relaxed);
        let min = WRITEBACK_RETRY_MIN.as_millis() as u64;
        if last != 0 && now < last + min {
            return false;
        }
        self.poked
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Recompute the earliest retry time (after a pass over the file).
    pub(crate) fn refresh(&self) {
        if !self.is_failing() {
            return;
        }
        let next = self.next_entry();
        self.next.store(next, Ordering::Relaxed);
    }

    /// The write of the folio at `index` failed, leaving `bytes` dirty:
    /// back off, doubling the wait.
    pub(crate) fn failed(&self, cache: &CacheInner, index: u64, bytes: u64) {
        let now = cache.now_ms();
        let gauge = &cache.counters.unwritable_bytes;
        let mut m = self.entries.lock();
        let e = m.entry(index).or_insert(Entry {
            fails: 0,
            retry_at: 0,
            bytes: 0,
        });
        e.fails = e.fails.saturating_add(1);
        e.retry_at = now + wait_after(u64::from(e.fails)).as_millis() as u64;
        self.next.fetch_min(e.retry_at, Ordering::Relaxed);
        gauge.fetch_add(bytes, Ordering::Relaxed);
        sub(gauge, core::mem::replace(&mut e.bytes, bytes));
        self.len.store(m.len() as u64, Ordering::Relaxed);
    }

    /// The folio at `index` was written (or left the file): forget it.
    pub(crate) fn forget(&self, cache: &CacheInner, index: u64) {
        if !self.is_failing() {
            return;
        }
        let mut m = self.entries.lock();
        if let Some(e) = m.remove(&index) {
            sub(&cache.counters.unwritable_bytes, e.bytes);
        }
        self.len.store(m.len() as u64, Ordering::Relaxed);
    }

    /// The file goes away: forget every entry.
    pub(crate) fn clear(&self, cache: &CacheInner) {
        let mut m = self.entries.lock();
        for (_, e) in m.drain() {
            sub(&cache.counters.unwritable_bytes, e.bytes);
        }
        self.len.store(0, Ordering::Relaxed);
        self.gate_fails.store(0, Ordering::Relaxed);
        self.gate_at.store(0, Ordering::Relaxed);
    }
}

/// Lower `gauge` by `n`, never below zero.
fn sub(gauge: &AtomicU64, n: u64) {
    if n > 0 {
        let _ = gauge.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(n))
        });
    }
}

impl CacheInner {
    /// Bytes the cache could not write (their folio's last write failed).
    #[inline]
    pub(crate) fn unwritable_bytes(&self) -> u64 {
        self.counters.unwritable_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pagecache::{CacheConfig, PageCache};

    /// Each failure doubles the wait (up to the cap) and replaces the
    /// bytes the folio counts in the gauge; a write (or the folio leaving)
    /// forgets it; other folios are never held.
    #[test]
    fn waits_double_up_to_the_cap_and_the_gauge_follows() {
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let c = &cache.inner;
        let b = Backoff::new();
        assert!(!b.is_failing() && b.ready(5, c.now_ms()));
        let mut wait = WRITEBACK_RETRY_MIN;
        for fails in 1..=12u64 {
            let t0 = c.now_ms();
            b.failed(c, 5, 100 * fails);
            let t1 = c.now_ms();
            assert_eq!(c.unwritable_bytes(), 100 * fails, "replaced, not added");
            let ms = wait.as_millis() as u64;
            assert!(!b.ready(5, t0 + ms - 1), "failure {fails}");
            assert!(b.ready(5, t1 + ms), "failure {fails}");
            assert!(b.ready(6, t0), "another folio");
            wait = (wait * 2).min(WRITEBACK_RETRY_MAX);
        }
        assert_eq!(wait, WRITEBACK_RETRY_MAX, "the cap was reached");
        b.failed(c, 9, 7);
        assert_eq!(c.unwritable_bytes(), 1207);
        b.forget(c, 5);
        assert_eq!(c.unwritable_bytes(), 7);
        assert!(b.is_failing() && b.ready(5, c.now_ms()));
        // The file's gate: a failed pass keeps every folio that failed
        // before waiting, even one whose own time came; a pass whose
        // writes succeeded opens it.
        let far = c.now_ms() + 10 * WRITEBACK_RETRY_MAX.as_millis() as u64;
        assert!(b.ready(9, far));
        b.pass_ended(c, true, false);
        let t = c.now_ms();
        assert!(
            !b.ready(9, t) && !b.due(t) && b.ready(42, t),
            "never failed: tried"
        );
        b.pass_ended(c, true, true);
        let min = WRITEBACK_RETRY_MIN.as_millis() as u64;
        assert!(
            !b.ready(9, t + min) && b.ready(9, far),
            "the gate's wait doubled"
        );
        b.pass_ended(c, false, true);
        assert!(b.ready(9, far), "open again");
        b.refresh();
        let now = c.now_ms();
        assert!(!b.due(now) && b.due(now + min));
        assert!(!b.poke(now) && b.poke(now + min), "due: poked once");
        assert!(!b.poke(now + min + 1), "not again so soon");
        assert!(b.poke(now + 2 * min));
        b.clear(c);
        assert_eq!(c.unwritable_bytes(), 0);
        assert!(!b.is_failing());
    }
}
