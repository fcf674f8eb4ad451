//! The entry encoding: one machine word per slot, decoded only here.
//!
//! | low bits | meaning |
//! |---|---|
//! | `..00`, non-zero | an item pointer (items are at least 4-byte aligned) |
//! | `...1` | a value entry `v << 1 \| 1`, `v` in `0..=i64::MAX` |
//! | `..10` | internal: sibling `s << 2 \| 2` (`s` < chunk size), RETRY, ZERO, or a node pointer `p \| 2` |
//!
//! Invariants: `RawEntry(0)` is the empty slot; a node pointer is always above
//! [`NODE_MIN`] so it never collides with sibling, retry or zero entries; no
//! other module shifts or masks entry bits. [`AtomicEntry`] is the only way a
//! slot is read or written, with Acquire loads for lock-free readers and
//! Release stores for publication.
//!
//! Provenance: a word is a `*mut ()`, never an integer. Item and node
//! entries keep the provenance of the pointer they were made from (the tag
//! bits are added and removed with `map_addr`); value, sibling, RETRY and
//! ZERO entries are made with `without_provenance` and are never
//! dereferenced. Strict provenance holds: no pointer is rebuilt from an
//! integer.

use crate::geometry::CHUNK_SIZE;
use crate::sync::{AtomicPtr, Ordering};
use core::ptr;
use core::ptr::NonNull;

/// Largest payload of a value entry (the kernel's `LONG_MAX`).
pub const MAX_VALUE: u64 = i64::MAX as u64;

const INTERNAL: usize = 2;
const RETRY_RAW: usize = (256 << 2) | INTERNAL;
const ZERO_RAW: usize = (257 << 2) | INTERNAL;
/// Every encoded node pointer is above this (the kernel's `xa_is_node`: > 4096).
const NODE_MIN: usize = 4096;

/// One encoded slot word.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub(crate) struct RawEntry(*mut ());

// SAFETY: a `RawEntry` is an encoded word; moving or sharing it between
// threads is moving a word. Reading what it points to needs the node or
// item contracts (and their own `unsafe`), wherever the word is.
unsafe impl Send for RawEntry {}
// SAFETY: as for `Send`: `&RawEntry` gives access to the word only.
unsafe impl Sync for RawEntry {}

impl core::fmt::Debug for RawEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_null() {
            f.write_str("NULL")
        } else if self.is_value() {
            write!(f, "value({})", self.to_value())
        } else if self.is_retry() {
            f.write_str("RETRY")
        } else if self.is_zero() {
            f.write_str("ZERO")
        } else if self.is_sibling() {
            write!(f, "sibling({})", self.to_sibling())
        } else if self.is_node() {
            write!(f, "node({:#x})", self.addr() & !3)
        } else {
            write!(f, "item({:#x})", self.addr())
        }
    }
}

impl RawEntry {
    pub(crate) const NULL: RawEntry = RawEntry(ptr::null_mut());
    pub(crate) const RETRY: RawEntry = RawEntry(ptr::without_provenance_mut(RETRY_RAW));
    pub(crate) const ZERO: RawEntry = RawEntry(ptr::without_provenance_mut(ZERO_RAW));

    /// The word's address bits (all of it, for entries without provenance).
    #[inline(always)]
    fn addr(self) -> usize {
        self.0.addr()
    }

    /// A value entry. The caller has checked `v <= MAX_VALUE`.
    #[inline]
    pub(crate) fn value(v: u64) -> RawEntry {
        debug_assert!(v <= MAX_VALUE);
        RawEntry(ptr::without_provenance_mut(((v as usize) << 1) | 1))
    }

    #[inline]
    pub(crate) fn sibling(offset: usize) -> RawEntry {
        debug_assert!(offset < CHUNK_SIZE);
        RawEntry(ptr::without_provenance_mut((offset << 2) | INTERNAL))
    }

    #[inline]
    pub(crate) fn internal_ptr<N>(node: NonNull<N>) -> RawEntry {
        let p = node.as_ptr().cast::<()>();
        debug_assert!(p.addr() & 3 == 0 && p.addr() > NODE_MIN);
        RawEntry(p.map_addr(|a| a | INTERNAL))
    }

    /// An item pointer; `None` if it is not 4-byte aligned.
    #[inline]
    pub(crate) fn item<U>(ptr: NonNull<U>) -> Option<RawEntry> {
        let p = ptr.as_ptr().cast::<()>();
        if p.addr() & 3 != 0 {
            return None;
        }
        Some(RawEntry(p))
    }

    #[inline]
    pub(crate) fn is_null(self) -> bool {
        self.addr() == 0
    }
    #[inline]
    pub(crate) fn is_value(self) -> bool {
        self.addr() & 1 == 1
    }
    #[inline]
    pub(crate) fn is_internal(self) -> bool {
        self.addr() & 3 == INTERNAL
    }
    /// An item pointer (not null, not value, not internal).
    #[inline]
    pub(crate) fn is_item(self) -> bool {
        self.addr() & 3 == 0 && self.addr() != 0
    }
    #[inline]
    pub(crate) fn is_sibling(self) -> bool {
        self.is_internal() && self.addr() < ((CHUNK_SIZE - 1) << 2 | INTERNAL)
    }
    #[inline]
    pub(crate) fn is_node(self) -> bool {
        self.is_internal() && self.addr() > NODE_MIN
    }
    #[inline]
    pub(crate) fn is_retry(self) -> bool {
        self.addr() == RETRY_RAW
    }
    #[inline]
    pub(crate) fn is_zero(self) -> bool {
        self.addr() == ZERO_RAW
    }
    /// Entries a user can see: items and values (the kernel's "not advanced").
    #[inline]
    pub(crate) fn is_user(self) -> bool {
        self.is_item() || self.is_value()
    }

