//! Storing and deleting through a cursor (`xas_store`), node bookkeeping, shrinking
//! the tree (`xas_shrink`) and freeing detached subtrees; the allocate-outside-the-lock
//! retry (`xas_nomem`).
//!
//! Invariant: every write publishes with Release stores and replaces detached slots
//! with RETRY so a reader inside a detached node restarts.

use super::lock::XaLock;
use super::state::{PoisonOnUnwind, Pos, XaState};
use crate::entry::RawEntry;
use crate::error::Error;
use crate::item::{Entry, EntryRef, Item};
use crate::mark::Mark;
use crate::node::{Dying, Locked, Node, NodeRef, Writer, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};
use crate::rejected::Rejected;

impl<'a, T: Item> XaState<'a, T> {
    /// `xas_store`. Returns the entry that was at the first slot of the range
    /// (NOT disposed: the caller owns it); every other displaced item and
    /// node is disposed of here.
    pub(crate) fn store_raw(&mut self, w: Writer<'_>, entry: RawEntry) -> RawEntry {
        let bomb = PoisonOnUnwind::arm(self.xa);
        let r = self.store_raw_inner(w, entry);
        bomb.defuse();
        r
    }

    pub(crate) fn store_raw_inner(&mut self, w: Writer<'_>, entry: RawEntry) -> RawEntry {
        let value = entry.is_value();
        let mut first = if !entry.is_null() {
            let allow_root = !entry.is_node() && !entry.is_zero();
            self.create(w, allow_root)
        } else {
            self.load_raw()
        };
        let node = match self.pos {
            // SAFETY: the cursor's node, in this tree under the lock `w`
            // witnesses (state.rs inv. 1).
            Pos::Node(n) => Some(unsafe { self.nmut(n, w) }),
            Pos::Head => None,
            _ => return first,
        };
        if let Some(n) = node {
            if (self.shift) < n.shift {
                self.sibs = 0;
            }
        }
        if first == entry && self.sibs == 0 {
            return first;
        }
        let ret = first;
        let mut next = first;
        let mut offset = self.offset as usize;
        let max = offset + self.sibs as usize;
        if let Some(n) = node {
            if self.sibs != 0 {
                self.squash_marks(n);
            }
        }
        if entry.is_null() {
            self.init_marks_raw(w);
        }
        let mut cur = entry;
        let mut count: i32 = 0;
        let mut values: i32 = 0;
        let mut first_slot = true;
        let mut last_written: usize;
        loop {
            let old = next;
            match node {
                Some(n) => n.set_slot(offset, cur),
                None => self.xa.head.store(cur),
            }
            if !first_slot && old.is_item() {
                // SAFETY: `old` (a sibling slot's own item, not the first
                // slot's, which the caller gets back) was just overwritten:
                // no slot holds it any more; disposed once, here.
                unsafe { self.dispose(old) };
            }
            last_written = offset;
            crate::fault::slot_written();
            if old.is_node() && node.is_none_or(|n| n.shift != 0) {
                // SAFETY: the child was a node of this tree, read from a
                // slot under the lock `w` witnesses.
                let child = unsafe { self.nmut(old.to_node(), w) };
                // SAFETY: the slot that held the child was just overwritten,
                // so nothing in the tree links the subtree any more.
                let dying = unsafe { child.into_dying() };
                self.free_nodes(dying);
                self.xa.bump_seq();
            }
            let Some(n) = node else { break };
            count += next.is_null() as i32 - cur.is_null() as i32;
            values += (!first.is_value()) as i32 - (!value) as i32;
            if !cur.is_null() {
                if offset == max {
                    break;
                }
                if !cur.is_sibling() {
                    cur = RawEntry::sibling(self.offset as usize);
                }
            } else if offset == CHUNK_MASK as usize {
                break;
            }
            offset += 1;
            next = n.slot_locked(offset);
            if !next.is_sibling() {
                if cur.is_null() && offset > max {
                    break;
                }
                first = next;
            }
            first_slot = false;
        }
        // A store into part of a larger entry rewrote only its first slots
        // (`sibs` was cut to the range); its remaining siblings now belong to
        // the new entry, so they change kind with it (`nr_values` counts the
        // siblings of value entries). The kernel leaves this count stale.
        if !cur.is_null() {
            if let Some(n) = node {
                let sib = RawEntry::sibling(self.offset as usize);
                let mut o = offset + 1;
                while o < CHUNK_SIZE && n.slot_locked(o) == sib {
                    values += (!first.is_value()) as i32 - (!value) as i32;
                    o += 1;
                }
            }
        }
        // Erasing a multi-index entry on an allocating array frees its
        // sibling slots too: mark them free, as `init_marks_raw` did the
        // canonical slot (and its ancestors). The kernel's `xas_store` marks
        // only the canonical slot, so `xa_alloc` never again hands out the
        // indices under the old siblings while the node lives (see
        // docs/kernel-differences.md).
        if entry.is_null() && self.xa.track_free() {
            if let Some(n) = node {
                for o in self.offset as usize + 1..=last_written {
                    n.set_mark(o, Mark::FREE);
                }
            }
        }
        self.update_node(w, node, count, values);
        // Every other cursor's position may be stale now (a slot became or
        // stopped being a sibling, a canonical slot moved, a node went):
        // bump after the last write, so a lock-free walk that read the old
        // counter is re-done. This cursor's own position is exact.
        self.xa.bump_seq();
        self.seq = self.xa.seq();
        ret
    }

