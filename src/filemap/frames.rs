//! Folio frames: the buffers that hold folios' bytes (`2^k` pages each, `k`
//! from 0 to 9, 4 KiB to 2 MiB, carved from the huge-page [`regions`](super::regions)),
//! each with its header ([`Frame`]: a reference count, the length, the
//! bytes' address), and their recycling: a frame whose folio was evicted or
//! truncated goes back, header and bytes together, to a free list of its
//! size class and is handed to the next miss as it is. Its bytes are not
//! zeroed (the miss fills them from the backend and zeroes only what lies
//! past the end of the file), its memory is not faulted in again and no
//! allocator runs: the kernel's per-CPU free page lists, which never zero a
//! page-cache page about to be filled from disk.
//!
//! What it owns:
//! - per thread, a magazine per class (up to [`mag_cap`] frames, at most
//!   128 KiB of them per class, at least one), so most takes and gives touch
//!   no lock and no shared line;
//! - per class, a shared list of free frames behind one lock, which
//!   magazines refill from and spill into half a magazine at a time;
//! - the retain limit: the sum of the live caches' capacities
//!   ([`retain`]). Free frames are kept while every frame held (in use or
//!   free) stays within the limit plus its [`headroom`] (an eighth of the
//!   limit, from [`SLACK`] to [`HEADROOM_MAX`]), and never fewer than
//!   [`SLACK`] of them: a cache missing at its capacity holds more than
//!   its capacity in use for a moment (its readahead in flight, evicted
//!   folios waiting for their grace period, the background reclaimer's
//!   gap: 3 MiB over 64 MiB when reading sequentially), and the frames
//!   that come back when it falls under again are the ones its next
//!   misses take, so releasing them there made every miss after the first
//!   pass fault its memory in again (40 minor faults per MiB
//!   read at 64 MiB). Beyond that, free frames are released in batches
//!   of at least [`RELEASE_BATCH`]:
//!   `MADV_DONTNEED` over runs of adjacent frames (their memory goes back
//!   to the system at once and reads as zero next time), then their blocks
//!   go back to their regions, which are unmapped when they empty beyond
//!   one spare per class. [`trim_frames`] releases every free frame the
//!   shared lists and the calling thread's magazines hold;
//! - the prefaulter: a thread, made when a cache first grows, that keeps
//!   two regions of 4 KiB frames faulted in ahead of need while every
//!   frame and ready region stays within the retain limit (ready regions
//!   count as free frames and are released first).
//!
//! Invariants:
//! - a frame is in exactly one place: handed out (a folio's buffer, a pin's,
//!   or retired and waiting for its grace period), a magazine, or a shared
//!   list; its header's `len` and `data` never change while it exists;
//! - a frame handed out with `zeroed == true` holds only zero bytes (carved
//!   from a region, whose free blocks are zero); otherwise its bytes are
//!   stale (a former folio's), and the taker must write every byte a
//!   reader may see;
//! - `IN_USE` counts the bytes of pool frames handed out, `HELD` the bytes
//!   of pool frames in existence (handed out or free), so `HELD - IN_USE`
//!   are the free frames' bytes;
//! - no lock of this module is held while mapping, advising or unmapping
//!   memory or calling the global allocator.
//!
//! Not used under Miri, loom, cargo-fuzz (`cfg(fuzzing)`) or
//! `--cfg kxarray_system_alloc`: there every frame is two global
//! allocations (the header and zeroed bytes), freed when given back, so
//! those tools see each buffer's lifetime. Other sizes (under a page, not a
//! power of two, over 2 MiB) always are.

use crate::sync::{AtomicBool, AtomicUsize};
use core::alloc::Layout;
use core::ptr::NonNull;

const PAGE: usize = 4096;
/// Bytes of a region, and its alignment.
const REGION: usize = 2 << 20;
/// Size classes: `PAGE << k` for `k < CLASSES`.
const CLASSES: usize = 10;
/// Free frames kept beyond the retain limit (see the module docs).
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
pub(super) const SLACK: usize = 2 << 20;
/// Most bytes held beyond the retain limit (see [`headroom`]).
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
pub(super) const HEADROOM_MAX: usize = 4 << 20;
/// Fewest bytes of free frames released at once when over the limit.
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
pub(super) const RELEASE_BATCH: usize = 1 << 20;

