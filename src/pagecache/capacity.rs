//! A cache's capacity at run time: the typed refusal of a capacity that
//! cannot be meant ([`CapacityError`]), the change itself (the capacity,
//! the dirty thresholds scaled with it, the workingset's shadow-node cap,
//! the frames' retain limit, then, whenever the cache is over the
//! capacity (not only when it shrank), reclaim down to it and the free
//! frames released), and the estimate of the memory a cache spends
//! beside its folios' bytes (the metadata in [`CacheStats`](super::CacheStats)).
//!
//! Invariants: capacity changes are serialized (`CacheInner::resize`); the
//! frames' retain limit always holds the sum of the live caches'
//! capacities in bytes (added when a cache is made, moved by every change,
//! removed when its last handle goes).

use super::inode::FileShared;
use super::CacheInner;
use crate::filemap::{Folio, PAGE_SIZE};
use crate::sync::Ordering;
use core::fmt;

/// The largest capacity [`PageCache::set_capacity`](super::PageCache::set_capacity)
/// accepts: 2^47 bytes (128 TiB, the user address space of x86-64 with
/// four-level page tables). Anything above cannot be held by one process.
pub const MAX_CAPACITY: u64 = 1 << 47;

/// A capacity [`PageCache::set_capacity`](super::PageCache::set_capacity)
/// refuses (nothing changed).
///
/// ```
/// use kxarray::pagecache::{CacheConfig, CapacityError, PageCache, MAX_CAPACITY};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// assert_eq!(cache.set_capacity(0), Err(CapacityError::TooSmall(0)));
/// let e = cache.set_capacity(MAX_CAPACITY + 1).unwrap_err();
/// assert_eq!(e, CapacityError::TooLarge(MAX_CAPACITY + 1));
/// assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::InvalidInput);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityError {
    /// Less than one page ([`PAGE_SIZE`] bytes).
    TooSmall(u64),
    /// More than [`MAX_CAPACITY`].
    TooLarge(u64),
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapacityError::TooSmall(b) => write!(
                f,
                "a cache capacity of {b} bytes is less than one page ({PAGE_SIZE} bytes)"
            ),
            CapacityError::TooLarge(b) => write!(
                f,
                "a cache capacity of {b} bytes is more than the largest, {MAX_CAPACITY} bytes"
            ),
        }
    }
}

impl std::error::Error for CapacityError {}

impl From<CapacityError> for std::io::Error {
    fn from(e: CapacityError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// The capacity in pages for `bytes`, or why it is refused.
pub(crate) fn pages_for(bytes: u64) -> Result<u64, CapacityError> {
    if bytes < PAGE_SIZE as u64 {
        return Err(CapacityError::TooSmall(bytes));
    }
    if bytes > MAX_CAPACITY {
        return Err(CapacityError::TooLarge(bytes));
    }
    Ok(bytes / PAGE_SIZE as u64)
}

/// `v * num / den` without overflow (`den > 0`).
fn scale(v: u64, num: u64, den: u64) -> u64 {
    (v as u128 * num as u128 / den as u128).min(u64::MAX as u128) as u64
}

/// Estimated heap bytes of one cached folio beside its bytes: the
/// `Arc<Folio>` allocation (the folio, the two counts, and the
/// allocator's chunk header and rounding, 16 bytes) and its frame's header
/// (a boxed [`Frame`](crate::filemap), with its chunk header).
pub(crate) const FOLIO_META_BYTES: usize =
    core::mem::size_of::<Folio>() + 16 + 16 + crate::filemap::FRAME_HEADER_BYTES + 16;

impl CacheInner {
    /// Set the capacity to `pages` (validated) and follow it: thresholds,
    /// shadow-node cap and retain limit first, then (whenever the cache is
    /// over it) reclaim down to it and release the free frames beyond the
    /// limit.
    pub(crate) fn resize(&self, pages: u64) {
        let _one_at_a_time = self.resize.lock();
        let old = self.capacity_pages.swap(pages, Ordering::Relaxed);
        for t in [&self.dirty_background, &self.dirty_limit] {
            let _ = t.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(scale(v, pages, old))
            });
        }
        self.workingset.set_capacity(pages);
        let page = PAGE_SIZE as u64;
        if pages >= old {
            crate::filemap::retain_frames(((pages - old) * page) as usize, true);
        } else {
            // The limit is lowered first, so that the frames the evictions
            // free are released rather than kept.
            crate::filemap::retain_frames(((old - pages) * page) as usize, false);
        }
        // Whenever the cache is over the capacity (this one, or an earlier
        // one pins, dirty folios or failed writes held it over), evict
        // down to it: setting the same capacity again, or a larger one
        // still under what is cached, is not a no-op.
        if self.nr_cached.load(Ordering::Relaxed) <= pages {
            return;
        }
        self.shrink_to_capacity();
        // Evicted buffers are freed after their grace periods: drive them
        // (this thread's deferred frees, then the light limbo), then
        // release what is over the limit.
        for _ in 0..8 {
            crate::pin().flush();
            crate::lightpin::reclaim();
        }
        crate::filemap::trim_frames_to_limit();
    }

