//! Folio memory: the buffers that hold folios' bytes, `2^k` pages each
//! (`k` from 0 to 9, 4 KiB to 2 MiB), carved from 2 MiB regions aligned to
//! their size and advised for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`, Linux). A cache's folios then sit in a few
//! huge pages instead of 4 KiB pages scattered through the heap, so a hit
//! on a large cache misses the TLB far less (one entry covers 512 pages;
//! the kernel's page cache, read through `mmap`, pays a page walk per 4 KiB
//! page). Other sizes come from the global allocator.
//!
//! What it owns: per size class, the regions (a side table: region base to
//! its free block indices, its never-used tail and its count of blocks
//! handed out) and the list of regions with a block to give. At most one
//! region per class is kept empty (the spare); a region that empties
//! beyond it is given back to the global allocator at once.
//!
//! Invariants:
//! - a block is handed out at most once until it is freed, and freed with
//!   the length it was allocated with (its class);
//! - a region's `used` counts its blocks handed out; a region lives while
//!   `used > 0` or it is its class's spare;
//! - the class lock is never held while calling the global allocator.
//!
//! Not used under Miri, loom, cargo-fuzz (`cfg(fuzzing)`) or
//! `--cfg kxarray_system_alloc`: there every buffer is its own global
//! allocation, so those tools see each buffer's lifetime.

use core::alloc::Layout;
use core::ptr::NonNull;

const PAGE: usize = 4096;
/// Bytes of a region, and its alignment.
const REGION: usize = 2 << 20;
/// Size classes: `PAGE << k` for `k < CLASSES`.
const CLASSES: usize = 10;

const _: () = assert!(PAGE << (CLASSES - 1) == REGION);

/// A snapshot of the folio memory's regions ([`frame_stats`]).
///
/// ```
/// use kxarray::filemap::{frame_stats, Folio};
///
/// let before = frame_stats();
/// let folio = Folio::new(0, 1).unwrap();
/// folio.fill(b"bytes"); // an 8 KiB buffer, from a region
/// let now = frame_stats();
/// // (No regions where folio memory comes from the global allocator:
/// // Miri, loom, `--cfg kxarray_system_alloc`.)
/// if now.regions > 0 {
///     assert_eq!(now.bytes_in_use, before.bytes_in_use + 8192);
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// 2 MiB regions held (each advised for a transparent huge page).
    pub regions: usize,
    /// Bytes of folio buffers handed out from them.
    pub bytes_in_use: usize,
}

/// The folio memory's regions now.
///
/// ```
/// let s = kxarray::filemap::frame_stats();
/// assert!(s.bytes_in_use <= s.regions * (2 << 20));
/// ```
pub fn frame_stats() -> FrameStats {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    return arena::stats();
    #[cfg(any(miri, loom, fuzzing, kxarray_system_alloc))]
    FrameStats::default()
}

/// The class of a buffer of `len` bytes, if the regions serve it.
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
fn class_of(len: usize) -> Option<usize> {
    if !(PAGE..=REGION).contains(&len) || !len.is_power_of_two() {
        return None;
    }
    Some((len / PAGE).trailing_zeros() as usize)
}

fn system_layout(len: usize) -> Option<Layout> {
    let align = if len >= PAGE { PAGE } else { 64 };
    Layout::from_size_align(len.max(1), align).ok()
}

/// Allocate a buffer of `len` bytes, zeroed if `zero`, page-aligned when
/// `len` is at least a page. `None` if memory is exhausted.
pub(crate) fn alloc(len: usize, zero: bool) -> Option<NonNull<u8>> {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    if let Some(k) = class_of(len) {
        return arena::alloc(k, len, zero);
    }
    let l = system_layout(len)?;
    let p = if zero {
        // SAFETY: `l` has a non-zero size.
        unsafe { std::alloc::alloc_zeroed(l) }
    } else {
        // SAFETY: `l` has a non-zero size.
        unsafe { std::alloc::alloc(l) }
    };
    NonNull::new(p)
}

/// Free a buffer from [`alloc`].
///
/// # Safety
/// - `p` came from [`alloc`] with this `len`, and is freed once;
/// - nothing uses its bytes any more.
pub(crate) unsafe fn free(p: NonNull<u8>, len: usize) {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    if let Some(k) = class_of(len) {
        // SAFETY: forwarded: from `alloc`, so from the arena's class `k`.
        unsafe { arena::free(k, p, len) };
        return;
    }
    let l = system_layout(len).expect("the layout was valid when allocated");
    // SAFETY: allocated by the global allocator with this layout (the
    // contract), freed once.
    unsafe { std::alloc::dealloc(p.as_ptr(), l) };
}

/// The regions (not compiled where every buffer is a global allocation).
#[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
mod arena {
    use super::{FrameStats, REGION};
    use crate::sync::{AtomicUsize, Lock, Ordering};
    #[cfg(not(target_os = "linux"))]
    use core::alloc::Layout;
    use core::ptr::NonNull;
    use std::collections::HashMap;

