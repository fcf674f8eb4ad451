//! The cache's view of a folio: the access bit the hit path sets, the
//! liveness test every reader and writer repeats under the data lock, and
//! [`FolioRef`], the zero-copy reference.
//!
//! Owns the rule that makes a cached folio's bytes safe to borrow: they
//! change only under the folio's data lock held for writing, so a shared
//! read guard is a stable `&[u8]`. A `FolioRef` holds that guard (and the
//! folio it borrows from); writers to the folio and reclaim of it wait
//! (reclaim skips it) until the reference is dropped.

use crate::filemap::{Folio, FolioFlags, PAGE_SIZE};
use crate::sync::RwLockReadGuard;
use std::sync::Arc;

/// Record an access for reclaim (`folio_mark_accessed`): set `REFERENCED`,
/// without a write when it is already set (the common hit).
#[inline]
pub(crate) fn mark_accessed(f: &Folio) {
    if !f.test(FolioFlags::REFERENCED) {
        f.set(FolioFlags::REFERENCED);
    }
}

/// Whether a folio whose data lock the caller holds is still the cached,
/// filled one (not detached, read finished).
#[inline]
pub(crate) fn is_live(f: &Folio) -> bool {
    f.test(FolioFlags::UPTODATE) && !f.test(FolioFlags::DETACHED)
}

/// A zero-copy reference to a cached folio's bytes.
///
/// Dereferences to the whole folio (`2^order` pages; bytes past the end of
/// the file read as zeros). It holds the folio's data lock shared, so the
/// bytes cannot change while it lives: writers to this folio wait, and
/// reclaim passes it over. Keep it briefly (parse, then drop), as one would
/// a kernel `kmap_local_folio` mapping.
///
/// A thread holding a `FolioRef` must not write, truncate or read the same
/// folio through its [`CachedFile`](super::CachedFile) until it drops the
/// reference: the write waits for the reference (a self-deadlock), and a
/// read queued behind a waiting writer waits too. It is never unsound,
/// only a hang, like re-locking any reader-writer lock.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
/// file.write_at(&[7u8; 4096], 8192).unwrap();
/// let page = file.read_folio(2).unwrap();
/// assert_eq!(page.page(2), &[7u8; 4096][..]);
/// ```
pub struct FolioRef {
    // Field order matters: the guard borrows from `folio` and is dropped
    // first.
    guard: RwLockReadGuard<'static, Vec<u8>>,
    folio: Arc<Folio>,
}

impl FolioRef {
    /// Lock `folio` shared; `None` if it was detached or never filled (the
    /// caller looks the index up again).
    pub(crate) fn new(folio: Arc<Folio>, index: u64) -> Option<FolioRef> {
        debug_assert!(folio.contains(index));
        // SAFETY: the `Folio` lives in the `Arc`'s heap allocation, which
        // does not move and stays alive while `folio` (stored next to the
        // guard in the returned value) holds a reference; the guard field
        // is declared first, so it is dropped before that reference.
        let lock: &'static Folio = unsafe { &*Arc::as_ptr(&folio) };
        let guard = lock.data().read();
        if !is_live(&folio) {
            return None;
        }
        Some(FolioRef { guard, folio })
    }

    /// The folio itself.
    pub(crate) fn folio(&self) -> &Folio {
        &self.folio
    }

    /// Another reference to the folio itself.
    pub(crate) fn folio_arc(&self) -> Arc<Folio> {
        Arc::clone(&self.folio)
    }

    /// The folio's first page index.
    pub fn index(&self) -> u64 {
        self.folio.index()
    }

    /// The folio's order (`2^order` pages).
    pub fn order(&self) -> u32 {
        self.folio.order()
    }

    /// The bytes of page `index` (which must lie in this folio; an index
    /// outside gives an empty slice).
    pub fn page(&self, index: u64) -> &[u8] {
        if !self.folio.contains(index) {
            return &[];
        }
        let at = (index - self.folio.index()) as usize * PAGE_SIZE;
        &self.guard[at..at + PAGE_SIZE]
    }
}

impl std::ops::Deref for FolioRef {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.guard
    }
}

impl std::fmt::Debug for FolioRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolioRef")
            .field("index", &self.index())
            .field("order", &self.order())
            .finish()
    }
}