    /// Estimated bytes of memory the cache spends beside its folios' bytes
    /// (see [`CacheStats::metadata_bytes`](super::CacheStats::metadata_bytes)).
    pub(crate) fn metadata_bytes(&self, files: &[std::sync::Arc<FileShared>]) -> u64 {
        let node = crate::node_cache::stats()
            .node_stride
            .max(core::mem::size_of::<crate::node::Node>());
        let nodes: usize = files.iter().map(|f| f.mapping.pages().node_count()).sum();
        let (entries, lists) = {
            let lru = self.lru.lock();
            (lru.entries(), lru.heap_bytes())
        };
        let blocks: usize = files.iter().map(|f| f.blocks.heap_bytes()).sum();
        let per_file = files.len() * core::mem::size_of::<FileShared>()
            + files.iter().map(|f| f.ring.lock().bytes()).sum::<usize>();
        (nodes * node
            + entries * FOLIO_META_BYTES
            + lists
            + blocks
            + self.workingset.queue_bytes()
            + per_file) as u64
    }
}

impl Drop for CacheInner {
    fn drop(&mut self) {
        let bytes = self.capacity_pages() as usize * PAGE_SIZE;
        crate::filemap::retain_frames(bytes, false);
    }
}

/// A [`PageCache`](super::PageCache) follows memory pressure through a
/// [`PressureMonitor`](crate::memory::PressureMonitor): the monitor calls
/// [`PageCache::set_capacity`](super::PageCache::set_capacity).
///
/// ```no_run
/// use kxarray::memory::{PressureConfig, PressureMonitor};
/// use kxarray::pagecache::{CacheConfig, PageCache};
/// use std::sync::Arc;
///
/// let cache = PageCache::new(CacheConfig::default().capacity(1 << 30));
/// // Off by default; where PSI is unavailable this logs one line and errs.
/// let _monitor = PressureMonitor::start(Arc::new(cache.clone()), PressureConfig::default()).ok();
/// ```
#[cfg(target_os = "linux")]
impl crate::memory::Resizable for super::PageCache {
    type Error = CapacityError;

    fn capacity(&self) -> u64 {
        super::PageCache::capacity(self)
    }

    fn set_capacity(&self, bytes: u64) -> Result<(), CapacityError> {
        super::PageCache::set_capacity(self, bytes)
    }

    fn used(&self) -> Option<u64> {
        Some(self.inner.nr_cached.load(Ordering::Relaxed) * PAGE_SIZE as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_are_checked_and_thresholds_scale() {
        assert_eq!(pages_for(0), Err(CapacityError::TooSmall(0)));
        assert_eq!(pages_for(4095), Err(CapacityError::TooSmall(4095)));
        assert_eq!(pages_for(4096), Ok(1));
        assert_eq!(pages_for(10_000), Ok(2));
        assert_eq!(pages_for(MAX_CAPACITY), Ok(MAX_CAPACITY / 4096));
        assert!(pages_for(u64::MAX).is_err());
        assert_eq!(scale(100, 1, 4), 25);
        assert_eq!(scale(u64::MAX, 2, 1), u64::MAX);
    }
}
