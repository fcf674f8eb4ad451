//! Workingset detection (`mm/workingset.c`): the eviction clock, shadow
//! packing on eviction, the refault-distance test, and the cap on index
//! ranges that hold only shadows.
//!
//! Owns the non-resident age clock and the queue of index ranges (one tree
//! node's span, [`CHUNK_SIZE`] pages) that received shadows.
//!
//! Policy: the clock advances by the pages of every eviction. A refault's
//! distance is `clock - eviction` (modulo the shadow's bits): the number of
//! pages evicted while this one was out. The kernel activates when that
//! distance is at most the active list; a cache that starts cold has no
//! active list, so here a refault activates when the distance fits in the
//! whole cache (the page would have stayed had the cache been that much
//! larger, as ARC's ghost test) and the active list is under its cap. The
//! cap is what keeps a loop larger than the cache from churning the active
//! list: once full, it only changes by second-access promotions, so a loop
//! of 1.25x the capacity keeps the active list's pages resident.
//!
//! Invariants: shadows carry the low [`EVICTION_BITS`] of the clock; the
//! node queue holds each (file, node) at most once (the set mirrors it);
//! shadow-only nodes beyond the cap (1/8 of the capacity in pages, the
//! kernel's `count_shadow_nodes` bound) are dropped oldest first, and a node
//! that still holds a folio is never touched.

use super::inode::FileShared;
use crate::filemap::{AddressSpace, Shadow, ShadowFields, EVICTION_BITS};
use crate::sync::{AtomicU64, AtomicUsize, Lock, Ordering};
use crate::{pin, EntryRef, CHUNK_SHIFT, CHUNK_SIZE};
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Weak;

const EVICTION_MASK: u64 = (1u64 << EVICTION_BITS) - 1;

/// Shadow-only nodes a cache of `capacity_pages` keeps.
fn node_cap(capacity_pages: u64) -> usize {
    (capacity_pages / 8).max(1) as usize
}

/// The set's hasher: its keys (file id, node index) are small integers,
/// which a multiply-rotate mixes well enough; SipHash's protection against
/// chosen keys buys nothing here, and every eviction looks a key up.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Default)]
struct Nodes {
    queue: VecDeque<(u64, u64, Weak<FileShared>)>,
    set: HashSet<(u64, u64), BuildHasherDefault<KeyHasher>>,
}

/// The workingset state of one cache.
pub(crate) struct Workingset {
    clock: AtomicU64,
    nodes: Lock<Nodes>,
    /// Shadow-only nodes kept: an eighth of the capacity in pages.
    node_cap: AtomicUsize,
}

impl Workingset {
    pub(crate) fn new(capacity_pages: u64) -> Self {
        Workingset {
            clock: AtomicU64::new(0),
            nodes: Lock::new(Nodes::default()),
            node_cap: AtomicUsize::new(node_cap(capacity_pages)),
        }
    }

    /// Follow a new capacity (the cap on shadow-only nodes is an eighth of
    /// it; [`Workingset::shrink`] applies it).
    pub(crate) fn set_capacity(&self, capacity_pages: u64) {
        self.node_cap
            .store(node_cap(capacity_pages), Ordering::Relaxed);
    }

    /// Index ranges (tree nodes) remembered as holding shadows, and the
    /// heap bytes their queue and set take (an estimate: capacities times
    /// entry sizes, plus a control byte per set bucket).
    pub(crate) fn queue_bytes(&self) -> usize {
        let n = self.nodes.lock();
        n.queue.capacity() * core::mem::size_of::<(u64, u64, Weak<FileShared>)>()
            + n.set.capacity() * (core::mem::size_of::<(u64, u64)>() + 1)
    }

    /// Advance the clock for an eviction of `pages` and pack the shadow
    /// (`workingset_eviction`).
    pub(crate) fn eviction(&self, pages: u64, workingset: bool) -> Shadow {
        let now = self.clock.fetch_add(pages, Ordering::Relaxed);
        let f = ShadowFields {
            eviction: now & EVICTION_MASK,
            workingset,
            ..Default::default()
        };
        // node 0 always fits in NODE_BITS, so packing cannot fail
        Shadow::pack(f).unwrap_or(Shadow::from_value(0))
    }

    /// The clock now: pages evicted so far.
    #[inline]
    pub(crate) fn clock(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// The refault distance of `shadow`: pages evicted since it was.
    pub(crate) fn refault_distance(&self, shadow: Shadow) -> u64 {
        let now = self.clock.load(Ordering::Relaxed) & EVICTION_MASK;
        now.wrapping_sub(shadow.unpack().eviction) & EVICTION_MASK
    }

    /// Remember that `index` of `file` now holds a shadow.
    pub(crate) fn note_shadow(&self, file_id: u64, file: &Weak<FileShared>, index: u64) {
        let node = index >> CHUNK_SHIFT;
        let mut n = self.nodes.lock();
        if n.set.insert((file_id, node)) {
            n.queue.push_back((file_id, node, file.clone()));
        }
    }

    /// Drop shadow-only nodes beyond the cap; returns how many were dropped.
    pub(crate) fn shrink(&self) -> u64 {
        let mut dropped = 0;
        // Released after the lock (a file's last handle may go here).
        let mut files = Vec::new();
        let mut n = self.nodes.lock();
        let cap = self.node_cap.load(Ordering::Relaxed);
        while n.set.len() > cap {
            let Some((id, node, file)) = n.queue.pop_front() else {
                break;
            };
            n.set.remove(&(id, node));
            let Some(file) = file.upgrade() else {
                continue;
            };
            if drop_shadow_node(&file.mapping, node) {
                dropped += 1;
            }
            files.push(file);
        }
        drop(n);
        drop(files);
        dropped
    }
}

/// Drop every shadow in `node`'s span if it holds no folio.
fn drop_shadow_node(mapping: &AddressSpace, node: u64) -> bool {
    let start = node << CHUNK_SHIFT;
    let end = start + (CHUNK_SIZE as u64 - 1);
    let guard = pin();
    let mut shadows = Vec::new();
    for (i, e) in mapping.pages().range(start..=end, &guard) {
        match e {
            EntryRef::Item(_) => return false,
            EntryRef::Value(_) => shadows.push(i),
        }
    }
    drop(guard);
    let mut any = false;
    for i in shadows {
        any |= mapping.drop_shadow(i);
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_evictions_since() {
        let ws = Workingset::new(64);
        let s = ws.eviction(1, false);
        for _ in 0..10 {
            ws.eviction(1, false);
        }
        assert_eq!(ws.refault_distance(s), 11, "its own eviction counts");
        let big = ws.eviction(16, true);
        assert!(big.unpack().workingset);
        assert_eq!(ws.refault_distance(big), 16);
    }
}
