//! The locked API: one-call operations on a held [`XaLock`] (the kernel's `__xa_*`).

use super::check_order;
use crate::engine::array::FLAG_ALLOC_WRAPPED;
use crate::engine::lock::XaLock;
use crate::engine::state::CursorState;
use crate::engine::state::{dispose_item, order_shape, XaState};
use crate::entry::RawEntry;
use crate::error::Error;
use crate::guard::Guard;
use crate::item::{Entry, EntryRef, Item};
use crate::mark::Mark;
use crate::node::Writer;
use crate::rejected::Rejected;
use crate::sync::Ordering;
use core::ops::RangeInclusive;

impl<'a, T: Item> XaLock<'a, T> {
    /// Run a cursor operation, retrying once memory has been found for it.
    pub(crate) fn with_retry<R>(
        &self,
        xas: &mut XaState<'_, T>,
        mut f: impl FnMut(&mut XaState<'_, T>, Writer<'_>) -> R,
    ) -> R {
        loop {
            let r = f(xas, self.writer());
            if xas.error() == Some(Error::NoMemory) && xas.nomem() {
                continue;
            }
            return r;
        }
    }

    #[inline]
    pub(crate) fn store_raw(
        &self,
        index: u64,
        order: u32,
        entry: Option<Entry<T>>,
    ) -> Result<RawEntry, Rejected<T>> {
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let mut raw = raw;
        if raw.is_null() && self.xa.track_free() {
            raw = RawEntry::ZERO;
        }
        let mut xas = self.cursor(index);
        if order > 0 {
            let (shift, sibs) = order_shape(order);
            xas.set_shape(shift, sibs);
        }
        let track_free = self.xa.track_free();
        let old = self.with_retry(&mut xas, |xas, w| {
            let old = match xas.store_fast(w, raw) {
                Some(old) => old,
                None => xas.store_raw(w, raw),
            };
            if track_free && xas.error().is_none() {
                xas.clear_mark_raw(w, Mark::FREE);
            }
            old
        });
        if let Some(e) = xas.error() {
            // SAFETY: never published (the array is unchanged on error), so the
            // caller still owns it.
            return Err(unsafe { Rejected::unpublished(e, raw) });
        }
        let old = old.zero_to_null();
        if old.is_user() {
            // SAFETY: `store_raw` unlinked `old` and left it to the caller;
            // disposed once, here.
            unsafe { xas.dispose(old) };
            Ok(old)
        } else {
            Ok(RawEntry::NULL)
        }
    }

    /// Store under the held lock (`__xa_store`); see [`XArray::store`](crate::XArray::store).
    ///
    /// Context: under the held lock.
    ///
    /// # Errors
    ///
    /// As [`XArray::store`](crate::XArray::store).
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// assert!(lock.store(1, Some(Entry::Value(1))).unwrap().is_none());
    /// let old = lock.store(1, Some(Entry::Value(2))).unwrap();
    /// assert_eq!(old.and_then(|e| e.value()), Some(1));
    /// ```
    pub fn store(
        &self,
        index: u64,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'_, T>>, Rejected<T>> {
        let raw = self.store_raw(index, 0, entry)?;
        // SAFETY: disposed through the lock's guard (pinned on the default
        // collector, where the free is deferred), alive for '_.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    /// Store a multi-index entry under the held lock; see
    /// [`XArray::store_order`](crate::XArray::store_order).
    ///
    /// Context: under the held lock.
    ///
    /// # Errors
    ///
    /// As [`XArray::store_order`](crate::XArray::store_order).
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store_order(16, 4, Some(Entry::Value(1))).unwrap();
    /// assert_eq!(lock.load(31).and_then(|e| e.value()), Some(1));
    /// ```
    pub fn store_order(
        &self,
        index: u64,
        order: u32,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'_, T>>, Rejected<T>> {
        if let Err(e) = check_order(index, order) {
            return Err(Rejected::new(e, entry));
        }
        let raw = self.store_raw(index, order, entry)?;
        // SAFETY: as in `store`.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    pub(crate) fn erase_raw(&self, index: u64) -> RawEntry {
        let mut xas = self.cursor(index);
        let old = xas.store_raw(self.writer(), RawEntry::NULL).zero_to_null();
        if old.is_user() {
            // SAFETY: `store_raw` unlinked `old` and left it to the caller;
            // disposed once, here.
            unsafe { xas.dispose(old) };
            old
        } else {
            RawEntry::NULL
        }
    }

    /// Erase under the held lock (`__xa_erase`).
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// assert_eq!(lock.erase(1).and_then(|e| e.value()), Some(1));
    /// assert!(lock.load(1).is_none());
    /// ```
    pub fn erase(&self, index: u64) -> Option<EntryRef<'_, T>> {
        let raw = self.erase_raw(index);
        // SAFETY: as in `store`.
        unsafe { EntryRef::from_raw_opt(raw) }
    }

