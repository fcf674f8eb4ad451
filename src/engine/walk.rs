//! Walking the tree: positioning a cursor (`xas_start`/`xas_descend`/`xas_load`),
//! reloading, and re-validating a position after the lock was dropped.
//!
//! Invariant: a position is trusted for a write only if the array's modification
//! sequence has not moved since the cursor walked; otherwise the cursor restarts.

use super::iter::Stale;
use super::lock::XaLock;
use super::state::{Pos, XaState};
use crate::entry::RawEntry;
use crate::item::{EntryRef, Item};
use crate::node::{NodeRef, Shared, Writer, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};

impl<'a, T: Item> XaState<'a, T> {
    /// Begin a walk (`xas_start`): reload if positioned, else read the head.
    #[inline(always)]
    pub(crate) fn start(&mut self) -> RawEntry {
        if self.is_valid() {
            return self.reload_raw();
        }
        if let Pos::Error(_) = self.pos {
            return RawEntry::NULL;
        }
        self.walks += 1;
        self.seq = self.xa.seq();
        let entry = self.xa.head.load();
        if !entry.is_node() {
            if self.index != 0 {
                return self.set_bounds_root();
            }
        // SAFETY: a node of this tree, read under the guard or lock (or linked by
        // this cursor); nodes are freed only through the epoch (state.rs inv. 1).
        } else if (self.index >> unsafe { self.node_of(entry) }.shift) > CHUNK_MASK {
            return self.set_bounds_root();
        }
        self.pos = Pos::Head;
        entry
    }

    #[inline]
    pub(crate) fn set_bounds_root(&mut self) -> RawEntry {
        self.pos = Pos::Bounds;
        self.bounds_at_root = true;
        RawEntry::NULL
    }

    #[inline]
    pub(crate) fn set_bounds(&mut self) -> RawEntry {
        self.pos = Pos::Bounds;
        self.bounds_at_root = false;
        RawEntry::NULL
    }

    /// Step into `node` at the cursor's index, resolving siblings.
    #[inline(always)]
    pub(crate) fn descend(&mut self, node: NodeRef<'a, Shared>) -> RawEntry {
        self.descend_at(node, node.shift as u32)
    }

    /// `descend` for a node whose shift the caller knows (a child's shift is
    /// its parent's minus CHUNK_SHIFT), so the node's header line is not
    /// touched: one cache line per level, the slot's.
    #[inline(always)]
    pub(crate) fn descend_at(&mut self, n: NodeRef<'a, Shared>, shift: u32) -> RawEntry {
        debug_assert_eq!(n.shift as u32, shift);
        let mut offset = ((self.index >> shift) & CHUNK_MASK) as usize;
        let mut entry = n.slot(offset);
        self.pos = Pos::Node(n);
        if entry.is_sibling() {
            (entry, offset) = n.resolve_sibling(offset, entry);
        }
        self.offset = offset as u8;
        entry
    }

    /// `xas_load`: walk to the index (never expands the tree).
    #[inline]
    pub(crate) fn load_raw(&mut self) -> RawEntry {
        let mut entry = self.start();
        if !entry.is_node() {
            return entry;
        }
        // Only the first node's header is read; below it shifts step down
        // by CHUNK_SHIFT (they never change once published).
        // SAFETY: a node entry, just read from the head under the cursor's
        // guard (state.rs inv. 1).
        let mut node = unsafe { self.node_of(entry) };
        let mut shift = node.shift as u32;
        loop {
            if self.shift as u32 > shift {
                break;
            }
            entry = self.descend_at(node, shift);
            if shift == 0 || !entry.is_node() {
                break;
            }
            // SAFETY: a node entry, just read from a slot of `node` under the
            // cursor's guard.
            node = unsafe { self.node_of(entry) };
            shift -= CHUNK_SHIFT;
        }
        entry
    }

    /// `xas_reload`: re-read the slot at the current position.
    #[inline]
    pub(crate) fn reload_raw(&self) -> RawEntry {
        match self.pos {
            Pos::Head => self.xa.head.load(),
            Pos::Node(n) => {
                let offset = ((self.index >> n.shift) & CHUNK_MASK) as usize;
                let e = n.slot(offset);
                if !e.is_sibling() {
                    return e;
                }
                n.slot(e.to_sibling())
            }
            _ => RawEntry::NULL,
        }
    }

