//! The cache's view of a folio: the access bit the hit path sets, the
//! liveness test every locked reader and writer repeats, and [`FolioRef`],
//! the zero-copy reference, and [`HeldFolio`], a reference kept with its
//! folio so that asking whether it is still current needs no lookup.
//!
//! Owns the rule that makes a cached folio's bytes safe to hand out: a
//! reference pins the buffer that held the folio's bytes when it was taken
//! ([`BufPin`]), and a pinned buffer never changes: a writer to the folio
//! writes a copy and makes that current instead (copy-on-write), reclaim
//! passes a pinned folio over, and truncation leaves the pinned bytes to
//! the pin. So a reference never blocks anyone and never sees a byte move.

use crate::filemap::{BufPin, Folio, FolioFlags, PAGE_SIZE};
use std::sync::Arc;

/// Record an access for reclaim (`folio_mark_accessed`): set `REFERENCED`,
/// without a write when it is already set (the common hit).
#[inline]
pub(crate) fn mark_accessed(f: &Folio) {
    if !f.test(FolioFlags::REFERENCED) {
        f.set(FolioFlags::REFERENCED);
    }
}

/// Whether a folio is still the cached, filled one (not detached, fill
/// finished).
#[inline]
pub(crate) fn is_live(f: &Folio) -> bool {
    f.flags_are(
        FolioFlags::UPTODATE | FolioFlags::DETACHED,
        FolioFlags::UPTODATE,
    )
}

/// Whether a lock-free hit may use the folio as it is: live, not
/// readahead's marker (a reader touching the marker goes to the locked
/// path, which submits the next window), and not read to be dropped behind
/// its reader (the locked path drops it). One load, as [`is_live`].
#[inline]
pub(crate) fn is_plain_hit(f: &Folio) -> bool {
    f.flags_are(
        FolioFlags::UPTODATE
            | FolioFlags::DETACHED
            | FolioFlags::READAHEAD
            | FolioFlags::DROPBEHIND,
        FolioFlags::UPTODATE,
    )
}

/// A zero-copy reference to a cached folio's bytes
/// ([`CachedFile::read_folio`](super::CachedFile::read_folio)).
///
/// Dereferences to the whole folio (`2^order` pages; bytes past the end of
/// the file read as zeros), as they were when the reference was taken: they
/// never change while it lives, and it never makes anyone wait. A write to
/// the folio, from any thread including the holder's, completes at once
/// and is seen by every later read; this reference keeps the bytes it
/// pinned (the writer wrote a copy). Truncation and invalidation drop the
/// folio from the cache but not the pinned bytes. While the folio's bytes
/// are the ones a reference pinned, reclaim leaves the folio cached (once
/// a writer has copied them, the folio may go; the reference keeps its
/// copy). It holds no reference to the folio itself.
///
/// It is `'static`, `Send` and `Sync`: hold it as long as needed (SQLite
/// holds the pages it fetches for a whole statement); the bytes it pins
/// count against no cache's capacity once the folio has moved on.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
/// file.write_at(&[7u8; 4096], 8192).unwrap();
/// let page = file.read_folio(2).unwrap();
/// file.write_at(&[8u8; 4096], 8192).unwrap(); // does not wait
/// assert_eq!(page.page(2), &[7u8; 4096][..]); // the pinned bytes
/// assert_eq!(file.read_folio(2).unwrap().page(2), &[8u8; 4096][..]);
/// ```
pub struct FolioRef {
    pin: BufPin,
    index: u64,
    order: u32,
}

impl FolioRef {
    /// A reference to `folio`'s bytes keeping `pin`, a pin of them;
    /// `looked_up` is a page index the folio holds (its first index is
    /// derived from it and the order: folios are aligned to their size, and
    /// the hit path does not load `index`, off the folio's hot bytes).
    #[inline]
    pub(crate) fn new(folio: &Folio, looked_up: u64, pin: BufPin) -> FolioRef {
        debug_assert_eq!(pin.bytes().len(), folio.max_bytes());
        let order = folio.order();
        let index = looked_up & !((1u64 << order) - 1);
        debug_assert_eq!(index, folio.index());
        FolioRef { pin, index, order }
    }

