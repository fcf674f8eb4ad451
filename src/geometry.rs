//! The tree's geometry: fan-out and mark count, fixed at compile time
//! (64-way nodes, or 8-way under `--cfg kxarray_small_nodes` and loom).

/// log2 of the fan-out: 6 (64-way) normally, 3 (8-way, as the kernel's
/// user-space test harness uses) under `--cfg kxarray_small_nodes` or loom.
#[cfg(not(any(loom, kxarray_small_nodes)))]
pub const CHUNK_SHIFT: u32 = 6;
/// log2 of the fan-out (small-node test configuration).
#[cfg(any(loom, kxarray_small_nodes))]
pub const CHUNK_SHIFT: u32 = 3;
/// Slots per node.
pub const CHUNK_SIZE: usize = 1 << CHUNK_SHIFT;
pub(crate) const CHUNK_MASK: u64 = CHUNK_SIZE as u64 - 1;
pub(crate) const MAX_MARKS: usize = 3;