const _: () = assert!(PAGE << (CLASSES - 1) == REGION);
#[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
const _: () = assert!(
    super::regions::PAGE == PAGE
        && super::regions::REGION == REGION
        && super::regions::CLASSES == CLASSES
);

/// A frame: a folio buffer's header and its bytes (see the module docs).
pub(crate) struct Frame {
    /// The owner's reference plus one per pin (`filemap::mem`'s protocol);
    /// 0 while free.
    pub(super) refs: AtomicUsize,
    /// Whether the bytes are known to be zero (set when carved, cleared
    /// when given back); read and written only by the frame's owner.
    #[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
    zeroed: AtomicBool,
    /// Bytes at `data`; never changes.
    len: usize,
    /// The bytes; never changes.
    data: NonNull<u8>,
}

impl Frame {
    /// Bytes at [`Frame::data`].
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The bytes' address (page-aligned when a page or more).
    #[inline]
    pub(super) fn data(&self) -> NonNull<u8> {
        self.data
    }

    /// A header for `data`, `len` bytes, on the global heap.
    fn boxed(data: NonNull<u8>, len: usize, zeroed: bool) -> NonNull<Frame> {
        NonNull::from(Box::leak(Box::new(Frame {
            refs: AtomicUsize::new(0),
            zeroed: AtomicBool::new(zeroed),
            len,
            data,
        })))
    }
}

/// A snapshot of the folio frames ([`frame_stats`]).
///
/// ```
/// use kxarray::filemap::{frame_stats, Folio};
///
/// let before = frame_stats();
/// let folio = Folio::new(0, 1).unwrap();
/// folio.fill(b"bytes"); // an 8 KiB frame, from a region
/// let now = frame_stats();
/// // (No regions where folio memory comes from the global allocator:
/// // Miri, loom, `--cfg kxarray_system_alloc`. Other threads' frames count
/// // too: these are process-wide figures.)
/// if now.regions > 0 {
///     assert!(now.bytes_in_use >= 8192);
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// 2 MiB regions mapped (each advised for a transparent huge page).
    pub regions: usize,
    /// Bytes of frames handed out (folio buffers, pinned buffers, and
    /// buffers waiting for their grace period).
    pub bytes_in_use: usize,
    /// Bytes of free frames kept for the next misses (in the threads'
    /// magazines and the shared lists): resident memory no folio holds.
    pub bytes_free: usize,
}

/// The folio frames now (process-wide: every cache shares them).
///
/// ```
/// let s = kxarray::filemap::frame_stats();
/// assert!(s.bytes_in_use + s.bytes_free <= s.regions * (2 << 20));
/// ```
pub fn frame_stats() -> FrameStats {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    return pool::stats();
    #[cfg(any(miri, loom, fuzzing, kxarray_system_alloc))]
    FrameStats::default()
}

/// Release every free frame the shared lists and the calling thread's
/// magazines hold: their memory goes back to the system (`MADV_DONTNEED`,
/// and regions left empty are unmapped). Returns the bytes released. Free
/// frames in other threads' magazines (at most 128 KiB per class and
/// thread) stay; so do frames still waiting for a grace period (drive
/// them out first with [`Guard::flush`](crate::Guard::flush)).
///
/// ```
/// use kxarray::filemap::{frame_stats, trim_frames, Folio};
///
/// drop(Folio::new(0, 0).unwrap()); // no buffer yet: nothing to free
/// let released = trim_frames();
/// assert!(released % 4096 == 0);
/// let s = frame_stats();
/// assert!(s.bytes_free <= s.regions * (2 << 20));
/// ```
pub fn trim_frames() -> usize {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    return pool::trim(false);
    #[cfg(any(miri, loom, fuzzing, kxarray_system_alloc))]
    0
}

/// Raise (`grow`) or lower the retain limit by `bytes` (a cache's
/// capacity: made, resized, dropped). Lowering it releases the free frames
/// beyond the new limit at once.
pub(crate) fn retain(bytes: usize, grow: bool) {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    pool::retain(bytes, grow);
    #[cfg(any(miri, loom, fuzzing, kxarray_system_alloc))]
    let _ = (bytes, grow);
}

/// Release the free frames beyond the retain limit plus its [`headroom`]
/// (all but other threads' magazines). Returns the bytes
/// released.
pub(crate) fn trim_to_limit() -> usize {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    return pool::trim(true);
    #[cfg(any(miri, loom, fuzzing, kxarray_system_alloc))]
    0
}

