//! Whether a read miss's data will be read again before it would be
//! evicted: the rule that decides which misses are admitted into the cache
//! and which pass it by (`passthrough` reads them straight into the
//! caller's buffer), as PostgreSQL's `BufferAccessStrategy` keeps a large
//! scan out of its shared buffers and the kernel's `POSIX_FADV_NOREUSE`
//! and `RWF_DONTCACHE` read without keeping.
//!
//! Owns one file's [`Reuse`] state: the `NoReuse` hint
//! ([`Advice::NoReuse`](super::Advice::NoReuse)), the stream of its read
//! misses (the page after the last one), and the runs of pages recently
//! passed by with the clocks when they were ([`Run`]), and the public
//! [`ReadFlags`] of one read.
//!
//! The rule ([`Reuse::wants`], then [`Reuse::pass`]), for a miss of a read at page `p` (no
//! folio there):
//! - it **may pass by** when the read asked for it ([`ReadFlags::NOREUSE`]),
//!   the file is advised `NoReuse`, or (when the cache's
//!   [`passthrough`](super::CacheConfig::passthrough) is on, the default,
//!   and the file is not advised `Random`) it continues a sequential
//!   stream (from the last page of the previous miss to [`GAP`] pages past
//!   it, or the file's first page) of a file larger than the cache's
//!   capacity: a second scan of such a file would find none of its pages
//!   cached (the workingset re-admits a refault only within the capacity),
//!   so keeping them buys nothing and evicts what is hot;
//! - **but is admitted** if `p` was passed by recently: inside a run
//!   remembered here whose refault distance (the pages of the run read
//!   after `p`, plus every page passed by and every page evicted since the
//!   run's last page) is at most the capacity: a page read again that soon
//!   would have stayed had it been cached, the workingset's own test
//!   (`workingset`) for pages that never had a shadow.
//!
//! Invariants: the rule only chooses where a miss's bytes come from (the
//! backend either way), never what a read returns; the state is per file
//! (as the readahead window): the stream moved on without a lock at every
//! miss the rule may pass by, and one lock taken only for a miss that
//! would pass by (the refault test and the record).

use crate::sync::{AtomicBool, AtomicU64, Lock, Ordering};

/// How far past the previous miss's end (in pages) a miss still continues
/// a sequential stream (a page or two read from elsewhere between).
pub(crate) const GAP: u64 = 4;

/// Runs of pages passed by that a file remembers.
const RECENT: usize = 8;

/// Flags of one read ([`CachedFile::read_at_with`](super::CachedFile::read_at_with)),
/// as `preadv2(2)` takes `RWF_*` flags.
///
/// ```
/// use kxarray::pagecache::ReadFlags;
///
/// let f = ReadFlags::empty() | ReadFlags::NOREUSE;
/// assert!(f.contains(ReadFlags::NOREUSE));
/// assert!(!ReadFlags::empty().contains(ReadFlags::NOREUSE));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadFlags(u32);

impl ReadFlags {
    /// The bytes read will not be read again soon: pages the cache does not
    /// hold are read from the backend without a frame (128 KiB or more
    /// straight into the caller's buffer, less through the file's 256 KiB
    /// ring) and not kept (the kernel's `RWF_DONTCACHE`); pages it holds, dirty
    /// or clean, are served from it as always. A page passed by that is
    /// read again within the workingset's distance is admitted then.
    pub const NOREUSE: ReadFlags = ReadFlags(1);

    /// No flag: what [`read_at`](super::CachedFile::read_at) does.
    pub const fn empty() -> ReadFlags {
        ReadFlags(0)
    }

    /// Whether every flag of `other` is set here.
    pub const fn contains(self, other: ReadFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for ReadFlags {
    type Output = ReadFlags;
    fn bitor(self, other: ReadFlags) -> ReadFlags {
        ReadFlags(self.0 | other.0)
    }
}

/// A run of pages passed by: `start..end`, and the clocks right after its
/// last page was ([`Clocks`]).
#[derive(Clone, Copy, Default)]
struct Run {
    start: u64,
    end: u64,
    passed: u64,
    evicted: u64,
}

/// The cache's clocks when a miss is judged: pages passed by so far (every
/// file's), pages evicted so far (the workingset's clock), and the
/// capacity in pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clocks {
    pub(crate) passed: u64,
    pub(crate) evicted: u64,
    pub(crate) capacity: u64,
}

/// Where a miss stands in its file's stream ([`Reuse::step`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    /// It continues the stream: from the previous miss's last page (a
    /// read that ended inside a page, then the next starting there) to
    /// [`GAP`] pages past it, or the file's first page (where a scan starts
    /// again: the kernel's readahead starts a window there).
    sequential: bool,
    /// It is the previous miss's last page again: the same read going on,
    /// not a refault.
    continuing: bool,
}

