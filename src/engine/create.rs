//! Creating the path to the cursor's slot (`xas_create`/`xas_expand`): the tree grows
//! upwards and downwards from nodes reserved beforehand.

use super::state::{max_index, Pos, XaState};
use crate::entry::RawEntry;
use crate::item::Item;
use crate::mark::Mark;
use crate::node::{Locked, NodeRef, Writer, CHUNK_MASK, CHUNK_SHIFT, CHUNK_SIZE};

impl<'a, T: Item> XaState<'a, T> {
    /// `xas_max`: the largest index the cursor's range needs.
    pub(crate) fn max_needed(&self) -> u64 {
        let mut max = self.index;
        if self.shift != 0 || self.sibs != 0 {
            let mask = self.size().wrapping_sub(1);
            max |= mask;
            if mask == max {
                max = max.wrapping_add(1);
            }
        }
        max
    }

    /// How many nodes a create from the head needs, counted before any
    /// change: new top levels plus the chain below them.
    pub(crate) fn plan_top(&self, head: RawEntry, allow_root: bool) -> usize {
        let order = self.shift as u32;
        let max = self.max_needed();
        let chain = |top_shift: u32| -> usize {
            // levels top_shift - CHUNK, ..., down to `order`
            if top_shift > order {
                ((top_shift - order) / CHUNK_SHIFT) as usize
            } else {
                0
            }
        };
        if head.is_null() {
            let mut shift = 0;
            if max == 0 {
                return if allow_root { 0 } else { chain(CHUNK_SHIFT) };
            }
            while (max >> shift) >= CHUNK_SIZE as u64 {
                shift += CHUNK_SHIFT;
            }
            return chain(shift + CHUNK_SHIFT);
        }
        // New top levels, as `expand` will add them.
        let mut levels = 0usize;
        // SAFETY: the head of this tree, read under the lock (nodes are freed
        // only through the epoch, state.rs inv. 1).
        let top = head.is_node().then(|| unsafe { self.node_of(head) });
        let mut shift = top.map_or(0, |n| n.shift as u32 + CHUNK_SHIFT);
        let mut cur_max = max_index(top);
        while max > cur_max {
            levels += 1;
            cur_max = ((CHUNK_SIZE as u64) << shift).wrapping_sub(1);
            shift += CHUNK_SHIFT;
        }
        if levels > 0 {
            let top_shift = shift - CHUNK_SHIFT;
            let offset = (self.index >> top_shift) & CHUNK_MASK;
            if offset != 0 {
                return levels + chain(top_shift);
            }
        }
        levels
    }

    /// `xas_expand`: grow the tree until the cursor's range fits. Returns the
    /// shift to descend from (top shift + CHUNK_SHIFT, or 0 for the head).
    /// Nodes must have been reserved by `plan_top`.
    pub(crate) fn expand(&mut self, w: Writer<'_>, mut head: RawEntry) -> u32 {
        let max = self.max_needed();
        let mut shift = 0u32;
        if head.is_null() {
            if max == 0 {
                return 0;
            }
            while (max >> shift) >= CHUNK_SIZE as u64 {
                shift += CHUNK_SHIFT;
            }
            return shift + CHUNK_SHIFT;
        }
        let mut top = head.is_node().then(|| {
            // SAFETY: the head of this tree, read under the lock `w` witnesses.
            unsafe { self.nmut(head.to_node(), w) }
        });
        if let Some(t) = top {
            shift = t.shift as u32 + CHUNK_SHIFT;
        }
        self.pos = Pos::Head;
        let xa = self.xa;
        while max > max_index(top.map(NodeRef::shared)) {
            let n = self.take_node(w, shift, None, 0);
            n.set_count(1);
            if head.is_value() {
                n.set_nr_values(1);
            }
            n.init_slot(0, head);
            for mark in Mark::ALL {
                if xa.track_free() && mark == Mark::FREE {
                    n.mark_all(Mark::FREE);
                    if !xa.marked(Mark::FREE) {
                        n.clear_mark(0, Mark::FREE);
                        xa.mark_set(Mark::FREE);
                    }
                } else if xa.marked(mark) {
                    n.set_mark(0, mark);
                }
            }
            if let Some(t) = top {
                t.set_parent(Some(n.as_ptr()));
            }
            top = Some(n);
            head = RawEntry::node(n.as_ptr());
            xa.head.store(head);
            xa.bump_seq();
            shift += CHUNK_SHIFT;
        }
        shift
    }

