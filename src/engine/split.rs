//! Splitting multi-index entries: the uniform split (`xas_split_alloc`/`xas_split`)
//! and the partial split (`xas_try_split`), together.
//!
//! Partial split: the page cache's `xas_try_split`, all levels at once.
//!
//! Splitting an order-`o` value entry so that one aligned block of the
//! cursor's order `n` becomes an entry of its own touches only what that
//! block needs: the rest of the old range keeps the value in entries of the
//! intermediate orders `n..o` (the buddy halves that do not contain the
//! block), exactly as repeated `xas_try_split` calls leave it, but with one
//! walk and one node per level crossed (order 9 to order 0: one node,
//! instead of the eight a uniform `xas_split` needs).
//!
//! Invariants: the nodes come from `try_split_alloc`, made without the lock
//! and tagged with the (entry, order) they are for; `try_split` refuses (and
//! frees them) if the entry at the cursor is no longer that entry of that
//! order. Every slot readers can reach holds the old value, a sibling of it,
//! or a fully initialised child node at every instant, so lock-free readers
//! see the same value throughout.

use super::lock::XaLock;
use super::state::{order_shape, PoisonOnUnwind, Pos, XaState};
use crate::entry::RawEntry;
use crate::error::Error;
use crate::item::Item;
use crate::mark::Mark;
use crate::node::{Locked, Node, NodeRef, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};

impl<'a, T: Item> XaState<'a, T> {
    /// Preallocate, without the lock, the nodes needed to split a value entry
    /// of order `order` into entries of the cursor's order
    /// (`xas_split_alloc`). The nodes are prefilled with `value` and tagged
    /// with it, so [`XaState::split`] can check that the entry it splits is
    /// still the one they were built for.
    ///
    /// Context: no lock needed (allocates).
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`], [`Error::InvalidSplit`] when the order is
    /// not above the cursor's, [`Error::NoMemory`]; nothing is kept then.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store_order(0, 6, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.split_alloc(1, 6).unwrap();
    /// assert!(xas.preallocated() > 0);
    /// ```
    pub fn split_alloc(&mut self, value: u64, order: u32) -> Result<(), Error> {
        if value > crate::entry::MAX_VALUE {
            return Err(Error::ValueOutOfRange(value));
        }
        if order > 63 {
            return Err(Error::OrderTooLarge(order));
        }
        self.clear_split();
        let entry = RawEntry::value(value);
        if self.shift as u32 + 2 * CHUNK_SHIFT <= order {
            return Err(Error::InvalidSplit);
        }
        if order <= self.order() {
            return Err(Error::InvalidSplit);
        }
        if self.shift as u32 + CHUNK_SHIFT <= order {
            let sibs = (1usize << (order % CHUNK_SHIFT)) - 1;
            for _ in 0..=sibs {
                let Some(mut nb) = Node::alloc(0, 0, None) else {
                    self.clear_split();
                    return Err(Error::NoMemory);
                };
                self.fill_for_split(nb.as_locked(), entry);
                self.push_split_node(nb);
            }
        }
        self.set_split_tag(entry, order, false);
        Ok(())
    }

    pub(crate) fn fill_for_split(&self, n: NodeRef<'_, Locked>, entry: RawEntry) {
        let mask = self.sibs as usize;
        n.init_full(|i| {
            if i & mask == 0 {
                entry
            } else {
                RawEntry::sibling(i & !mask)
            }
        });
    }

