//! Node allocation for one operation: reserved before the tree is touched, so a
//! failed allocation leaves the array unchanged; split nodes are tagged with the
//! entry and order they were made for.

use super::state::{dispose_item, Prealloc, XaState};
use crate::entry::RawEntry;
use crate::error::Error;
use crate::item::Item;
use crate::node::{Dying, Locked, Node, NodeBox, NodeRef, Writer};

impl<'a, T: Item> XaState<'a, T> {
    /// Make sure `need` blank nodes are at hand, allocating the rest now.
    /// On failure sets `Error::NoMemory`, remembers `need`, and allocates
    /// nothing.
    pub(crate) fn reserve(&mut self, need: usize) -> bool {
        if self.pre.as_ref().map_or(0, |p| p.alloc.len()) >= need {
            return true;
        }
        let pre = self.pre();
        while pre.alloc.len() < need {
            match Node::alloc(0, 0, None) {
                Some(n) => pre.alloc.push(n),
                None => {
                    pre.need = need;
                    self.set_err(Error::NoMemory);
                    return false;
                }
            }
        }
        true
    }

    /// The cursor's reserve, created on first use.
    pub(crate) fn pre(&mut self) -> &mut Prealloc {
        self.pre.get_or_insert_with(Box::default)
    }

    /// Forget (and free) any split preallocation.
    pub(crate) fn clear_split(&mut self) {
        if let Some(p) = self.pre.as_mut() {
            p.split_nodes.clear();
            p.split_for = None;
            p.split_partial = false;
        }
    }

    /// What the split preallocation was made for: (entry, order, partial).
    pub(crate) fn split_tag(&self) -> Option<(RawEntry, u32, bool)> {
        let p = self.pre.as_ref()?;
        p.split_for.map(|(e, o)| (e, o, p.split_partial))
    }

    pub(crate) fn set_split_tag(&mut self, entry: RawEntry, order: u32, partial: bool) {
        let p = self.pre();
        p.split_for = Some((entry, order));
        p.split_partial = partial;
    }

    pub(crate) fn push_split_node(&mut self, n: NodeBox) {
        self.pre().split_nodes.push(n);
    }

    pub(crate) fn pop_split_node(&mut self) -> NodeBox {
        self.pre
            .as_mut()
            .and_then(|p| p.split_nodes.pop())
            .expect("kxarray: split node preallocated")
    }

    /// Link a reserved node as a child of `parent` at `offset` (not yet
    /// published): returns its write handle.
    pub(crate) fn take_node<'l>(
        &mut self,
        w: Writer<'l>,
        shift: u32,
        parent: Option<NodeRef<'l, Locked>>,
        offset: usize,
    ) -> NodeRef<'l, Locked> {
        let mut nb = self
            .pre
            .as_mut()
            .and_then(|p| p.alloc.pop())
            .expect("kxarray: node reserved before use");
        nb.place(shift as u8, offset as u8, parent.map(NodeRef::as_ptr));
        if let Some(p) = parent {
            p.add_count(1);
        }
        self.xa.node_added();
        // SAFETY: the node now belongs to this tree (the caller links it
        // before the lock `w` witnesses is released); freed only through
        // the epoch.
        unsafe { self.nmut(nb.into_raw(), w) }
    }

    /// Free a node unlinked from the tree once no reader can see it.
    pub(crate) fn free_node(&mut self, node: Dying<'_>) {
        self.xa.node_removed();
        node.retire(self.guard);
    }

    /// Drop a displaced item once no reader can see it.
    ///
    /// # Safety
    ///
    /// - `e` was just unlinked from this cursor's array (no slot and not
    ///   the head holds it any more), and this is its only disposal.
    pub(crate) unsafe fn dispose(&self, e: RawEntry) {
        if e.is_item() {
            // SAFETY: forwarded from this function's contract.
            unsafe { dispose_item::<T>(self.guard, e, self.xa.light_items()) };
        }
    }
}
