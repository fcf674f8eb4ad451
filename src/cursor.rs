//! The typed cursors: [`Cursor`] reads under an epoch guard, [`CursorMut`]
//! writes under the held lock it was created from.
//!
//! Both sit on the engine's [`XaState`], which stays public as the
//! low-level form (its write methods take the lock as an argument, so code
//! such as `add_folio` can drop the lock while keeping the cursor, allocate,
//! and take the lock again). The typed cursors make the common cases
//! impossible to get wrong:
//!
//! - a [`Cursor`] has no write methods at all;
//! - a [`CursorMut`] is made by [`XaLock::cursor_mut`] (or handed out by
//!   [`XArray::update`]) and borrows that lock, so it can only write the
//!   array whose lock is held, and cannot outlive the lock;
//! - [`XArray::update`] runs the kernel's allocate-outside-the-lock retry
//!   (`xas_nomem`) around a closure, so callers never see the
//!   `nomem`/`destroy` protocol.
//!
//! Invariant: a `CursorMut`'s engine cursor and its lock belong to the same
//! array (both come from the lock), so the engine's runtime lock check
//! never fires through this API.

use crate::engine::array::XArray;
use crate::engine::iter::{Conflicts, CursorIter, Stale};
use crate::engine::lock::XaLock;
use crate::engine::state::{CursorState, XaState};
use crate::error::Error;
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item};
use crate::mark::Mark;
use crate::rejected::Rejected;
use core::ops::{Deref, DerefMut};

/// A read cursor: the lock-free half of the kernel's `xa_state`, walking
/// under the epoch guard it borrows. Successive operations continue from
/// where the last one stopped.
///
/// Made by [`XArray::cursor`] or [`Cursor::new`]. Entries it returns are
/// readable while the guard lives. It has no write methods; for writes see
/// [`CursorMut`].
///
/// ```
/// use kxarray::{Cursor, CursorState, Entry, XArray};
/// let xa: XArray<Box<u32>> = XArray::new();
/// xa.store(3, Entry::Value(30)).unwrap();
/// xa.store(9, Entry::Value(90)).unwrap();
/// let guard = kxarray::pin();
/// let mut cur = xa.cursor(&guard, 0);
/// assert_eq!(cur.state(), CursorState::Restart);
/// assert_eq!(cur.find(u64::MAX).and_then(|e| e.value()), Some(30));
/// assert_eq!(cur.index(), 3);
/// assert_eq!(cur.find(u64::MAX).and_then(|e| e.value()), Some(90));
/// assert_eq!(cur.walks(), 1); // one descent for the whole scan
/// ```
///
/// A read cursor cannot write:
///
/// ```compile_fail,E0599
/// use kxarray::{Entry, XArray};
/// let xa: XArray<Box<u32>> = XArray::new();
/// let guard = kxarray::pin();
/// let mut cur = xa.cursor(&guard, 0);
/// cur.store(Some(Entry::Value(1))); // no such method on `Cursor`
/// ```
#[repr(transparent)]
pub struct Cursor<'a, T: Item> {
    xas: XaState<'a, T>,
}

impl<'a, T: Item> Cursor<'a, T> {
    /// A cursor for the single index `index`, not walked yet.
    ///
    /// Context: any thread; takes no lock.
    ///
    /// ```
    /// use kxarray::{Cursor, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let cur = Cursor::new(&xa, &guard, 5);
    /// assert_eq!(cur.index(), 5);
    /// ```
    #[inline]
    pub fn new(xa: &'a XArray<T>, guard: &'a Guard, index: u64) -> Self {
        Cursor {
            xas: XaState::new(xa, guard, index),
        }
    }

    /// A cursor for the order-`order` block containing `index` (rounded
    /// down to the order, as `XA_STATE_ORDER` does).
    ///
    /// # Errors
    ///
    /// [`Error::OrderTooLarge`] for an order above 63.
    ///
    /// ```
    /// use kxarray::{Cursor, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let cur = Cursor::with_order(&xa, &guard, 70, 3).unwrap();
    /// assert_eq!((cur.index(), cur.order()), (64, 3));
    /// ```
    pub fn with_order(
        xa: &'a XArray<T>,
        guard: &'a Guard,
        index: u64,
        order: u32,
    ) -> Result<Self, Error> {
        Ok(Cursor {
            xas: XaState::with_order(xa, guard, index, order)?,
        })
    }

