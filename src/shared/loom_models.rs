//! Loom models of a frame's state machine and the index, on the real code
//! (`frame`, `index`) over loom's atomics: every interleaving of a fill, a
//! write, an eviction, a writeback's end and the optimistic reader, and of
//! the take-over of a dead holder's lock; and of a process's clock batch
//! (`hand`) taken by its threads.
//!
//! A frame's bytes are modelled by two relaxed atomic words a writer
//! changes together (byte-wise atomic copies are relaxed byte accesses): a
//! reader whose read section validates must see both equal, and the value
//! its tag promised.
//!
//! They are functions of the crate, compiled only under loom, so that
//! `tests/loom_shared.rs` runs them on the crate's private types. Run
//! with:
//! `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_shared --target-dir target/loom`

use super::frame::{FrameHeader, Owner, Tag, DIRTY, OWNER, VALID, WRITEBACK};
use super::hand::Hand;
use super::index::{fingerprint, Bucket, Frames, Inserted};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

struct One {
    h: FrameHeader,
    d1: AtomicU64,
    d2: AtomicU64,
    bucket: Bucket,
}

impl Frames for One {
    fn header(&self, f: u32) -> Option<&FrameHeader> {
        (f == 0).then_some(&self.h)
    }
}

impl One {
    fn new() -> Arc<One> {
        Arc::new(One {
            h: FrameHeader::default(),
            d1: AtomicU64::new(0),
            d2: AtomicU64::new(0),
            bucket: Bucket::default(),
        })
    }

    /// The optimistic hit: the bytes of `tag` if the frame holds them now.
    fn read(&self, tag: Tag) -> Option<(u64, u64)> {
        let fp = fingerprint(tag.hash());
        let (f, s) = self.bucket.find(fp, tag, self)?;
        if s & 1 != 0 || self.h.state() & VALID == 0 {
            return None;
        }
        assert_eq!(f, 0);
        let a = self.d1.load(Ordering::Relaxed);
        let b = self.d2.load(Ordering::Relaxed);
        self.h.read_check(s).then_some((a, b))
    }