/// One file's state for the rule (see the module notes).
pub(crate) struct Reuse {
    noreuse: AtomicBool,
    /// Advised `Random`: no sequential stream to detect.
    random: AtomicBool,
    /// The page after the previous miss (a miss at `next - 1..=next + GAP`
    /// continues the stream).
    next: AtomicU64,
    recent: Lock<[Run; RECENT]>,
}

impl Reuse {
    pub(crate) fn new() -> Reuse {
        Reuse {
            noreuse: AtomicBool::new(false),
            random: AtomicBool::new(false),
            next: AtomicU64::new(0),
            recent: Lock::new([Run::default(); RECENT]),
        }
    }

    /// Whether the file is advised `NoReuse`.
    #[inline]
    pub(crate) fn noreuse(&self) -> bool {
        self.noreuse.load(Ordering::Relaxed)
    }

    /// Advise `NoReuse` (`on`), or back to normal.
    pub(crate) fn set_noreuse(&self, on: bool) {
        self.noreuse.store(on, Ordering::Relaxed);
    }

    /// Advise `Random` (`on`: the automatic detection of streams is off for
    /// the file, as the kernel's readahead is), or `Normal`/`Sequential`.
    pub(crate) fn set_random(&self, on: bool) {
        self.random.store(on, Ordering::Relaxed);
    }

    /// Whether a miss of this file may pass by at all (no lock): asked for
    /// (`explicit`, or the `NoReuse` hint), or the file of `size_pages` is
    /// larger than the capacity and `auto` detection is on.
    #[inline]
    pub(crate) fn may_pass(&self, explicit: bool, auto: bool, size_pages: u64, cap: u64) -> bool {
        explicit
            || (auto && size_pages > cap && !self.random.load(Ordering::Relaxed))
            || self.noreuse()
    }

    /// A miss at page `index`: move the stream on (no lock) and say where
    /// the miss stands in it.
    #[inline]
    pub(crate) fn step(&self, index: u64) -> Step {
        let prev = self.next.swap(index + 1, Ordering::Relaxed);
        Step {
            sequential: index == 0 || (index + 1 >= prev && index <= prev + GAP),
            continuing: prev > 0 && index + 1 == prev,
        }
    }

    /// Whether a miss at `step` may pass by (no lock): asked for, or a
    /// sequential miss of a file larger than `cap` pages with `auto` on.
    #[inline]
    pub(crate) fn wants(
        &self,
        step: Step,
        explicit: bool,
        auto: bool,
        size_pages: u64,
        cap: u64,
    ) -> bool {
        explicit
            || self.noreuse()
            || (step.sequential && self.may_pass(false, auto, size_pages, cap))
    }

    /// The rest of the rule for a miss of `n` pages from `index` (none of
    /// them cached) that [`wants`](Reuse::wants) to pass by, at `step`
    /// (see the module notes): `true` to pass them by, recorded as a run
    /// passed by at `clocks` (the caller then adds the pages to the pages
    /// passed by); `false` to admit them (a refault).
    pub(crate) fn pass(&self, index: u64, n: u64, step: Step, clocks: Clocks) -> bool {
        self.next.store(index + n, Ordering::Relaxed);
        let mut recent = self.recent.lock();
        if !step.continuing && refault(&recent, index, clocks) {
            return false;
        }
        record(&mut recent, index, n, clocks);
        true
    }

    /// The whole rule for a miss of `n` pages from `index` (the tests').
    #[cfg(test)]
    fn on_miss(
        &self,
        index: u64,
        n: u64,
        explicit: bool,
        auto: bool,
        size_pages: u64,
        clocks: Clocks,
    ) -> bool {
        let step = self.step(index);
        self.next.store(index + n, Ordering::Relaxed);
        self.wants(step, explicit, auto, size_pages, clocks.capacity)
            && self.pass(index, n, step, clocks)
    }

    /// A reader reached readahead's marker and the next window would start
    /// at page `index`: whether to read it into the cache no more, the
    /// stream's misses from `index` on passing the cache by instead (the
    /// file grew larger than the capacity, or was advised `NoReuse`, since
    /// the stream began; `explicit`: the reader's own read asked).
    pub(crate) fn stop_readahead(
        &self,
        index: u64,
        explicit: bool,
        auto: bool,
        size_pages: u64,
        clocks: Clocks,
    ) -> bool {
        if !self.may_pass(explicit, auto, size_pages, clocks.capacity) {
            return false;
        }
        if refault(&self.recent.lock(), index, clocks) {
            return false;
        }
        self.next.store(index, Ordering::Relaxed);
        true
    }
}

/// Whether page `index` lies in a run passed by within `clocks.capacity`
/// pages of traffic (a refault the workingset would keep).
fn refault(recent: &[Run; RECENT], index: u64, c: Clocks) -> bool {
    recent.iter().any(|r| {
        index >= r.start && index < r.end && {
            let distance = (r.end - index)
                .saturating_add(c.passed.saturating_sub(r.passed))
                .saturating_add(c.evicted.saturating_sub(r.evicted));
            distance <= c.capacity
        }
    })
}