/// Bytes of frame headers (one per frame in existence), for the caches'
/// metadata estimates.
pub(crate) const HEADER_BYTES: usize = core::mem::size_of::<Frame>();

/// The bytes of frames (in use or free) kept beyond a retain limit of
/// `limit` bytes: an eighth of it, at least [`SLACK`], at most
/// [`HEADROOM_MAX`] (within the resident-set allowance of the caches'
/// memory contract: capacity plus metadata plus 8 MiB).
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
pub(super) const fn headroom(limit: usize) -> usize {
    let h = limit / 8;
    if h < SLACK {
        SLACK
    } else if h > HEADROOM_MAX {
        HEADROOM_MAX
    } else {
        h
    }
}

/// The class of a buffer of `len` bytes, if the regions serve it.
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
fn class_of(len: usize) -> Option<usize> {
    if !(PAGE..=REGION).contains(&len) || !len.is_power_of_two() {
        return None;
    }
    Some((len / PAGE).trailing_zeros() as usize)
}

/// Most frames of class `k` a magazine holds: 128 KiB of them, at least
/// one, at most 32.
#[cfg_attr(any(miri, loom, fuzzing, kxarray_system_alloc), allow(dead_code))]
const fn mag_cap(k: usize) -> usize {
    let n = (128 << 10) / (PAGE << k);
    if n == 0 {
        1
    } else if n > 32 {
        32
    } else {
        n
    }
}

fn system_layout(len: usize) -> Option<Layout> {
    let align = if len >= PAGE { PAGE } else { 64 };
    Layout::from_size_align(len.max(1), align).ok()
}

/// A frame of `len` bytes, page-aligned when `len` is at least a page,
/// holding no reference yet, and whether its bytes are zero (otherwise
/// stale: see the module invariants). `None` if memory is exhausted.
pub(super) fn take(len: usize) -> Option<(NonNull<Frame>, bool)> {
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    if let Some(k) = class_of(len) {
        return pool::take(k);
    }
    let l = system_layout(len)?;
    // SAFETY: `l` has a non-zero size.
    let data = NonNull::new(unsafe { std::alloc::alloc_zeroed(l) })?;
    Some((Frame::boxed(data, len, true), true))
}

/// Give a frame back: recycled (a class size, outside Miri, loom and
/// `kxarray_system_alloc`) or freed.
///
/// # Safety
/// - `f` came from [`take`] and is given back once;
/// - no one uses it or its bytes any more (its count is zero and every
///   reader that could reach it has finished).
pub(super) unsafe fn give(f: NonNull<Frame>) {
    // SAFETY: a live header (the contract).
    let len = unsafe { f.as_ref() }.len;
    #[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
    if let Some(k) = class_of(len) {
        // SAFETY: forwarded: from `take`, so from the pool's class `k`.
        unsafe { pool::give(k, f) };
        return;
    }
    // SAFETY: a header from `Frame::boxed`, given back once (the contract).
    let h = unsafe { Box::from_raw(f.as_ptr()) };
    let l = system_layout(len).expect("the layout was valid when allocated");
    // SAFETY: allocated by the global allocator with this layout (`take`),
    // freed once.
    unsafe { std::alloc::dealloc(h.data.as_ptr(), l) };
}

/// The recycling pool (not compiled where every frame is a global
/// allocation).
#[cfg(not(any(miri, loom, fuzzing, kxarray_system_alloc)))]
mod pool {
    use super::super::regions;
    use super::{
        class_of, headroom, mag_cap, Frame, FrameStats, CLASSES, PAGE, REGION, RELEASE_BATCH, SLACK,
    };
    use crate::sync::{AtomicUsize, Lock, Ordering};
    use core::cell::RefCell;
    use core::ptr::NonNull;

    /// Bytes of pool frames handed out.
    static IN_USE: AtomicUsize = AtomicUsize::new(0);
    /// Bytes of pool frames in existence.
    static HELD: AtomicUsize = AtomicUsize::new(0);
    /// The retain limit: the live caches' capacities.
    static LIMIT: AtomicUsize = AtomicUsize::new(0);

    pub(super) fn stats() -> FrameStats {
        let held = held();
        let in_use = IN_USE.load(Ordering::Relaxed).min(held);
        FrameStats {
            regions: regions::count(),
            bytes_in_use: in_use,
            bytes_free: held - in_use,
        }
    }

