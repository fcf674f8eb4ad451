//! Folios: a naturally aligned run of `2^order` pages with page-cache flags
//! and their bytes ([`FolioMem`]), shared as `Arc<Folio>`.
//!
//! Invariant: `index` is aligned to `order` (checked by [`Folio::new`]);
//! the flags are atomic bits so lock-free readers may test them. The bytes
//! follow [`FolioMem`]'s protocol: read without a lock, written under the
//! folio's lock, pinned without blocking writers.

use super::mem::FolioMem;
use super::AddError;
use crate::sync::{AtomicU32, Ordering};

/// Bytes per page.
pub const PAGE_SIZE: usize = 4096;
/// Largest folio order the page cache accepts (the kernel's
/// `MAX_PAGECACHE_ORDER` on x86-64 with 4 KiB pages is 9 to 11; we allow
/// more for testing, but far less than the 63 bits an index has).
pub const MAX_FOLIO_ORDER: u32 = 20;

/// Folio flag bits; `|` combines them.
///
/// ```
/// use kxarray::filemap::{Folio, FolioFlags};
///
/// let folio = Folio::new(0, 0).unwrap();
/// assert!(!folio.set(FolioFlags::DIRTY)); // it was not set before
/// assert!(folio.set(FolioFlags::DIRTY)); // now it was
/// assert!(folio.test(FolioFlags::DIRTY | FolioFlags::WRITEBACK)); // any of them
/// assert!(!folio.test(FolioFlags::UPTODATE));
/// assert!(folio.clear(FolioFlags::DIRTY));
/// assert!(!folio.test(FolioFlags::DIRTY));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FolioFlags(u32);

impl core::ops::BitOr for FolioFlags {
    type Output = FolioFlags;
    fn bitor(self, o: FolioFlags) -> FolioFlags {
        FolioFlags(self.0 | o.0)
    }
}

impl FolioFlags {
    /// The data is valid (`PG_uptodate`).
    pub const UPTODATE: FolioFlags = FolioFlags(1);
    /// The data differs from the backing store (`PG_dirty`).
    pub const DIRTY: FolioFlags = FolioFlags(2);
    /// Being written back (`PG_writeback`).
    pub const WRITEBACK: FolioFlags = FolioFlags(4);
    /// Locked for I/O (`PG_locked`).
    pub const LOCKED: FolioFlags = FolioFlags(8);
    /// Refaulted while in the workingset (`PG_workingset`).
    pub const WORKINGSET: FolioFlags = FolioFlags(16);
    /// Accessed since reclaim last looked at it (`PG_referenced`).
    pub const REFERENCED: FolioFlags = FolioFlags(32);
    /// On the active list (`PG_active`).
    pub const ACTIVE: FolioFlags = FolioFlags(64);
    /// Removed from its address space (the kernel's `folio->mapping ==
    /// NULL`): holders of a stale reference must look it up again.
    pub const DETACHED: FolioFlags = FolioFlags(128);
    /// On a reclaim list (`PG_lru`).
    pub const LRU: FolioFlags = FolioFlags(256);
    /// Free for the owner of the folio's address space (the kernel's
    /// `PG_owner_priv_1`). The page cache sets it on a folio whose every
    /// block is dirty, changing it only under the folio's lock.
    pub const OWNER_PRIV: FolioFlags = FolioFlags(512);
    /// Readahead's marker (`PG_readahead`): a reader touching this folio
    /// submits the next readahead window.
    pub const READAHEAD: FolioFlags = FolioFlags(1024);
    /// Read for a stream that passes the cache by (`PG_dropbehind`): the
    /// folio leaves the cache as soon as a reader has read it to its end.
    pub const DROPBEHIND: FolioFlags = FolioFlags(2048);
}

