//! The conflict scan (`xas_find_conflict`): the entries a store of the cursor's
//! range would overwrite.

use super::iter::Conflicts;
use super::lock::XaLock;
use super::state::{Pos, XaState};
use crate::entry::RawEntry;
use crate::item::{EntryRef, Item};
use crate::node::CHUNK_MASK;

impl<'a, T: Item> XaState<'a, T> {
    /// `xas_find_conflict`, raw.
    pub(crate) fn find_conflict_raw(&mut self) -> RawEntry {
        match self.pos {
            Pos::Error(_) | Pos::Head => return RawEntry::NULL,
            Pos::Restart | Pos::Bounds => {
                self.pos = Pos::Restart;
                let mut curr = self.start();
                if curr.is_null() {
                    return RawEntry::NULL;
                }
                while curr.is_node() {
                    // SAFETY: a node entry, just read from the head or a slot
                    // of this tree under the cursor's guard.
                    curr = self.descend(unsafe { self.node_of(curr) });
                }
                if !curr.is_null() {
                    return curr;
                }
            }
            Pos::Node(_) => {}
        }
        let Pos::Node(mut node) = self.pos else {
            return RawEntry::NULL;
        };
        if node.shift > self.shift {
            return RawEntry::NULL;
        }
        loop {
            let n = node;
            if n.shift == self.shift {
                if (self.offset & self.sibs) == self.sibs {
                    break;
                }
            } else if self.offset as u64 == CHUNK_MASK {
                self.offset = n.offset;
                match n.parent_ref() {
                    Some(p) => {
                        node = p;
                        self.pos = Pos::Node(p);
                        continue;
                    }
                    None => {
                        self.pos = Pos::Head;
                        break;
                    }
                }
            }
            self.offset += 1;
            let mut curr = node.slot_locked(self.offset as usize);
            if curr.is_sibling() {
                continue;
            }
            while curr.is_node() {
                // SAFETY: a node entry read from a slot of a node of this tree
                // reached under the cursor's guard (nodes are retired only through
                // the epoch, state.rs inv. 1).
                node = unsafe { self.node_of(curr) };
                self.pos = Pos::Node(node);
                self.offset = 0;
                curr = node.slot_locked(0);
            }
            if !curr.is_null() {
                return curr;
            }
        }
        // u8 arithmetic like the kernel's: after climbing out of the top
        // node (cursor at the head) the offset is meaningless and may wrap
        self.offset = self.offset.wrapping_sub(self.sibs);
        RawEntry::NULL
    }

    /// The next entry present in the cursor's range, i.e. one that a store of
    /// the cursor's order would overwrite (`xas_find_conflict`). A larger
    /// entry covering the range is returned once, with the cursor on its
    /// canonical slot so [`XaState::get_order`] reads its order in place.
    /// After the last conflict the cursor is left ready for `store` over the
    /// range without another walk.
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
    /// xa.store(3, Entry::Value(3)).unwrap();
    /// let lock = xa.lock();
    /// let mut xas = XaState::with_order(&xa, &guard, 0, 2).unwrap();
    /// assert_eq!(xas.find_conflict(&lock).and_then(|e| e.value()), Some(3));
    /// assert!(xas.find_conflict(&lock).is_none());
    /// ```
    pub fn find_conflict(&mut self, lock: &XaLock<'_, T>) -> Option<EntryRef<'a, T>> {
        self.check_lock(lock);
        loop {
            let e = self.find_conflict_raw();
            if e.is_zero() {
                continue;
            }
            // SAFETY: read under the lock and `self.guard` (default
            // collector, where item frees are deferred); lives for 'a.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// Every conflicting entry in the range, in index order
    /// (`xas_for_each_conflict`).
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
    /// xa.store(1, Entry::Value(1)).unwrap();
    /// xa.store(2, Entry::Value(2)).unwrap();
    /// let lock = xa.lock();
    /// let mut xas = XaState::with_order(&xa, &guard, 0, 2).unwrap();
    /// assert_eq!(xas.conflicts(&lock).count(), 2);
    /// ```
    pub fn conflicts<'c, 'l>(&'c mut self, lock: &'c XaLock<'l, T>) -> Conflicts<'c, 'a, 'l, T> {
        Conflicts { xas: self, lock }
    }
}