    /// Bytes of frames in existence plus the regions faulted in ahead.
    fn held() -> usize {
        HELD.load(Ordering::Relaxed) + regions::ready_count() * REGION
    }

    /// Regions of 4 KiB frames the prefaulter keeps faulted in ahead of a
    /// growing cache: 4 MiB, 1,024 misses' worth.
    const READY_TARGET: usize = 2;

    /// Whether one more region fits under the retain limit, with every
    /// frame and ready region counted.
    fn room_for_a_region() -> bool {
        held() + REGION <= LIMIT.load(Ordering::Relaxed)
    }

    /// The prefaulter: a thread, made on a need a second or more after the
    /// process first carved a 4 KiB frame (a short-lived process, a
    /// one-shot bulk load, never starts one: glibc keeps its single-thread
    /// fast paths while a process has no second thread), that keeps
    /// [`READY_TARGET`] regions of 4 KiB frames faulted in while a cache
    /// grows (the kernel's `kswapd` keeping free pages above a watermark,
    /// in miniature), so that a miss does not wait for the kernel to find,
    /// compact and zero fresh memory (on a machine whose memory is full of
    /// page cache, a huge page's fault reclaims and compacts: 2 to 10 us
    /// per 4 KiB). It never holds more than the retain limit allows. One
    /// per process: a forked child makes its own (the parent's thread does
    /// not exist there).
    static PREFAULTER: crate::sync::Lock<Option<(u64, std::sync::Arc<crate::sync::Event>)>> =
        crate::sync::Lock::new(None);
    /// When this process first carved a 4 KiB frame (milliseconds on the
    /// monotonic clock, plus one; 0: not yet), and its fork generation.
    static FIRST_CARVE: crate::sync::AtomicU64 = crate::sync::AtomicU64::new(0);
    static FIRST_CARVE_GEN: crate::sync::AtomicU64 = crate::sync::AtomicU64::new(0);
    /// How long after the first carve the prefaulter may start.
    const PREFAULT_AFTER_MS: u64 = 1000;

