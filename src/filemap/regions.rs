//! The regions folio frames are carved from: 2 MiB of address space each,
//! aligned to its size, cut into blocks of one size class (`PAGE << k`,
//! 4 KiB to 2 MiB). The 4 KiB class's regions, from its second on, are
//! advised for transparent huge pages (`madvise(MADV_HUGEPAGE)`, Linux): a
//! cache of one-page folios (random reads) then sits in a few huge pages
//! instead of 4 KiB pages scattered through the heap, so a hit misses the
//! TLB far less (one entry covers 512 pages), and a growing cache faults
//! 2 MiB at a time. The larger classes are advised from their fourth
//! region on (`HUGE_AFTER`): a huge page is resident whole from its first
//! touch, and with huge pages for every region of every class a 64 MiB
//! cache read sequentially (readahead's 8 to 64 KiB folios) kept about
//! 7 MiB more resident than its frames (partly carved regions of each
//! class); without them a cache of readahead's 64 KiB folios missed the
//! TLB on most hits (4 KiB random hits over 256 MiB 0.69x the build with
//! huge pages everywhere, 0.93x with them from the fourth region).
//!
//! What it owns: the regions of the 4 KiB class faulted in ahead of need
//! ([`prefault`], for the frames' prefaulter thread); per size class, the
//! regions (a side table: region base to
//! its free block indices, its never-used tail and its count of blocks
//! handed out) and the list of regions with a block to give. At most one
//! region per class is kept empty (the spare); a region that empties beyond
//! it is unmapped at once.
//!
//! Invariants:
//! - a block is handed out at most once until it is given back, and given
//!   back to its own class;
//! - every block not handed out is zero: never touched since the region was
//!   mapped, or discarded ([`discard`]: `MADV_DONTNEED`, which also returns
//!   its memory to the system) before it was given back; so a block
//!   [`carve`] hands out is zero, and a region's resident memory is its
//!   handed-out blocks;
//! - a region's `used` counts its blocks handed out; a region lives while
//!   `used > 0` or it is its class's spare;
//! - a class lock is never held while mapping or unmapping a region (it
//!   is held while a region that emptied is discarded whole to become the
//!   spare: an `madvise`, which allocates nothing).
//!
//! Only the frames module (`filemap::frames`) uses it, and only where folio memory does
//! not come from the global allocator (not under Miri, loom, cargo-fuzz or
//! `--cfg kxarray_system_alloc`).

/// Bytes of a page: the smallest block.
pub(super) const PAGE: usize = 4096;
/// Bytes of a region, and its alignment.
pub(super) const REGION: usize = 2 << 20;
/// Size classes: blocks of `PAGE << k` bytes for `k < CLASSES`.
pub(super) const CLASSES: usize = 10;

const _: () = assert!(PAGE << (CLASSES - 1) == REGION);

use crate::sync::{AtomicUsize, Lock, Ordering};
#[cfg(not(target_os = "linux"))]
use core::alloc::Layout;
use core::ptr::NonNull;
use std::collections::HashMap;

/// Regions in existence, over every class.
static REGIONS: AtomicUsize = AtomicUsize::new(0);

/// Regions mapped now.
pub(super) fn count() -> usize {
    REGIONS.load(Ordering::Relaxed)
}

/// Regions of the 4 KiB class mapped and faulted in ahead of need
/// ([`prefault`]), not yet in the class's table.
static READY: Lock<Vec<usize>> = Lock::new(Vec::new());
/// `READY`'s length, readable without the lock.
static READY_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Regions faulted in ahead of need now.
pub(super) fn ready_count() -> usize {
    READY_COUNT.load(Ordering::Relaxed)
}

/// Map a region for the 4 KiB class and fault it in now (its memory
/// allocated and zeroed by the kernel here, on the caller's thread, not on
/// a miss), then keep it for the next [`carve`] that needs a region.
/// Returns false if the system refused.
pub(super) fn prefault() -> bool {
    let Some(base) = new_region(true) else {
        return false;
    };
    for off in (0..REGION).step_by(PAGE) {
        // SAFETY: inside the region just mapped, which no one else knows;
        // writing a zero over a zero keeps it zero (the module invariant).
        unsafe { base.as_ptr().wrapping_add(off).write_volatile(0) };
    }
    READY.lock().push(base.as_ptr().expose_provenance());
    READY_COUNT.fetch_add(1, Ordering::Relaxed);
    true
}

/// A region faulted in ahead of need, if there is one.
fn take_ready() -> Option<usize> {
    let base = READY.lock().pop()?;
    READY_COUNT.fetch_sub(1, Ordering::Relaxed);
    Some(base)
}