    /// Insert under the held lock (`__xa_insert`); see [`XArray::insert`](crate::XArray::insert).
    ///
    /// Context: under the held lock.
    ///
    /// # Errors
    ///
    /// As [`XArray::insert`](crate::XArray::insert).
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.insert(1, None).unwrap(); // reserve
    /// assert_eq!(lock.insert(1, Some(Entry::Value(1))).unwrap_err().error, Error::Busy);
    /// ```
    pub fn insert(&self, index: u64, entry: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        let raw = match entry {
            None => RawEntry::ZERO,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let mut xas = self.cursor(index);
        let track_free = self.xa.track_free();
        let busy = self.with_retry(&mut xas, |xas, w| {
            let curr = xas.load_raw();
            if !curr.is_null() {
                return true;
            }
            xas.store_raw(w, raw);
            if track_free && xas.error().is_none() {
                xas.clear_mark_raw(w, Mark::FREE);
            }
            false
        });
        let err = if busy { Some(Error::Busy) } else { xas.error() };
        match err {
            None => Ok(()),
            Some(e) => {
                // SAFETY: never published (the array is unchanged on error), so the
                // caller still owns it.
                Err(unsafe { Rejected::unpublished(e, raw) })
            }
        }
    }

    /// `__xa_cmpxchg_raw`: if the raw entry at `index` is exactly `expect`
    /// (NULL matches an empty index only, ZERO a reserved one), store `new`
    /// as is (NULL erases, in allocating arrays too). Returns the replaced
    /// entry with ZERO read as NULL; a displaced item is disposed of through
    /// `guard`. On any error the array is unchanged.
    pub(crate) fn cmpxchg_raw(
        &self,
        index: u64,
        expect: RawEntry,
        new: RawEntry,
        guard: &Guard,
    ) -> Result<RawEntry, Error> {
        let mut xas = XaState::new(self.xa, guard, index);
        let track_free = self.xa.track_free();
        let result = self.with_retry(&mut xas, |xas, w| {
            let curr = xas.load_raw();
            if curr != expect {
                return Err(Error::Mismatch);
            }
            xas.store_raw(w, new);
            if track_free && xas.error().is_none() && !new.is_null() && curr.is_null() {
                xas.clear_mark_raw(w, Mark::FREE);
            }
            Ok(curr)
        });
        if let Some(e) = xas.error() {
            return Err(e);
        }
        let curr = result?.zero_to_null();
        // only items are owned pointers; a value must not be freed
        if curr.is_item() {
            // SAFETY: `store_raw` unlinked the item of this array under
            // `guard`, the cursor's; disposed once, here.
            unsafe { dispose_item::<T>(guard, curr, self.xa.light_items()) };
        }
        Ok(curr)
    }

    /// [`Self::cmpxchg_raw`] for a caller's `new` entry, which comes back in
    /// the [`Rejected`] on any error (including a bad `expect`).
    pub(crate) fn cmpxchg_entry(
        &self,
        index: u64,
        expect: Result<RawEntry, Error>,
        new: Option<Entry<T>>,
        guard: &Guard,
    ) -> Result<RawEntry, Rejected<T>> {
        let raw = match new {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        expect
            .and_then(|expect| self.cmpxchg_raw(index, expect, raw, guard))
            .map_err(|e| {
                // SAFETY: never published (the array is unchanged on error).
                unsafe { Rejected::unpublished(e, raw) }
            })
    }

    /// Compare-and-exchange under the held lock; see [`XArray::cmpxchg`](crate::XArray::cmpxchg).
    ///
    /// # Errors
    ///
    /// As [`XArray::cmpxchg`](crate::XArray::cmpxchg).
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, EntryRef, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// lock.cmpxchg(1, Some(EntryRef::Value(1)), Some(Entry::Value(2))).unwrap();
    /// assert_eq!(lock.load(1).and_then(|e| e.value()), Some(2));
    /// ```
    pub fn cmpxchg(
        &self,
        index: u64,
        old: Option<EntryRef<'_, T>>,
        new: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'_, T>>, Rejected<T>> {
        let expect = old.map_or(Ok(RawEntry::NULL), EntryRef::to_raw);
        let raw = self.cmpxchg_entry(index, expect, new, &self.epoch)?;
        // SAFETY: disposed through the lock's guard (pinned on the default
        // collector, where the free is deferred), alive for '_.
        Ok(unsafe { EntryRef::from_raw_opt(raw) })
    }

    /// Replace a reserved entry under the held lock; see
    /// [`XArray::cmpxchg_reserved`](crate::XArray::cmpxchg_reserved).
    ///
    /// # Errors
    ///
    /// As [`XArray::cmpxchg_reserved`](crate::XArray::cmpxchg_reserved).
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.insert(1, None).unwrap();
    /// lock.cmpxchg_reserved(1, Some(Entry::Value(1))).unwrap();
    /// assert_eq!(lock.load(1).and_then(|e| e.value()), Some(1));
    /// ```
    pub fn cmpxchg_reserved(&self, index: u64, new: Option<Entry<T>>) -> Result<(), Rejected<T>> {
        self.cmpxchg_entry(index, Ok(RawEntry::ZERO), new, &self.epoch)
            .map(|_| ())
    }

    /// Undo a reservation under the held lock.
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.insert(1, None).unwrap();
    /// lock.release(1);
    /// drop(lock);
    /// assert!(xa.is_empty());
    /// ```
    pub fn release(&self, index: u64) {
        let mut xas = self.cursor(index);
        let curr = xas.load_raw();
        if curr.is_zero() {
            xas.store_raw(self.writer(), RawEntry::NULL);
        }
    }

    /// Set `mark` on the entry at `index` (`__xa_set_mark`).
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// lock.set_mark(1, Mark::M0);
    /// drop(lock);
    /// assert!(xa.get_mark(1, Mark::M0));
    /// ```
    pub fn set_mark(&self, index: u64, mark: Mark) {
        let mut xas = self.cursor(index);
        let e = xas.load_raw();
        if !e.is_null() {
            xas.set_mark_raw(self.writer(), mark);
        }
    }

    /// Clear `mark` on the entry at `index` (`__xa_clear_mark`).
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// lock.set_mark(1, Mark::M0);
    /// lock.clear_mark(1, Mark::M0);
    /// drop(lock);
    /// assert!(!xa.marked(Mark::M0));
    /// ```
    pub fn clear_mark(&self, index: u64, mark: Mark) {
        let mut xas = self.cursor(index);
        let e = xas.load_raw();
        if !e.is_null() {
            xas.clear_mark_raw(self.writer(), mark);
        }
    }

    /// The entry at `index`, read under the lock.
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1, Some(Entry::Value(1))).unwrap();
    /// assert_eq!(lock.load(1).and_then(|e| e.value()), Some(1));
    /// ```
    pub fn load(&self, index: u64) -> Option<EntryRef<'_, T>> {
        let e = self.xa.load_raw(index, &self.epoch);
        // SAFETY: read under the lock and its guard, pinned on the default
        // collector where removed items' frees are deferred; alive for '_.
        unsafe { EntryRef::from_raw_opt(e) }
    }