    #[inline]
    pub(crate) fn to_value(self) -> u64 {
        (self.addr() >> 1) as u64
    }
    #[inline]
    pub(crate) fn to_sibling(self) -> usize {
        self.addr() >> 2
    }
    /// The raw pointer of a node word, for the lock-free descent: no
    /// `NonNull` check on the pointer-chasing path (the caller checked
    /// `is_node`, asserted here, before dereferencing it in its own
    /// `unsafe`).
    #[inline(always)]
    pub(crate) fn internal_raw_ptr<N>(self) -> *mut N {
        debug_assert!(self.is_node());
        self.0.map_addr(|a| a.wrapping_sub(INTERNAL)).cast()
    }
    #[inline]
    pub(crate) fn to_internal_ptr<N>(self) -> NonNull<N> {
        debug_assert!(self.is_node());
        let p: *mut N = self.0.map_addr(|a| a.wrapping_sub(INTERNAL)).cast();
        // A node word (`is_node`, checked by every caller and asserted above)
        // is never the null pointer plus the tag; `new` keeps a misused word
        // from becoming a null `NonNull` (dereferencing it is the caller's
        // `unsafe`, under the node or item contract).
        NonNull::new(p).unwrap_or(NonNull::dangling())
    }
    #[inline]
    pub(crate) fn to_item<U>(self) -> NonNull<U> {
        debug_assert!(self.is_item());
        let p: *mut U = self.0.cast();
        // An item word (`is_item`, asserted above) is non-zero; `new` keeps
        // a misused NULL word from becoming a null `NonNull`.
        NonNull::new(p).unwrap_or(NonNull::dangling())
    }
    /// The zero (reserved) entry reads as empty through the normal API.
    #[inline]
    pub(crate) fn zero_to_null(self) -> RawEntry {
        if self.is_zero() {
            RawEntry::NULL
        } else {
            self
        }
    }
}

/// An atomic slot holding a [`RawEntry`].
#[repr(transparent)]
pub(crate) struct AtomicEntry(AtomicPtr<()>);

impl AtomicEntry {
    pub(crate) fn new(e: RawEntry) -> Self {
        AtomicEntry(AtomicPtr::new(e.0))
    }
    /// Lock-free read: Acquire, so a node or item published by a Release
    /// store is seen fully initialised.
    #[inline(always)]
    pub(crate) fn load(&self) -> RawEntry {
        RawEntry(self.0.load(Ordering::Acquire))
    }
    /// Read under the writer lock: the lock orders it after every write.
    #[inline(always)]
    pub(crate) fn load_locked(&self) -> RawEntry {
        RawEntry(self.0.load(Ordering::Relaxed))
    }
    /// Publish an entry to lock-free readers.
    #[inline(always)]
    pub(crate) fn store(&self, e: RawEntry) {
        self.0.store(e.0, Ordering::Release)
    }
    /// Initialise a slot of a node nobody else can see yet.
    #[inline(always)]
    pub(crate) fn init(&self, e: RawEntry) {
        self.0.store(e.0, Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_disjoint() {
        let block = Box::new([0u64; 8]);
        let node = NonNull::from(&*block);
        let item = NonNull::<u64>::dangling(); // 8-aligned address
        let cases = [
            RawEntry::NULL,
            RawEntry::RETRY,
            RawEntry::ZERO,
            RawEntry::value(0),
            RawEntry::value(MAX_VALUE),
            RawEntry::sibling(0),
            RawEntry::sibling(CHUNK_SIZE - 2),
            RawEntry::internal_ptr(node),
            RawEntry::item(item).unwrap(),
        ];
        for e in cases {
            let kinds = [
                e.is_null(),
                e.is_value(),
                e.is_retry(),
                e.is_zero(),
                e.is_sibling(),
                e.is_node(),
                e.is_item(),
            ];
            assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{e:?}");
        }
    }

    #[test]
    fn round_trips() {
        for v in [0, 1, 12345, MAX_VALUE] {
            assert_eq!(RawEntry::value(v).to_value(), v);
            assert!(RawEntry::value(v).is_user());
        }
        for s in 0..CHUNK_SIZE - 1 {
            let e = RawEntry::sibling(s);
            assert!(e.is_sibling() && !e.is_node() && !e.is_user());
            assert_eq!(e.to_sibling(), s);
        }
        let b = Box::new(7u32);
        let p = NonNull::from(&*b);
        let e = RawEntry::item(p).unwrap();
        assert_eq!(e.to_item::<u32>(), p);
        // misaligned pointers are refused
        let odd = NonNull::new(core::ptr::without_provenance_mut::<u8>(0x1001)).unwrap();
        assert!(RawEntry::item(odd).is_none());
        assert_eq!(RawEntry::ZERO.zero_to_null(), RawEntry::NULL);
        assert_eq!(RawEntry::value(3).zero_to_null(), RawEntry::value(3));
    }

    #[test]
    fn atomic_entry_publishes() {
        let a = AtomicEntry::new(RawEntry::NULL);
        a.store(RawEntry::value(9));
        assert_eq!(a.load(), RawEntry::value(9));
        a.init(RawEntry::RETRY);
        assert_eq!(a.load_locked(), RawEntry::RETRY);
    }
}
