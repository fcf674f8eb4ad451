//! The lookup table: which frame holds a page, found by any member without
//! a system call or a lock.
//!
//! Owns the bucket format and its protocol. The table is set-associative:
//! a tag's hash picks one bucket of [`WAYS`] entries (two cache lines with
//! the bucket's lock word), and the page's entry, if any, is in that bucket
//! and nowhere else. Nothing ever moves an entry, so a reader scanning a
//! bucket without the lock sees each way either before or after a change,
//! never a half-moved chain (the hazard of open addressing, whose deletions
//! shift entries). An entry is one word:
//!
//! - 0: empty;
//! - a frame: bit 63 clear, a 31-bit fingerprint of the tag's hash in bits
//!   32..63, the frame number + 1 below;
//! - a shadow (a page evicted lately, the workingset's memory of it): bit 63
//!   set, the fingerprint, and the low 32 bits of the eviction clock when it
//!   left.
//!
//! A fingerprint match is only a candidate: the reader then checks the
//! frame's own tag inside its read section (`frame`), so a stale entry, a
//! fingerprint collision or a frame reused under a reader costs a retry,
//! never a wrong page. A shadow is only a hint for the refault test.
//!
//! Inserts and removals take the bucket's lock (an owner word like a
//! frame's, taken over by whoever proves its holder dead; every change is a
//! single store, so a bucket whose holder died is always consistent). A
//! waiter about to sleep on the lock counts itself in the bucket's
//! `sleepers` word for the length of its sleep, and a release wakes only
//! when that count is not 0 (a miss and a write each take bucket locks, and
//! a shared futex's wake with no one asleep is a system call and a page
//! walk). The lock word keeps only the holder's bits, so the recovery's
//! compare-and-swap of a dead holder's word is exact; a waiter that dies
//! asleep leaves the count above 0, which costs only the wakes it saves;
//! a member built before the count never counts itself and sleeps at most
//! one wait's tick (every wait is bounded).
//! Under the lock an insert first looks for the tag (two members missing
//! the same page meet here: the second finds the first's frame and waits
//! for its fill), then takes an empty way or the oldest shadow. A full
//! bucket (15 frames: rare at three entries per frame of the region) makes
//! the caller read without caching.

use super::frame::{FrameHeader, Owner, Tag};
use super::layout::WAYS;
use super::wait::{self, Backoff};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// A shadow entry's bit.
const SHADOW: u64 = 1 << 63;
/// The fingerprint's mask (after shifting down by 32).
const FP_MASK: u64 = 0x7fff_ffff;

/// One bucket: its lock word and [`WAYS`] entries.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    lock: AtomicU32,
    /// Waiters asleep on `lock` now (see the module notes).
    sleepers: AtomicU32,
    ways: [AtomicU64; WAYS],
}

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Bucket>() == super::layout::BUCKET_WORDS * 8);

/// The fingerprint of a tag's hash.
#[inline]
pub(crate) fn fingerprint(hash: u64) -> u64 {
    (hash >> 33) & FP_MASK
}

#[inline]
fn frame_entry(fp: u64, frame: u32) -> u64 {
    fp << 32 | (u64::from(frame) + 1)
}

/// What an entry word holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    /// Nothing.
    Empty,
    /// A frame (its number) with this fingerprint.
    Frame(u64, u32),
    /// A shadow with this fingerprint, evicted at this (truncated) clock.
    Shadow(u64, u32),
}

#[inline]
pub(crate) fn decode(e: u64) -> Way {
    let fp = (e >> 32) & FP_MASK;
    if e == 0 {
        Way::Empty
    } else if e & SHADOW != 0 {
        Way::Shadow(fp, e as u32)
    } else {
        match (e as u32).checked_sub(1) {
            Some(f) => Way::Frame(fp, f),
            None => Way::Empty,
        }
    }
}

/// The result of an insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// The entry is in; a shadow of the same page was there (its truncated
    /// eviction clock), for the refault test.
    New(Option<u32>),
    /// Another frame already holds the page.
    Exists(u32),
    /// No way was free.
    Full,
}

