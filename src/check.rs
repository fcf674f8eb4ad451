//! The invariant checker and the tree dump: [`XArray::check_invariants`] (the
//! kernel's `XA_NODE_BUG_ON` checks, run by tests, the proptest model and fuzzing after
//! every operation) and [`XArray::dump`] (`xa_dump`).
//!
//! Invariants checked: node counts match their slots; marks propagate to parents and
//! to the root flags; no node reachable from the head is empty; the tree is no taller
//! than its largest index needs; every multi-index entry is an aligned power-of-two block.

use crate::engine::array::XArray;
use crate::item::Item;
use crate::mark::Mark;
use crate::node::{Node, NodeRef, Shared, CHUNK_SHIFT, CHUNK_SIZE};
use core::fmt::Write as _;
use core::ptr::NonNull;

impl<T: Item> XArray<T> {
    /// Check the structural invariants; `Err` describes the first violation.
    /// Takes the lock.
    ///
    /// Context: takes the writer lock.
    ///
    /// # Errors
    ///
    /// A description of the first violated invariant (or of the poisoning).
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store_range(0, 1000, Some(1)).unwrap();
    /// xa.check_invariants().unwrap();
    /// ```
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.is_poisoned() {
            return Err("array poisoned by a panic inside a write".into());
        }
        let lock = self.lock();
        let head = self.head.load_locked();
        let guard = lock.guard();
        let mut nodes = 0usize;
        let mut root_marks = [false; 3];
        let mut tall = None;
        if head.is_node() {
            // SAFETY: the top node, read from the head under the lock and its
            // guard: reachable nodes are live while the guard is.
            let t = unsafe { NodeRef::<Shared>::from_entry(head, guard) };
            if t.parent().is_some() {
                return Err("top node has a parent".into());
            }
            let m = check_node(t, None, 0, &mut nodes, self.track_free())?;
            for (i, r) in root_marks.iter_mut().enumerate() {
                *r = m & (1 << i) != 0;
            }
            // Minimal height: a top node that only uses slot 0 would have been
            // shrunk (`xas_shrink`), except a leaf holding a reserved index 0
            // in an array where index 0 is not implicitly busy.
            let s0 = t.slot_locked(0);
            let shrinkable = t.count() == 1 && !s0.is_null() && (s0.is_node() || t.shift == 0);
            let reserved_leaf = t.shift == 0 && s0.is_zero() && !self.zero_busy();
            // Reported last, after the checks below: `store_range`'s
            // pre-create and `split` can leave such a tree, as in the kernel.
            if shrinkable && !reserved_leaf {
                tall = Some(format!(
                    "tree not minimal: top node (shift {}) only holds slot 0",
                    t.shift
                ));
            }
        } else if head.is_internal() && !head.is_zero() {
            return Err(format!("bad head entry {head:?}"));
        }
        if nodes != self.node_count() {
            return Err(format!(
                "node counter {} but {} nodes reachable",
                self.node_count(),
                nodes
            ));
        }
        if head.is_node() {
            for mark in Mark::ALL {
                if self.track_free() && mark == Mark::FREE {
                    continue;
                }
                if root_marks[mark.index()] != self.marked(mark) {
                    return Err(format!(
                        "root flag {mark:?} is {} but subtree says {}",
                        self.marked(mark),
                        root_marks[mark.index()]
                    ));
                }
            }
        } else if head.is_null() {
            for mark in Mark::ALL {
                if !(self.track_free() && mark == Mark::FREE) && self.marked(mark) {
                    return Err(format!("empty array has root flag {mark:?}"));
                }
            }
        }
        drop(lock);
        match tall {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A readable dump of the tree (one line per node and entry).
    ///
    /// Context: takes the writer lock.
    ///
    /// ```
    /// use kxarray::{Entry, Mark, XArray};
    /// let xa: XArray<Box<u32>> = XArray::new();
    /// xa.store(70, Entry::Value(7)).unwrap();
    /// assert!(xa.dump().contains("value(7)"));
    /// ```
    pub fn dump(&self) -> String {
        let lock = self.lock();
        let mut out = String::new();
        let head = self.head.load_locked();
        let _ = writeln!(
            out,
            "xarray flags {:#x} nodes {} head {:?}",
            self.flags(),
            self.node_count(),
            head
        );
        if head.is_node() {
            // SAFETY: the top node, read from the head under the lock and its
            // guard: reachable nodes are live while the guard is.
            let top = unsafe { NodeRef::<Shared>::from_entry(head, lock.guard()) };
            dump_node(&mut out, top, 0, 0);
        }
        out
    }
}

/// Validate a subtree; returns its aggregated marks (bit i = mark i).
pub(crate) fn check_node(
    n: NodeRef<'_, Shared>,
    parent: Option<NonNull<Node>>,
    base: u64,
    nodes: &mut usize,
    track_free: bool,
) -> Result<u8, String> {
    *nodes += 1;
    if n.parent() != parent {
        return Err(format!(
            "node at {base:#x} shift {} has a wrong parent",
            n.shift
        ));
    }
    let mut count = 0u32;
    let mut values = 0u32;
    let mut agg = 0u8;
    let mut canon_is_value = false;
    let mut canon: Option<usize> = None;
    for off in 0..CHUNK_SIZE {
        let e = n.slot_locked(off);
        if e.is_null() {
            // Free-tracking arrays hand out exactly the indices marked
            // free: an empty slot without the mark is an ID lost to alloc.
            if track_free && !n.get_mark(off, Mark::FREE) {
                return Err(format!(
                    "empty slot {off} of node at {base:#x} is not marked free"
                ));
            }
            for mark in Mark::ALL {
                // Free-tracking arrays mark empty slots free.
                if n.get_mark(off, mark) && mark != Mark::FREE {
                    return Err(format!(
                        "empty slot {off} of node at {base:#x} has mark {mark:?}"
                    ));
                }
            }
            canon = None;
            continue;
        }
        count += 1;
        if e.is_sibling() {
            let c = e.to_sibling();
            if canon != Some(c) || c >= off {
                return Err(format!("slot {off} of node at {base:#x}: sibling({c}) does not follow its canonical slot"));
            }
            if canon_is_value {
                values += 1;
            }
            for mark in Mark::ALL {
                if n.get_mark(off, mark) && mark != Mark::FREE {
                    return Err(format!(
                        "sibling slot {off} of node at {base:#x} carries mark {mark:?}"
                    ));
                }
            }
            continue;
        }
        canon = Some(off);
        canon_is_value = e.is_value();
        if e.is_value() {
            values += 1;
        }
        let child_base = base | ((off as u64) << n.shift);
        let slot_marks = n.slot_marks(off);
        if e.is_node() {
            if n.shift == 0 {
                return Err(format!("leaf at {base:#x} holds a node"));
            }
            let c = n.child(off).expect("a node entry in a non-leaf");
            if c.shift as u32 + CHUNK_SHIFT != n.shift as u32 || c.offset as usize != off {
                return Err(format!(
                    "child at slot {off} of node at {base:#x} has shift {} offset {}",
                    c.shift, c.offset
                ));
            }
            if c.count() == 0 {
                return Err(format!("empty node at {child_base:#x}"));
            }
            let m = check_node(c, Some(n.as_ptr()), child_base, nodes, track_free)?;
            for mark in Mark::ALL {
                if mark == Mark::FREE && (slot_marks & 1 != 0 || m & 1 != 0) {
                    // free-tracking arrays: parents may be marked free
                    // conservatively; only check non-FREE marks strictly
                    continue;
                }
                let bit = 1 << mark.index();
                if (m & bit) != (slot_marks & bit) {
                    return Err(format!(
                        "mark {mark:?} at slot {off} of node at {base:#x} is {} but child says {}",
                        slot_marks & bit != 0,
                        m & bit != 0
                    ));
                }
            }
            agg |= slot_marks;
        } else {
            if e.is_retry() {
                return Err(format!("RETRY entry in live node at {base:#x}"));
            }
            agg |= slot_marks;
        }
    }
    if count != n.count() as u32 {
        return Err(format!(
            "node at {base:#x}: count {} but {} slots used",
            n.count(),
            count
        ));
    }
    let occupied = (0..CHUNK_SIZE).fold(0u64, |w, off| {
        w | (u64::from(!n.slot_locked(off).is_null()) << off)
    });
    if occupied != n.occupied() {
        return Err(format!(
            "node at {base:#x}: occupancy word {:#x} but slots used {occupied:#x}",
            n.occupied()
        ));
    }
    if values != n.nr_values() as u32 {
        return Err(format!(
            "node at {base:#x}: nr_values {} but {} value slots",
            n.nr_values(),
            values
        ));
    }
    if count == 0 {
        return Err(format!("empty node at {base:#x}"));
    }
    Ok(agg)
}

pub(crate) fn dump_node(out: &mut String, n: NodeRef<'_, Shared>, base: u64, depth: usize) {
    let _ = writeln!(
        out,
        "{:indent$}node {:#x} shift {} offset {} count {} values {} marks {:#x} {:#x} {:#x}",
        "",
        base,
        n.shift,
        n.offset,
        n.count(),
        n.nr_values(),
        n.marks(Mark::M0),
        n.marks(Mark::M1),
        n.marks(Mark::M2),
        indent = depth * 2
    );
    for off in 0..CHUNK_SIZE {
        let e = n.slot_locked(off);
        if e.is_null() {
            continue;
        }
        let idx = base | ((off as u64) << n.shift);
        if let Some(c) = n.child(off) {
            dump_node(out, c, idx, depth + 1);
        } else {
            let _ = writeln!(
                out,
                "{:indent$}{:#x}: {:?}",
                "",
                idx,
                e,
                indent = depth * 2 + 2
            );
        }
    }
}
