//! The page cache's counters: [`CacheStats`] (what a user reads) and the
//! sharded counters behind it.
//!
//! Owns every event counter and gauge of a cache: the dirty gauge
//! ([`DirtyGauge`]: bytes of dirty blocks over every file of a cache, one
//! padded slot per thread shard, so dirtying never bounces one shared line)
//! among them. Hot counters (hits, misses) and the gauge are split over
//! cache-line-padded slots, one per thread: the first 64 threads that count
//! each own a slot (claimed on their first count, given back when they
//! exit) and count in it with a plain load and store, no locked
//! instruction and no line shared between cores; later threads share one
//! slot and count in it with atomic adds. A snapshot sums the slots, and
//! is exact once the counting threads' stores are visible.
//! Invariant: counters only grow, except the gauges (`dirty_bytes`,
//! `writeback_bytes`, `unwritable_bytes`), which the cache raises and lowers in pairs.

use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use std::cell::Cell;

/// Slots a thread may own alone (then it counts with a plain load and
/// store, no locked instruction); threads beyond them share the last slot.
const OWNED: usize = 64;
/// The shared slot.
const SHARED: usize = OWNED;
const SHARDS: usize = OWNED + 1;

#[repr(align(128))]
struct Slot(AtomicU64);

impl Slot {
    /// Add `n` (wrapping): a plain load and store in an owned slot (its
    /// only writer), an atomic add in the shared one.
    #[inline(always)]
    fn add(&self, i: usize, n: u64) {
        if i < OWNED {
            self.0.store(
                self.0.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        } else {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Which owned slots are taken (one bit each), process-wide: the slot
/// index is the same in every counter of every cache.
static OWNERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

crate::sync::thread_local_const! {
    /// This thread's slot, `usize::MAX` before its first count.
    static ID: Cell<usize> = Cell::new(usize::MAX);
}

/// Gives the owned slot back when its thread exits.
struct Owner(usize);

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = ID.try_with(|c| c.set(SHARED));
        // Release: the slot's next owner (which claims it with Acquire)
        // sees every count this thread stored in it.
        OWNERS.fetch_and(!(1u64 << self.0), std::sync::atomic::Ordering::Release);
    }
}

std::thread_local! {
    static OWNER: Cell<Option<Owner>> = const { Cell::new(None) };
}

/// This thread's slot: claimed on its first count.
#[inline(always)]
pub(crate) fn shard() -> usize {
    // Loom replays a model many times and needs every run to touch the
    // same atomics: the shared slot, counted with atomic adds.
    if cfg!(loom) {
        return SHARED;
    }
    let i = ID.with(Cell::get);
    if i != usize::MAX {
        return i;
    }
    claim()
}

#[cold]
fn claim() -> usize {
    use std::sync::atomic::Ordering as O;
    let mut taken = OWNERS.load(O::Relaxed);
    let i = loop {
        if taken == u64::MAX {
            break SHARED;
        }
        let i = (!taken).trailing_zeros() as usize;
        match OWNERS.compare_exchange_weak(taken, taken | 1 << i, O::Acquire, O::Relaxed) {
            Ok(_) => break i,
            Err(t) => taken = t,
        }
    };
    if i != SHARED && OWNER.try_with(|o| o.set(Some(Owner(i)))).is_err() {
        // The thread is exiting (no destructor can be registered): give
        // the slot back at once and share.
        OWNERS.fetch_and(!(1u64 << i), O::Release);
        ID.with(|c| c.set(SHARED));
        return SHARED;
    }
    ID.with(|c| c.set(i));
    i
}

/// A counter split over per-thread slots.
pub(crate) struct Sharded([Slot; SHARDS]);

impl Sharded {
    pub(crate) fn new() -> Self {
        Sharded(std::array::from_fn(|_| Slot(AtomicU64::new(0))))
    }
    #[inline(always)]
    pub(crate) fn add(&self, n: u64) {
        let i = shard();
        self.0[i].add(i, n);
    }
    pub(crate) fn sum(&self) -> u64 {
        self.0
            .iter()
            .fold(0u64, |a, s| a.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// A gauge split over padded per-thread slots. A slot may go "negative"
/// (wrapping) when a thread cleans bytes another dirtied; the wrapping sum
/// is exact.
pub(crate) struct DirtyGauge([Slot; SHARDS]);

impl DirtyGauge {
    pub(crate) fn new() -> Self {
        DirtyGauge(std::array::from_fn(|_| Slot(AtomicU64::new(0))))
    }
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        if n > 0 {
            let i = shard();
            self.0[i].add(i, n);
        }
    }
    #[inline]
    pub(crate) fn sub(&self, n: u64) {
        if n > 0 {
            let i = shard();
            self.0[i].add(i, n.wrapping_neg());
        }
    }
    /// The global read: every shard. Transiently negative sums (a clean
    /// booked before its dirtying was seen) read as 0.
    pub(crate) fn read(&self) -> u64 {
        let s = self
            .0
            .iter()
            .fold(0u64, |a, s| a.wrapping_add(s.0.load(Ordering::Relaxed)));
        if (s as i64) < 0 {
            0
        } else {
            s
        }
    }
}

/// The live counters of one cache.
pub(crate) struct Counters {
    pub(crate) hits: Sharded,
    pub(crate) misses: Sharded,
    pub(crate) refaults: AtomicU64,
    pub(crate) activations: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) shadow_nodes_reclaimed: AtomicU64,
    pub(crate) dirty_bytes: DirtyGauge,
    pub(crate) writeback_bytes: AtomicU64,
    pub(crate) writeback_errors: AtomicU64,
    /// Dirty bytes whose folio's last backend write failed (`retry`).
    pub(crate) unwritable_bytes: AtomicU64,
    pub(crate) backend_read_bytes: AtomicU64,
    pub(crate) backend_written_bytes: AtomicU64,
    pub(crate) readahead_pages: AtomicU64,
    /// Pages and bytes read for callers straight from the backend
    /// (`passthrough`); the pages are the rule's clock too (`reuse`).
    pub(crate) passthrough_pages: AtomicU64,
    pub(crate) passthrough_bytes: AtomicU64,
    pub(crate) flusher_runs: AtomicUsize,
    pub(crate) background_evictions: AtomicU64,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            hits: Sharded::new(),
            misses: Sharded::new(),
            refaults: AtomicU64::new(0),
            activations: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            shadow_nodes_reclaimed: AtomicU64::new(0),
            dirty_bytes: DirtyGauge::new(),
            writeback_bytes: AtomicU64::new(0),
            writeback_errors: AtomicU64::new(0),
            unwritable_bytes: AtomicU64::new(0),
            backend_read_bytes: AtomicU64::new(0),
            backend_written_bytes: AtomicU64::new(0),
            readahead_pages: AtomicU64::new(0),
            passthrough_pages: AtomicU64::new(0),
            passthrough_bytes: AtomicU64::new(0),
            flusher_runs: AtomicUsize::new(0),
            background_evictions: AtomicU64::new(0),
        }
    }
}

/// Add to a plain counter.
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Subtract from a gauge.
#[inline]
pub(crate) fn drop_gauge(c: &AtomicU64, n: u64) {
    c.fetch_sub(n, Ordering::Relaxed);
}

/// A snapshot of a cache's counters ([`PageCache::stats`](super::PageCache::stats)).
///
/// Page counts are in pages of [`PAGE_SIZE`](crate::filemap::PAGE_SIZE)
/// bytes; `hits` and `misses` count page lookups by reads, writes and
/// [`read_folio`](super::CachedFile::read_folio).
///
/// Each field is read on its own, not under one lock: while the flusher
/// runs, bytes moving between `dirty_bytes` and `writeback_bytes` may
/// count in both or in neither of one snapshot.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 20)).unwrap();
/// file.write_at(&[7; 4096], 0).unwrap(); // a whole block: nothing to read first
/// let s = cache.stats();
/// assert_eq!((s.capacity_bytes, s.cached_bytes), (64 << 20, 4096));
/// assert!(s.metadata_bytes > 0); // a tree node, a folio struct, a frame header
/// let s = cache.stats();
/// assert_eq!((s.misses, s.cached_pages, s.dirty_bytes), (1, 1, 4096));
/// assert_eq!(s.backend_read_bytes, 0);
/// file.sync().unwrap();
/// let s = cache.stats();
/// assert_eq!((s.dirty_bytes, s.backend_written_bytes), (0, 4096));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Page lookups that found an uptodate folio.
    pub hits: u64,
    /// Page lookups that had to read the backend into a folio (or
    /// allocate one for a write): the frames filled. Reads that passed the
    /// cache by are not misses here: see `passthrough_pages`.
    pub misses: u64,
    /// Misses that found a shadow entry (the page was cached before).
    pub refaults: u64,
    /// Folios moved to the active list (second access or refault).
    pub activations: u64,
    /// Folios evicted by reclaim.
    pub evictions: u64,
    /// Folios of those evictions made by the background reclaimer (ahead
    /// of the readers), not by a miss over capacity
    /// ([`CacheConfig::background_reclaim`](super::CacheConfig::background_reclaim)).
    pub background_evictions: u64,
    /// Shadow entries held now, over every file.
    pub shadows: u64,
    /// Shadow-only index ranges (one tree node's span) reclaimed.
    pub shadow_nodes_reclaimed: u64,
    /// Bytes in dirty blocks now (whole folios in whole-folio mode).
    pub dirty_bytes: u64,
    /// Times a writer found the dirty limit exceeded and was throttled.
    pub throttled: u64,
    /// Pauses throttled writers slept (each at most 200 ms).
    pub pauses: u64,
    /// Total time throttled writers slept, in nanoseconds.
    pub pause_ns: u64,
    /// Longest single pause as slept (measured), in nanoseconds: at most
    /// `max_pause_asked_ns` plus however late the OS woke the sleeper.
    pub max_pause_ns: u64,
    /// Longest single pause asked for, in nanoseconds (never above
    /// [`MAX_PAUSE`](super::MAX_PAUSE)).
    pub max_pause_asked_ns: u64,
    /// Reads of the global dirty gauge by writers.
    pub dirty_global_reads: u64,
    /// Writer checks that found the dirty bytes above the background
    /// threshold and woke the flusher (counted with or without a flusher
    /// thread).
    pub background_kicks: u64,
    /// Wake-ups of the flusher thread (its timer or a request); one
    /// wake-up runs passes until the dirty bytes are at or below the
    /// background threshold or a pass writes nothing.
    pub flusher_runs: u64,
    /// Bytes under writeback now (taken from dirty blocks, not yet
    /// written to the backend). Dirty throttling counts `dirty_bytes +
    /// writeback_bytes - unwritable_bytes`.
    pub writeback_bytes: u64,
    /// Backend writes that failed during writeback (the blocks stayed
    /// dirty; the error went to each file's error sequence).
    pub writeback_errors: u64,
    /// Dirty bytes the cache could not write now: their folio's last
    /// backend write failed, and the cache's own writeback waits before it
    /// tries them again ([`WRITEBACK_RETRY_MIN`](super::WRITEBACK_RETRY_MIN)).
    /// Throttling leaves them out; while they are above the dirty limit a
    /// write to a file whose writeback fails returns the file's writeback
    /// error (see `docs/memory.md`).
    pub unwritable_bytes: u64,
    /// Bytes read from backends.
    pub backend_read_bytes: u64,
    /// Bytes written to backends.
    pub backend_written_bytes: u64,
    /// Pages cached now.
    pub cached_pages: u64,
    /// Pages brought in by readahead (beyond the one asked for).
    pub readahead_pages: u64,
    /// Pages read for callers from the backend without a frame (into
    /// their buffers, through a file's ring, or a folio dropped behind its
    /// reader), passing the cache by (a scan of a file larger than the
    /// cache, [`ReadFlags::NOREUSE`](super::ReadFlags::NOREUSE), a file
    /// advised [`NoReuse`](super::Advice::NoReuse)): no frame filled,
    /// nothing evicted. Also counted in `backend_read_bytes`. A page
    /// read in parts by several reads counts once per read.
    pub passthrough_pages: u64,
    /// Bytes of those reads (what their callers received).
    pub passthrough_bytes: u64,
    /// The capacity now, in bytes ([`PageCache::set_capacity`](super::PageCache::set_capacity)).
    pub capacity_bytes: u64,
    /// Bytes of folios cached now (`cached_pages` pages): at most
    /// `capacity_bytes`, except folios pinned, in use or dirty that reclaim
    /// could not evict yet.
    pub cached_bytes: u64,
    /// Bytes of free folio frames held for the next misses, process-wide
    /// (every cache shares the frames): at most the sum of the live caches'
    /// capacities minus the frames in use, plus 2 MiB, plus up to 128 KiB
    /// per size class in each thread's magazine
    /// ([`frame_stats`](crate::filemap::frame_stats)).
    pub frame_bytes_free: u64,
    /// Estimated bytes the cache spends beside its folios' bytes: tree
    /// nodes (every file's, counted times the node's stride), one folio
    /// struct and frame header per folio on the reclaim lists (with the
    /// allocator's chunk headers), the reclaim lists' and the block maps'
    /// tables (capacities times entry sizes), the workingset's queue of
    /// shadow nodes and the files' shared state (with the 256 KiB ring of
    /// each file a small read passed the cache by). Not counted: the bytes
    /// of frames pinned by zero-copy references after their folio moved
    /// on, and threads' magazines of tree nodes.
    pub metadata_bytes: u64,
}

