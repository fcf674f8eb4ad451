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
//! its leaves are read in address order anyway). `XaState::prefetched_to`
//! records the end of the last subtree it covered, so the nodes below are
//! not walked again.

use super::state::XaState;
use crate::item::Item;
use crate::node::{NodeRef, Shared, CHUNK_SHIFT};

/// The most slots the lookahead follows on one level.
const WIDTH: usize = 32;

impl<'a, T: Item> XaState<'a, T> {
    /// Called by a search about to scan `node` (a non-leaf node it just
    /// descended into, the cursor's index on the node's first index):
    /// prefetch the node's subtree unless the previous lookahead covered it
    /// or it is too wide.
    #[inline]
    pub(crate) fn look_ahead(&mut self, node: NodeRef<'a, Shared>) {
        if node.shift == 0 || self.index < self.prefetched_to {
            return;
        }
        if self.prefetch_subtree(node) {
            let span_shift = u32::from(node.shift) + CHUNK_SHIFT;
            let last = self.index | ((1u64 << span_shift) - 1);
            self.prefetched_to = last.saturating_add(1);
        }
    }

    /// Breadth-first prefetch of the subtree under `top`; false when a
    /// level has more than [`WIDTH`] occupied slots (then nothing below it
    /// was prefetched).
    #[cold]
    fn prefetch_subtree(&self, top: NodeRef<'a, Shared>) -> bool {
        let mut level = [top; WIDTH];
        let mut nodes = 1;
        loop {
            // The slots of this level: prefetch their lines.
            let mut slots = [(top, 0u8); WIDTH];
            let mut n = 0;
            for &node in &level[..nodes] {
                let mut occ = node.occupied();
                if n + occ.count_ones() as usize > WIDTH {
                    return false;
                }
                while occ != 0 {
                    let off = occ.trailing_zeros() as usize;
                    occ &= occ - 1;
                    node.prefetch_slot(off);
                    slots[n] = (node, off as u8);
                    n += 1;
                }
            }
            if level[0].shift == 0 {
                return true;
            }
            // Their children: prefetch the headers.
            nodes = 0;
            for &(node, off) in &slots[..n] {
                let e = node.slot(off as usize);
                if e.is_node() {
                    // SAFETY: a node entry read from a slot of this tree's
                    // node under the cursor's guard (state.rs inv. 1).
                    let child = unsafe { self.node_of(e) };
                    child.prefetch_header();
                    level[nodes] = child;
                    nodes += 1;
                }
            }
            if nodes == 0 {
                return true;
            }
        }
    }
}
