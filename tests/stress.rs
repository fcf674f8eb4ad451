//! Multi-threaded stress: one writer stores, erases and re-stores items and
//! value entries of random orders (so the tree grows, shrinks, and nodes
//! are freed under the readers' feet) and sets/clears marks, while three
//! readers `load` random indices and iterate with `iter` / `iter_marked`
//! under `kxarray::pin()`.
//!
//! Every entry says where it lives: an item is an `Arc<Payload>` holding its
//! first index, its order, a generation and a checksum over the three; a
//! value entry packs its first index and order. A reader that sees a torn,
//! freed or misplaced entry fails the checksum or the placement check.
//!
//! At the end every payload ever created must have been dropped exactly
//! once: after the array is dropped, the epoch's deferred garbage is flushed
//! (a bounded number of `pin().flush()` rounds).

use kxarray::{Entry, EntryRef, Mark, XArray};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

static CREATED: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);

fn checksum(base: u64, order: u32, gen: u64) -> u64 {
    let mut x = base ^ (order as u64).rotate_left(40) ^ gen.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

#[derive(Debug)]
struct Payload {
    base: u64,
    order: u32,
    gen: u64,
    check: u64,
    alive: AtomicBool,
}

impl Payload {
    fn new(base: u64, order: u32, gen: u64) -> Arc<Payload> {
        CREATED.fetch_add(1, Ordering::Relaxed);
        Arc::new(Payload {
            base,
            order,
            gen,
            check: checksum(base, order, gen),
            alive: AtomicBool::new(true),
        })
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        assert!(
            self.alive.swap(false, Ordering::Relaxed),
            "payload dropped twice"
        );
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Value entries: first index (< 2^48) and order packed in 63 bits.
fn pack(base: u64, order: u32) -> u64 {
    (base << 7) | order as u64
}

fn unpack(v: u64) -> (u64, u32) {
    (v >> 7, (v & 0x7f) as u32)
}

fn covers(base: u64, order: u32, index: u64) -> bool {
    let mask = if order >= 64 {
        u64::MAX
    } else {
        (1u64 << order) - 1
    };
    base & mask == 0 && index & !mask == base
}

/// Validate an entry seen at `index`; returns its (base, order).
fn validate(index: u64, e: EntryRef<'_, Arc<Payload>>) -> (u64, u32) {
    let (base, order) = match e {
        EntryRef::Value(v) => unpack(v),
        EntryRef::Item(r) => {
            let p = r.get();
            assert!(
                p.alive.load(Ordering::Relaxed),
                "reader saw a dropped payload at {index:#x}"
            );
            assert_eq!(
                p.check,
                checksum(p.base, p.order, p.gen),
                "torn payload at {index:#x}: {p:?}"
            );
            (p.base, p.order)
        }
    };
    assert!(
        covers(base, order, index),
        "entry for {base:#x}/{order} seen at {index:#x}"
    );
    (base, order)
}

/// A seeded stream (the same operations on every run) and the index
/// distribution the writer and readers draw from.
struct Rng(SmallRng);
impl Rng {
    fn seeded(seed: u64) -> Rng {
        Rng(SmallRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
    fn index(&mut self) -> u64 {
        match self.below(10) {
            0..=5 => self.below(300),
            6 | 7 => self.below(5000),
            8 => (1 << 20) + self.below(200),
            _ => (1 << 40) + self.below(100),
        }
    }
}

const ORDERS: [u32; 10] = [0, 0, 0, 0, 1, 2, 3, 6, 7, 9];

#[test]
fn stress_readers_vs_writer() {
    let xa: Arc<XArray<Arc<Payload>>> = Arc::new(XArray::new());
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let run_for = Duration::from_millis(if cfg!(debug_assertions) { 2500 } else { 4000 });

    let writer = {
        let xa = xa.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut rng = Rng::seeded(0x1234_5678_9abc_def1);
            let start = Instant::now();
            let mut gen = 0u64;
            let mut ops = 0u64;
            while start.elapsed() < run_for {
                gen += 1;
                let mut order = ORDERS[rng.below(ORDERS.len() as u64) as usize];
                let mut index = rng.index() & !((1u64 << order) - 1);
                // Storing into part of a larger entry replaces it whole,
                // keeping its shape: describe the range really covered.
                // (This thread is the only writer, so the probe is stable.)
                if xa.contains(index) {
                    let cur = xa.get_order(index);
                    if cur > order {
                        order = cur;
                        index &= !((1u64 << order) - 1);
                    }
                }
                match rng.below(12) {
                    0..=3 => {
                        let e = Entry::Item(Payload::new(index, order, gen));
                        let old = xa.store_order(index, order, e).expect("store");
                        drop(old);
                    }
                    4 | 5 => {
                        xa.store_order(index, order, Entry::Value(pack(index, order)))
                            .expect("store value");
                    }
                    6..=8 => {
                        drop(xa.erase(rng.index()));
                    }
                    9 => xa.set_mark(rng.index(), Mark::M0),
                    10 => xa.clear_mark(rng.index(), Mark::M0),
                    _ => {
                        // burst-erase a small window so leaves empty and the tree shrinks
                        let base = rng.index() & !63;
                        for i in (base..base + 64).step_by(1 + rng.below(8) as usize) {
                            drop(xa.erase(i));
                        }
                    }
                }
                ops += 1;
                if ops.is_multiple_of(4096) {
                    xa.check_invariants().unwrap_or_else(|e| panic!("{e}"));
                }
            }
            stop.store(true, Ordering::Release);
            ops
        })
    };

    let readers: Vec<_> = (0..3)
        .map(|t| {
            let xa = xa.clone();
            let stop = stop.clone();
            let reads = reads.clone();
            thread::spawn(move || {
                let mut rng = Rng::seeded(0xdead_beef_0000_0001 + t * 7919);
                let mut n = 0u64;
                let mut held: Vec<Arc<Payload>> = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    let guard = kxarray::pin();
                    for _ in 0..64 {
                        let i = rng.index();
                        if let Some(e) = xa.load(i, &guard) {
                            validate(i, e);
                            // take a reference that outlives the guard
                            if let (EntryRef::Item(r), 0) = (e, rng.below(16)) {
                                held.push(r.to_owned());
                            }
                        }
                        n += 1;
                    }
                    if rng.below(8) == 0 {
                        let mut last: Option<u64> = None;
                        let it: Box<dyn Iterator<Item = _>> = if rng.below(2) == 0 {
                            Box::new(xa.iter(&guard))
                        } else {
                            Box::new(xa.iter_marked(.., Mark::M0, &guard))
                        };
                        for (i, e) in it {
                            validate(i, e);
                            if let Some(l) = last {
                                assert!(i > l, "iteration went backwards: {l:#x} then {i:#x}");
                            }
                            last = Some(i);
                            n += 1;
                        }
                    }
                    drop(guard);
                    if held.len() > 32 {
                        for p in held.drain(..) {
                            assert_eq!(p.check, checksum(p.base, p.order, p.gen));
                        }
                    }
                }
                drop(held);
                reads.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();

    let ops = writer.join().expect("writer panicked");
    for r in readers {
        r.join().expect("reader panicked");
    }
    eprintln!(
        "stress: {ops} writer ops, {} reads, {} payloads, {} nodes at the end",
        reads.load(Ordering::Relaxed),
        CREATED.load(Ordering::Relaxed),
        xa.node_count()
    );
    assert!(ops > 1000, "writer made too little progress: {ops}");
    assert!(reads.load(Ordering::Relaxed) > 1000);
    xa.check_invariants().unwrap();

    // Final contents are still consistent.
    {
        let guard = kxarray::pin();
        for (i, e) in xa.iter(&guard) {
            validate(i, e);
        }
    }

    let Ok(xa) = Arc::try_unwrap(xa) else {
        panic!("array still shared")
    };
    drop(xa);

    // Flush the deferred destructors: every payload must be dropped.
    let created = CREATED.load(Ordering::Relaxed);
    // Bounded by time, not rounds: other tests in this process may hold
    // guards for a while and keep the epoch from advancing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while DROPPED.load(Ordering::Relaxed) != created && std::time::Instant::now() < deadline {
        kxarray::pin().flush();
        thread::yield_now();
    }
    assert_eq!(
        DROPPED.load(Ordering::Relaxed),
        created,
        "payloads leaked (created {created})"
    );
}
