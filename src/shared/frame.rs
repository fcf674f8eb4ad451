//! A frame's header ([`FrameHeader`]): the state machine every member runs
//! on a frame, in four words of the region.
//!
//! Owns the protocol of one frame:
//!
//! - **`seq`**, a sequence lock over the frame's bytes *and* its tag. Even
//!   while both are stable. Only the holder of the frame's lock changes
//!   either, and only between [`begin_change`](FrameHeader::begin_change)
//!   (odd) and [`end_change`](FrameHeader::end_change) (two higher than
//!   before). A reader copies between two loads of `seq` and keeps the copy
//!   only if both are equal and even, so a hit writes nothing shared.
//! - **`state`**, one 32-bit word: the lock's owner (a member's slot + 1,
//!   0 when free), [`VALID`] (the bytes are the file's), [`DIRTY`],
//!   [`WRITEBACK`] with its owner (writeback runs unlocked, so writers
//!   are never blocked by I/O), [`ERROR`] (the last writeback of these
//!   bytes failed), and [`WAITERS`] (someone sleeps on the word: the
//!   unlocker wakes them). It is the futex word members sleep on.
//! - **`refbit`**, the clock's reference bit: a hit stores 1 when it reads
//!   0 (a plain store, never a read-modify-write: a lost bit costs one
//!   sweep), the clock stores 0.
//! - **the tag** (`file`, `index`): which page of which file the frame
//!   holds. `file` is a file slot and the slot's epoch (`epoch << 16 |
//!   slot`); 0 when the frame holds nothing. A frame whose epoch is not its
//!   slot's current one is stale: no lookup matches it, and the clock
//!   frees it.
//!
//! States (the owner column is the lock):
//!
//! | state | owner | VALID | seq | in the index |
//! |---|---|---|---|---|
//! | free | none | no | even | no |
//! | filling | the filler | no | odd | yes |
//! | cached | none, or a writer, evicter, writeback | yes | even (odd while a writer changes bytes) | yes |
//!
//! A member that dies holds at most the locks it had taken: whoever proves
//! it dead (its liveness lock, `member`) takes them over with
//! [`steal`](FrameHeader::steal) and finishes by the rules of `recover`:
//! a fill never finished frees the frame, a change never finished leaves
//! the bytes as they are and dirty (a write cut short by death, as the
//! kernel's `write` cut short), a writeback never finished is dirty again.
//!
//! Nothing here trusts the words: any value another process stores is a
//! valid `u32`/`u64`, and callers bound every number they take from them.

use super::wait::{self, Backoff};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// The lock owner's bits (a member's slot + 1).
pub(crate) const OWNER: u32 = 0xff;
/// The bytes are the file's.
pub(crate) const VALID: u32 = 1 << 8;
/// The bytes are newer than the file's.
pub(crate) const DIRTY: u32 = 1 << 9;
/// A writeback of the bytes is in flight (its owner in [`WB_OWNER`]).
pub(crate) const WRITEBACK: u32 = 1 << 10;
/// The writeback owner's shift.
pub(crate) const WB_SHIFT: u32 = 11;
/// The writeback owner's bits.
pub(crate) const WB_OWNER: u32 = 0xff << WB_SHIFT;
/// The last writeback of these bytes failed.
pub(crate) const ERROR: u32 = 1 << 19;
/// Someone sleeps on the word.
pub(crate) const WAITERS: u32 = 1 << 31;

/// How long a waiter sleeps before it checks on the owner.
pub(crate) const WAIT_TICK: Duration = Duration::from_millis(5);

/// A member's identity in a lock word: its slot + 1 (never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Owner(u8);

impl Owner {
    /// The owner word of member slot `m` (`m < 255`).
    pub(crate) fn of_slot(m: usize) -> Owner {
        debug_assert!(m < 255);
        Owner(m as u8 + 1)
    }
    /// The owner a lock word names, if any.
    #[inline]
    pub(crate) fn from_bits(bits: u32) -> Option<Owner> {
        let b = (bits & OWNER) as u8;
        (b != 0).then_some(Owner(b))
    }
    /// The member slot.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        usize::from(self.0) - 1
    }
    /// The word's bits.
    #[inline]
    pub(crate) fn bits(self) -> u32 {
        u32::from(self.0)
    }
}

/// Pages of a file whose hashes differ in their low bits only
/// ([`Tag::hash`]): 32 buckets of 128 bytes, one 4 KiB page of the index.
pub(crate) const GROUP: u64 = 32;

