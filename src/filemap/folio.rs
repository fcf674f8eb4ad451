//! Folios: a naturally aligned run of `2^order` pages with page-cache flags
//! and a data buffer, shared as `Arc<Folio>`.
//!
//! Invariant: `index` is aligned to `order` (checked by [`Folio::new`]);
//! the flags are atomic bits so lock-free readers may test them.

use super::AddError;
use crate::sync::{AtomicU32, Ordering, RwLock};

/// Bytes per page.
pub const PAGE_SIZE: usize = 4096;
/// Largest folio order the page cache accepts (the kernel's
/// `MAX_PAGECACHE_ORDER` on x86-64 with 4 KiB pages is 9 to 11; we allow
/// more for testing, but far less than the 63 bits an index has).
pub const MAX_FOLIO_ORDER: u32 = 20;

/// Folio flag bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FolioFlags(u32);

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
}

/// A folio: `2^order` pages starting at page index `index`.
pub struct Folio {
    index: u64,
    order: u32,
    flags: AtomicU32,
    data: RwLock<Vec<u8>>,
}

impl Folio {
    /// A folio for `2^order` pages at `index`, with an empty data buffer
    /// (call [`Folio::fill`] or [`Folio::write`] to give it contents).
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
            data: RwLock::new(Vec::new()),
        })
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
    pub fn contains(&self, index: u64) -> bool {
        index >= self.index && index - self.index < self.nr_pages()
    }
    /// Test a flag.
    #[inline]
    pub fn test(&self, f: FolioFlags) -> bool {
        self.flags.load(Ordering::Acquire) & f.0 != 0
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
    /// Replace the whole contents (marks the folio uptodate).
    pub fn fill(&self, bytes: Vec<u8>) {
        *self.data.write() = bytes;
        self.set(FolioFlags::UPTODATE);
    }
    /// Copy `buf.len()` bytes at byte `offset` of the folio into `buf`;
    /// returns how many were available.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> usize {
        let d = self.data.read();
        if offset >= d.len() {
            return 0;
        }
        let n = buf.len().min(d.len() - offset);
        buf[..n].copy_from_slice(&d[offset..offset + n]);
        n
    }
    /// Write bytes at `offset` (growing the buffer) and mark the folio dirty.
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        let mut d = self.data.write();
        if d.len() < offset + bytes.len() {
            d.resize(offset + bytes.len(), 0);
        }
        d[offset..offset + bytes.len()].copy_from_slice(bytes);
        drop(d);
        self.set(FolioFlags::DIRTY);
    }
    /// A copy of the data.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().clone()
    }
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
