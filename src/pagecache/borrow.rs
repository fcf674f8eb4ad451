//! [`FolioBorrow`], the zero-copy reference borrowed under a caller's epoch
//! guard: the hit path with no reference count on the folio and no epoch
//! pin of its own.
//!
//! Owns the rule that lets a folio be borrowed for the guard's lifetime
//! `'g`: a folio loaded from a file's tree under a pinned [`Guard`](crate::Guard)
//! is not freed before the guard is dropped (a removed folio's last `Arc`
//! is dropped through the epoch), nor is the buffer its bytes were in when
//! borrowed (a replaced buffer is freed after a grace period), and while
//! the folio's borrow count is raised ([`MemBorrow`]) writers write a copy:
//! the bytes stay put. The count sits on the folio's line, so a zero-copy
//! hit touches nothing else of the folio's.

use super::folio::page_of;
use crate::filemap::{Folio, MemBorrow};

/// A zero-copy reference to a cached folio's bytes, borrowed under an epoch
/// [`Guard`](crate::Guard) the caller pinned
/// ([`CachedFile::read_folio_in`](super::CachedFile::read_folio_in)).
///
/// The same as [`FolioRef`](super::FolioRef) but cheaper: no reference
/// count on the folio and no epoch pin per lookup, so a caller that reads
/// many pages pins once for the batch. Its bytes never change while it
/// lives and it blocks no one (writers to the folio write a copy; reclaim
/// passes the folio over). The guard it borrows from keeps every folio
/// unlinked meanwhile unfreed, so do not hold the guard for long (see the
/// crate docs on guards).
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
/// file.write_at(&[7u8; 4096], 8192).unwrap();
/// let guard = kxarray::pin();
/// let mut sum = 0u64;
/// for index in 0..4 {
///     let page = file.read_folio_in(index, &guard).unwrap();
///     sum += page.page(index)[0] as u64;
/// }
/// assert_eq!(sum, 7);
/// ```
pub struct FolioBorrow<'g> {
    bytes: MemBorrow<'g>,
    folio: &'g Folio,
}

impl<'g> FolioBorrow<'g> {
    /// A borrow of `folio` holding `bytes`, a borrow of its bytes.
    #[inline]
    pub(crate) fn new(folio: &'g Folio, bytes: MemBorrow<'g>) -> FolioBorrow<'g> {
        FolioBorrow { bytes, folio }
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
    #[inline]
    pub fn page(&self, index: u64) -> &[u8] {
        page_of(
            self.folio.index(),
            self.folio.order(),
            self.bytes.bytes(),
            index,
        )
    }
}

impl std::ops::Deref for FolioBorrow<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.bytes.bytes()
    }
}

impl std::fmt::Debug for FolioBorrow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolioBorrow")
            .field("index", &self.index())
            .field("order", &self.order())
            .finish()
    }
}

/// The borrow cannot outlive the guard it was taken under:
///
/// ```compile_fail
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
/// let page = {
///     let guard = kxarray::pin();
///     file.read_folio_in(0, &guard).unwrap()
/// };
/// let _ = page.len();
/// ```
#[cfg(doctest)]
struct BorrowOutlivesGuard;