    /// Whether these bytes are `f`'s current ones (`f` being the folio at
    /// this reference's index).
    #[inline]
    pub(crate) fn is_current_in(&self, f: &Folio) -> bool {
        is_live(f) && f.index() == self.index && f.order() == self.order && f.mem().holds(&self.pin)
    }

    /// The folio's first page index.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The folio's order (`2^order` pages).
    pub fn order(&self) -> u32 {
        self.order
    }

    /// The bytes of page `index` (which must lie in this folio; an index
    /// outside gives an empty slice).
    pub fn page(&self, index: u64) -> &[u8] {
        page_of(self.index, self.order, self.pin.bytes(), index)
    }
}

/// The bytes of page `index` of a folio of `2^order` pages at `first`
/// whose bytes are `bytes`.
#[inline]
pub(crate) fn page_of(first: u64, order: u32, bytes: &[u8], index: u64) -> &[u8] {
    match index.checked_sub(first) {
        Some(i) if i < 1 << order => {
            let at = i as usize * PAGE_SIZE;
            bytes.get(at..at + PAGE_SIZE).unwrap_or(&[])
        }
        _ => &[],
    }
}

impl std::ops::Deref for FolioRef {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.pin.bytes()
    }
}

impl Clone for FolioRef {
    /// Another reference to the same pinned bytes.
    fn clone(&self) -> FolioRef {
        FolioRef {
            pin: self.pin.clone(),
            index: self.index,
            order: self.order,
        }
    }
}

/// A [`FolioRef`] kept together with the folio it was taken from
/// ([`CachedFile::hold`](super::CachedFile::hold)), for a holder that
/// serves the same pages again and again (a SQLite connection's B-tree
/// roots): [`is_current`](HeldFolio::is_current) asks the folio itself,
/// two loads of memory that only writers write, where
/// [`CachedFile::is_current`](super::CachedFile::is_current) walks the
/// file's index first.
///
/// It is current while its folio is cached, filled and not detached and
/// the folio's current bytes are the pinned ones: a write, a truncation or
/// an invalidation that touches the folio makes it stale for good (every
/// path that removes a folio marks it detached first, and a pinned buffer
/// is never written in place). The bytes stay valid and unchanged either
/// way, as for a [`FolioRef`]. Keeping the folio keeps reclaim from
/// evicting it (a held folio is busy), so hold few, and drop the stale.
///
/// ```
/// use kxarray::backend::RamDisk;
/// use kxarray::pagecache::{CacheConfig, PageCache};
///
/// let cache = PageCache::new(CacheConfig::default().flusher(false));
/// let file = cache.open(RamDisk::new(1 << 16)).unwrap();
/// file.write_at(&[1; 4096], 0).unwrap();
/// let held = file.hold(file.read_folio(0).unwrap()).unwrap();
/// assert!(held.is_current());
/// file.write_at(&[2; 8], 100).unwrap(); // the folio's bytes move on
/// assert!(!held.is_current());
/// assert_eq!(held.page(0)[100], 1); // the pinned bytes stay
/// ```
pub struct HeldFolio {
    folio: Arc<Folio>,
    page: FolioRef,
}

impl HeldFolio {
    /// `page` kept with `folio`, the folio it pins the bytes of.
    pub(crate) fn new(folio: Arc<Folio>, page: FolioRef) -> HeldFolio {
        debug_assert_eq!((folio.index(), folio.order()), (page.index, page.order));
        HeldFolio { folio, page }
    }

    /// Whether the pinned bytes are still the file's: the same answer as
    /// [`CachedFile::is_current`](super::CachedFile::is_current) for the
    /// reference, without the lookup. Writes nothing.
    #[inline]
    pub fn is_current(&self) -> bool {
        self.page.is_current_in(&self.folio)
    }

    /// The reference.
    #[inline]
    pub fn folio_ref(&self) -> &FolioRef {
        &self.page
    }

    /// Let go of the folio, keeping the reference.
    pub fn into_ref(self) -> FolioRef {
        self.page
    }
}

impl std::ops::Deref for HeldFolio {
    type Target = FolioRef;
    #[inline]
    fn deref(&self) -> &FolioRef {
        &self.page
    }
}

impl std::fmt::Debug for HeldFolio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldFolio")
            .field("index", &self.page.index())
            .field("order", &self.page.order())
            .field("current", &self.is_current())
            .finish()
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