    pub(crate) fn alloc_raw(&self, min: u64, max: u64, raw: RawEntry) -> Result<u64, Error> {
        if !self.xa.track_free() {
            return Err(Error::NotAllocating);
        }
        // An ALLOC1 array never hands out index 0, whatever the marks say:
        // the kernel relies on index 0's free mark alone, which an erase
        // over index 0 (of a multi-index entry, or of the placeholder)
        // sets again, after which `xa_alloc` returns 0.
        let min = if self.xa.zero_busy() { min.max(1) } else { min };
        if min > max {
            return Err(Error::Busy);
        }
        let raw = if raw.is_null() { RawEntry::ZERO } else { raw };
        let mut xas = self.cursor(min);
        let mut id = 0;
        let r = self.with_retry(&mut xas, |xas, w| {
            xas.set_index(min);
            xas.find_marked_raw(max, Mark::FREE);
            if xas.state() == CursorState::Restart {
                return Err(Error::Busy);
            }
            id = xas.index();
            xas.store_raw(w, raw);
            if xas.error().is_none() {
                xas.clear_mark_raw(w, Mark::FREE);
            }
            Ok(())
        });
        r?;
        if let Some(e) = xas.error() {
            return Err(e);
        }
        Ok(id)
    }

    /// Allocate an ID under the held lock; see [`XArray::alloc`](crate::XArray::alloc).
    ///
    /// Context: under the held lock.
    ///
    /// # Errors
    ///
    /// As [`XArray::alloc`](crate::XArray::alloc).
    ///
    /// ```
    /// use kxarray::{Entry, Flags, XArray};
    /// let ids: XArray<Box<u32>> = XArray::with_flags(Flags::ALLOC);
    /// let lock = ids.lock();
    /// assert_eq!(lock.alloc(0..=9, Some(Entry::Value(5))).unwrap(), 0);
    /// assert_eq!(lock.alloc(0..=9, None).unwrap(), 1);
    /// ```
    pub fn alloc(
        &self,
        limit: RangeInclusive<u64>,
        entry: Option<Entry<T>>,
    ) -> Result<u64, Rejected<T>> {
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let (min, max) = (*limit.start(), *limit.end());
        let r = if min > max {
            Err(Error::Busy)
        } else {
            self.alloc_raw(min, max, raw)
        };
        r.map_err(|e| {
            // SAFETY: never published (the array is unchanged on error), so the
            // caller still owns it.
            unsafe { Rejected::unpublished(e, raw) }
        })
    }