    /// Load the entry at the cursor's index, restarting from the root if a
    /// concurrent writer detached the node the cursor was in.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(9, Entry::Value(9)).unwrap();
    /// assert_eq!(XaState::new(&xa, &guard, 9).load().and_then(|e| e.value()), Some(9));
    /// ```
    #[inline]
    pub fn load(&mut self) -> Option<EntryRef<'a, T>> {
        loop {
            let e = self.load_raw();
            if e.is_retry() {
                self.pos = Pos::Restart;
                continue;
            }
            // SAFETY: user entries read under `self.guard` (default
            // collector, where item frees are deferred) stay alive for 'a.
            return unsafe { EntryRef::from_raw_opt(e) };
        }
    }

    /// Re-read the slot the cursor is on without walking (`xas_reload`):
    /// the lock-free "did it change?" check. `Err(Stale)` when the node was
    /// detached (a RETRY entry) or the cursor is not positioned: restart with
    /// [`XaState::reset`] and load again.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// # Errors
    ///
    /// [`Stale`] when the cursor is not positioned or its node
    /// was detached: reset and load again.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store(9, Entry::Value(9)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 9);
    /// assert!(xas.reload().is_err());
    /// xas.load();
    /// assert_eq!(xas.reload().unwrap().and_then(|e| e.value()), Some(9));
    /// ```
    #[inline]
    pub fn reload(&self) -> Result<Option<EntryRef<'a, T>>, Stale> {
        if !self.is_valid() {
            return Err(Stale);
        }
        let e = self.reload_raw();
        if e.is_retry() || e.is_node() {
            return Err(Stale);
        }
        // SAFETY: as in `load`.
        Ok(unsafe { EntryRef::from_raw_opt(e) })
    }

    /// The order of the entry at the cursor (`xas_get_order`), read from the
    /// current node: no walk. Call after `load` or `find_conflict`.
    ///
    /// Context: lock-free, under the cursor's guard.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store_order(8, 3, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 9);
    /// xas.load();
    /// assert_eq!(xas.get_order(), 3);
    /// ```
    #[inline]
    pub fn get_order(&self) -> u32 {
        let Pos::Node(node) = self.pos else {
            return 0;
        };
        let n = node;
        let mut order = 0u32;
        loop {
            let slot = self.offset as usize + (1usize << order);
            if slot >= CHUNK_SIZE || !n.slot(slot).is_sibling() {
                break;
            }
            order += 1;
        }
        order + n.shift as u32
    }

    // ------------------------------------------------------------------
    // Lock validation
    // ------------------------------------------------------------------

    /// Check that `lock` is this cursor's array's, re-validate the position,
    /// and hand out the [`Writer`] the held lock is.
    #[inline]
    pub(crate) fn check_lock<'l>(&mut self, lock: &'l XaLock<'_, T>) -> Writer<'l> {
        assert!(
            core::ptr::eq(lock.array(), self.xa),
            "kxarray: XaState used with the lock of another XArray"
        );
        // The position is still exact if no write that could move or retype
        // its slot happened since it was established; otherwise walk again.
        if self.is_valid() && self.seq != self.xa.seq() {
            self.pos = Pos::Restart;
        }
        if self.pos == Pos::Bounds && self.seq != self.xa.seq() {
            self.bounds_at_root = false;
        }
        lock.writer()
    }

    /// Whether the position taken before the lock was (re)acquired is still
    /// exact: true when no store, split or node change happened since (only
    /// order-0 stores into plain leaf slots and mark changes, which cannot
    /// move or retype a slot, do not count); otherwise the cursor is reset
    /// so that the next operation walks from the root.
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
    /// xa.store(9, Entry::Value(9)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 9);
    /// xas.load();
    /// xa.store(1 << 40, Entry::Value(1)).unwrap(); // grows the tree
    /// let lock = xa.lock();
    /// assert!(!xas.revalidate(&lock));
    /// ```
    pub fn revalidate(&mut self, lock: &XaLock<'_, T>) -> bool {
        self.check_lock(lock);
        self.is_valid()
    }
}