/// Unmap the regions faulted in ahead of need; returns their bytes.
pub(super) fn release_ready() -> usize {
    let ready = core::mem::take(&mut *READY.lock());
    READY_COUNT.fetch_sub(ready.len(), Ordering::Relaxed);
    for &base in &ready {
        // SAFETY: from `new_region`, in no class's table, none of its
        // blocks handed out; taken off the ready list, so unmapped once.
        unsafe { unmap_region(base) };
    }
    ready.len() * REGION
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
    /// Blocks given back (zero), by index.
    free: Vec<u16>,
    /// Blocks `bump..` were never handed out (and are zero).
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
    /// A block's address; `None` without one.
    fn take(&mut self, per_region: u16, block: usize) -> Option<usize> {
        while let Some(&base) = self.partial.last() {
            let Some(r) = self.regions.get_mut(&base) else {
                self.partial.pop();
                continue;
            };
            let idx = if let Some(i) = r.free.pop() {
                i
            } else if r.bump < per_region {
                r.bump += 1;
                r.bump - 1
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
            return Some(base + idx as usize * block);
        }
        None
    }

    /// Give back block `addr`; returns a region to unmap, if it emptied
    /// beyond the spare.
    fn put(&mut self, addr: usize, per_region: u16, block: usize) -> Option<usize> {
        let base = addr & !(REGION - 1);
        let r = self
            .regions
            .get_mut(&base)
            .expect("a block is given back to the region it came from");
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
            // The spare: all of it goes back to the system now, the huge
            // page's never-carved tail too (a huge page is resident whole
            // from its first touch), under the class lock so that no block
            // is carved from it meanwhile.
            self.empty = 1;
            #[cfg(target_os = "linux")]
            // SAFETY: the region is mapped and none of its blocks is handed
            // out, so no one uses its bytes; they read as zero afterwards.
            unsafe {
                libc::madvise(
                    core::ptr::with_exposed_provenance_mut::<libc::c_void>(base),
                    REGION,
                    libc::MADV_DONTNEED,
                );
            }
            r.free.clear();
            r.bump = 0;
            return None;
        }
        self.regions.remove(&base);
        Some(base)
    }
}

/// A new region, zero, advised for huge pages before anything touches it
/// (a page faulted in first would be a 4 KiB page); `None` if the system
/// refuses. Mapped directly (Linux), so its bytes are known to be zero and
/// no allocator bookkeeping shares its first huge page.
#[cfg(target_os = "linux")]
fn new_region(huge: bool) -> Option<NonNull<u8>> {
    let len = 2 * REGION;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing: it aliases nothing.
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
        // pages (the mapping and 2 MiB are page-aligned), and nothing uses
        // it; the region after it stays mapped.
        unsafe { libc::munmap(p.cast(), head) };
    }
    if tail > 0 {
        // SAFETY: as for the head, at the mapping's end.
        unsafe { libc::munmap(p.wrapping_add(head + REGION).cast(), tail) };
    }
    let region = p.wrapping_add(head);
    if huge {
        // SAFETY: the region is ours and mapped; MADV_HUGEPAGE only changes
        // how the kernel backs it, never its contents. A refusal (no THP
        // support) changes nothing.
        unsafe { libc::madvise(region.cast(), REGION, libc::MADV_HUGEPAGE) };
    }
    REGIONS.fetch_add(1, Ordering::Relaxed);
    NonNull::new(region)
}

/// A new region, zero; `None` if the allocator refuses.
#[cfg(not(target_os = "linux"))]
fn new_region(_huge: bool) -> Option<NonNull<u8>> {
    // SAFETY: the layout has a non-zero size.
    let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(region_layout()) })?;
    REGIONS.fetch_add(1, Ordering::Relaxed);
    Some(base)
}

