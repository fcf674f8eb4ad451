//! Reclaim over the shared frames: one clock for every member, its hand
//! taken in batches, with the workingset's refault test; and the region's
//! capacity, grown and shrunk at run time.
//!
//! Owns frame allocation and eviction.
//!
//! - **The clock.** Frames `[0, capacity)` are swept by one hand, a header
//!   word each member moves on by [`BATCH`] frames with one fetch-add (the
//!   batched sweep proposed for PostgreSQL: a member then walks its batch,
//!   one frame per allocation, without touching a shared line but the
//!   frames'). A free frame is taken
//!   at once; a cached one whose reference bit is set gets a second chance
//!   (the bit is cleared); a dirty or written-back one is passed over (the
//!   flushers write it back first); a clean unreferenced one is evicted. A
//!   frame whose file epoch moved on is evicted whatever its bits (its
//!   dirty bytes belong to a file someone truncated or retired: dropped).
//! - **Eviction** locks the frame, makes its version odd, takes its entry
//!   out of the index and leaves a shadow stamped with the eviction clock
//!   (evictions so far), clears the tag, and hands the frame on locked and
//!   free: the caller fills it.
//! - **The refault test** (`mm/workingset.c`'s, with the clock's one list):
//!   a page missed again whose shadow says it left fewer evictions ago than
//!   the region's capacity would have stayed in a cache of its size with
//!   better luck, so it comes back referenced and survives one more sweep.
//! - **Capacity.** Only frames below [`hdr::BACKED`] have memory allocated
//!   in the file (`fallocate`, so a full tmpfs is an error at a fill, which
//!   then reads past the region, never a `SIGBUS` at a write), and the
//!   clock sweeps only below [`hdr::CAPACITY`] and the backed mark. The
//!   memory is allocated as the frames are first needed, not when the
//!   capacity is set (a region sized for gigabytes holding a small
//!   database costs what it holds): while frames below the capacity were
//!   never used ([`hdr::FRESH`]), a fill takes the next one instead of
//!   evicting, raising the backed mark by [`GROW_FRAMES`] at a time under
//!   the resize lock. Growing the capacity raises the word only;
//!   shrinking lowers the capacity first (no new fill lands above it),
//!   evicts everything above (writing back what is dirty), then punches the
//!   memory out of the file (`FALLOC_FL_PUNCH_HOLE`): it goes back to the
//!   system. The resize lock (a header owner word) serializes resizes; a
//!   resize a dead member left half done is finished by the next.

use super::files::{w as fw, LIVE as FILE_LIVE};
use super::frame::{FrameHeader, Owner, Tag, DIRTY, ERROR, OWNER, VALID, WRITEBACK};
use super::index::fingerprint;
use super::layout::{hdr, BATCH, FILES, PAGE64};
use super::region::Region;
use crate::sync::Ordering;
use std::io;

/// Frames whose memory a fill that finds none allocates at once (2 MiB).
pub(crate) const GROW_FRAMES: u64 = 512;

/// Why the clock found no frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoFrame {
    /// The region has no capacity.
    Empty,
    /// Two sweeps found every frame in use, referenced twice, dirty or
    /// being written back (the count of dirty ones seen).
    Busy(u64),
}

impl Region {
    /// Whether frame `f`'s tag names a file epoch that is no longer its
    /// slot's (the frame holds nothing anyone can find).
    pub(crate) fn stale(&self, tag: Tag) -> bool {
        let s = tag.slot();
        if s >= FILES || tag.file == 0 {
            return true;
        }
        let slot = self.map().file(s);
        slot.get(fw::STATE) != FILE_LIVE || slot.epoch() != tag.epoch()
    }

    /// A free frame, locked by `me`, its tag cleared and its version even:
    /// from the clock, evicting if need be.
    pub(crate) fn alloc_frame(&self, me: Owner) -> Result<u32, NoFrame> {
        let cap = self.hword(hdr::CAPACITY).load(Ordering::Acquire);
        let cap = cap.min(self.map().geo().max_frames);
        if cap == 0 {
            return Err(NoFrame::Empty);
        }
        // A frame never used, while there is one below the capacity.
        if let Some(f) = self.fresh_frame(cap, me) {
            return Ok(f);
        }
        let cap = cap.min(self.hword(hdr::BACKED).load(Ordering::Acquire));
        if cap == 0 {
            return Err(NoFrame::Empty);
        }
        let mut dirty = 0;
        // Two sweeps of the whole clock, a frame at a time from this
        // process's batch, a new batch from the hand when it runs out.
        for _ in 0..2 * cap + BATCH {
            let f = (self
                .local
                .next_hand(|| self.hword(hdr::HAND).fetch_add(BATCH, Ordering::Relaxed))
                % cap) as u32;
            match self.try_take(f, me) {
                Take::Got if self.keep_taken(f, me) => return Ok(f),
                Take::Got => {}
                Take::Dirty => dirty += 1,
                Take::No => {}
            }
        }
        Err(NoFrame::Busy(dirty))
    }

