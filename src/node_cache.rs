//! Introspection of the node cache, where every tree node of every
//! [`XArray`](crate::XArray) in the process comes from (the kernel's
//! `radix_tree_node_cachep` slab; `/proc/slabinfo`).
//!
//! Nodes are carved from 2 MiB regions at a stride of whole cache lines;
//! from the second region on, a region is advised for transparent huge
//! pages (Linux, `madvise(MADV_HUGEPAGE)`), so a large tree's walks miss
//! the TLB less. Each thread keeps up to 64 free nodes; a region whose
//! nodes are all free is given back to the global allocator, except one
//! spare. Under Miri, loom, cargo-fuzz and `--cfg kxarray_system_alloc`
//! each node is its own global allocation instead (so sanitizers see every
//! node's lifetime) and [`stats`] reports no regions.
//!
//! ```
//! use kxarray::{node_cache, Entry, XArray};
//! let before = node_cache::thread_node_balance();
//! let mut xa: XArray<Box<u32>> = XArray::new();
//! for i in 0..10_000 {
//!     xa.replace(i, Entry::Value(i)).unwrap();
//! }
//! assert!(node_cache::thread_node_balance() > before);
//! let s = node_cache::stats();
//! assert!(!s.cached || s.regions >= 1);
//! drop(xa); // through `&mut`/ownership, nodes are freed at once
//! assert_eq!(node_cache::thread_node_balance(), before);
//! ```

/// A snapshot of the node cache ([`stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeCacheStats {
    /// Whether nodes come from the cache in this build (false under Miri,
    /// loom, cargo-fuzz and `--cfg kxarray_system_alloc`).
    pub cached: bool,
    /// Regions held now, over all threads.
    pub regions: usize,
    /// Bytes of one region (2 MiB).
    pub region_bytes: usize,
    /// Bytes a node takes in its region (the node rounded up to whole
    /// cache lines).
    pub node_stride: usize,
}

/// The node cache's state now.
pub fn stats() -> NodeCacheStats {
    #[cfg(not(loom))]
    let (regions, region_bytes, node_stride) = (
        crate::node::cache::regions(),
        crate::node::cache::REGION,
        crate::node::cache::STRIDE,
    );
    // The cache is not built under loom.
    #[cfg(loom)]
    let (regions, region_bytes, node_stride) = (0, 0, 0);
    NodeCacheStats {
        cached: crate::node::CACHED,
        regions,
        region_bytes,
        node_stride,
    }
}

/// Nodes this thread allocated minus the nodes it freed, since it started
/// (negative when it freed nodes other threads allocated, as the epoch's
/// deferred frees may). For leak checks: a code path that runs entirely on
/// one thread and frees what it allocates leaves it unchanged.
pub fn thread_node_balance() -> isize {
    crate::node::thread_balance()
}