/// Unmap a region.
///
/// # Safety
/// - `base` came from [`new_region`], is unmapped once, and none of its
///   blocks is handed out.
unsafe fn unmap_region(base: usize) {
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

/// Regions a class holds before its next ones are advised for huge pages:
/// the 4 KiB class from its second region on, the larger classes from
/// their fourth (a class that big holds at least 6 MiB of frames, and at
/// most its one partly carved region is resident beyond its frames).
const HUGE_AFTER: [usize; 2] = [1, 3];

/// Hand out up to `want` zero blocks of class `k` to `out`, mapping a new
/// region when none has a block; returns how many (0: the system refused
/// memory).
pub(super) fn carve(k: usize, want: usize, out: &mut dyn FnMut(NonNull<u8>)) -> usize {
    let block = PAGE << k;
    let per_region = (REGION / block) as u16;
    loop {
        let mut got = 0;
        let huge;
        {
            let mut class = POOL[k].lock();
            let c = class.get_or_insert_with(Class::default);
            huge = c.regions.len() >= HUGE_AFTER[usize::from(k > 0)];
            while got < want {
                let Some(addr) = c.take(per_region, block) else {
                    break;
                };
                let p = NonNull::new(core::ptr::with_exposed_provenance_mut::<u8>(addr))
                    .expect("regions are not at address 0");
                out(p);
                got += 1;
            }
        }
        if got > 0 {
            return got;
        }
        // No block: a region faulted in ahead (the 4 KiB class), or a new
        // one, mapped without the lock.
        let ready = if k == 0 { take_ready() } else { None };
        let base = match ready {
            Some(base) => base,
            None => match new_region(huge) {
                Some(base) => base.as_ptr().expose_provenance(),
                None => return 0,
            },
        };
        let mut class = POOL[k].lock();
        let c = class.get_or_insert_with(Class::default);
        c.regions.insert(
            base,
            Region {
                free: Vec::new(),
                bump: 0,
                used: 0,
            },
        );
        c.empty += 1;
        c.partial.push(base);
    }
}

/// Return the memory of `blocks` (each `len` bytes, unused) to the system,
/// making them zero: one `MADV_DONTNEED` per run of adjacent blocks (the
/// slice is sorted first). Elsewhere than Linux the bytes are zeroed and
/// the memory stays.
///
/// # Safety
/// - every block is `len` bytes of a live region, handed out, and used by
///   no one (its contents may be discarded).
pub(super) unsafe fn discard(blocks: &mut [NonNull<u8>], len: usize) {
    blocks.sort_unstable();
    let mut i = 0;
    while i < blocks.len() {
        let start = blocks[i];
        let mut end = i + 1;
        while end < blocks.len()
            && blocks[end].as_ptr().addr() == blocks[end - 1].as_ptr().addr() + len
        {
            end += 1;
        }
        let bytes = (end - i) * len;
        #[cfg(target_os = "linux")]
        // SAFETY: `start..start + bytes` is adjacent whole blocks of live
        // mappings no one uses (the contract); MADV_DONTNEED drops their
        // pages, and a private anonymous page reads as zero afterwards.
        unsafe {
            libc::madvise(start.as_ptr().cast(), bytes, libc::MADV_DONTNEED);
        }
        #[cfg(not(target_os = "linux"))]
        // SAFETY: as above; the bytes are ours to write.
        unsafe {
            start.as_ptr().write_bytes(0, bytes)
        };
        i = end;
    }
}

/// Give back blocks of class `k`, unmapping the regions this empties
/// beyond the spare.
///
/// # Safety
/// - every block came from [`carve`] for class `k`, is given back once, is
///   used by no one, and is zero (passed through [`discard`], or never
///   written).
pub(super) unsafe fn give_back(k: usize, blocks: &[NonNull<u8>]) {
    let block = PAGE << k;
    let per_region = (REGION / block) as u16;
    let mut unmap = Vec::new();
    {
        let mut class = POOL[k].lock();
        let c = class
            .as_mut()
            .expect("a class that handed out a block exists");
        for p in blocks {
            debug_assert!(
                p.as_ptr().addr().is_multiple_of(block),
                "blocks are aligned to their size"
            );
            if let Some(base) = c.put(p.as_ptr().expose_provenance(), per_region, block) {
                unmap.push(base);
            }
        }
    }
    for base in unmap {
        // SAFETY: none of its blocks is handed out (it emptied) and it is no
        // longer listed (removed from the class under its lock).
        unsafe { unmap_region(base) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_zero_distinct_and_regions_go_back() {
        let k = 4; // 64 KiB, 32 per region
        let len = PAGE << k;
        let mut blocks = Vec::new();
        while blocks.len() < 100 {
            let got = carve(k, 100 - blocks.len(), &mut |p| blocks.push(p));
            assert!(got > 0);
        }
        for (i, p) in blocks.iter().enumerate() {
            assert_eq!(p.as_ptr() as usize % len, 0);
            // SAFETY: ours, `len` bytes.
            let b = unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), len) };
            assert!(b.iter().all(|&x| x == 0), "block {i} not zero");
            b.fill(i as u8 + 1);
        }
        for (i, p) in blocks.iter().enumerate() {
            // SAFETY: ours.
            let b = unsafe { core::slice::from_raw_parts(p.as_ptr(), len) };
            assert!(b.iter().all(|&x| x == i as u8 + 1), "blocks overlap");
        }
        assert!(count() >= 4);
        // SAFETY: ours, unused from here on.
        unsafe { discard(&mut blocks, len) };
        for p in &blocks {
            // SAFETY: still handed out to us.
            let b = unsafe { core::slice::from_raw_parts(p.as_ptr(), len) };
            assert!(b.iter().all(|&x| x == 0), "discarded blocks read zero");
        }
        // SAFETY: from `carve` for class `k`, given back once, zero.
        unsafe { give_back(k, &blocks) };
        // Other tests share the pool, so only this class's invariant can be
        // counted on: the regions our blocks emptied went back but one.
        let class = POOL[k].lock();
        let empty = class
            .as_ref()
            .unwrap()
            .regions
            .values()
            .filter(|r| r.used == 0);
        assert!(empty.count() <= 1, "emptied regions were unmapped");
    }
}