    /// Split the value entry of order `order` at the cursor into entries of
    /// the cursor's order, all holding `value` (`xas_split`), using the
    /// nodes from [`XaState::split_alloc`]. No allocation happens here.
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`] if `value` does not fit in 63 bits (it
    /// cannot be the entry's); [`Error::InvalidSplit`] if the entry at the
    /// cursor is not `value` of order `order`, or if the preallocation was
    /// made for another entry or order: the check the kernel's pre-6.10 page
    /// cache lacked. Either way the array is unchanged and the preallocation
    /// freed.
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
    /// xa.store_order(0, 6, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.split_alloc(1, 6).unwrap();
    /// let lock = xa.lock();
    /// xas.split(&lock, 1, 6).unwrap();
    /// drop(lock);
    /// assert_eq!(xa.get_order(40), 0);
    /// assert_eq!(xa.load_value(40), Some(1));
    /// ```
    pub fn split(&mut self, lock: &XaLock<'_, T>, value: u64, order: u32) -> Result<(), Error> {
        let w = self.check_lock(lock);
        if value > crate::entry::MAX_VALUE {
            self.clear_split();
            return Err(Error::ValueOutOfRange(value));
        }
        let entry = RawEntry::value(value);
        if self.split_tag() != Some((entry, order, false)) {
            self.clear_split();
            return Err(Error::InvalidSplit);
        }
        let curr = self.load_raw();
        let node = match self.pos {
            Pos::Node(n) => n,
            _ => {
                self.destroy();
                return Err(Error::InvalidSplit);
            }
        };
        if curr != entry || self.get_order() != order {
            self.destroy();
            return Err(Error::InvalidSplit);
        }
        let bomb = PoisonOnUnwind::arm(self.xa);
        // SAFETY: the cursor's node, in this tree under the lock `w`
        // witnesses (state.rs inv. 1).
        let n = unsafe { self.nmut(node, w) };
        let sibs = (1usize << (order % CHUNK_SHIFT)) - 1;
        let marks = n.slot_marks(self.offset as usize);
        let mut values: i32 = 0;
        let mut offset = self.offset as usize + sibs;
        let xa = self.xa;
        loop {
            if (self.shift) < n.shift {
                let mut child = self.pop_split_node();
                child.place(
                    n.shift - CHUNK_SHIFT as u8,
                    offset as u8,
                    Some(node.as_ptr()),
                );
                {
                    let c = child.as_locked();
                    c.set_count(CHUNK_SIZE as u8);
                    c.set_nr_values(if entry.is_value() {
                        CHUNK_SIZE as u8
                    } else {
                        0
                    });
                    self.set_split_marks(n, offset, Some(c), marks);
                }
                let child = child.into_raw();
                xa.node_added();
                n.set_slot(offset, RawEntry::node(child));
                crate::fault::slot_written();
                if curr.is_value() {
                    values -= 1;
                }
            } else {
                let canon = offset - self.sibs as usize;
                self.set_split_marks(n, canon, None, marks);
                n.set_slot(canon, entry);
                crate::fault::slot_written();
                while offset > canon {
                    n.set_slot(offset, RawEntry::sibling(canon));
                    offset -= 1;
                }
                values +=
                    (entry.is_value() as i32 - curr.is_value() as i32) * (self.sibs as i32 + 1);
            }
            if offset == self.offset as usize {
                break;
            }
            offset -= 1;
        }
        n.add_nr_values(values);
        xa.bump_seq();
        self.seq = xa.seq();
        bomb.defuse();
        self.clear_split();
        Ok(())
    }

    pub(crate) fn set_split_marks(
        &self,
        n: NodeRef<'_, Locked>,
        offset: usize,
        child: Option<NodeRef<'_, Locked>>,
        marks: u8,
    ) {
        for mark in Mark::ALL {
            if marks & (1 << mark.index()) != 0 {
                n.set_mark(offset, mark);
                if let Some(c) = child {
                    if self.sibs == 0 {
                        c.mark_all(mark);
                    } else {
                        let mut i = 0;
                        while i < CHUNK_SIZE {
                            c.set_mark(i, mark);
                            i += self.sibs as usize + 1;
                        }
                    }
                }
            }
        }
    }
}

/// Nodes a partial split from order `order` to order `new_order` needs.
pub(crate) fn partial_split_nodes(order: u32, new_order: u32) -> usize {
    let (old_shift, _) = order_shape(order);
    let (new_shift, _) = order_shape(new_order);
    ((old_shift - new_shift) as u32 / CHUNK_SHIFT) as usize
}