    /// Whether frame `f`, just taken free (its lock held by `me`), may be
    /// used: it lies below the capacity and the backed mark; if not, it is
    /// unlocked, free. A shrink lowers the capacity before it locks and
    /// evicts each frame above, and punches their memory out after: a take
    /// that locked the frame after the shrink passed it sees the lower
    /// capacity here (the lock orders the two) and gives it back, or the
    /// punch would zero a page in use; one before is evicted by the shrink
    /// in turn.
    fn keep_taken(&self, f: u32, me: Owner) -> bool {
        let at = u64::from(f);
        if at < self.hword(hdr::CAPACITY).load(Ordering::Acquire)
            && at < self.hword(hdr::BACKED).load(Ordering::Acquire)
        {
            return true;
        }
        if let Some(h) = self.map().frame(f) {
            h.unlock(me, 0, 0);
        }
        false
    }

    /// The next frame never used below `cap`, locked by `me`, its memory
    /// allocated first; `None` when every frame below `cap` was used, or
    /// the memory cannot be allocated (a full tmpfs).
    fn fresh_frame(&self, cap: u64, me: Owner) -> Option<u32> {
        let fresh = self.hword(hdr::FRESH);
        loop {
            let f = fresh.load(Ordering::Acquire);
            if f >= cap {
                return None;
            }
            if fresh
                .compare_exchange(f, f + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if f >= self.hword(hdr::BACKED).load(Ordering::Acquire) && !self.back_to(f + 1, cap, me)
            {
                // (the frame stays unused: a sweep never reaches it until
                // a later fill backs it)
                fresh.fetch_min(f, Ordering::AcqRel);
                return None;
            }
            // A frame handed out once may be in use by now (a shrink and a
            // grow in between): taken only if free, as the clock does.
            if let Take::Got = self.try_take_free(f as u32, me) {
                return self.keep_taken(f as u32, me).then_some(f as u32);
            }
        }
    }

    /// Raise the backed mark to at least `need` frames (by
    /// [`GROW_FRAMES`], at most `cap`), under the resize lock; whether the
    /// frames below `need` have memory now.
    fn back_to(&self, need: u64, cap: u64, me: Owner) -> bool {
        let lock = self.map().header_u32(hdr::RESIZE);
        if lock
            .compare_exchange(0, me.bits(), Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // a resize or another growth runs: take what it leaves
            let mut b = super::wait::Backoff::new();
            loop {
                if self.hword(hdr::BACKED).load(Ordering::Acquire) >= need {
                    return true;
                }
                if lock
                    .compare_exchange(0, me.bits(), Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
                if !b.spin() {
                    let cur = lock.load(Ordering::Relaxed);
                    super::wait::wait(lock, cur, super::frame::WAIT_TICK);
                    if let Some(o) = Owner::from_bits(lock.load(Ordering::Relaxed)) {
                        self.stuck(o);
                    }
                }
            }
        }
        let _held = ResizeHeld(lock);
        let backed = self.hword(hdr::BACKED).load(Ordering::Acquire);
        let cap_now = self
            .hword(hdr::CAPACITY)
            .load(Ordering::Acquire)
            .min(self.map().geo().max_frames);
        let target = (need.max(backed + GROW_FRAMES))
            .min(cap.max(need))
            .min(cap_now.max(need))
            .min(self.map().geo().max_frames);
        backed >= need || (need <= cap_now && self.allocate(backed, target).is_ok())
    }

    /// Allocate the memory of frames `from..to` in the region's file and
    /// raise the backed mark to `to`; the resize lock held.
    fn allocate(&self, from: u64, to: u64) -> io::Result<()> {
        if to <= from {
            return Ok(());
        }
        let geo = self.map().geo();
        let off = geo.frames_off + from * PAGE64;
        let len = (to - from) * PAGE64;
        // SAFETY: a valid descriptor of the region (ours); fallocate only
        // allocates the file's blocks in the range.
        let r = self.with_fd(|fd| unsafe {
            use std::os::fd::AsRawFd;
            libc::fallocate(fd.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t)
        });
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        self.hword(hdr::BACKED).store(to, Ordering::Release);
        Ok(())
    }

    /// Take frame `f` if it holds nothing (never used, or freed).
    fn try_take_free(&self, f: u32, me: Owner) -> Take {
        let Some(h) = self.map().frame(f) else {
            return Take::No;
        };
        if h.state() & (OWNER | VALID | WRITEBACK) != 0 {
            return Take::No;
        }
        self.try_take(f, me)
    }

    fn try_take(&self, f: u32, me: Owner) -> Take {
        let Some(h) = self.map().frame(f) else {
            return Take::No;
        };
        let st = h.state();
        if st & OWNER != 0 {
            return Take::No;
        }
        if st & VALID == 0 {
            if st & WRITEBACK != 0 {
                return Take::No;
            }
            return match h.try_lock(me) {
                Some(now) if now & (VALID | WRITEBACK) == 0 => {
                    // a free frame; a tag left on it is stale
                    if h.tag() != Tag::NONE {
                        let s = h.begin_change();
                        h.set_tag(Tag::NONE);
                        h.end_change(s);
                    }
                    h.set_flags(me, 0, DIRTY | ERROR);
                    Take::Got
                }
                Some(_) => {
                    h.unlock(me, 0, 0);
                    Take::No
                }
                None => Take::No,
            };
        }
        let tag = h.tag();
        let stale = self.stale(tag);
        if !stale {
            if h.take_ref() {
                return Take::No;
            }
            if st & (DIRTY | WRITEBACK) != 0 {
                return Take::Dirty;
            }
        } else if st & WRITEBACK != 0 {
            return Take::No;
        }
        let Some(now) = h.try_lock(me) else {
            return Take::No;
        };
        let tag = h.tag();
        let stale = self.stale(tag);
        if now & WRITEBACK != 0 || (!stale && now & DIRTY != 0) || now & VALID == 0 {
            h.unlock(me, 0, 0);
            return Take::No;
        }
        self.evict_locked(f, h, me, tag, now, stale);
        Take::Got
    }

    /// Evict frame `f` (locked by `me`, state `now`, tag `tag`): out of the
    /// index with a shadow (unless stale), tag cleared; stays locked.
    ///
    /// `VALID` goes first: an eviction its member dies in is then a frame
    /// recovery frees, never one it takes for a write cut short.
    pub(crate) fn evict_locked(
        &self,
        f: u32,
        h: &FrameHeader,
        me: Owner,
        tag: Tag,
        now: u32,
        stale: bool,
    ) {
        h.set_flags(me, 0, VALID | DIRTY | ERROR);
        if now & DIRTY != 0 && tag.slot() < FILES {
            // stale dirty bytes: the file was truncated or retired
            self.map().file(tag.slot()).dirty_dec();
        }
        let s = h.begin_change();
        let fp = fingerprint(tag.hash());
        let clock = self.hword(hdr::EVICTIONS).fetch_add(1, Ordering::Relaxed);
        {
            let b = self.map().bucket(tag.hash());
            let g = b.lock(me, &mut |o| self.stuck(o));
            if !g.remove(fp, f, (!stale).then_some(clock as u32)) {
                g.remove_frame(f);
            }
        }
        h.set_tag(Tag::NONE);
        h.end_change(s);
        self.hword(hdr::CLOCK_EVICTIONS)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a refault with shadow stamp `stamp` is within the workingset
    /// (it left fewer evictions ago than the capacity).
    pub(crate) fn refault_is_hot(&self, stamp: u32) -> bool {
        let now = self.hword(hdr::EVICTIONS).load(Ordering::Relaxed) as u32;
        let distance = now.wrapping_sub(stamp);
        u64::from(distance) < self.hword(hdr::CAPACITY).load(Ordering::Relaxed)
    }

    /// The region's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.hword(hdr::CAPACITY).load(Ordering::Acquire) * PAGE64
    }

    /// Set the region's capacity to `bytes` (rounded down to frames,
    /// clamped to the region's most). Growing allocates the frames' memory
    /// in the file first; shrinking evicts every frame above the new
    /// capacity and gives its memory back. `writeback` writes a dirty
    /// frame back (the caller's way to reach its file); a frame it cannot
    /// write back stops the shrink above it.
    ///
    /// # Errors
    /// The `fallocate` error when growing (a full tmpfs: the capacity stays
    /// where it was).
    pub(crate) fn resize(
        &self,
        bytes: u64,
        me: Owner,
        writeback: &mut dyn FnMut(u32) -> bool,
    ) -> io::Result<u64> {
        let target = (bytes / PAGE64).min(self.map().geo().max_frames);
        let lock = self.map().header_u32(hdr::RESIZE);
        let mut b = super::wait::Backoff::new();
        while lock
            .compare_exchange(0, me.bits(), Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            if !b.spin() {
                let cur = lock.load(Ordering::Relaxed);
                super::wait::wait(lock, cur, super::frame::WAIT_TICK);
                if let Some(o) = Owner::from_bits(lock.load(Ordering::Relaxed)) {
                    self.stuck(o);
                }
            }
        }
        let _held = ResizeHeld(lock);
        self.resize_locked(target, me, writeback)
    }

    fn resize_locked(
        &self,
        target: u64,
        me: Owner,
        writeback: &mut dyn FnMut(u32) -> bool,
    ) -> io::Result<u64> {
        let cap = self.hword(hdr::CAPACITY).load(Ordering::Acquire);
        let backed = self.hword(hdr::BACKED).load(Ordering::Acquire);
        if target >= cap {
            // The memory comes as frames are first needed (`fresh_frame`).
            self.hword(hdr::CAPACITY).store(target, Ordering::Release);
            return Ok(target);
        }
        // Shrink: nothing new lands above the target from now on.
        self.hword(hdr::CAPACITY).store(target, Ordering::Release);
        self.hword(hdr::FRESH).fetch_min(target, Ordering::AcqRel);
        // Frames above the backed mark never had memory (or had it
        // punched out after their eviction): nothing to evict there, and
        // reading their headers would allocate the metadata's pages (48
        // MiB for a 6 GiB region shrunk to a small one).
        let top = backed.min(self.map().geo().max_frames);
        let mut keep = target;
        for f in (target..top).map(|f| f as u32) {
            let Some(h) = self.map().frame(f) else { break };
            loop {
                let st = h.lock(me, &mut |o| self.stuck(o));
                if st & VALID == 0 && st & WRITEBACK == 0 {
                    h.unlock(me, 0, 0);
                    break;
                }
                if st & WRITEBACK != 0 {
                    h.unlock(me, 0, 0);
                    // (a dead member's is made dirty again by its recovery,
                    // then written back here)
                    self.wait_writeback_end(h, h.state(), me);
                    continue;
                }
                let tag = h.tag();
                let stale = self.stale(tag);
                if st & DIRTY != 0 && !stale {
                    h.unlock(me, 0, 0);
                    if !writeback(f) {
                        keep = u64::from(f) + 1;
                        break;
                    }
                    continue;
                }
                self.evict_locked(f, h, me, tag, st, stale);
                h.unlock(me, 0, 0);
                break;
            }
        }
        if keep > target {
            // a dirty frame that cannot be written back stays: the
            // capacity is what is left above it
            self.hword(hdr::CAPACITY).store(keep, Ordering::Release);
        }
        let geo = self.map().geo();
        if backed > keep {
            let from = geo.frames_off + keep * PAGE64;
            let len = (backed - keep) * PAGE64;
            // SAFETY: a valid descriptor of the region; punching a hole
            // frees the range's memory and leaves the file's size alone.
            let r = self.with_fd(|fd| unsafe {
                use std::os::fd::AsRawFd;
                libc::fallocate(
                    fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    from as libc::off_t,
                    len as libc::off_t,
                )
            });
            if r == 0 {
                self.hword(hdr::BACKED).store(keep, Ordering::Release);
            }
        }
        self.hword(hdr::FRESH)
            .fetch_min(keep.max(target), Ordering::AcqRel);
        Ok(keep)
    }
}

enum Take {
    Got,
    Dirty,
    No,
}

/// The resize lock, held by this thread: released (and its sleepers
/// woken) when dropped, also by a panic's unwinding (a caller that catches
/// it goes on using the region: a lock left naming this member would make
/// its next resize, and every other member's, wait for it forever).
struct ResizeHeld<'a>(&'a crate::sync::AtomicU32);

impl Drop for ResizeHeld<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
        super::wait::wake_all(self.0);
    }
}