/// Which page of which file a frame holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tag {
    /// `epoch << 16 | file slot`; 0 for none.
    pub(crate) file: u64,
    /// The page index in the file.
    pub(crate) index: u64,
}

impl Tag {
    /// No page.
    pub(crate) const NONE: Tag = Tag { file: 0, index: 0 };

    /// The tag of page `index` of file slot `slot` in `epoch`.
    #[inline]
    pub(crate) fn new(slot: usize, epoch: u64, index: u64) -> Tag {
        debug_assert!(slot < 1 << 16 && epoch != 0);
        Tag {
            file: epoch << 16 | slot as u64,
            index,
        }
    }
    /// The file slot.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        (self.file & 0xffff) as usize
    }
    /// The epoch.
    #[inline]
    pub(crate) fn epoch(self) -> u64 {
        self.file >> 16
    }
    /// The lookup hash: a 64-bit mix of the file word and the page's group
    /// of [`GROUP`] pages, whose low bits are the page's place in its group.
    /// So a file's neighbouring pages land in neighbouring buckets (and
    /// hints): a file of N pages touches about N / 32 of the index's 4 KiB
    /// pages, not N (the index is sized for the region's most and lives in
    /// shared memory that a first touch allocates and faults in), and a
    /// scan walks the index in order. Groups spread as pages did: a
    /// bucket's load is as before.
    #[inline]
    pub(crate) fn hash(self) -> u64 {
        let mut h = self.file.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (self.index / GROUP);
        h ^= h >> 32;
        h = h.wrapping_mul(0xd6e8_feb8_6659_fd93);
        h ^= h >> 29;
        // The page's place in its group picks the bucket among 32
        // neighbours (low bits) and moves the fingerprint (bits 33 and
        // up, above any bucket bit), so no two pages of a group share one.
        let low = self.index % GROUP;
        ((h & !(GROUP - 1)) ^ (low.wrapping_mul(0x9e37_79b9_7f4a_7c15) << 33)) | low
    }
}

impl Tag {
    /// Where a process's hints keep the page (`hint`): a file's pages side
    /// by side from a place its file word picks, so the hints of a file of
    /// N pages are N neighbouring entries (4 N bytes of the process's
    /// memory, in N / 1024 pages), not N entries spread over the table.
    #[inline]
    pub(crate) fn hint_key(self) -> u64 {
        (self.file.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 24).wrapping_add(self.index)
    }
}

/// One frame's header: four words in the region (see the module notes).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct FrameHeader {
    seq: AtomicU64,
    state: AtomicU32,
    refbit: AtomicU32,
    file: AtomicU64,
    index: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<FrameHeader>() == super::layout::FRAME_HEADER_BYTES);

/// A frame's lock is held by a member the waiter suspects is dead: the
/// waiter's `stuck` callback decides (and recovers it).
pub(crate) type Stuck<'a> = &'a mut dyn FnMut(Owner);

impl FrameHeader {
    /// The state word now.
    #[inline]
    pub(crate) fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// The tag now (meaningful inside a read section or under the lock).
    #[inline]
    pub(crate) fn tag(&self) -> Tag {
        Tag {
            file: self.file.load(Ordering::Relaxed),
            index: self.index.load(Ordering::Relaxed),
        }
    }