    /// The engine cursor underneath, for the low-level `xas_*` protocol.
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = xa.cursor(&guard, 8).into_raw();
    /// assert_eq!(xas.index(), 8);
    /// ```
    pub fn into_raw(self) -> XaState<'a, T> {
        self.xas
    }

    /// The array this cursor walks.
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// assert!(std::ptr::eq(xa.cursor(&guard, 0).array(), &xa));
    /// ```
    pub fn array(&self) -> &'a XArray<T> {
        self.xas.array()
    }

    /// The current index.
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.cursor(&guard, 42).index(), 42);
    /// ```
    #[inline]
    pub fn index(&self) -> u64 {
        self.xas.index()
    }

    /// The order of the block the cursor operates on.
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.cursor(&guard, 0).order(), 0);
    /// ```
    pub fn order(&self) -> u32 {
        self.xas.order()
    }

    /// Where the cursor is: see [`CursorState`].
    ///
    /// ```
    /// use kxarray::{CursorState, Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(0, Entry::Value(1)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// cur.load();
    /// assert_eq!(cur.state(), CursorState::Head); // index 0 lives in the head
    /// ```
    #[inline]
    pub fn state(&self) -> CursorState {
        self.xas.state()
    }

    /// Descents from the root so far (restarts included).
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// cur.load();
    /// assert_eq!(cur.walks(), 1);
    /// ```
    #[inline]
    pub fn walks(&self) -> u64 {
        self.xas.walks()
    }

    /// Move to `index` (order 0) and forget the position (`xas_set`).
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// cur.set_index(77);
    /// assert_eq!(cur.index(), 77);
    /// ```
    #[inline]
    pub fn set_index(&mut self, index: u64) {
        self.xas.set_index(index);
    }

    /// Operate on the order-`order` block containing `index`.
    ///
    /// # Errors
    ///
    /// [`Error::OrderTooLarge`] for an order above 63; the cursor is then
    /// unchanged.
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// cur.set_order(130, 6).unwrap();
    /// assert_eq!(cur.index(), 128);
    /// ```
    pub fn set_order(&mut self, index: u64, order: u32) -> Result<(), Error> {
        self.xas.set_order(index, order)
    }

    /// Forget the position: the next operation walks from the root.
    ///
    /// ```
    /// use kxarray::{CursorState, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 5);
    /// cur.load();
    /// cur.reset();
    /// assert_eq!(cur.state(), CursorState::Restart);
    /// ```
    #[inline]
    pub fn reset(&mut self) {
        self.xas.reset();
    }

    /// The entry at the cursor's index (`xas_load`), walking only as far as
    /// needed from the current position.
    ///
    /// Context: lock-free.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(1000, Entry::Value(5)).unwrap();
    /// let guard = kxarray::pin();
    /// assert_eq!(xa.cursor(&guard, 1000).load().and_then(|e| e.value()), Some(5));
    /// ```
    #[inline]
    pub fn load(&mut self) -> Option<EntryRef<'a, T>> {
        self.xas.load()
    }

    /// Re-read the slot the cursor is at without walking (`xas_reload`).
    ///
    /// # Errors
    ///
    /// [`Stale`] when the cursor is not positioned or its node was detached
    /// by a writer: reset and load again.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(7, Entry::Value(1)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 7);
    /// assert!(cur.reload().is_err()); // not walked yet
    /// cur.load();
    /// assert_eq!(cur.reload().unwrap().and_then(|e| e.value()), Some(1));
    /// ```
    pub fn reload(&self) -> Result<Option<EntryRef<'a, T>>, Stale> {
        self.xas.reload()
    }

    /// The order of the entry at the cursor's index (0 when empty).
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(64, 4, Entry::Value(1)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 70);
    /// cur.load();
    /// assert_eq!(cur.get_order(), 4);
    /// ```
    pub fn get_order(&self) -> u32 {
        self.xas.get_order()
    }

    /// Whether the entry the cursor is at has `mark` (`xas_get_mark`).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(5, Entry::Value(1)).unwrap();
    /// xa.set_mark(5, Mark::M1);
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 5);
    /// cur.load();
    /// assert!(cur.get_mark(Mark::M1));
    /// ```
    pub fn get_mark(&self, mark: Mark) -> bool {
        self.xas.get_mark(mark)
    }

    /// The next present entry at or after the cursor's index, up to `max`
    /// (`xas_find`); the cursor moves to it.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(500, Entry::Value(5)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// assert!(cur.find(499).is_none());
    /// cur.set_index(0);
    /// assert_eq!(cur.find(u64::MAX).and_then(|e| e.value()), Some(5));
    /// ```
    #[inline]
    pub fn find(&mut self, max: u64) -> Option<EntryRef<'a, T>> {
        self.xas.find(max)
    }

    /// The next entry with `mark` at or after the cursor's index, up to
    /// `max` (`xas_find_marked`).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// xa.set_mark(2, Mark::M0);
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// assert_eq!(cur.find_marked(10, Mark::M0).and_then(|e| e.value()), Some(2));
    /// ```
    pub fn find_marked(&mut self, max: u64, mark: Mark) -> Option<EntryRef<'a, T>> {
        self.xas.find_marked(max, mark)
    }

    /// Step to the next index and load it (`xas_next`), empty or not.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(4, Entry::Value(4)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 3);
    /// cur.load();
    /// assert_eq!(cur.next().and_then(|e| e.value()), Some(4));
    /// assert_eq!(cur.index(), 4);
    /// ```
    #[inline]
    #[allow(clippy::should_implement_trait)] // the kernel's name; `iter` is the Iterator
    pub fn next(&mut self) -> Option<EntryRef<'a, T>> {
        self.xas.next()
    }

    /// Step to the previous index and load it (`xas_prev`).
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 3);
    /// cur.load();
    /// assert_eq!(cur.prev().and_then(|e| e.value()), Some(2));
    /// ```
    pub fn prev(&mut self) -> Option<EntryRef<'a, T>> {
        self.xas.prev()
    }

    /// Forget the position but keep the index, so an iteration can resume
    /// after the caller drops the guard or the lock (`xas_pause`).
    ///
    /// ```
    /// use kxarray::{CursorState, Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 0);
    /// cur.find(u64::MAX);
    /// cur.pause();
    /// assert_eq!(cur.state(), CursorState::Restart);
    /// assert_eq!(cur.index(), 3); // resumes after the entry seen last
    /// ```
    pub fn pause(&mut self) {
        self.xas.pause();
    }

    /// An iterator over present entries from the cursor's index up to `max`.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// for i in [3, 5, 8] {
    ///     xa.store(i, Entry::Value(i)).unwrap();
    /// }
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 4);
    /// let seen: Vec<u64> = cur.iter(u64::MAX).map(|(i, _)| i).collect();
    /// assert_eq!(seen, [5, 8]);
    /// ```
    pub fn iter<'c>(&'c mut self, max: u64) -> CursorIter<'c, 'a, T> {
        self.xas.iter(max)
    }
}

