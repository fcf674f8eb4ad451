//! Node allocation for one operation: reserved before the tree is touched, so a
//! failed allocation leaves the array unchanged; split nodes are tagged with the
//! entry and order they were made for.

use super::state::{dispose_item, Prealloc, SendPtr, XaState};
use crate::entry::RawEntry;
use crate::error::Error;
use crate::item::Item;
use crate::node::{Node, NodeBox};
use core::ptr::NonNull;

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
    /// published).
    pub(crate) fn take_node(
        &mut self,
        shift: u32,
        parent: Option<NonNull<Node>>,
        offset: usize,
    ) -> NonNull<Node> {
        let mut nb = self
            .pre
            .as_mut()
            .and_then(|p| p.alloc.pop())
            .expect("kxarray: node reserved before use");
        {
            let n = nb.node_mut();
            n.shift = shift as u8;
            n.offset = offset as u8;
            n.set_parent(parent);
        }
        if let Some(p) = parent {
            // SAFETY: a node of this tree, read under the guard or lock (or linked by
            // this cursor); nodes are freed only through the epoch (state.rs inv. 1).
            unsafe { self.nref(p) }.add_count(1);
        }
        self.xa.node_added();
        nb.into_raw()
    }

    /// Free a node detached from the tree once no reader can see it.
    pub(crate) fn free_node(&mut self, node: NonNull<Node>) {
        self.xa.node_removed();
        let p = SendPtr(node.cast());
        let free = move || {
            let p = p;
            // SAFETY: the closure holds the last reference to the
            // unreachable node (see below).
            unsafe { Node::free(p.0.cast::<Node>()) };
        };
        // SAFETY: the node is unreachable; `self.guard` is pinned on the
        // default collector (or is the unprotected guard under `&mut
        // XArray`), the one every reader's `Guard` pins, so readers delay the
        // deferred free until they leave; the closure owns the last reference.
        unsafe { self.guard.defer_unchecked(free) }
    }

    /// Drop a displaced item once no reader can see it.
    pub(crate) fn dispose(&self, e: RawEntry) {
        if e.is_item() {
            dispose_item::<T>(self.guard, e);
        }
    }
}
