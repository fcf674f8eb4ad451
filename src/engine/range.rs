//! Ranges: `create_range` (the kernel's `xas_create_range`), bounded and
//! all-or-nothing, and the sweep that removes the nodes it made which no
//! store filled.
//!
//! Invariants: `create_range` allocates every node it may need before it
//! touches the tree, so a failure leaves the array unchanged; it refuses a
//! range spanning more than [`MAX_RANGE_NODES`] nodes before allocating;
//! the span it created is recorded in the array and swept when the lock is
//! released, so no empty node outlives the lock.

use super::lock::XaLock;
use super::state::{PoisonOnUnwind, Pos, XaState};
use crate::error::Error;
use crate::item::Item;
use crate::node::{Writer, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};

/// The most nodes one [`XaState::create_range`] may span (8192 nodes, about
/// 4.5 MiB with 64-slot nodes: an order-18 range); larger requests fail
/// with [`Error::RangeTooLarge`] before anything is allocated.
pub const MAX_RANGE_NODES: usize = 8192;

impl<T: Item> XaState<'_, T> {
    /// Nodes a fully created range `first..=last` consists of: every leaf
    /// and every node above them up to the top the tree will have, counted
    /// whether they exist already or not (an upper bound on what
    /// [`XaState::create_range`] allocates).
    fn range_nodes(&self, first: u64, last: u64) -> u64 {
        let head = self.xa.head.load_locked();
        let mut top = if head.is_node() {
            // SAFETY: a node of this tree, read under the guard or lock (or linked by
            // this cursor); nodes are freed only through the epoch (state.rs inv. 1).
            unsafe { self.node_of(head) }.shift as u32
        } else {
            0
        };
        while top + CHUNK_SHIFT < 64 && (last >> (top + CHUNK_SHIFT)) != 0 {
            top += CHUNK_SHIFT;
        }
        let mut total = 0u64;
        let mut shift = 0u32;
        loop {
            let span = shift + CHUNK_SHIFT;
            total += if span >= 64 {
                1
            } else {
                (last >> span) - (first >> span) + 1
            };
            if shift >= top {
                return total;
            }
            shift += CHUNK_SHIFT;
        }
    }

    /// Make every slot of the cursor's range exist, so that order-0 stores
    /// into it need no allocation (`xas_create_range`). Leaves the cursor at
    /// the start of the range with order 0.
    ///
    /// The nodes are allocated before the tree is touched: on failure the
    /// array is unchanged. Nodes created here hold nothing until the caller
    /// stores into them (as in the kernel), under the same lock: the ones
    /// still empty when the lock is released are removed then, so no empty
    /// node outlives the lock.
    ///
    /// # Errors
    ///
    /// [`Error::RangeTooLarge`], before anything is allocated, when the
    /// range spans more than [`MAX_RANGE_NODES`] nodes (counting those that
    /// exist already); [`Error::NoMemory`] when the nodes cannot be
    /// allocated ([`XaState::nomem`] then allocates them all).
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
    /// let mut xas = XaState::with_order(&xa, &guard, 0, 6).unwrap();
    /// xas.create_range(&lock).unwrap();
    /// assert!(xa.node_count() >= 1);
    /// ```
    pub fn create_range(&mut self, lock: &XaLock<'_, T>) -> Result<(), Error> {
        let w = self.check_lock(lock);
        if let Pos::Error(e) = self.pos {
            return Err(e);
        }
        let index = self.index;
        let shift = self.shift;
        let sibs = self.sibs;
        let last = index | ((sibs as u64 + 1) << shift).wrapping_sub(1);
        let nodes = self.range_nodes(index, last);
        if nodes > MAX_RANGE_NODES as u64 {
            return Err(Error::RangeTooLarge {
                nodes,
                max: MAX_RANGE_NODES as u64,
            });
        }
        if !self.reserve(nodes as usize) {
            return Err(Error::NoMemory);
        }
        let bomb = PoisonOnUnwind::arm(self.xa);
        let r = self.create_range_reserved(w, index, shift, sibs);
        bomb.defuse();
        self.xa.note_created(index, last);
        r
    }

    /// Remove the empty nodes (left by `create_range`) in `first..=last`,
    /// visiting only the nodes that exist there. Called under the lock.
    pub(crate) fn sweep_empty(&mut self, w: Writer<'_>, first: u64, last: u64) {
        let mut i = first;
        loop {
            self.set_index(i);
            self.load_raw();
            let Pos::Node(node) = self.pos else {
                return; // at the head or past the tree: no nodes further on
            };
            let n = node;
            let span = if n.shift == 0 {
                if n.count() == 0 {
                    self.delete_node(w);
                }
                CHUNK_SHIFT
            } else {
                n.shift as u32 // an empty slot or an entry above the leaves
            };
            match (i | ((1u64 << span) - 1)).checked_add(1) {
                Some(next) if next <= last => i = next,
                _ => return,
            }
        }
    }

    fn create_range_reserved(
        &mut self,
        w: Writer<'_>,
        index: u64,
        shift: u8,
        sibs: u8,
    ) -> Result<(), Error> {
        self.index |= ((sibs as u64 + 1) << shift).wrapping_sub(1);
        if let Pos::Node(n) = self.pos {
            if n.shift == self.shift {
                self.offset |= sibs;
            }
        }
        self.shift = 0;
        self.sibs = 0;
        loop {
            self.create(w, true);
            if let Some(e) = self.error() {
                self.shift = shift;
                self.sibs = sibs;
                self.index = index;
                return Err(e);
            }
            if self.index <= (index | CHUNK_MASK) {
                break;
            }
            self.index -= CHUNK_SIZE as u64;
            while let Pos::Node(node) = self.pos {
                let n = node;
                if n.shift >= shift {
                    break;
                }
                let parent = n.parent_ref();
                self.pos = match parent {
                    Some(p) => Pos::Node(p),
                    None => Pos::Head,
                };
                self.offset = n.offset.wrapping_sub(1);
                if n.offset != 0 {
                    break;
                }
            }
        }
        self.index = index;
        if let Pos::Node(n) = self.pos {
            self.offset = ((self.index >> n.shift) & CHUNK_MASK) as u8;
        }
        Ok(())
    }
}