    /// Fill the frame with page `tag` holding `v`, as `get_locked` does.
    fn fill(&self, me: Owner, tag: Tag, v: u64) {
        self.h.try_lock(me).unwrap();
        let s = self.h.begin_change();
        self.h.set_tag(tag);
        let g = self.bucket.lock(me, &mut |_| {});
        assert_eq!(
            g.insert(fingerprint(tag.hash()), tag, 0, self),
            Inserted::New(None)
        );
        drop(g);
        self.d1.store(v, Ordering::Relaxed);
        self.d2.store(v, Ordering::Relaxed);
        self.h.set_flags(me, VALID, 0);
        self.h.end_change(s);
        self.h.unlock(me, 0, 0);
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(2);
    b.check(f);
}

/// A reader racing a fill sees nothing or the whole filled page.
pub fn a_reader_sees_a_fill_whole_or_not_at_all() {
    model(|| {
        let one = One::new();
        let tag = Tag::new(1, 1, 7);
        let o = one.clone();
        let filler = thread::spawn(move || o.fill(Owner::of_slot(0), tag, 42));
        if let Some((a, b)) = one.read(tag) {
            assert_eq!((a, b), (42, 42), "a validated read of a fill");
        }
        filler.join().unwrap();
        assert_eq!(one.read(tag), Some((42, 42)));
    });
}

/// A reader racing a write in place sees the old page or the new one.
pub fn a_reader_never_keeps_a_torn_write() {
    model(|| {
        let one = One::new();
        let tag = Tag::new(1, 1, 7);
        one.fill(Owner::of_slot(0), tag, 1);
        let o = one.clone();
        let writer = thread::spawn(move || {
            let me = Owner::of_slot(1);
            o.h.try_lock(me).unwrap();
            let s = o.h.begin_change();
            o.d1.store(2, Ordering::Relaxed);
            o.d2.store(2, Ordering::Relaxed);
            o.h.set_flags(me, DIRTY, 0);
            o.h.end_change(s);
            o.h.unlock(me, 0, 0);
        });
        if let Some((a, b)) = one.read(tag) {
            assert_eq!(a, b, "torn");
            assert!(a == 1 || a == 2);
        }
        writer.join().unwrap();
        assert_eq!(one.read(tag), Some((2, 2)));
    });
}

/// A reader racing an eviction and a refill for another page never takes
/// the new page's bytes for the old page.
pub fn a_reader_never_takes_a_reused_frame_for_its_page() {
    model(|| {
        let one = One::new();
        let old = Tag::new(1, 1, 7);
        let new = Tag::new(1, 1, 8);
        one.fill(Owner::of_slot(0), old, 1);
        let o = one.clone();
        let evicter = thread::spawn(move || {
            let me = Owner::of_slot(1);
            let st = o.h.try_lock(me).unwrap();
            assert_eq!(st & OWNER, 0);
            // evict_locked's order: VALID first, then the change
            o.h.set_flags(me, 0, VALID);
            let s = o.h.begin_change();
            {
                let g = o.bucket.lock(me, &mut |_| {});
                assert!(g.remove(fingerprint(old.hash()), 0, Some(1)));
            }
            o.h.set_tag(Tag::NONE);
            o.h.end_change(s);
            o.h.unlock(me, 0, 0);
            o.fill(me, new, 2);
        });
        if let Some((a, b)) = one.read(old) {
            assert_eq!((a, b), (1, 1), "the old page's bytes only");
        }
        evicter.join().unwrap();
        assert_eq!(one.read(old), None);
        assert_eq!(one.read(new), Some((2, 2)));
    });
}

/// Two waiters on a dead holder's lock: each may try to take it over, one
/// does; the lock ends held by a waiter, then free.
pub fn a_dead_holders_lock_is_taken_over_once() {
    model(|| {
        let h = Arc::new(FrameHeader::default());
        let dead = Owner::of_slot(0);
        h.try_lock(dead).unwrap();
        let takeovers = Arc::new(AtomicU64::new(0));
        let waiter = |me: Owner| {
            let h = h.clone();
            let t = takeovers.clone();
            thread::spawn(move || {
                let hh = h.clone();
                let st = h.lock(me, &mut |holder| {
                    if holder == dead && hh.steal(dead, me).is_some() {
                        t.fetch_add(1, Ordering::Relaxed);
                        hh.unlock(me, 0, 0);
                    }
                });
                assert_eq!(st & OWNER, 0);
                h.unlock(me, 0, 0);
            })
        };
        let a = waiter(Owner::of_slot(1));
        let b = waiter(Owner::of_slot(2));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(takeovers.load(Ordering::Relaxed), 1);
        assert_eq!(h.state() & OWNER, 0);
    });
}

/// A write during a writeback keeps the frame dirty; a writeback's end
/// without a write leaves it clean.
pub fn a_write_during_writeback_stays_dirty() {
    model(|| {
        let h = Arc::new(FrameHeader::default());
        let w = Owner::of_slot(0);
        let wb = Owner::of_slot(1);
        h.try_lock(w).unwrap();
        h.unlock(w, VALID | DIRTY, 0);
        // the writeback's start, under the lock
        h.lock(wb, &mut |_| {});
        h.unlock(wb, WRITEBACK | FrameHeader::wb_bits(wb), DIRTY);
        let h2 = h.clone();
        let writer = thread::spawn(move || {
            h2.lock(w, &mut |_| {});
            let s = h2.begin_change();
            h2.end_change(s);
            h2.unlock(w, DIRTY, 0);
        });
        // the writeback's end, without the lock
        h.end_writeback(0);
        writer.join().unwrap();
        let st = h.state();
        assert_eq!(st & (DIRTY | WRITEBACK | OWNER), DIRTY, "{st:#x}");
    });
}

/// Two threads of one process taking frames from its clock batch (batches
/// of two frames, claimed from a shared hand, so each thread's second take
/// may find the batch used up while the other refills it) never get the
/// same frame.
pub fn a_batch_hands_out_each_frame_once() {
    model(|| {
        let clock = Arc::new(AtomicU64::new(0));
        let hand = Arc::new(Hand::new());
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let (clock, hand) = (Arc::clone(&clock), Arc::clone(&hand));
                thread::spawn(move || {
                    let claim = || clock.fetch_add(2, Ordering::Relaxed);
                    [hand.next_of(2, claim), hand.next_of(2, claim)]
                })
            })
            .collect();
        let mut got: Vec<u64> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let taken = got.clone();
        got.sort_unstable();
        got.dedup();
        assert_eq!(
            got.len(),
            taken.len(),
            "a frame handed out twice: {taken:?}"
        );
        assert!(
            got.iter().all(|&f| f < clock.load(Ordering::Relaxed)),
            "a frame no batch claimed: {got:?}"
        );
    });
}