/// Record pages `index..index + n` passed by at `c`: the run they continue
/// (`index` its last page, or up to [`GAP`] pages past it) grows, or the
/// run stamped longest ago is replaced.
fn record(recent: &mut [Run; RECENT], index: u64, n: u64, c: Clocks) {
    let stamp = Run {
        start: index,
        end: index + n,
        passed: c.passed.wrapping_add(n),
        evicted: c.evicted,
    };
    let grows = recent
        .iter_mut()
        .find(|r| r.end > r.start && index + 1 >= r.end && index <= r.end + GAP);
    if let Some(r) = grows {
        *r = Run {
            start: r.start,
            end: r.end.max(stamp.end),
            ..stamp
        };
        return;
    }
    let oldest = recent
        .iter_mut()
        .min_by_key(|r| if r.end > r.start { r.passed } else { 0 })
        .expect("RECENT > 0");
    *oldest = stamp;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clocks(passed: u64, evicted: u64, capacity: u64) -> Clocks {
        Clocks {
            passed,
            evicted,
            capacity,
        }
    }

    #[test]
    fn a_stream_of_a_file_larger_than_the_cache_passes_by() {
        let r = Reuse::new();
        let mut passed = 0;
        // 400 pages, a 100-page cache: sequential misses pass by.
        for i in 0..400 {
            assert!(r.on_miss(i, 1, false, true, 400, clocks(passed, 0, 100)));
            passed += 1;
        }
        // A jump is a random miss: admitted.
        assert!(!r.on_miss(10_000, 1, false, true, 400, clocks(passed, 0, 100)));
        // The same file fits in a 500-page cache: admitted.
        let r = Reuse::new();
        assert!(!r.on_miss(0, 1, false, true, 400, clocks(0, 0, 500)));
        // Automatic detection off: admitted unless asked.
        let r = Reuse::new();
        assert!(!r.on_miss(0, 1, false, false, 400, clocks(0, 0, 100)));
        assert!(r.on_miss(1, 1, true, false, 400, clocks(0, 0, 100)));
        r.set_noreuse(true);
        assert!(r.on_miss(9000, 1, false, false, 400, clocks(1, 0, 100)));
    }

    #[test]
    fn a_page_passed_by_and_read_again_soon_is_admitted() {
        let r = Reuse::new();
        // Pages 100..120 of a large file passed by (asked for).
        let mut passed = 0;
        for i in 100..120 {
            assert!(r.on_miss(i, 1, true, true, 10_000, clocks(passed, 0, 50)));
            passed += 1;
        }
        // Read again at once: within 20 pages of traffic, admitted.
        assert!(!r.on_miss(100, 1, true, true, 10_000, clocks(passed, 0, 50)));
        // After 40 more pages passed by elsewhere and 10 evicted, page 105
        // is 15 + 40 + 10 = 65 pages away: past a 50-page cache.
        let c = clocks(passed + 40, 10, 50);
        assert!(r.on_miss(105, 1, true, true, 10_000, c));
        // Page 118 is 2 + 40 + 10 = 52 pages away: past a 51-page cache.
        assert!(r.on_miss(118, 1, true, true, 10_000, clocks(passed + 40, 10, 51)));
        let r2 = Reuse::new();
        for i in 0..10 {
            r2.on_miss(i, 1, true, true, 10_000, clocks(i, 0, 50));
        }
        // (Elsewhere first: page 9 right after page 9 is the same read.)
        r2.on_miss(5000, 1, true, true, 10_000, clocks(10, 0, 50));
        assert!(!r2.on_miss(9, 1, true, true, 10_000, clocks(10 + 49, 0, 50)));
        assert!(r2.on_miss(8, 1, true, true, 10_000, clocks(10 + 49, 0, 50)));
    }

    #[test]
    fn runs_grow_across_small_gaps_and_the_oldest_is_replaced() {
        let mut recent = [Run::default(); RECENT];
        record(&mut recent, 10, 2, clocks(0, 0, 0));
        record(&mut recent, 14, 1, clocks(2, 0, 0)); // 2 pages past the end
        assert_eq!((recent[0].start, recent[0].end), (10, 15));
        for k in 0..RECENT as u64 {
            record(&mut recent, 1000 * (k + 1), 1, clocks(10 + k, 0, 0));
        }
        // The run [10, 15) was the oldest: replaced.
        assert!(recent.iter().all(|r| r.start != 10));
    }

    #[test]
    fn readahead_stops_when_the_file_no_longer_fits() {
        let r = Reuse::new();
        assert!(!r.stop_readahead(64, false, true, 400, clocks(0, 0, 500)));
        assert!(r.stop_readahead(64, false, true, 400, clocks(0, 0, 100)));
        // The next miss, at the window's start, continues the stream.
        assert!(r.on_miss(64, 1, false, true, 400, clocks(0, 0, 100)));
    }
}
