//! Lookahead for searches through sparse subtrees: before a search descends
//! into a node whose subtree is small, it walks that subtree breadth-first
//! and asks the CPU to prefetch every header and slot line the search will
//! touch, so the cache misses of the subtree's chains overlap instead of
//! following one another.
//!
//! With random keys over a wide range (say 2^20 keys below 2^40) most
//! entries sit at the bottom of a chain of one-child nodes, and a search
//! pays two dependent misses per node of the chain (the header with the
//! occupancy word, then the slot). Prefetching a whole subtree level by
//! level issues the misses of all its chains at once.
//!
//! Invariants: the lookahead only reads (Acquire slot loads and the
//! occupancy word, under the cursor's guard, like the search itself) and
//! issues prefetch hints; what the search returns does not depend on it. A
//! level wider than [`WIDTH`] slots stops it (such a subtree is dense, and
//! its leaves are read in address order anyway). The subtrees of the next
//! sibling nodes are prefetched together with the one entered, as long as
//! their roots hold at most [`ROOT_WIDTH`] slots between them, so the
//! misses of several subtrees overlap. `XaState::prefetched` records the
//! index range of the last subtrees covered, so the nodes below are not
//! walked again (a cursor moved elsewhere simply falls outside it).

use super::state::XaState;
use crate::item::Item;
use crate::node::{NodeRef, Shared, CHUNK_SHIFT};

/// The most slots the lookahead follows on one level.
const WIDTH: usize = 64;
/// The most subtrees (the one entered and its next siblings) one lookahead
/// prefetches together, and the most slots their roots may hold between
/// them: the misses of several subtrees overlap, with room for them to
/// widen below.
const ROOTS: usize = 8;
const ROOT_WIDTH: usize = 32;

impl<'a, T: Item> XaState<'a, T> {
    /// Called by a search that just descended from `parent` into `node`,
    /// the child in slot `offset` (the cursor's index on the child's first
    /// index): prefetch the child's subtree and those of the next sibling
    /// nodes, unless the previous lookahead covered them or they are too
    /// wide.
    #[inline]
    pub(crate) fn look_ahead(
        &mut self,
        parent: NodeRef<'a, Shared>,
        offset: usize,
        node: NodeRef<'a, Shared>,
    ) {
        if node.shift == 0 || self.prefetched.contains(&self.index) {
            return;
        }
        let covered = self.prefetch_subtrees(parent, offset, node);
        if covered > 0 {
            // `covered` consecutive children from `offset` on, each spanning
            // 2^(shift + CHUNK_SHIFT) indices.
            let span_shift = u32::from(node.shift) + CHUNK_SHIFT;
            let end = (covered as u64)
                .checked_shl(span_shift)
                .and_then(|span| self.index.checked_add(span))
                .unwrap_or(u64::MAX);
            self.prefetched = self.index..end;
        }
    }

    /// Breadth-first prefetch of the subtrees under `node` and the sibling
    /// nodes right after it in `parent`; returns how many consecutive
    /// subtrees were covered (0 when even `node`'s was too wide).
    #[cold]
    fn prefetch_subtrees(
        &self,
        parent: NodeRef<'a, Shared>,
        offset: usize,
        node: NodeRef<'a, Shared>,
    ) -> usize {
        // The roots: `node`, then the next non-empty slots of `parent` as
        // long as they hold nodes (a gap in coverage would be wrong).
        let mut roots = [node; ROOTS];
        let mut r = 1;
        let mut occ = parent.occupied() & (u64::MAX << offset) & !(1u64 << offset);
        while occ != 0 && r < ROOTS {
            let off = occ.trailing_zeros() as usize;
            occ &= occ - 1;
            if off != offset + r {
                break; // an empty slot between: stop at the gap
            }
            let e = parent.slot(off);
            if !e.is_node() {
                break;
            }
            // SAFETY: a node entry read from a slot of this tree's node under
            // the cursor's guard (state.rs inv. 1).
            let child = unsafe { self.node_of(e) };
            child.prefetch_header();
            roots[r] = child;
            r += 1;
        }
        // Keep the roots whose slots fit in ROOT_WIDTH together.
        let mut level: [Option<NodeRef<'a, Shared>>; WIDTH] = [None; WIDTH];
        let mut nodes = 0;
        let mut width = 0;
        for &root in &roots[..r] {
            width += root.occupied().count_ones() as usize;
            if width > ROOT_WIDTH {
                break;
            }
            level[nodes] = Some(root);
            nodes += 1;
        }
        if nodes == 0 {
            return 0;
        }
        if self.prefetch_levels(&mut level, nodes) {
            nodes
        } else {
            0
        }
    }

    /// Prefetch level by level below `level[..nodes]` (nodes of one
    /// height); false when a level has more than [`WIDTH`] occupied slots
    /// (then nothing below it was prefetched).
    fn prefetch_levels(
        &self,
        level: &mut [Option<NodeRef<'a, Shared>>; WIDTH],
        mut nodes: usize,
    ) -> bool {
        loop {
            // The slots of this level (index into `level`, offset): prefetch
            // their lines.
            let mut slots = [(0u8, 0u8); WIDTH];
            let mut n = 0;
            let mut leaves = false;
            for (i, node) in level[..nodes].iter().flatten().enumerate() {
                let mut occ = node.occupied();
                if n + occ.count_ones() as usize > WIDTH {
                    return false;
                }
                leaves = node.shift == 0;
                while occ != 0 {
                    let off = occ.trailing_zeros() as usize;
                    occ &= occ - 1;
                    node.prefetch_slot(off);
                    slots[n] = (i as u8, off as u8);
                    n += 1;
                }
            }
            if leaves {
                return true;
            }
            // Their children: prefetch the headers.
            let parents = *level;
            nodes = 0;
            for &(i, off) in &slots[..n] {
                let Some(node) = parents[i as usize] else {
                    continue;
                };
                let e = node.slot(off as usize);
                if e.is_node() {
                    // SAFETY: a node entry read from a slot of this tree's
                    // node under the cursor's guard (state.rs inv. 1).
                    let child = unsafe { self.node_of(e) };
                    child.prefetch_header();
                    level[nodes] = Some(child);
                    nodes += 1;
                }
            }
            if nodes == 0 {
                return true;
            }
        }
    }
}