/// A folio: `2^order` pages starting at page index `index`.
// Layout: what a lock-free hit reads (the flags, the order, the bytes'
// version, pointer and length) in the first 32 bytes; a hit derives the
// folio's first index from the index it looked up and the order, so
// `index` (last) is not read. The folio is not aligned beyond its fields
// (8 bytes): an `Arc<Folio>` aligned to 32 bytes went through
// `posix_memalign`, which glibc serves without its per-thread cache and
// whose freed chunks later aligned requests cannot reuse, so a cache at
// steady state left about 200 bytes of heap behind per miss (a
// 1 GiB cache of 4 KiB folios held 50 MiB of such holes) and spent 5% of
// a miss in `_int_free`, `unlink_chunk` and `malloc_consolidate`. With
// `malloc`'s 16-byte alignment and the `Arc`'s two counts in front, the
// 32 hot bytes cross a cache line for a quarter of the folios (when the
// hit also read `len` and `index`, spread over 64 bytes, it was three
// quarters: the hit path's 7-10% loss against the aligned folio).
#[repr(C)]
pub struct Folio {
    flags: AtomicU32,
    order: u32,
    mem: FolioMem,
    index: u64,
}

impl Folio {
    /// A folio for `2^order` pages at `index`, without bytes yet (call
    /// [`Folio::fill`] or [`Folio::write`] to give it contents).
    ///
    /// # Errors
    /// [`AddError::OrderTooLarge`] when `order` is above
    /// [`MAX_FOLIO_ORDER`]; [`AddError::Misaligned`] when `index` is not a
    /// multiple of `2^order`.
    ///
    /// ```
    /// use kxarray::filemap::{AddError, Folio, MAX_FOLIO_ORDER, PAGE_SIZE};
    ///
    /// let folio = Folio::new(8, 3).unwrap(); // pages 8..16
    /// assert_eq!((folio.index(), folio.nr_pages()), (8, 8));
    /// assert_eq!(folio.max_bytes(), 8 * PAGE_SIZE);
    /// let e = Folio::new(4, 3).unwrap_err();
    /// assert_eq!(e, AddError::Misaligned { index: 4, order: 3 });
    /// let e = Folio::new(0, MAX_FOLIO_ORDER + 1).unwrap_err();
    /// assert_eq!(e, AddError::OrderTooLarge(MAX_FOLIO_ORDER + 1));
    /// ```
    pub fn new(index: u64, order: u32) -> Result<Folio, AddError> {
        if order > MAX_FOLIO_ORDER {
            return Err(AddError::OrderTooLarge(order));
        }
        if index & ((1u64 << order) - 1) != 0 {
            return Err(AddError::Misaligned { index, order });
        }
        if index.checked_add((1u64 << order) - 1).is_none() {
            return Err(AddError::IndexOverflow { index, order });
        }
        Ok(Folio {
            index,
            order,
            flags: AtomicU32::new(0),
            mem: FolioMem::new((1usize << order) * PAGE_SIZE),
        })
    }
    /// Ask the CPU to fetch the folio's lines, and the two words before it
    /// (an `Arc`'s counts). A hint: reads nothing the program sees.
    #[inline]
    pub(crate) fn prefetch(&self) {
        let p = core::ptr::from_ref(self).cast::<i8>();
        crate::node::prefetch(p.wrapping_sub(16));
        crate::node::prefetch(p);
        crate::node::prefetch(p.wrapping_add(core::mem::size_of::<Folio>() - 1));
    }

    /// Ask the CPU to fetch the header of the folio's current buffer (its
    /// line must be cached already, or this waits for it: see
    /// [`Folio::prefetch`]).
    #[inline]
    pub(crate) fn prefetch_buffer(&self) {
        self.mem.prefetch_buffer();
    }