impl<T: Item> core::fmt::Debug for Cursor<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Cursor").field(&self.xas).finish()
    }
}

/// A write cursor: a [`Cursor`] plus the held lock it was created from
/// ([`XaLock::cursor_mut`], or the one [`XArray::update`] holds). Its
/// writes need no lock argument, so it cannot write one array under
/// another array's lock, and it cannot outlive the lock. All read methods
/// of [`Cursor`] are available through `Deref`.
///
/// ```
/// use kxarray::{Entry, Mark, XArray};
/// let xa: XArray<Box<u32>> = XArray::new();
/// let lock = xa.lock();
/// let mut cur = lock.cursor_mut(100);
/// cur.store(Some(Entry::Value(7))).unwrap();
/// cur.set_mark(Mark::M0);
/// assert_eq!(cur.load().and_then(|e| e.value()), Some(7));
/// assert_eq!(cur.walks(), 1); // the load reused the store's position
/// ```
///
/// A write cursor cannot outlive the lock it came from:
///
/// ```compile_fail,E0505
/// use kxarray::{Entry, XArray};
/// let xa: XArray<Box<u32>> = XArray::new();
/// let lock = xa.lock();
/// let mut cur = lock.cursor_mut(0);
/// drop(lock);
/// cur.store(Some(Entry::Value(1))); // error: `lock` was moved while borrowed
/// ```
///
/// and there is no way to hand it a different array's lock: its writes
/// take none, and the only constructor is the lock itself.
///
/// ```compile_fail,E0599
/// use kxarray::{Entry, XArray};
/// let a: XArray<Box<u32>> = XArray::new();
/// let b: XArray<Box<u32>> = XArray::new();
/// let lock_b = b.lock();
/// let guard = kxarray::pin();
/// let mut cur = a.cursor(&guard, 0);
/// cur.store(&lock_b, Some(Entry::Value(1))); // no write with a foreign lock
/// ```
pub struct CursorMut<'c, 'g, T: Item> {
    cur: Cursor<'g, T>,
    lock: &'c XaLock<'g, T>,
}

impl<'g, T: Item> Deref for CursorMut<'_, 'g, T> {
    type Target = Cursor<'g, T>;
    #[inline]
    fn deref(&self) -> &Cursor<'g, T> {
        &self.cur
    }
}

impl<T: Item> DerefMut for CursorMut<'_, '_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cur
    }
}