/// Resolve a frame number of an entry (bounded by the caller's frame
/// count) to its header.
pub(crate) trait Frames {
    /// Frame `f`'s header, if `f` is a frame of the region.
    fn header(&self, f: u32) -> Option<&FrameHeader>;
}

impl Bucket {
    /// A frame whose entry fingerprint matches `fp` and whose tag (read
    /// inside a read section that then validated) is `tag`, without the
    /// lock: the frame and the version its tag was read at. `None` when no
    /// such frame is visible now (the caller takes the slow path).
    #[inline]
    pub(crate) fn find(&self, fp: u64, tag: Tag, frames: &impl Frames) -> Option<(u32, u64)> {
        for w in &self.ways {
            let e = w.load(Ordering::Acquire);
            if e & SHADOW != 0 || (e >> 32) & FP_MASK != fp || e == 0 {
                continue;
            }
            let Some(f) = (e as u32).checked_sub(1) else {
                continue;
            };
            let Some(h) = frames.header(f) else { continue };
            let Some(s) = h.read_begin() else {
                // being changed: a fill or a write; the caller waits on it
                // only if the tag is the one it wants, which it cannot read
                // stably now, so it reports the frame with an odd version
                return Some((f, 1));
            };
            if h.tag() == tag && h.read_check(s) {
                return Some((f, s));
            }
        }
        None
    }

    /// Take the bucket's lock (see [`FrameHeader::lock`] for `stuck`).
    pub(crate) fn lock(&self, me: Owner, stuck: &mut dyn FnMut(Owner)) -> BucketGuard<'_> {
        let mut backoff = Backoff::new();
        loop {
            match self
                .lock
                .compare_exchange(0, me.bits(), Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return BucketGuard { b: self, me },
                Err(cur) => {
                    if backoff.spin() {
                        continue;
                    }
                    // Counted before the kernel compares the word: either
                    // the holder's release sees the count and wakes, or
                    // the kernel sees the word changed and returns.
                    self.sleepers.fetch_add(1, Ordering::SeqCst);
                    wait::wait(&self.lock, cur, super::frame::WAIT_TICK);
                    self.sleepers.fetch_sub(1, Ordering::Relaxed);
                    if let Some(holder) = Owner::from_bits(self.lock.load(Ordering::Relaxed)) {
                        if holder.bits() == cur {
                            stuck(holder);
                        }
                    }
                }
            }
        }
    }

    /// The holder of the bucket's lock, if any.
    #[cfg(test)]
    pub(crate) fn holder(&self) -> Option<Owner> {
        Owner::from_bits(self.lock.load(Ordering::Acquire))
    }

    /// Take over the lock of `dead` and release it (every change under the
    /// lock is one store, so the bucket is consistent as it stands).
    /// Whether `dead` held it.
    pub(crate) fn release_dead(&self, dead: Owner) -> bool {
        let ok = self
            .lock
            .compare_exchange(dead.bits(), 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if ok {
            wait::wake_all(&self.lock);
        }
        ok
    }

    /// Every way's word (for recovery and tests).
    pub(crate) fn ways(&self) -> impl Iterator<Item = (usize, Way)> + '_ {
        self.ways
            .iter()
            .enumerate()
            .map(|(i, w)| (i, decode(w.load(Ordering::Acquire))))
    }
}

/// The bucket's lock, held.
#[derive(Debug)]
pub(crate) struct BucketGuard<'a> {
    b: &'a Bucket,
    me: Owner,
}