    pub(crate) fn update_node(
        &mut self,
        w: Writer<'_>,
        node: Option<NodeRef<'_, Locked>>,
        count: i32,
        values: i32,
    ) {
        let Some(n) = node else { return };
        if count != 0 || values != 0 {
            n.add_count(count);
            n.add_nr_values(values);
            if count < 0 {
                self.delete_node(w);
                return;
            }
        }
        // A top node holding only slot 0 whose entry was just replaced (a
        // reserved index 0 that a store has filled) shrinks into the head,
        // as an erase would leave it; a reserved entry stays in its leaf.
        // (Not after an insert into an empty slot: `create_range`'s nodes
        // must stay until the stores that follow it fill them.)
        if count == 0 && n.parent().is_none() && n.count() == 1 {
            let s0 = n.slot_locked(0);
            if !s0.is_null() && !s0.is_zero() {
                self.pos = Pos::Node(self.at(n));
                self.shrink(w);
            }
        }
    }

    /// `xas_delete_node`: free empty nodes upwards, then shrink.
    pub(crate) fn delete_node(&mut self, w: Writer<'_>) {
        let Pos::Node(node) = self.pos else {
            return;
        };
        // SAFETY: the cursor's node, in this tree under the lock `w`
        // witnesses (state.rs inv. 1).
        let mut n = unsafe { self.nmut(node, w) };
        loop {
            if n.count() != 0 {
                break;
            }
            let parent = n.parent_ref();
            self.offset = n.offset;
            match parent {
                None => self.xa.head.store(RawEntry::NULL),
                Some(p) => p.set_slot(self.offset as usize, RawEntry::NULL),
            }
            // SAFETY: the slot (or head) that linked `n` was just cleared, and
            // an empty node links nothing below it.
            self.free_node(unsafe { n.into_dying() });
            self.xa.bump_seq();
            match parent {
                None => {
                    self.pos = Pos::Bounds;
                    self.bounds_at_root = false;
                    return;
                }
                Some(p) => {
                    self.pos = Pos::Node(self.at(p));
                    p.add_count(-1);
                    n = p;
                }
            }
        }
        if n.parent().is_none() {
            self.pos = Pos::Node(self.at(n));
            self.shrink(w);
        }
    }

    /// `xas_shrink`: remove top nodes that only hold slot 0.
    pub(crate) fn shrink(&mut self, w: Writer<'_>) {
        let Pos::Node(node) = self.pos else {
            return;
        };
        let xa = self.xa;
        // SAFETY: the cursor's node, in this tree under the lock `w`
        // witnesses (state.rs inv. 1).
        let mut n = unsafe { self.nmut(node, w) };
        loop {
            if n.count() != 1 {
                break;
            }
            let mut entry = n.slot_locked(0);
            if entry.is_null() {
                break;
            }
            if !entry.is_node() && n.shift != 0 {
                break;
            }
            if xa.zero_busy() {
                entry = entry.zero_to_null();
            }
            self.pos = Pos::Bounds;
            self.bounds_at_root = false;
            xa.head.store(entry);
            if xa.track_free() && !n.get_mark(0, Mark::FREE) {
                xa.mark_clear(Mark::FREE);
            }
            n.set_count(0);
            n.set_nr_values(0);
            if !entry.is_node() {
                n.set_slot(0, RawEntry::RETRY);
            }
            // The new top node forgets its parent before the old top is
            // retired, so no reader climbing from it can reach the old top
            // after its retirement.
            let child = entry.is_node().then(|| {
                // SAFETY: `n`'s only child, now the top node of this tree,
                // under the lock `w` witnesses.
                let c = unsafe { self.nmut(entry.to_node(), w) };
                c.set_parent(None);
                c
            });
            // SAFETY: the head no longer points to `n` (it holds `n`'s only
            // entry now), and `n` was the top node: nothing else links it.
            self.free_node(unsafe { n.into_dying() });
            xa.bump_seq();
            match child {
                Some(c) => n = c,
                None => break,
            }
        }
    }