    const CLASSES: usize = super::CLASSES;

    /// Regions in existence, over every class.
    static REGIONS: AtomicUsize = AtomicUsize::new(0);
    /// Bytes in blocks handed out from regions.
    static IN_USE: AtomicUsize = AtomicUsize::new(0);

    pub(super) fn stats() -> FrameStats {
        FrameStats {
            regions: REGIONS.load(Ordering::Relaxed),
            bytes_in_use: IN_USE.load(Ordering::Relaxed),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn region_layout() -> Layout {
        match Layout::from_size_align(REGION, REGION) {
            Ok(l) => l,
            Err(_) => unreachable!("2 MiB is a valid size and alignment"),
        }
    }

    /// One region's blocks.
    struct Region {
        /// Freed blocks, by index.
        free: Vec<u16>,
        /// Blocks `bump..` were never handed out (and are still zero).
        bump: u16,
        /// Blocks handed out.
        used: u16,
    }

    /// One size class.
    #[derive(Default)]
    struct Class {
        regions: HashMap<usize, Region>,
        /// Bases of regions that may have a block to give (entries may be
        /// stale: checked when used).
        partial: Vec<usize>,
        /// Regions with nothing handed out (at most one).
        empty: usize,
    }

    static POOL: [Lock<Option<Class>>; CLASSES] = [const { Lock::new(None) }; CLASSES];

    impl Class {
        /// A block, and whether it is known to be zero; `None` without one.
        fn take(&mut self, per_region: u16, block: usize) -> Option<(usize, bool)> {
            while let Some(&base) = self.partial.last() {
                let Some(r) = self.regions.get_mut(&base) else {
                    self.partial.pop();
                    continue;
                };
                let (idx, zero) = if let Some(i) = r.free.pop() {
                    (i, false)
                } else if r.bump < per_region {
                    r.bump += 1;
                    (r.bump - 1, true)
                } else {
                    self.partial.pop();
                    continue;
                };
                if r.used == 0 {
                    self.empty -= 1;
                }
                r.used += 1;
                if r.free.is_empty() && r.bump == per_region {
                    self.partial.pop();
                }
                return Some((base + idx as usize * block, zero));
            }
            None
        }

        /// Give back block `addr`; returns a region to release, if it emptied
        /// beyond the spare.
        fn put(&mut self, addr: usize, per_region: u16, block: usize) -> Option<usize> {
            let base = addr & !(REGION - 1);
            let r = self
                .regions
                .get_mut(&base)
                .expect("a block is freed into the region it came from");
            debug_assert!(r.used > 0);
            let was_full = r.free.is_empty() && r.bump == per_region;
            r.free.push(((addr - base) / block) as u16);
            r.used -= 1;
            if was_full {
                self.partial.push(base);
            }
            if r.used > 0 {
                return None;
            }
            if self.empty == 0 {
                self.empty = 1;
                return None;
            }
            self.regions.remove(&base);
            Some(base)
        }
    }

    /// A new region, zero, advised for huge pages before anything touches
    /// it (a page faulted in first would be a 4 KiB page); `None` if the
    /// system refuses. Mapped directly (Linux), so its bytes are known to be
    /// zero and no allocator bookkeeping shares its first huge page.
    #[cfg(target_os = "linux")]
    fn new_region() -> Option<NonNull<u8>> {
        let len = 2 * REGION;
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing: it aliases nothing.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let p = p.cast::<u8>();
        let start = p.expose_provenance();
        let head = ((start + REGION - 1) & !(REGION - 1)) - start;
        let tail = len - head - REGION;
        if head > 0 {
            // SAFETY: the head lies inside the mapping just made, is whole
            // pages (the mapping and 2 MiB are page-aligned), and nothing
            // uses it; the region after it stays mapped.
            unsafe { libc::munmap(p.cast(), head) };
        }
        if tail > 0 {
            // SAFETY: as for the head, at the mapping's end.
            unsafe { libc::munmap(p.wrapping_add(head + REGION).cast(), tail) };
        }
        let region = p.wrapping_add(head);
        // SAFETY: the region is ours and mapped; MADV_HUGEPAGE only changes
        // how the kernel backs it, never its contents. A refusal (no THP
        // support) changes nothing.
        unsafe { libc::madvise(region.cast(), REGION, libc::MADV_HUGEPAGE) };
        REGIONS.fetch_add(1, Ordering::Relaxed);
        NonNull::new(region)
    }

    /// A new region, zero; `None` if the allocator refuses.
    #[cfg(not(target_os = "linux"))]
    fn new_region() -> Option<NonNull<u8>> {
        // SAFETY: the layout has a non-zero size.
        let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(region_layout()) })?;
        REGIONS.fetch_add(1, Ordering::Relaxed);
        Some(base)
    }