impl BucketGuard<'_> {
    /// The frame holding `tag`, if any (tags read under the frame's read
    /// section; a frame being changed is read as its tag now, which only
    /// the frame's lock holder changes, and recovery sorts out).
    pub(crate) fn lookup(&self, fp: u64, tag: Tag, frames: &impl Frames) -> Option<u32> {
        for w in &self.b.ways {
            if let Way::Frame(efp, f) = decode(w.load(Ordering::Acquire)) {
                if efp == fp && frames.header(f).is_some_and(|h| h.tag() == tag) {
                    return Some(f);
                }
            }
        }
        None
    }

    /// Put frame `f` in for `tag`, unless a frame already holds the tag.
    pub(crate) fn insert(&self, fp: u64, tag: Tag, f: u32, frames: &impl Frames) -> Inserted {
        if let Some(other) = self.lookup(fp, tag, frames) {
            return Inserted::Exists(other);
        }
        let mut empty = None;
        let mut same_shadow = None;
        let mut oldest: Option<(usize, u32)> = None;
        for (i, w) in self.b.ways.iter().enumerate() {
            match decode(w.load(Ordering::Relaxed)) {
                Way::Empty => {
                    if empty.is_none() {
                        empty = Some(i);
                    }
                }
                Way::Shadow(sfp, clock) => {
                    if sfp == fp && same_shadow.is_none() {
                        same_shadow = Some((i, clock));
                    }
                    if oldest.is_none_or(|(_, c)| clock.wrapping_sub(c) > u32::MAX / 2) {
                        oldest = Some((i, clock));
                    }
                }
                Way::Frame(..) => {}
            }
        }
        let (way, refault) = match (same_shadow, empty, oldest) {
            (Some((i, clock)), _, _) => (i, Some(clock)),
            (None, Some(i), _) => (i, None),
            (None, None, Some((i, _))) => (i, None),
            (None, None, None) => return Inserted::Full,
        };
        self.b.ways[way].store(frame_entry(fp, f), Ordering::Release);
        Inserted::New(refault)
    }

    /// Take frame `f`'s entry out, leaving a shadow stamped `clock` when
    /// given. Whether the entry was there.
    pub(crate) fn remove(&self, fp: u64, f: u32, shadow: Option<u32>) -> bool {
        let want = frame_entry(fp, f);
        for w in &self.b.ways {
            if w.load(Ordering::Relaxed) == want {
                let new = shadow.map_or(0, |c| SHADOW | fp << 32 | u64::from(c));
                w.store(new, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Take out every entry naming frame `f` whatever its fingerprint
    /// (recovery: a frame whose tag is no longer trusted). How many.
    pub(crate) fn remove_frame(&self, f: u32) -> usize {
        let mut n = 0;
        for w in &self.b.ways {
            if matches!(decode(w.load(Ordering::Relaxed)), Way::Frame(_, g) if g == f) {
                w.store(0, Ordering::Release);
                n += 1;
            }
        }
        n
    }
}

impl Drop for BucketGuard<'_> {
    fn drop(&mut self) {
        let prev = self.b.lock.swap(0, Ordering::SeqCst);
        debug_assert_eq!(prev, self.me.bits(), "released by its holder");
        if self.b.sleepers.load(Ordering::SeqCst) != 0 {
            wait::wake_all(&self.b.lock);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::shared::frame::VALID;

    struct Table(Vec<FrameHeader>);
    impl Frames for Table {
        fn header(&self, f: u32) -> Option<&FrameHeader> {
            self.0.get(f as usize)
        }
    }

    fn tagged(t: &Table, f: u32, tag: Tag) {
        let h = &t.0[f as usize];
        let me = Owner::of_slot(0);
        h.try_lock(me).unwrap();
        let s = h.begin_change();
        h.set_tag(tag);
        h.end_change(s);
        h.unlock(me, VALID, 0);
    }

    #[test]
    fn an_insert_finds_the_page_already_there() {
        let t = Table((0..4).map(|_| FrameHeader::default()).collect());
        let b = Bucket::default();
        let me = Owner::of_slot(0);
        let tag = Tag::new(1, 1, 42);
        let fp = fingerprint(tag.hash());
        tagged(&t, 2, tag);
        let g = b.lock(me, &mut |_| unreachable!());
        assert_eq!(g.insert(fp, tag, 2, &t), Inserted::New(None));
        assert_eq!(g.insert(fp, tag, 3, &t), Inserted::Exists(2));
        drop(g);
        assert_eq!(b.find(fp, tag, &t).map(|(f, _)| f), Some(2));
        assert_eq!(b.find(fp, Tag::new(1, 2, 42), &t), None, "another epoch");
    }

    #[test]
    fn a_removed_page_leaves_a_shadow_its_refault_finds() {
        let t = Table((0..2).map(|_| FrameHeader::default()).collect());
        let b = Bucket::default();
        let me = Owner::of_slot(0);
        let tag = Tag::new(3, 1, 7);
        let fp = fingerprint(tag.hash());
        tagged(&t, 0, tag);
        let g = b.lock(me, &mut |_| unreachable!());
        assert_eq!(g.insert(fp, tag, 0, &t), Inserted::New(None));
        assert!(g.remove(fp, 0, Some(1234)));
        assert!(!g.remove(fp, 0, None), "once");
        drop(g);
        assert_eq!(b.find(fp, tag, &t), None);
        tagged(&t, 1, tag);
        let g = b.lock(me, &mut |_| unreachable!());
        assert_eq!(g.insert(fp, tag, 1, &t), Inserted::New(Some(1234)));
    }

    #[test]
    fn a_full_bucket_refuses_and_shadows_make_room() {
        let n = WAYS as u32 + 1;
        let t = Table((0..n).map(|_| FrameHeader::default()).collect());
        let b = Bucket::default();
        let me = Owner::of_slot(0);
        let g = b.lock(me, &mut |_| unreachable!());
        for f in 0..WAYS as u32 {
            let tag = Tag::new(1, 1, u64::from(f));
            tagged(&t, f, tag);
            assert!(matches!(
                g.insert(fingerprint(tag.hash()), tag, f, &t),
                Inserted::New(_)
            ));
        }
        let last = Tag::new(1, 1, 99);
        tagged(&t, n - 1, last);
        assert_eq!(
            g.insert(fingerprint(last.hash()), last, n - 1, &t),
            Inserted::Full
        );
        let t0 = Tag::new(1, 1, 0);
        assert!(g.remove(fingerprint(t0.hash()), 0, Some(5)));
        assert!(matches!(
            g.insert(fingerprint(last.hash()), last, n - 1, &t),
            Inserted::New(None)
        ));
    }

    #[test]
    fn a_dead_holders_bucket_lock_is_released() {
        let b = Bucket::default();
        let dead = Owner::of_slot(9);
        core::mem::forget(b.lock(dead, &mut |_| unreachable!()));
        assert_eq!(b.holder(), Some(dead));
        assert!(!b.release_dead(Owner::of_slot(8)));
        assert!(b.release_dead(dead));
        assert_eq!(b.holder(), None);
    }

    #[test]
    fn a_sleeping_waiter_is_counted_while_it_sleeps_and_gets_the_lock() {
        let b = Bucket::default();
        let holder = Owner::of_slot(1);
        let g = b.lock(holder, &mut |_| {});
        assert_eq!(b.sleepers.load(Ordering::Relaxed), 0, "no waiter yet");
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let w = b.lock(Owner::of_slot(2), &mut |_| {});
                assert_eq!(b.holder(), Some(Owner::of_slot(2)));
                drop(w);
            });
            let start = std::time::Instant::now();
            while b.sleepers.load(Ordering::Relaxed) == 0 {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(30),
                    "a waiter past its spins counts itself"
                );
                std::thread::yield_now();
            }
            assert_eq!(b.holder(), Some(holder), "the count leaves the word alone");
            drop(g);
            waiter.join().unwrap();
        });
        assert_eq!(b.lock.load(Ordering::Relaxed), 0, "released");
        assert_eq!(b.sleepers.load(Ordering::Relaxed), 0, "no one asleep");
    }

    #[test]
    fn garbage_words_decode_to_nothing_harmful() {
        assert_eq!(decode(0), Way::Empty);
        assert_eq!(decode(5 << 32), Way::Empty, "frame + 1 of 0");
        assert!(matches!(decode(u64::MAX), Way::Shadow(..)));
        assert_eq!(decode(1), Way::Frame(0, 0));
    }
}