impl<'c, 'g, T: Item> CursorMut<'c, 'g, T> {
    /// The lock this cursor writes under.
    ///
    /// ```
    /// use kxarray::XArray;
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// let cur = lock.cursor_mut(0);
    /// assert!(std::ptr::eq(cur.lock().array(), &xa));
    /// ```
    pub fn lock(&self) -> &'c XaLock<'g, T> {
        self.lock
    }

    /// Store `entry` (or erase, with `None`) over the cursor's block
    /// (`xas_store`), returning what was there (the first entry, for a
    /// block that covered several).
    ///
    /// Context: under the lock this cursor borrows.
    ///
    /// # Errors
    ///
    /// The entry comes back in [`Rejected`]: [`Error::NoMemory`] when a
    /// node is needed and none could be allocated (use [`XArray::update`]
    /// to retry with memory found outside the lock), or
    /// [`Error::ValueOutOfRange`]. The array is then unchanged.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(3);
    /// assert!(cur.store(Some(Entry::Value(1))).unwrap().is_none());
    /// let old = cur.store(None).unwrap();
    /// assert_eq!(old.and_then(|e| e.value()), Some(1));
    /// ```
    pub fn store(
        &mut self,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'g, T>>, Rejected<T>> {
        self.cur.xas.store(self.lock, entry)
    }

    /// Set `mark` on the entry at the cursor (`xas_set_mark`); the cursor
    /// must have been positioned by a load, find or store.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(9);
    /// cur.store(Some(Entry::Value(9))).unwrap();
    /// cur.set_mark(Mark::M2);
    /// drop(cur);
    /// drop(lock);
    /// assert!(xa.get_mark(9, Mark::M2));
    /// ```
    pub fn set_mark(&mut self, mark: Mark) {
        self.cur.xas.set_mark(self.lock, mark);
    }

    /// Clear `mark` on the entry at the cursor (`xas_clear_mark`).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(9, Entry::Value(9)).unwrap();
    /// xa.set_mark(9, Mark::M0);
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(9);
    /// cur.load();
    /// cur.clear_mark(Mark::M0);
    /// assert!(!cur.get_mark(Mark::M0));
    /// ```
    pub fn clear_mark(&mut self, mark: Mark) {
        self.cur.xas.clear_mark(self.lock, mark);
    }

    /// Clear every mark on the entry at the cursor (`xas_init_marks`).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(9, Entry::Value(9)).unwrap();
    /// xa.set_mark(9, Mark::M1);
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(9);
    /// cur.load();
    /// cur.init_marks();
    /// assert!(!cur.get_mark(Mark::M1));
    /// ```
    pub fn init_marks(&mut self) {
        self.cur.xas.init_marks(self.lock);
    }

    /// The next entry a store of the cursor's block would overwrite
    /// (`xas_find_conflict`), or `None` when there is no more.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(5, Entry::Value(5)).unwrap();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(0);
    /// cur.set_order(0, 3).unwrap(); // indices 0..=7
    /// assert_eq!(cur.find_conflict().and_then(|e| e.value()), Some(5));
    /// assert!(cur.find_conflict().is_none());
    /// ```
    pub fn find_conflict(&mut self) -> Option<EntryRef<'g, T>> {
        self.cur.xas.find_conflict(self.lock)
    }

    /// Every entry a store of the cursor's block would overwrite, as an
    /// iterator.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// xa.store(6, Entry::Value(6)).unwrap();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(0);
    /// cur.set_order(0, 3).unwrap();
    /// assert_eq!(cur.conflicts().count(), 2);
    /// ```
    pub fn conflicts(&mut self) -> Conflicts<'_, 'g, 'g, T> {
        let lock = self.lock;
        self.cur.xas.conflicts(lock)
    }

    /// Create every node of the range `first..=last` now, so stores inside
    /// it cannot fail for lack of memory (`xas_create_range`); see
    /// [`XaState::create_range`].
    ///
    /// # Errors
    ///
    /// As [`XaState::create_range`]; the array is then unchanged.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(0);
    /// cur.set_order(0, 6).unwrap();
    /// cur.create_range().unwrap();
    /// cur.set_index(63);
    /// cur.store(Some(Entry::Value(1))).unwrap();
    /// ```
    pub fn create_range(&mut self) -> Result<(), Error> {
        self.cur.xas.create_range(self.lock)
    }

    /// Split the multi-index value entry `value` of order `order` at the
    /// cursor into entries of the cursor's order, allocating what it needs
    /// first (`xas_split_alloc` + `xas_split`).
    ///
    /// # Errors
    ///
    /// As [`XaState::split_alloc`] and [`XaState::split`]: nothing changed.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(0, 6, Entry::Value(3)).unwrap();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(0);
    /// cur.set_order(0, 0).unwrap();
    /// cur.split(3, 6).unwrap();
    /// drop(cur);
    /// drop(lock);
    /// assert_eq!(xa.get_order(17), 0);
    /// assert_eq!(xa.load_value(17), Some(3));
    /// ```
    pub fn split(&mut self, value: u64, order: u32) -> Result<(), Error> {
        self.cur.xas.split_alloc(value, order)?;
        self.cur.xas.split(self.lock, value, order)
    }

    /// Split off the cursor's block from the multi-index value entry
    /// `value` of order `order`, leaving the rest in the largest aligned
    /// pieces (`xas_try_split`, all levels at once).
    ///
    /// # Errors
    ///
    /// As [`XaState::try_split_alloc`] and [`XaState::try_split`]: nothing
    /// changed.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_order(0, 4, Entry::Value(3)).unwrap();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(5);
    /// cur.try_split(3, 4).unwrap();
    /// drop(cur);
    /// drop(lock);
    /// assert_eq!(xa.get_order(5), 0);
    /// assert_eq!(xa.get_order(8), 3);
    /// ```
    pub fn try_split(&mut self, value: u64, order: u32) -> Result<(), Error> {
        self.cur.xas.try_split_alloc(value, order)?;
        self.cur.xas.try_split(self.lock, value, order)
    }
}