    /// Allocate cyclically under the held lock; see [`XArray::alloc_cyclic`](crate::XArray::alloc_cyclic).
    ///
    /// Context: under the held lock.
    ///
    /// # Errors
    ///
    /// As [`XArray::alloc_cyclic`](crate::XArray::alloc_cyclic).
    ///
    /// ```
    /// use kxarray::{Flags, XArray};
    /// let ids: XArray<Box<u32>> = XArray::with_flags(Flags::ALLOC);
    /// let lock = ids.lock();
    /// let mut next = 5;
    /// assert_eq!(lock.alloc_cyclic(0..=9, &mut next, None).unwrap(), (5, false));
    /// assert_eq!(next, 6);
    /// ```
    pub fn alloc_cyclic(
        &self,
        limit: RangeInclusive<u64>,
        next: &mut u64,
        entry: Option<Entry<T>>,
    ) -> Result<(u64, bool), Rejected<T>> {
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let (min, max) = (*limit.start(), *limit.end());
        let xa = self.xa;
        let lo = min.max(*next);
        let mut wrapped = false;
        let mut r = if lo > max {
            Err(Error::Busy)
        } else {
            self.alloc_raw(lo, max, raw)
        };
        if r.is_ok() && xa.flags() & FLAG_ALLOC_WRAPPED != 0 {
            xa.flags
                .store(xa.flags() & !FLAG_ALLOC_WRAPPED, Ordering::Relaxed);
            wrapped = true;
        }
        if r.is_err() && lo > min && r != Err(Error::NotAllocating) {
            r = self.alloc_raw(min, max, raw);
            if r.is_ok() {
                wrapped = true;
            }
        }
        match r {
            Ok(id) => {
                // A 32-bit range counts with the kernel's `u32 *next`: after
                // u32::MAX it wraps to 0. Wider ranges wrap after u64::MAX.
                *next = if max <= u64::from(u32::MAX) {
                    u64::from((id as u32).wrapping_add(1))
                } else {
                    id.wrapping_add(1)
                };
                if *next == 0 {
                    xa.flags
                        .store(xa.flags() | FLAG_ALLOC_WRAPPED, Ordering::Relaxed);
                }
                Ok((id, wrapped))
            }
            Err(e) => {
                // SAFETY: never published (the array is unchanged on error), so the
                // caller still owns it.
                Err(unsafe { Rejected::unpublished(e, raw) })
            }
        }
    }

    /// Remove every entry under the held lock; see [`XArray::clear`](crate::XArray::clear).
    ///
    /// Context: under the held lock.
    ///
    /// ```
    /// use kxarray::{Entry, Error, Flags, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// lock.store(1000, Some(Entry::Value(1))).unwrap();
    /// lock.clear();
    /// assert!(lock.load(1000).is_none());
    /// ```
    pub fn clear(&self) {
        let mut xas = self.cursor(0);
        xas.destroy_all(self.writer());
    }
}

impl<T: Item> core::fmt::Debug for XaLock<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("XaLock").finish_non_exhaustive()
    }
}
