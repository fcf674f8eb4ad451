//! The text of `PRAGMA kx_stats` ([`stats_text`]): the process cache's
//! counters (`passthrough_pages` and `passthrough_bytes`: reads that passed
//! the cache by, without a frame), then the VFS's own ([`VfsStats`](crate::process::VfsStats):
//! writes, syncs, fetches, lock conflicts, uncached reads, held reads
//! (`hold`), and the
//! coherence checks of issue 38: `coherence_checks`,
//! `coherence_partial_drops`, `coherence_full_drops`,
//! `coherence_pages_dropped`), the files open, and the shared memory
//! budget's `budget_*` fields when the cache joined one. Owns nothing else;
//! every counter is read with relaxed loads (a snapshot, not a
//! transaction).

use crate::inode;
use crate::process::vfs_stats;
use kxarray::pagecache::PageCache;
use std::sync::atomic::Ordering;

/// The text of `PRAGMA kx_stats`: the cache's counters and the VFS's, as
/// `name=value` pairs separated by spaces.
pub(crate) fn stats_text(cache: &PageCache) -> String {
    let s = cache.stats();
    let v = vfs_stats();
    let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    // The shared budget's fields, when the cache is in one.
    let budget = crate::process::budget_stats().map_or_else(String::new, |b| format!(" {b}"));
    format!(
        "capacity={} cached_pages={} hits={} misses={} readahead_pages={} passthrough_pages={} \
         passthrough_bytes={} evictions={} refaults={} backend_read_bytes={} backend_written_bytes={} dirty_bytes={} \
         writes={} syncs={} fetches={} fetches_held={} fetch_fallbacks={} lock_conflicts={} \
         uncached_reads={} held_reads={} coherence_checks={} coherence_partial_drops={} \
         coherence_full_drops={} coherence_pages_dropped={} open_files={}{budget}",
        cache.capacity(),
        s.cached_pages,
        s.hits,
        s.misses,
        s.readahead_pages,
        s.passthrough_pages,
        s.passthrough_bytes,
        s.evictions,
        s.refaults,
        s.backend_read_bytes,
        s.backend_written_bytes,
        s.dirty_bytes,
        r(&v.writes),
        r(&v.syncs),
        r(&v.fetches),
        r(&v.fetches_held),
        r(&v.fetch_fallbacks),
        r(&v.lock_conflicts),
        r(&v.uncached_reads),
        r(&v.held_reads),
        r(&v.coherence_checks),
        r(&v.coherence_partial_drops),
        r(&v.coherence_full_drops),
        r(&v.coherence_pages_dropped),
        inode::open_files(),
    )
}