impl<T: Item> core::fmt::Debug for CursorMut<'_, '_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("CursorMut").field(&self.cur.xas).finish()
    }
}

impl<T: Item> XArray<T> {
    /// A read cursor at `index` under `guard`.
    ///
    /// Context: any thread; takes no lock.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// let guard = kxarray::pin();
    /// let mut cur = xa.cursor(&guard, 2);
    /// assert_eq!(cur.load().and_then(|e| e.value()), Some(2));
    /// ```
    #[inline]
    pub fn cursor<'a>(&'a self, guard: &'a Guard, index: u64) -> Cursor<'a, T> {
        Cursor::new(self, guard, index)
    }

    /// Run `f` with a write cursor at `index` under the lock, retrying with
    /// memory found outside the lock when `f` fails for lack of it: the
    /// kernel's `do { xas_lock(); ...; xas_unlock(); } while
    /// (xas_nomem(&xas, gfp))` loop as one call. The cursor keeps its index,
    /// order and preallocated nodes across retries; `f` may run more than
    /// once and should start from the cursor's index each time.
    ///
    /// Context: takes the lock (do not hold it already); the lock is
    /// dropped while memory is allocated.
    ///
    /// # Errors
    ///
    /// Whatever `f` returns; [`Error::NoMemory`] only when allocating
    /// outside the lock failed too.
    ///
    /// # Panics
    ///
    /// If the array is poisoned ([`XArray::is_poisoned`]).
    ///
    /// ```
    /// use kxarray::{fault, Entry, Error, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// fault::fail_next_allocations(1); // the first try under the lock fails
    /// let old = xa
    ///     .update(1 << 20, |cur| {
    ///         let old = cur.store(Some(Entry::Value(1))).map_err(|r| r.error)?;
    ///         Ok::<_, Error>(old.and_then(|e| e.value()))
    ///     })
    ///     .unwrap();
    /// assert_eq!(old, None);
    /// assert_eq!(xa.load_value(1 << 20), Some(1));
    /// ```
    pub fn update<R, E>(
        &self,
        index: u64,
        mut f: impl FnMut(&mut CursorMut<'_, '_, T>) -> Result<R, E>,
    ) -> Result<R, E> {
        let guard = pin();
        let mut xas = XaState::new(self, &guard, index);
        loop {
            let lock = self.lock();
            let mut cur = CursorMut {
                cur: Cursor { xas },
                lock: &lock,
            };
            let r = f(&mut cur);
            xas = cur.cur.xas;
            if r.is_err() && xas.error() == Some(Error::NoMemory) {
                drop(lock);
                if xas.nomem() {
                    continue;
                }
            }
            return r;
        }
    }
}

impl<'a, T: Item> XaLock<'a, T> {
    /// A write cursor at `index` that writes under this lock.
    ///
    /// ```
    /// use kxarray::{Entry, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let lock = xa.lock();
    /// let mut cur = lock.cursor_mut(4);
    /// cur.store(Some(Entry::Value(4))).unwrap();
    /// assert_eq!(lock.load(4).and_then(|e| e.value()), Some(4));
    /// ```
    pub fn cursor_mut(&self, index: u64) -> CursorMut<'_, '_, T> {
        CursorMut {
            cur: Cursor::new(self.array(), self.guard(), index),
            lock: self,
        }
    }
}