    /// Start an optimistic read: the version, if the frame is not being
    /// changed.
    #[inline]
    pub(crate) fn read_begin(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Acquire);
        (s & 1 == 0).then_some(s)
    }

    /// Whether nothing changed since [`read_begin`](Self::read_begin)
    /// returned `s`: the copy and tag read meanwhile are good.
    #[inline]
    pub(crate) fn read_check(&self, s: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == s
    }

    /// The version now (for tests and recovery).
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Mark the frame referenced (a hit): a store only when the bit is
    /// clear.
    #[inline]
    pub(crate) fn touch(&self) {
        if self.refbit.load(Ordering::Relaxed) == 0 {
            self.refbit.store(1, Ordering::Relaxed);
        }
    }

    /// The clock's pass: whether the frame was referenced since the last
    /// pass (the bit is cleared).
    pub(crate) fn take_ref(&self) -> bool {
        if self.refbit.load(Ordering::Relaxed) != 0 {
            self.refbit.store(0, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Set the reference bit (a refault the workingset keeps).
    pub(crate) fn set_ref(&self) {
        self.refbit.store(1, Ordering::Relaxed);
    }

    /// Take the lock if it is free; the state before.
    #[inline]
    pub(crate) fn try_lock(&self, me: Owner) -> Option<u32> {
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            if st & OWNER != 0 {
                return None;
            }
            match self.state.compare_exchange_weak(
                st,
                st | me.bits(),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(st),
                Err(now) => st = now,
            }
        }
    }

    /// Take the lock, waiting for its holder; the state before (without
    /// the owner). Each time a sleep times out with the same holder,
    /// `stuck(holder)` runs: it checks the holder's liveness and, if it is
    /// dead, recovers the frame (after which the lock is free or ours to
    /// retry).
    pub(crate) fn lock(&self, me: Owner, stuck: Stuck<'_>) -> u32 {
        let mut backoff = Backoff::new();
        loop {
            if let Some(st) = self.try_lock(me) {
                return st;
            }
            if backoff.spin() {
                continue;
            }
            let st = self.state.load(Ordering::Relaxed);
            let Some(holder) = Owner::from_bits(st) else {
                continue;
            };
            // The holder may be `me`: a member is a process, and another of
            // its threads may hold the frame (two threads missing one page:
            // the second waits for the first's fill). `stuck` never takes
            // this member for dead.
            if st & WAITERS == 0
                && self
                    .state
                    .compare_exchange(st, st | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            wait::wait(&self.state, st | WAITERS, WAIT_TICK);
            if Owner::from_bits(self.state.load(Ordering::Relaxed)) == Some(holder) {
                stuck(holder);
            }
        }
    }

    /// Release the lock held by `me`, setting the flags `set` and clearing
    /// `clear` in the same store; wakes sleepers.
    #[inline]
    pub(crate) fn unlock(&self, me: Owner, set: u32, clear: u32) {
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            debug_assert_eq!(st & OWNER, me.bits(), "unlock by the holder");
            let new = (st & !(clear | OWNER | WAITERS)) | set;
            match self
                .state
                .compare_exchange_weak(st, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => st = now,
            }
        }
        if st & WAITERS != 0 {
            wait::wake_all(&self.state);
        }
    }

    /// Change flags while holding the lock (the owner stays).
    #[inline]
    pub(crate) fn set_flags(&self, me: Owner, set: u32, clear: u32) {
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            debug_assert_eq!(st & OWNER, me.bits());
            let new = (st & !clear) | set;
            match self
                .state
                .compare_exchange_weak(st, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => st = now,
            }
        }
    }

    /// Take over the lock of `dead` (proved dead by the caller); the state
    /// before, or `None` if `dead` no longer holds it.
    pub(crate) fn steal(&self, dead: Owner, me: Owner) -> Option<u32> {
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            if st & OWNER != dead.bits() {
                return None;
            }
            let new = (st & !OWNER) | me.bits();
            match self
                .state
                .compare_exchange_weak(st, new, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(st & !OWNER),
                Err(now) => st = now,
            }
        }
    }

    /// Begin changing the bytes or the tag (the lock is held): the version
    /// goes odd. Returns the version to pass to
    /// [`end_change`](Self::end_change).
    #[inline]
    pub(crate) fn begin_change(&self) -> u64 {
        let s = self.seq.load(Ordering::Relaxed) & !1;
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        s
    }

    /// End a change begun at version `s`: the version becomes `s + 2`.
    #[inline]
    pub(crate) fn end_change(&self, s: u64) {
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Set the tag (inside a change).
    pub(crate) fn set_tag(&self, tag: Tag) {
        self.file.store(tag.file, Ordering::Relaxed);
        self.index.store(tag.index, Ordering::Relaxed);
    }

    /// Mark a writeback by `me` begun: the bytes are clean, a writeback is
    /// in flight (the lock is held; it is released by the caller).
    pub(crate) fn writeback_owner(st: u32) -> Option<Owner> {
        Owner::from_bits((st & WB_OWNER) >> WB_SHIFT)
    }

    /// The [`WB_OWNER`] bits for `me`.
    pub(crate) fn wb_bits(me: Owner) -> u32 {
        me.bits() << WB_SHIFT
    }

    /// Clear a writeback's flag and owner without the lock (the writeback's
    /// end), setting `set`; wakes sleepers.
    pub(crate) fn end_writeback(&self, set: u32) {
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            let new = (st & !(WRITEBACK | WB_OWNER | WAITERS)) | set;
            match self
                .state
                .compare_exchange_weak(st, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => st = now,
            }
        }
        if st & WAITERS != 0 {
            wait::wake_all(&self.state);
        }
    }

    /// Take over a writeback `dead` left in flight: whether it did (the
    /// flags are then `set`, the writeback cleared).
    pub(crate) fn steal_writeback(&self, dead: Owner, set: u32) -> bool {
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            if st & WRITEBACK == 0 || Self::writeback_owner(st) != Some(dead) {
                return false;
            }
            let new = (st & !(WRITEBACK | WB_OWNER | WAITERS)) | set;
            match self
                .state
                .compare_exchange_weak(st, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if st & WAITERS != 0 {
                        wait::wake_all(&self.state);
                    }
                    return true;
                }
                Err(now) => st = now,
            }
        }
    }

    /// Wait (bounded by `tick`) while the state word is `st`: for a
    /// writeback or a lock to end. Returns at once if it already changed.
    pub(crate) fn wait_while(&self, st: u32, tick: Duration) {
        let want = st | WAITERS;
        if st & WAITERS == 0
            && self
                .state
                .compare_exchange(st, want, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        wait::wait(&self.state, want, tick);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_read_across_a_change_is_refused() {
        let h = FrameHeader::default();
        let me = Owner::of_slot(3);
        let s = h.read_begin().unwrap();
        assert!(h.read_check(s));
        h.try_lock(me).unwrap();
        let v = h.begin_change();
        assert_eq!(h.read_begin(), None, "odd while changing");
        h.set_tag(Tag::new(1, 1, 9));
        h.end_change(v);
        h.unlock(me, VALID, 0);
        assert!(!h.read_check(s), "the version moved");
        let s2 = h.read_begin().unwrap();
        assert_eq!(s2, s + 2);
        assert_eq!(h.tag(), Tag::new(1, 1, 9));
        assert_eq!(h.state() & (VALID | OWNER), VALID);
    }

    #[test]
    fn a_dead_owners_lock_is_stolen_once() {
        let h = FrameHeader::default();
        let dead = Owner::of_slot(0);
        let me = Owner::of_slot(1);
        h.try_lock(dead).unwrap();
        h.set_flags(dead, VALID | DIRTY, 0);
        assert_eq!(h.try_lock(me), None);
        assert_eq!(h.steal(dead, me), Some(VALID | DIRTY));
        assert_eq!(h.steal(dead, me), None, "already taken over");
        h.unlock(me, 0, DIRTY);
        assert_eq!(h.state(), VALID);
    }

    #[test]
    fn a_waiter_on_a_dead_holder_is_told() {
        let h = FrameHeader::default();
        let dead = Owner::of_slot(5);
        let me = Owner::of_slot(6);
        h.try_lock(dead).unwrap();
        let mut calls = 0;
        let st = h.lock(me, &mut |o| {
            assert_eq!(o, dead);
            calls += 1;
            // the recovery: take the lock over and release it
            assert!(h.steal(dead, Owner::of_slot(7)).is_some());
            h.unlock(Owner::of_slot(7), 0, 0);
        });
        assert_eq!(calls, 1);
        assert_eq!(st & OWNER, 0);
        assert_eq!(Owner::from_bits(h.state()), Some(me));
    }

    #[test]
    fn a_writeback_left_by_the_dead_is_dirty_again() {
        let h = FrameHeader::default();
        let dead = Owner::of_slot(2);
        h.try_lock(dead).unwrap();
        h.unlock(dead, VALID | WRITEBACK | FrameHeader::wb_bits(dead), DIRTY);
        assert_eq!(FrameHeader::writeback_owner(h.state()), Some(dead));
        assert!(!h.steal_writeback(Owner::of_slot(3), DIRTY));
        assert!(h.steal_writeback(dead, DIRTY));
        assert_eq!(h.state(), VALID | DIRTY);
    }

    #[test]
    fn tags_pack_slot_and_epoch() {
        let t = Tag::new(16383, 77, 1 << 40);
        assert_eq!(t.slot(), 16383);
        assert_eq!(t.epoch(), 77);
        assert_ne!(t.hash(), Tag::new(16383, 78, 1 << 40).hash());
        assert_ne!(Tag::NONE.file, t.file);
    }
}