impl CacheStats {
    /// `hits / (hits + misses)`, or 0 with no lookups.
    ///
    /// ```
    /// use kxarray::pagecache::CacheStats;
    ///
    /// let mut s = CacheStats::default();
    /// assert_eq!(s.hit_ratio(), 0.0); // no lookups
    /// s.hits = 3;
    /// s.misses = 1;
    /// assert_eq!(s.hit_ratio(), 0.75);
    /// ```
    pub fn hit_ratio(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More threads than owned slots, each counting many times, some
    /// exiting while others count: the sum is exact, and slots are given
    /// back (a later wave of threads finds owned slots again).
    #[test]
    fn counts_are_exact_over_owned_and_shared_slots() {
        let c = std::sync::Arc::new(Sharded::new());
        for wave in 0..2 {
            let threads: Vec<_> = (0..80)
                .map(|t| {
                    let c = std::sync::Arc::clone(&c);
                    std::thread::spawn(move || {
                        for _ in 0..1000 {
                            c.add(1);
                        }
                        c.add(t);
                        shard()
                    })
                })
                .collect();
            let slots: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert!(
                slots.iter().any(|&i| i < OWNED),
                "wave {wave}: no owned slot"
            );
            let per_wave = 80 * 1000 + (0..80).sum::<u64>();
            assert_eq!(c.sum(), per_wave * (wave + 1));
        }
    }

    #[test]
    fn gauge_sums_across_threads() {
        let g = std::sync::Arc::new(DirtyGauge::new());
        g.add(10_000);
        let g2 = std::sync::Arc::clone(&g);
        std::thread::spawn(move || g2.sub(4_000)).join().unwrap();
        assert_eq!(g.read(), 6_000);
    }
}