    fn now_ms() -> u64 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
            + 1
    }

    /// Ask the prefaulter for regions if it is short of them and there is
    /// room (a load or two when it is not).
    fn kick_prefaulter() {
        if regions::ready_count() >= READY_TARGET || !room_for_a_region() {
            return;
        }
        let gen = crate::fork::generation();
        let now = now_ms();
        if FIRST_CARVE_GEN.load(Ordering::Relaxed) != gen {
            FIRST_CARVE.store(now, Ordering::Relaxed);
            FIRST_CARVE_GEN.store(gen, Ordering::Relaxed);
            return;
        }
        if now.saturating_sub(FIRST_CARVE.load(Ordering::Relaxed)) < PREFAULT_AFTER_MS {
            return;
        }
        let Some(mut slot) = PREFAULTER.try_lock() else {
            return;
        };
        if slot.as_ref().is_none_or(|(g, _)| *g != gen) {
            // An inherited one is the parent's: its thread is not here.
            std::mem::forget(slot.take());
            let ev = std::sync::Arc::new(crate::sync::Event::new());
            let theirs = std::sync::Arc::clone(&ev);
            let spawned = std::thread::Builder::new()
                .name("kxarray-frames".into())
                .spawn(move || loop {
                    theirs.wait_timeout(std::time::Duration::from_secs(1));
                    theirs.take();
                    while regions::ready_count() < READY_TARGET && room_for_a_region() {
                        if !regions::prefault() {
                            break;
                        }
                    }
                });
            // Without a thread misses fault their own memory in; it is
            // not tried again in this process.
            let _ = spawned;
            *slot = Some((gen, ev));
        }
        if let Some((_, ev)) = slot.as_ref() {
            ev.kick();
        }
    }

    /// A frame pointer that may sit in a shared list.
    struct Free(NonNull<Frame>);
    // SAFETY: a free frame belongs to the list that holds it; whoever takes
    // it out owns it, on whatever thread.
    unsafe impl Send for Free {}

    static SHARED: [Lock<Vec<Free>>; CLASSES] = [const { Lock::new(Vec::new()) }; CLASSES];

    const MAG: usize = mag_cap(0);

    /// One class's magazine: free frames in a fixed array.
    struct Mag {
        len: usize,
        slots: [*mut Frame; MAG],
    }

    impl Mag {
        const EMPTY: Mag = Mag {
            len: 0,
            slots: [core::ptr::null_mut(); MAG],
        };
        #[inline]
        fn pop(&mut self) -> Option<NonNull<Frame>> {
            self.len = self.len.checked_sub(1)?;
            NonNull::new(self.slots[self.len])
        }
        #[inline]
        fn push(&mut self, f: NonNull<Frame>) {
            self.slots[self.len] = f.as_ptr();
            self.len += 1;
        }
    }

    /// A thread's magazines; given back to the shared lists when it exits.
    struct Mags(RefCell<[Mag; CLASSES]>);

    impl Drop for Mags {
        fn drop(&mut self) {
            for (k, m) in self.0.get_mut().iter_mut().enumerate() {
                spill(k, m, 0);
            }
        }
    }

    std::thread_local! {
        static MAGS: Mags = const { Mags(RefCell::new([Mag::EMPTY; CLASSES])) };
    }

    /// The bytes of free frames (and ready regions) beyond what the limit
    /// allows: those that take every frame held past the limit plus its
    /// headroom, but never the last [`SLACK`] of them.
    fn excess() -> usize {
        let held = held();
        let in_use = IN_USE.load(Ordering::Relaxed).min(held);
        let limit = LIMIT.load(Ordering::Relaxed);
        let allowed = limit
            .saturating_add(headroom(limit))
            .saturating_sub(in_use)
            .max(SLACK);
        (held - in_use).saturating_sub(allowed)
    }

    /// Move the frames of `m` from `keep` on into class `k`'s shared list,
    /// then release what is over the limit.
    fn spill(k: usize, m: &mut Mag, keep: usize) {
        {
            let mut shared = SHARED[k].lock();
            for &p in &m.slots[keep..m.len] {
                if let Some(p) = NonNull::new(p) {
                    shared.push(Free(p));
                }
            }
        }
        m.len = keep.min(m.len);
        if excess() >= RELEASE_BATCH {
            trim(true);
        }
    }

    /// Release up to `bytes` of class `k`'s shared free frames, the oldest
    /// first. Returns the bytes released.
    fn release_from(k: usize, bytes: usize) -> usize {
        let len = PAGE << k;
        let n = bytes.div_ceil(len);
        let frames: Vec<Free> = {
            let mut shared = SHARED[k].lock();
            let n = n.min(shared.len());
            shared.drain(..n).collect()
        };
        release(k, frames)
    }

    /// Release free frames of class `k`: headers freed, bytes discarded,
    /// blocks back to their regions.
    fn release(k: usize, frames: Vec<Free>) -> usize {
        if frames.is_empty() {
            return 0;
        }
        let len = PAGE << k;
        let mut blocks: Vec<NonNull<u8>> = frames
            .into_iter()
            .map(|Free(f)| {
                // SAFETY: a free frame's header, owned here (taken off its
                // list), made by `Frame::boxed` and freed once.
                let h = unsafe { Box::from_raw(f.as_ptr()) };
                debug_assert_eq!(h.len, len);
                h.data
            })
            .collect();
        // SAFETY: each block is a frame's bytes, `len` long, of a live
        // region, handed out by it, and no one uses them (free).
        unsafe { regions::discard(&mut blocks, len) };
        // SAFETY: from `carve` for class `k`, given back once, now zero.
        unsafe { regions::give_back(k, &blocks) };
        let bytes = blocks.len() * len;
        HELD.fetch_sub(bytes, Ordering::Relaxed);
        bytes
    }

    pub(super) fn retain(bytes: usize, grow: bool) {
        if grow {
            LIMIT.fetch_add(bytes, Ordering::Relaxed);
        } else {
            let _ = LIMIT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                Some(l.saturating_sub(bytes))
            });
            trim(true);
        }
    }

    /// Release free frames: those over the limit (`to_limit`), or all of
    /// the shared lists and this thread's magazines. Over the limit, the
    /// largest classes go first: a workload whose folio size changed (a
    /// sequential warm-up's 64 KiB folios, then 4 KiB random misses) gives
    /// back the frames it no longer uses, not the ones it recycles.
    pub(super) fn trim(to_limit: bool) -> usize {
        let _ = MAGS.try_with(|m| {
            if let Ok(mut mags) = m.0.try_borrow_mut() {
                for (k, mag) in mags.iter_mut().enumerate() {
                    if !to_limit {
                        spill(k, mag, 0);
                    }
                }
            }
        });
        let mut released = 0;
        if !to_limit || excess() > 0 {
            released += regions::release_ready();
        }
        for k in (0..CLASSES).rev() {
            let want = if to_limit { excess() } else { usize::MAX };
            if want == 0 {
                break;
            }
            released += release_from(k, want);
        }
        released
    }

    /// Refill `m` (empty) with up to half a magazine of class `k`: from the
    /// shared list, else carved from the regions. Returns whether the
    /// frames are zero (carved).
    fn refill(k: usize, m: &mut Mag) -> Option<bool> {
        let want = mag_cap(k).div_ceil(2);
        {
            let mut shared = SHARED[k].lock();
            while m.len < want {
                let Some(Free(f)) = shared.pop() else {
                    break;
                };
                m.push(f);
            }
        }
        if m.len > 0 {
            return Some(false);
        }
        let len = PAGE << k;
        let mut got = 0;
        regions::carve(k, want, &mut |data| {
            m.push(Frame::boxed(data, len, true));
            got += 1;
        });
        if got == 0 {
            return None;
        }
        HELD.fetch_add(got * len, Ordering::Relaxed);
        if k == 0 {
            kick_prefaulter();
        }
        Some(true)
    }

    /// One frame when this thread's magazines cannot be used (re-entered,
    /// or the thread is exiting).
    #[cold]
    fn take_unbuffered(k: usize) -> Option<NonNull<Frame>> {
        if let Some(Free(f)) = SHARED[k].lock().pop() {
            return Some(f);
        }
        let len = PAGE << k;
        let mut one = None;
        regions::carve(k, 1, &mut |data| one = Some(Frame::boxed(data, len, true)));
        if one.is_some() {
            HELD.fetch_add(len, Ordering::Relaxed);
        }
        one
    }

    /// Ask the CPU to fetch the frame this thread's next take of a page
    /// will hand out: its 4 KiB, and the header of the one after it. A
    /// recycled frame is cold (its folio was evicted for being the least
    /// recently used), and a miss writes it whole (the backend's read into
    /// it) and then reads it (the copy out): without the hint both wait on
    /// memory; with it, the lines arrive during the miss before. The
    /// header is fetched a take ahead of the bytes: reading the bytes'
    /// address from a cold header here stalled every miss. A hint: reads
    /// nothing the program sees.
    #[inline]
    fn prefetch_next(m: &Mag) {
        let live = &m.slots[..m.len];
        if let [.., after, _] = live {
            crate::node::prefetch(after.cast_const().cast());
        }
        let Some(&next) = live.last() else {
            return;
        };
        // SAFETY: a free frame in this thread's magazine: its header lives
        // until it leaves the magazine, and no one else touches it.
        let data = unsafe { &*next }.data.as_ptr().cast_const().cast::<i8>();
        for line in (0..PAGE).step_by(64) {
            crate::node::prefetch(data.wrapping_add(line));
        }
    }

    #[inline]
    pub(super) fn take(k: usize) -> Option<(NonNull<Frame>, bool)> {
        let f = MAGS
            .try_with(|m| match m.0.try_borrow_mut() {
                Ok(mut mags) => {
                    let mag = &mut mags[k];
                    let f = match mag.pop() {
                        Some(f) => Some(f),
                        None => {
                            refill(k, mag)?;
                            mag.pop()
                        }
                    };
                    if k == 0 {
                        prefetch_next(mag);
                    }
                    f
                }
                Err(_) => take_unbuffered(k),
            })
            .unwrap_or_else(|_| take_unbuffered(k))?;
        IN_USE.fetch_add(PAGE << k, Ordering::Relaxed);
        // SAFETY: a free frame, now ours alone.
        let h = unsafe { f.as_ref() };
        let zeroed = h.zeroed.load(Ordering::Relaxed);
        debug_assert_eq!(h.refs.load(Ordering::Relaxed), 0);
        Some((f, zeroed))
    }

    /// # Safety
    /// - as [`super::give`], for a frame of class `k`.
    #[inline]
    pub(super) unsafe fn give(k: usize, f: NonNull<Frame>) {
        debug_assert_eq!(
            class_of(
                // SAFETY: live (the contract).
                unsafe { f.as_ref() }.len
            ),
            Some(k)
        );
        // SAFETY: ours again (the contract).
        let h = unsafe { f.as_ref() };
        h.zeroed.store(false, Ordering::Relaxed);
        h.refs.store(0, Ordering::Relaxed);
        IN_USE.fetch_sub(PAGE << k, Ordering::Relaxed);
        let kept = MAGS.try_with(|m| match m.0.try_borrow_mut() {
            Ok(mut mags) => {
                let mag = &mut mags[k];
                if mag.len == mag_cap(k) {
                    spill(k, mag, mag_cap(k) / 2);
                }
                mag.push(f);
                true
            }
            Err(_) => false,
        });
        if kept != Ok(true) {
            SHARED[k].lock().push(Free(f));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{give, take, trim_frames};
        use super::*;

        /// A frame given back is handed out again (this thread's
        /// magazine) with its stale bytes and `zeroed == false`; fresh
        /// frames are zero; trimming releases the free ones.
        #[test]
        fn frames_are_recycled_stale_and_trimmed() {
            let len = 16 << 10;
            let (f, zeroed) = take(len).unwrap();
            // SAFETY: ours.
            let h = unsafe { f.as_ref() };
            // SAFETY: ours, `len` bytes, initialised (zero or a former
            // frame's).
            let b = unsafe { core::slice::from_raw_parts_mut(h.data().as_ptr(), len) };
            if zeroed {
                assert!(b.iter().all(|&x| x == 0));
            }
            b.fill(0xa5);
            let addr = h.data();
            // SAFETY: from `take`, given back once, unused.
            unsafe { give(f) };
            let (g, zeroed) = take(len).unwrap();
            // SAFETY: ours.
            let h = unsafe { g.as_ref() };
            assert_eq!(h.data(), addr, "the magazine hands the same frame back");
            assert!(!zeroed, "a recycled frame is not known zero");
            // SAFETY: ours.
            let b = unsafe { core::slice::from_raw_parts(h.data().as_ptr(), len) };
            assert!(b.iter().all(|&x| x == 0xa5), "not zeroed on the way");
            // SAFETY: from `take`, given back once, unused.
            unsafe { give(g) };
            assert!(stats().bytes_free >= len);
            // Trimming spills this thread's magazine to the shared lists
            // and releases them; a test on another thread may take (or
            // trim) the spilled frame in between. So a few tries, one of
            // which must release at least our frame.
            let mut released = trim_frames();
            for _ in 0..8 {
                if released >= len {
                    break;
                }
                let (g, _) = take(len).unwrap();
                // SAFETY: from `take`, given back once, unused.
                unsafe { give(g) };
                released = trim_frames();
            }
            assert!(released >= len, "released {released}");
        }

        /// Many threads take and give frames of several classes; every
        /// frame handed out is distinct while held, and the counters
        /// balance.
        #[test]
        fn concurrent_takes_and_gives_hand_out_distinct_frames() {
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    std::thread::spawn(move || {
                        let mut held: Vec<(NonNull<Frame>, u8)> = Vec::new();
                        for i in 0..2000usize {
                            let len = PAGE << ((i + t) % 3);
                            let (f, _) = take(len).unwrap();
                            // SAFETY: ours.
                            let h = unsafe { f.as_ref() };
                            let tag = (i % 251) as u8;
                            // SAFETY: ours, `len` bytes.
                            unsafe { h.data().as_ptr().write_bytes(tag, len) };
                            held.push((f, tag));
                            if held.len() > 40 {
                                for (f, tag) in held.drain(..20) {
                                    // SAFETY: ours.
                                    let h = unsafe { f.as_ref() };
                                    // SAFETY: ours, `len` bytes.
                                    let b = unsafe {
                                        core::slice::from_raw_parts(h.data().as_ptr(), h.len())
                                    };
                                    assert!(b.iter().all(|&x| x == tag), "frame shared");
                                    // SAFETY: from `take`, given back once.
                                    unsafe { give(f) };
                                }
                            }
                        }
                        for (f, _) in held {
                            // SAFETY: from `take`, given back once.
                            unsafe { give(f) };
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_sizes_use_the_global_allocator() {
        for len in [1, 100, 4095, 4096 * 3, 4 << 20] {
            assert!(class_of(len).is_none(), "{len}");
            let (f, zeroed) = take(len).unwrap();
            assert!(zeroed);
            // SAFETY: from `take`, given back once.
            unsafe { give(f) };
        }
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(2 << 20), Some(9));
        assert_eq!((mag_cap(0), mag_cap(4), mag_cap(9)), (32, 2, 1));
    }
}
