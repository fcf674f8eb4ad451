//! Search marks through a cursor (`xas_set_mark`/`xas_clear_mark`/`xas_init_marks`):
//! a mark set on a slot is set on every ancestor and in the root flags.

use super::lock::XaLock;
use super::state::{Pos, XaState};
use crate::item::Item;
use crate::mark::Mark;
use crate::node::{Locked, NodeRef, Writer};

impl<'a, T: Item> XaState<'a, T> {
    /// Whether the entry at the cursor has `mark` (`xas_get_mark`).
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// xa.set_mark(2, Mark::M0);
    /// let mut xas = XaState::new(&xa, &guard, 2);
    /// xas.load();
    /// assert!(xas.get_mark(Mark::M0));
    /// ```
    #[inline]
    pub fn get_mark(&self, mark: Mark) -> bool {
        match self.pos {
            Pos::Head => self.xa.marked(mark),
            Pos::Node(n) => n.get_mark(self.offset as usize, mark),
            _ => false,
        }
    }

    /// The cursor's node as a write handle (`None` at the head), or
    /// `Err(())` when the cursor is not on a slot.
    #[inline]
    fn locked_pos<'l>(&self, w: Writer<'l>) -> Result<Option<NodeRef<'l, Locked>>, ()> {
        match self.pos {
            // SAFETY: the cursor's node, in this tree under the lock `w`
            // witnesses (state.rs inv. 1).
            Pos::Node(n) => Ok(Some(unsafe { self.nmut(n, w) })),
            Pos::Head => Ok(None),
            _ => Err(()),
        }
    }

    pub(crate) fn set_mark_raw(&self, w: Writer<'_>, mark: Mark) {
        let mut offset = self.offset as usize;
        let Ok(mut node) = self.locked_pos(w) else {
            return;
        };
        while let Some(n) = node {
            if n.set_mark(offset, mark) {
                return;
            }
            offset = n.offset as usize;
            node = n.parent_ref();
        }
        self.xa.mark_set(mark);
    }

    pub(crate) fn clear_mark_raw(&self, w: Writer<'_>, mark: Mark) {
        let mut offset = self.offset as usize;
        let Ok(mut node) = self.locked_pos(w) else {
            return;
        };
        while let Some(n) = node {
            if !n.clear_mark(offset, mark) {
                return;
            }
            if n.any_mark(mark) {
                return;
            }
            offset = n.offset as usize;
            node = n.parent_ref();
        }
        self.xa.mark_clear(mark);
    }

    pub(crate) fn init_marks_raw(&self, w: Writer<'_>) {
        for mark in Mark::ALL {
            if self.xa.track_free() && mark == Mark::FREE {
                self.set_mark_raw(w, mark);
            } else {
                self.clear_mark_raw(w, mark);
            }
        }
    }

    pub(crate) fn squash_marks(&self, n: NodeRef<'_, Locked>) {
        let off = self.offset as usize;
        let sibs = self.sibs as usize;
        let range: u64 = if sibs + 1 >= 64 {
            u64::MAX
        } else {
            ((1u64 << sibs) - 1) << (off + 1)
        };
        for mark in Mark::ALL {
            let w = n.marks(mark);
            if w & range != 0 {
                n.set_marks_word(mark, (w | (1 << off)) & !range);
            }
        }
    }

    /// Set `mark` on the entry at the cursor and its ancestors
    /// (`xas_set_mark`). Walks to the index first if the cursor is not
    /// positioned; does nothing on an empty slot.
    ///
    /// Context: under `lock`, the held lock of the cursor's array.
    ///
    /// # Panics
    ///
    /// If `lock` belongs to another array (use [`CursorMut`](crate::CursorMut),
    /// which cannot be given one).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let lock = xa.lock();
    /// let mut xas = XaState::new(&xa, &guard, 2);
    /// xas.store(&lock, Some(Entry::Value(2))).unwrap();
    /// xas.set_mark(&lock, Mark::M1);
    /// assert!(xas.get_mark(Mark::M1));
    /// ```
    pub fn set_mark(&mut self, lock: &XaLock<'_, T>, mark: Mark) {
        let w = self.check_lock(lock);
        if !self.is_valid() {
            let e = self.load_raw();
            if !e.is_user() && !e.is_zero() {
                return;
            }
        }
        self.set_mark_raw(w, mark);
    }

    /// Clear `mark` on the entry at the cursor, and on ancestors that no
    /// longer have a marked entry below them (`xas_clear_mark`).
    ///
    /// Context: under `lock`, the held lock of the cursor's array.
    ///
    /// # Panics
    ///
    /// If `lock` belongs to another array (use [`CursorMut`](crate::CursorMut),
    /// which cannot be given one).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let lock = xa.lock();
    /// let mut xas = XaState::new(&xa, &guard, 2);
    /// xas.store(&lock, Some(Entry::Value(2))).unwrap();
    /// xas.set_mark(&lock, Mark::M1);
    /// xas.clear_mark(&lock, Mark::M1);
    /// assert!(!xas.get_mark(Mark::M1));
    /// ```
    pub fn clear_mark(&mut self, lock: &XaLock<'_, T>, mark: Mark) {
        let w = self.check_lock(lock);
        if !self.is_valid() {
            let e = self.load_raw();
            if !e.is_user() && !e.is_zero() {
                return;
            }
        }
        self.clear_mark_raw(w, mark);
    }

    /// Clear every mark of the entry at the cursor (`xas_init_marks`).
    ///
    /// Context: under `lock`, the held lock of the cursor's array.
    ///
    /// # Panics
    ///
    /// If `lock` belongs to another array (use [`CursorMut`](crate::CursorMut),
    /// which cannot be given one).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let lock = xa.lock();
    /// let mut xas = XaState::new(&xa, &guard, 2);
    /// xas.store(&lock, Some(Entry::Value(2))).unwrap();
    /// xas.set_mark(&lock, Mark::M0);
    /// xas.init_marks(&lock);
    /// assert!(!xas.get_mark(Mark::M0));
    /// ```
    pub fn init_marks(&mut self, lock: &XaLock<'_, T>) {
        let w = self.check_lock(lock);
        if !self.is_valid() {
            self.load_raw();
        }
        self.init_marks_raw(w);
    }
}