    /// First page index.
    #[inline]
    pub fn index(&self) -> u64 {
        self.index
    }
    /// log2 of the page count.
    #[inline]
    pub fn order(&self) -> u32 {
        self.order
    }
    /// Number of pages.
    #[inline]
    pub fn nr_pages(&self) -> u64 {
        1 << self.order
    }
    /// Whether `index` lies inside this folio.
    ///
    /// ```
    /// use kxarray::filemap::Folio;
    ///
    /// let folio = Folio::new(16, 2).unwrap(); // pages 16..20
    /// assert!(folio.contains(16) && folio.contains(19));
    /// assert!(!folio.contains(15) && !folio.contains(20));
    /// ```
    pub fn contains(&self, index: u64) -> bool {
        index >= self.index && index - self.index < self.nr_pages()
    }
    /// Test a flag (given several, whether any of them is set).
    #[inline]
    pub fn test(&self, f: FolioFlags) -> bool {
        self.flags.load(Ordering::Acquire) & f.0 != 0
    }
    /// Whether the flags in `mask` are exactly those of `want` (one load:
    /// `test_all(UPTODATE | DETACHED, UPTODATE)` is "uptodate and not
    /// detached").
    #[inline]
    pub(crate) fn flags_are(&self, mask: FolioFlags, want: FolioFlags) -> bool {
        self.flags.load(Ordering::Acquire) & mask.0 == want.0
    }
    /// Set a flag; returns whether it was already set.
    #[inline]
    pub fn set(&self, f: FolioFlags) -> bool {
        self.flags.fetch_or(f.0, Ordering::AcqRel) & f.0 != 0
    }
    /// Clear a flag; returns whether it was set.
    #[inline]
    pub fn clear(&self, f: FolioFlags) -> bool {
        self.flags.fetch_and(!f.0, Ordering::AcqRel) & f.0 != 0
    }
    /// Replace the contents with `bytes` followed by zeros (the folio's
    /// bytes are its whole size, [`max_bytes`](Folio::max_bytes); longer
    /// input is cut) and mark the folio uptodate. Returns the bytes stored.
    ///
    /// # Panics
    /// If the memory for the bytes cannot be allocated (as `Vec` would).
    ///
    /// ```
    /// use kxarray::filemap::{Folio, FolioFlags};
    ///
    /// let folio = Folio::new(0, 1).unwrap(); // 8 KiB
    /// assert_eq!(folio.fill(&[7; 5000]), 5000);
    /// assert!(folio.test(FolioFlags::UPTODATE));
    /// let bytes = folio.snapshot();
    /// assert_eq!((bytes.len(), bytes[4999], bytes[5000]), (8192, 7, 0));
    /// assert_eq!(folio.fill(&[1; 10_000]), 8192); // longer input is cut
    /// ```
    pub fn fill(&self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.max_bytes());
        self.mem
            .lock()
            .install_zeroed(|b| {
                b[..n].copy_from_slice(&bytes[..n]);
                Ok::<(), ()>(())
            })
            .unwrap_or_else(|_| alloc_failed(self.max_bytes()));
        self.set(FolioFlags::UPTODATE);
        n
    }

    /// Copy up to `buf.len()` bytes at byte `offset` of the folio into
    /// `buf` (without waiting for a lock unless a writer is at work on this
    /// folio); returns how many it copied: 0 at or past the folio's end or
    /// when it has no bytes yet.
    ///
    /// ```
    /// use kxarray::filemap::Folio;
    ///
    /// let folio = Folio::new(0, 0).unwrap();
    /// let mut buf = [0u8; 4];
    /// assert_eq!(folio.read(0, &mut buf), 0); // no bytes yet
    /// folio.fill(b"abcdef");
    /// assert_eq!(folio.read(2, &mut buf), 4);
    /// assert_eq!(&buf, b"cdef");
    /// assert_eq!(folio.read(4094, &mut buf), 2); // the folio ends
    /// assert_eq!(folio.read(4096, &mut buf), 0);
    /// ```
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.max_bytes().saturating_sub(offset));
        if n == 0 {
            return 0;
        }
        {
            let guard = crate::pin();
            for _ in 0..4 {
                if self.mem.read(offset, &mut buf[..n], &guard) {
                    return n;
                }
            }
        }
        let w = self.mem.lock();
        match w.bytes().get(offset..offset + n) {
            Some(d) => {
                buf[..n].copy_from_slice(d);
                n
            }
            None => 0,
        }
    }

    /// Write `bytes` at byte `offset` (the folio's bytes start as zeros if
    /// it had none) and mark the folio dirty. Returns the bytes written:
    /// fewer than `bytes.len()` only where the folio ends.
    ///
    /// # Panics
    /// If the memory for the bytes cannot be allocated (as `Vec` would).
    ///
    /// ```
    /// use kxarray::filemap::{Folio, FolioFlags};
    ///
    /// let folio = Folio::new(0, 0).unwrap();
    /// assert_eq!(folio.write(4094, b"abcd"), 2); // cut where the folio ends
    /// assert!(folio.test(FolioFlags::DIRTY));
    /// let bytes = folio.snapshot();
    /// assert_eq!(&bytes[4094..], b"ab");
    /// assert!(bytes[..4094].iter().all(|&b| b == 0));
    /// ```
    pub fn write(&self, offset: usize, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.max_bytes().saturating_sub(offset));
        if n == 0 {
            return 0;
        }
        let mut w = self.mem.lock();
        if w.len() == 0 {
            w.install_zeroed(|b| {
                b[offset..offset + n].copy_from_slice(&bytes[..n]);
                Ok::<(), ()>(())
            })
            .unwrap_or_else(|_| alloc_failed(self.max_bytes()));
        } else {
            let mut e = w.edit().unwrap_or_else(|e| alloc_failed(e.bytes));
            e.write(offset, &bytes[..n]);
        }
        drop(w);
        self.set(FolioFlags::DIRTY);
        n
    }

    /// A copy of the contents (empty when it has none yet).
    ///
    /// ```
    /// use kxarray::filemap::Folio;
    ///
    /// let folio = Folio::new(0, 0).unwrap();
    /// assert!(folio.snapshot().is_empty());
    /// folio.fill(b"x");
    /// let copy = folio.snapshot();
    /// folio.write(0, b"y"); // the copy does not change
    /// assert_eq!((copy.len(), copy[0]), (4096, b'x'));
    /// ```
    pub fn snapshot(&self) -> Vec<u8> {
        self.mem.lock().bytes().to_vec()
    }

    /// The folio's bytes and their protocol (the page cache reads, pins and
    /// writes them through it).
    #[inline]
    pub(crate) fn mem(&self) -> &FolioMem {
        &self.mem
    }

    /// The folio's size in bytes.
    ///
    /// ```
    /// use kxarray::filemap::{Folio, PAGE_SIZE};
    ///
    /// assert_eq!(Folio::new(0, 0).unwrap().max_bytes(), PAGE_SIZE);
    /// assert_eq!(Folio::new(0, 4).unwrap().max_bytes(), 16 * PAGE_SIZE);
    /// ```
    #[inline]
    pub fn max_bytes(&self) -> usize {
        (self.nr_pages() as usize).saturating_mul(PAGE_SIZE)
    }
}

#[cold]
fn alloc_failed(bytes: usize) -> ! {
    std::alloc::handle_alloc_error(
        std::alloc::Layout::from_size_align(bytes.max(1), 1).expect("a byte layout"),
    )
}

impl core::fmt::Debug for Folio {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Folio")
            .field("index", &self.index)
            .field("order", &self.order)
            .field("flags", &self.flags.load(Ordering::Relaxed))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The fields a lock-free hit reads lie in the first 32 bytes, and
    /// the folio needs no alignment beyond `malloc`'s (no
    /// `posix_memalign` for an `Arc<Folio>`).
    #[test]
    fn the_hot_fields_come_first() {
        assert!(core::mem::align_of::<Folio>() <= 16);
        let f = Folio::new(0, 0).unwrap();
        let base = &f as *const Folio as usize;
        let hot = [
            &f.flags as *const _ as usize,
            &f.order as *const _ as usize,
            f.mem.hot_end(),
        ];
        for a in hot {
            assert!(a - base <= 32, "{} bytes in", a - base);
        }
    }
}