    /// `xas_free_nodes`: free a detached subtree, leaving RETRY behind for
    /// readers still inside it and disposing of its items.
    pub(crate) fn free_nodes(&mut self, top: Dying<'_>) {
        // Depth first: a node is retired after its last slot; the walk climbs
        // back through `stack`, which owns the handles of the nodes above
        // (so each dying node has exactly one handle, retired once) with the
        // occupancy bits of the slots still to visit. Only non-empty slots
        // are visited (the occupancy word is exact under the lock, and a
        // dying node's slots change only by being poisoned here, which keeps
        // them non-empty): a sparse node costs its header and one slot line.
        const MAX_DEPTH: usize = (u64::BITS / CHUNK_SHIFT) as usize + 1;
        let mut stack: [Option<(Dying<'_>, u64)>; MAX_DEPTH] = [const { None }; MAX_DEPTH];
        let mut depth = 0usize;
        let mut node = top;
        let mut left = node.get().occupied();
        loop {
            if left != 0 {
                let offset = left.trailing_zeros() as usize;
                left &= left - 1;
                if let Some(child) = node.child(offset) {
                    let below = child.get().occupied();
                    stack[depth] = Some((node, left));
                    depth += 1;
                    node = child;
                    left = below;
                    continue;
                }
                let entry = node.get().slot_locked(offset);
                debug_assert!(!entry.is_null(), "occupancy bit of an empty slot");
                node.poison_slot(offset);
                // SAFETY: the subtree is unreachable for new readers and
                // its slot now holds RETRY, so nothing holds the item;
                // each slot is disposed once.
                unsafe { self.dispose(entry) };
                continue;
            }
            node.clear_counts();
            self.free_node(node);
            if depth == 0 {
                return;
            }
            depth -= 1;
            (node, left) = stack[depth].take().expect("kxarray: free_nodes stack");
        }
    }

    /// Store `entry` over the cursor's range (`xas_store`). Returns the entry
    /// previously at the cursor's index, still readable for the cursor's
    /// lifetime (its drop is deferred through the epoch). On failure the entry
    /// comes back in [`Rejected`] and the array is unchanged.
    ///
    /// Storing over part of a larger entry replaces it for all its indices,
    /// keeping its shape; storing `None` erases the whole entry.
    ///
    /// Context: under `lock`, the held lock of the cursor's array.
    ///
    /// # Errors
    ///
    /// [`Error::NoMemory`] (call [`XaState::nomem`] after dropping the lock,
    /// then retry) or [`Error::ValueOutOfRange`]; the entry comes back in the
    /// [`Rejected`], the array is unchanged.
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
    /// let mut xas = XaState::new(&xa, &guard, 3);
    /// assert!(xas.store(&lock, Some(Entry::Value(3))).unwrap().is_none());
    /// assert_eq!(xas.load().and_then(|e| e.value()), Some(3));
    /// ```
    pub fn store(
        &mut self,
        lock: &XaLock<'_, T>,
        entry: Option<Entry<T>>,
    ) -> Result<Option<EntryRef<'a, T>>, Rejected<T>> {
        let w = self.check_lock(lock);
        let raw = match entry {
            None => RawEntry::NULL,
            Some(e) => match e.into_raw() {
                Ok(r) => r,
                Err((err, e)) => return Err(Rejected::new(err, Some(e))),
            },
        };
        let old = self.store_raw(w, raw);
        if let Some(err) = self.error() {
            // SAFETY: `raw` (from `into_raw` above) was never published:
            // `create` failed before any slot was written.
            return Err(unsafe { Rejected::unpublished(err, raw) });
        }
        if !old.is_user() {
            return Ok(None);
        }
        // SAFETY: `store_raw` unlinked `old` (the first slot's entry, which
        // it leaves to the caller); disposed once, here.
        unsafe { self.dispose(old) };
        // SAFETY: disposal is deferred through `self.guard` into the default
        // collector it is pinned on, for 'a.
        Ok(unsafe { EntryRef::from_raw_opt(old) })
    }

    /// The common store, fast: an order-0 item or value into a slot of an
    /// existing leaf. One locked descent, one slot write, the leaf's counts;
    /// marks are untouched (as `xas_store` leaves them for a non-NULL entry).
    /// Returns `None` when the case is not that simple; the cursor is then
    /// either positioned where the descent stopped (so `store_raw` carries on
    /// without another walk) or reset.
    #[inline]
    pub(crate) fn store_fast(&mut self, w: Writer<'_>, entry: RawEntry) -> Option<RawEntry> {
        if self.shift != 0 || self.sibs != 0 || !entry.is_user() || self.pos != Pos::Restart {
            return None;
        }
        let xa = self.xa;
        let head = xa.head.load_locked();
        if !head.is_node() {
            return None;
        }
        // SAFETY: the top node of this tree, under the lock `w` witnesses.
        let mut n = unsafe { self.nmut(head.to_node(), w) };
        let mut shift = n.shift as u32;
        if (self.index >> shift) > CHUNK_MASK {
            return None; // needs expansion: the general path walks
        }
        self.walks += 1;
        self.seq = xa.seq();
        self.bounds_at_root = false;
        loop {
            let off = ((self.index >> shift) & CHUNK_MASK) as usize;
            let e = n.slot_locked(off);
            if shift == 0 {
                self.pos = Pos::Node(self.at(n));
                self.offset = off as u8;
                if e.is_internal() {
                    // sibling, reserved or retry: let store_raw decide
                    if e.is_sibling() {
                        self.pos = Pos::Restart;
                        self.walks -= 1;
                    }
                    return None;
                }
                if off + 1 < CHUNK_SIZE && n.slot_locked(off + 1) == RawEntry::sibling(off) {
                    // the canonical slot of a multi-index entry: its
                    // siblings change kind with it, store_raw accounts them
                    return None;
                }
                n.set_slot(off, entry);
                if e.is_null() {
                    n.add_count(1);
                }
                let dv = entry.is_value() as i32 - e.is_value() as i32;
                if dv != 0 {
                    n.add_nr_values(dv);
                }
                return Some(e);
            }
            if !e.is_node() {
                if e.is_null() {
                    // a missing subtree: create() continues from here
                    self.pos = Pos::Node(self.at(n));
                    self.offset = off as u8;
                } else {
                    // a multi-index entry above the leaves
                    self.pos = Pos::Restart;
                    self.walks -= 1;
                }
                return None;
            }
            // SAFETY: a child node read from a slot of this tree under the
            // lock `w` witnesses.
            n = unsafe { self.nmut(e.to_node(), w) };
            shift -= CHUNK_SHIFT;
        }
    }

    /// Store through an exclusive borrow: the old entry is returned owned.
    pub(crate) fn store_owned(&mut self, w: Writer<'_>, raw: RawEntry) -> Result<RawEntry, Error> {
        if let Some(old) = self.store_fast(w, raw) {
            return Ok(old);
        }
        let old = self.store_raw(w, raw);
        match self.error() {
            Some(e) => Err(e),
            None => Ok(old),
        }
    }

    /// Allocate the nodes the last operation failed for, outside the lock
    /// (`xas_nomem`). Returns true if the caller should retry (the cursor was
    /// reset); false if there was no memory error or allocation failed again.
    ///
    /// Context: call with the lock dropped (it allocates).
    ///
    /// ```
    /// use kxarray::{fault, Entry, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let mut xas = XaState::new(&xa, &guard, 1 << 30);
    /// loop {
    ///     let lock = xa.lock();
    ///     fault::fail_next_allocations(1); // the store under the lock fails once
    ///     let r = xas.store(&lock, Some(Entry::Value(1)));
    ///     drop(lock);
    ///     if r.is_err() && xas.nomem() {
    ///         continue;
    ///     }
    ///     r.unwrap();
    ///     break;
    /// }
    /// assert_eq!(xa.load_value(1 << 30), Some(1));
    /// ```
    pub fn nomem(&mut self) -> bool {
        if self.pos != Pos::Error(Error::NoMemory) {
            if let Some(p) = self.pre.as_mut() {
                p.alloc.clear();
            }
            return false;
        }
        let pre = self.pre();
        let need = pre.need.max(1);
        while pre.alloc.len() < need {
            match Node::alloc(0, 0, None) {
                Some(n) => pre.alloc.push(n),
                None => return false,
            }
        }
        self.pos = Pos::Restart;
        true
    }

    /// Free every node this cursor preallocated (`xas_destroy`).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// xa.store_order(0, 6, Entry::Value(1)).unwrap();
    /// let mut xas = XaState::new(&xa, &guard, 0);
    /// xas.split_alloc(1, 6).unwrap();
    /// xas.destroy();
    /// assert_eq!(xas.preallocated(), 0);
    /// ```
    pub fn destroy(&mut self) {
        self.pre = None;
    }

    /// Nodes preallocated and not yet used (blank plus split nodes).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray, XaState};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// let guard = kxarray::pin();
    /// let xas = XaState::new(&xa, &guard, 0);
    /// assert_eq!(xas.preallocated(), 0);
    /// ```
    pub fn preallocated(&self) -> usize {
        self.pre
            .as_ref()
            .map_or(0, |p| p.alloc.len() + p.split_nodes.len())
    }
}