    /// `xas_create`: make the slot(s) for the cursor's range exist and return
    /// what is there now. NULL with an error set if allocation failed (in
    /// which case nothing was changed).
    pub(crate) fn create(&mut self, w: Writer<'_>, allow_root: bool) -> RawEntry {
        let order = self.shift as u32;
        let xa = self.xa;
        let mut shift: u32;
        let mut entry: RawEntry;
        let mut parent: Option<NodeRef<'_, Locked>>;
        match self.pos {
            Pos::Restart | Pos::Bounds | Pos::Head => {
                // At the head already (or continuing a root visit that found
                // the index outside the tree): not a new walk.
                let continuing = self.pos == Pos::Head
                    || (self.pos == Pos::Bounds && self.bounds_at_root && self.seq == xa.seq());
                if !continuing {
                    self.walks += 1;
                }
                self.bounds_at_root = false;
                let mut head = xa.head.load_locked();
                // SAFETY: the head of this tree, read under the lock; nodes
                // are freed only through the epoch (state.rs inv. 1).
                let top = head.is_node().then(|| unsafe { self.node_of(head) });
                if top.is_some() && self.max_needed() <= max_index(top) {
                    // The range fits under the current top node: no
                    // expansion to plan (the common case of a store).
                    shift = top.map_or(0, |t| t.shift as u32) + CHUNK_SHIFT;
                } else {
                    if head.is_null() && xa.zero_busy() {
                        head = RawEntry::ZERO;
                    }
                    let need = self.plan_top(head, allow_root);
                    if !self.reserve(need) {
                        return RawEntry::NULL;
                    }
                    self.pos = Pos::Head;
                    shift = self.expand(w, head);
                    if shift == 0 && !allow_root {
                        shift = CHUNK_SHIFT;
                    }
                    head = xa.head.load_locked();
                }
                self.pos = Pos::Head;
                self.seq = xa.seq();
                // A top node made below sits at offset 0, whatever offset a
                // stale position left behind.
                self.offset = 0;
                entry = head;
                parent = None;
            }
            Pos::Error(_) => return RawEntry::NULL,
            Pos::Node(node) => {
                // SAFETY: the cursor's node, in this tree under the lock `w`
                // witnesses (state.rs inv. 1).
                let n = unsafe { self.nmut(node, w) };
                shift = n.shift as u32;
                entry = n.slot_locked(self.offset as usize);
                parent = Some(n);
            }
        }
        while shift > order {
            shift -= CHUNK_SHIFT;
            let node;
            if entry.is_null() {
                let need = ((shift - order) / CHUNK_SHIFT + 1) as usize;
                if !self.reserve(need) {
                    return RawEntry::NULL;
                }
                node = self.take_node(w, shift, parent, self.offset as usize);
                if xa.track_free() {
                    node.mark_all(Mark::FREE);
                }
                match parent {
                    Some(p) => p.set_slot(self.offset as usize, RawEntry::node(node.as_ptr())),
                    None => xa.head.store(RawEntry::node(node.as_ptr())),
                }
                xa.bump_seq();
                self.seq = xa.seq();
            } else if entry.is_node() {
                // SAFETY: a child read from a slot of this tree under the
                // lock `w` witnesses.
                node = unsafe { self.nmut(entry.to_node(), w) };
            } else {
                break;
            }
            entry = self.descend_at(self.at(node), shift);
            parent = Some(node);
        }
        entry
    }
}