    /// Give a region back.
    ///
    /// # Safety
    /// - `base` came from [`new_region`], is released once, and none of its
    ///   blocks is handed out.
    unsafe fn release_region(base: usize) {
        REGIONS.fetch_sub(1, Ordering::Relaxed);
        let p = core::ptr::with_exposed_provenance_mut::<u8>(base);
        #[cfg(target_os = "linux")]
        // SAFETY: the contract: a mapping of `REGION` bytes no one uses.
        unsafe {
            libc::munmap(p.cast(), REGION);
        }
        #[cfg(not(target_os = "linux"))]
        // SAFETY: the contract: allocated with `region_layout`.
        unsafe {
            std::alloc::dealloc(p, region_layout())
        };
    }

    /// A block of class `k` (`len` bytes).
    pub(super) fn alloc(k: usize, len: usize, zero: bool) -> Option<NonNull<u8>> {
        let per_region = (REGION / len) as u16;
        loop {
            let got = POOL[k]
                .lock()
                .get_or_insert_with(Class::default)
                .take(per_region, len);
            if let Some((addr, fresh)) = got {
                IN_USE.fetch_add(len, Ordering::Relaxed);
                let p = NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(addr))
                    .expect("regions are not at address 0");
                if zero && !fresh {
                    // SAFETY: the block is `len` bytes of a live region, handed
                    // out to us alone.
                    unsafe { p.as_ptr().write_bytes(0, len) };
                }
                return Some(p);
            }
            // No block: a new region, made without the lock.
            let base = new_region()?;
            let mut class = POOL[k].lock();
            let c = class.get_or_insert_with(Class::default);
            c.regions.insert(
                base.as_ptr().expose_provenance(),
                Region {
                    free: Vec::new(),
                    bump: 0,
                    used: 0,
                },
            );
            c.empty += 1;
            c.partial.push(base.as_ptr().expose_provenance());
        }
    }

    /// Free a block of class `k`.
    ///
    /// # Safety
    /// - as [`super::free`], for a block of class `k`.
    pub(super) unsafe fn free(k: usize, p: NonNull<u8>, len: usize) {
        debug_assert!(
            (p.as_ptr() as usize).is_multiple_of(len),
            "blocks are aligned to their size"
        );
        IN_USE.fetch_sub(len, Ordering::Relaxed);
        let released = POOL[k]
            .lock()
            .as_mut()
            .expect("a class that handed out a block exists")
            .put(p.as_ptr().expose_provenance(), (REGION / len) as u16, len);
        if let Some(base) = released {
            // SAFETY: none of its blocks is handed out (it emptied) and it
            // is no longer listed (removed from the class under its lock).
            unsafe { release_region(base) };
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::filemap::frames::{alloc, class_of, frame_stats, free};

        #[test]
        fn blocks_are_aligned_zeroed_distinct_and_regions_go_back() {
            let before = frame_stats();
            let len = 64 << 10; // 32 per region
            let mut blocks = Vec::new();
            for i in 0..100 {
                let p = alloc(len, true).unwrap();
                assert_eq!(p.as_ptr() as usize % len, 0);
                // SAFETY: ours, `len` bytes.
                let b = unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), len) };
                assert!(b.iter().all(|&x| x == 0), "block {i} not zeroed");
                b.fill(i as u8 + 1);
                blocks.push(p);
            }
            for (i, p) in blocks.iter().enumerate() {
                // SAFETY: ours.
                let b = unsafe { core::slice::from_raw_parts(p.as_ptr(), len) };
                assert!(b.iter().all(|&x| x == i as u8 + 1), "blocks overlap");
            }
            assert!(frame_stats().regions >= before.regions + 3);
            // A freed block comes back zeroed when asked.
            // SAFETY: from `alloc` with `len`, freed once.
            unsafe { free(blocks.pop().unwrap(), len) };
            let p = alloc(len, true).unwrap();
            // SAFETY: ours.
            assert!(unsafe { core::slice::from_raw_parts(p.as_ptr(), len) }
                .iter()
                .all(|&x| x == 0));
            blocks.push(p);
            for p in blocks {
                // SAFETY: from `alloc` with `len`, freed once.
                unsafe { free(p, len) };
            }
            // Other tests share the pool, so only this class's invariant can
            // be counted on: the regions our blocks emptied went back but one.
            let class = POOL[class_of(len).unwrap()].lock();
            let empty = class
                .as_ref()
                .unwrap()
                .regions
                .values()
                .filter(|r| r.used == 0);
            assert!(empty.count() <= 1, "emptied regions were given back");
        }

        #[test]
        fn odd_sizes_use_the_global_allocator() {
            for len in [1, 100, 4095, 4096 * 3, 4 << 20] {
                assert!(class_of(len).is_none(), "{len}");
                let p = alloc(len, true).unwrap();
                // SAFETY: from `alloc` with `len`.
                unsafe { free(p, len) };
            }
            assert_eq!(class_of(4096), Some(0));
            assert_eq!(class_of(2 << 20), Some(9));
        }
    }
}