impl<T: Item> XaState<'_, T> {
    /// How many nodes a [`XaState::try_split`] of an entry of order `order`
    /// down to the cursor's order needs (0 when the split stays inside one
    /// node, so it can be done without dropping the lock).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = XaState::new(&xa, &guard, 0);
    /// assert_eq!(xas.try_split_nodes(0), 0); // nothing to split
    /// assert!(xas.try_split_nodes(20) >= 1);
    /// ```
    pub fn try_split_nodes(&self, order: u32) -> usize {
        if order <= self.order() || order > 63 {
            return 0;
        }
        partial_split_nodes(order, self.order())
    }

    /// Preallocate, without the lock, the nodes a [`XaState::try_split`] of
    /// the value entry `value` of order `order` down to the cursor's order
    /// needs: one per level crossed (order 9 to 0 with 64-slot nodes: one).
    ///
    /// Context: no lock needed (allocates).
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`], [`Error::InvalidSplit`], [`Error::NoMemory`].
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store_order(0, 9, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// let n = xas.try_split_alloc(1, 9).unwrap();
    /// assert_eq!(n, xas.try_split_nodes(9));
    /// ```
    pub fn try_split_alloc(&mut self, value: u64, order: u32) -> Result<usize, Error> {
        if value > crate::entry::MAX_VALUE {
            return Err(Error::ValueOutOfRange(value));
        }
        if order > 63 {
            return Err(Error::OrderTooLarge(order));
        }
        if order <= self.order() {
            return Err(Error::InvalidSplit);
        }
        self.clear_split();
        let need = partial_split_nodes(order, self.order());
        for _ in 0..need {
            match Node::alloc(0, 0, None) {
                Some(n) => self.push_split_node(n),
                None => {
                    self.clear_split();
                    return Err(Error::NoMemory);
                }
            }
        }
        self.set_split_tag(RawEntry::value(value), order, true);
        Ok(need)
    }

    /// Split the order-`order` value entry covering the cursor's range so
    /// that the range becomes an entry of exactly the cursor's order (still
    /// holding `value`), leaving the rest of the old range as entries of the
    /// intermediate orders. Uses only the nodes from
    /// [`XaState::try_split_alloc`]; allocates nothing under the lock.
    ///
    /// The cursor must be on the entry (after `load` or `find_conflict`);
    /// if it is not positioned it walks there first. Afterwards it sits on
    /// the new piece, so a `store` follows without another walk.
    ///
    /// Marks are kept exactly: every piece, at every level, carries the
    /// marks the entry had.
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`] when `value` does not fit in 63 bits;
    /// [`Error::InvalidSplit`] when the entry at the cursor is no longer
    /// `value` of order `order` or the preallocation was made for something
    /// else. Either way the array is unchanged and the preallocation freed.
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
    /// xa.store_order(0, 4, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 5);
    /// xas.try_split_alloc(1, 4).unwrap();
    /// let lock = xa.lock();
    /// xas.try_split(&lock, 1, 4).unwrap();
    /// drop(lock);
    /// assert_eq!((xa.get_order(5), xa.get_order(0)), (0, 2));
    /// ```
    pub fn try_split(&mut self, lock: &XaLock<'_, T>, value: u64, order: u32) -> Result<(), Error> {
        let w = self.check_lock(lock);
        if value > crate::entry::MAX_VALUE {
            self.destroy();
            return Err(Error::ValueOutOfRange(value));
        }
        let entry = RawEntry::value(value);
        if self.split_tag() != Some((entry, order, true)) {
            self.destroy();
            return Err(Error::InvalidSplit);
        }
        // Position on the entry (no walk if the cursor is already there).
        let curr = if matches!(self.pos, Pos::Node(_)) {
            self.reload_raw()
        } else {
            let (shift, sibs) = (self.shift, self.sibs);
            // load at the old entry's level: a cursor of the old order
            let (os, osi) = order_shape(order);
            self.shift = os;
            self.sibs = osi;
            let e = self.load_raw();
            self.shift = shift;
            self.sibs = sibs;
            e
        };
        let Pos::Node(node) = self.pos else {
            self.destroy();
            return Err(Error::InvalidSplit);
        };
        // SAFETY: the cursor's node, in this tree under the lock `w`
        // witnesses (state.rs inv. 1).
        let mut node = unsafe { self.nmut(node, w) };
        // Put the cursor on the entry's canonical slot (it may have been
        // reached through a sibling), then check entry and order.
        {
            let n = node;
            let off = ((self.index >> n.shift) & CHUNK_MASK) as usize;
            let e = n.slot_locked(off);
            self.offset = if e.is_sibling() { e.to_sibling() } else { off } as u8;
        }
        if curr != entry || self.get_order() != order {
            self.destroy();
            return Err(Error::InvalidSplit);
        }
        let bomb = PoisonOnUnwind::arm(self.xa);
        let new_order = self.order();
        let marks = node.slot_marks(self.offset as usize);
        let xa = self.xa;
        let mut lo = order; // order of the block still to split, in `node`
        let mut base_off = self.offset as usize; // first slot of that block in `node`
        loop {
            let n = node;
            let nshift = n.shift as u32;
            // Halve the block, writing the buddy halves that do not contain
            // the target, down to max(new_order, nshift).
            let floor = new_order.max(nshift);
            let target_off = ((self.index >> nshift) & CHUNK_MASK) as usize;
            while lo > floor {
                lo -= 1;
                let slots = 1usize << (lo - nshift);
                let lower = base_off;
                let upper = base_off + slots;
                let (buddy, keep) = if target_off >= upper {
                    (lower, upper)
                } else {
                    (upper, lower)
                };
                self.write_piece(n, buddy, slots, entry, marks);
                base_off = keep;
            }
            if new_order >= nshift {
                // the target block is `slots` slots at base_off of this node
                let slots = 1usize << (new_order - nshift);
                self.write_piece(n, base_off, slots, entry, marks);
                self.pos = Pos::Node(self.at(node));
                self.offset = base_off as u8;
                break;
            }
            // Cross a level: the target slot becomes a child full of the
            // value (as order-(nshift-CHUNK) entries), published at once.
            let mut child = self.pop_split_node();
            let cshift = nshift - CHUNK_SHIFT;
            child.place(cshift as u8, base_off as u8, Some(node.as_ptr()));
            {
                let c = child.as_locked();
                c.init_full(|_| entry);
                c.set_count(CHUNK_SIZE as u8);
                c.set_nr_values(CHUNK_SIZE as u8);
                for mark in Mark::ALL {
                    if marks & (1 << mark.index()) != 0 {
                        c.mark_all(mark);
                    }
                }
            }
            // SAFETY: the child is linked into this tree just below, under the
            // lock `w` witnesses.
            let child = unsafe { self.nmut(child.into_raw(), w) };
            xa.node_added();
            // The slot may have been a sibling (marks cleared): it now
            // holds the child, whose every slot carries the entry's marks.
            for mark in Mark::ALL {
                if marks & (1 << mark.index()) != 0 {
                    n.set_mark(base_off, mark);
                }
            }
            n.set_slot(base_off, RawEntry::node(child.as_ptr()));
            crate::fault::slot_written();
            n.add_nr_values(-1);
            node = child;
            // Inside the child, the order-`nshift` block the slot held is
            // the whole node: the next round halves it.
            lo = nshift;
            base_off = 0;
        }
        xa.bump_seq();
        self.seq = xa.seq();
        bomb.defuse();
        self.clear_split();
        Ok(())
    }

    /// Rewrite `slots` slots from `first` as one entry (canonical plus
    /// siblings) carrying `marks`. The old contents are the same value (or
    /// its siblings), so only the sibling links and marks change.
    fn write_piece(
        &self,
        n: NodeRef<'_, Locked>,
        first: usize,
        slots: usize,
        entry: RawEntry,
        marks: u8,
    ) {
        // Publish the canonical slot first so siblings never point at a
        // sibling; then the siblings from high to low.
        n.set_slot(first, entry);
        crate::fault::slot_written();
        for mark in Mark::ALL {
            if marks & (1 << mark.index()) != 0 {
                n.set_mark(first, mark);
            }
        }
        let mut off = first + slots - 1;
        while off > first {
            n.set_slot(off, RawEntry::sibling(first));
            for mark in Mark::ALL {
                n.clear_mark(off, mark);
            }
            off -= 1;
        }
    }
}
