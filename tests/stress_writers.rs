//! Two writers and lock-free readers, on the XArray and on the page cache.
//!
//! Every stored value says where it may be seen: a value entry packs the
//! range it was stored for (an aligned block or a `store_range` range) and
//! a checksum; a shadow packs the range of the folio it replaced; a folio
//! knows its own range and carries a checksummed tag in its data. Writers
//! compute under the lock the range an entry really covers (a store into
//! part of a larger entry replaces it whole), so the readers can assert
//! that they never see
//! - a value, shadow or folio that no writer stored (checksum),
//! - an entry at an index outside the range it was stored for (a split
//!   keeps the value in pieces of the original range, never outside it),
//! - iteration out of index order, or a tagged folio outside the range
//!   asked for.
//!
//! Writers race each other's multi-step operations: a split preallocated
//! without the lock, `add_folio` over a shadow the other writer replaces,
//! `tag_for_writeback` dropping the lock while the other writer evicts.
//!
//! Bounded by operation counts (not time); `KX_STRESS_SCALE=n` multiplies
//! them. `KX_STRESS_ISSUE8=1` adds the operations that hit the known open
//! defects of the tree: range stores over arbitrary ranges (unaligned
//! multi-slot runs) and partial splits across a node level (which drop the
//! parent's marks). By default range stores use aligned power-of-two ranges
//! and splits stay inside one node.

use kxarray::filemap::{AddressSpace, Folio, Lookup, Shadow, ShadowFields, Tag};
use kxarray::{Entry, EntryRef, Mark, XArray, XaState};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

fn scale() -> u64 {
    std::env::var("KX_STRESS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn issue8() -> bool {
    std::env::var_os("KX_STRESS_ISSUE8").is_some_and(|v| v == "1")
}

/// A seeded stream: the same operations on every run of a seed.
struct Rng(SmallRng);
impl Rng {
    fn seeded(seed: u64) -> Rng {
        Rng(SmallRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
}

fn mix(x: u64) -> u64 {
    let mut x = x ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// Indices stay below 2^20 so a range packs into a value entry.
const SPACE: u64 = 1 << 20;

/// A value entry for the inclusive range `first..=last`: 20 + 20 bits of
/// range, 23 bits of checksum.
fn pack_range(first: u64, last: u64) -> u64 {
    debug_assert!(first <= last && last < SPACE);
    let body = (first << 20) | last;
    (mix(body) & 0x7f_ffff) << 40 | body
}

/// The range a value entry was stored for; panics on a value no writer made.
fn unpack_range(v: u64, seen_at: u64) -> (u64, u64) {
    let body = v & ((1 << 40) - 1);
    assert_eq!(
        v >> 40,
        mix(body) & 0x7f_ffff,
        "value {v:#x} at {seen_at:#x} was never stored"
    );
    (body >> 20, body & (SPACE - 1))
}

fn check_value(v: u64, i: u64) {
    let (first, last) = unpack_range(v, i);
    assert!(
        (first..=last).contains(&i),
        "value for {first:#x}..={last:#x} seen at {i:#x}"
    );
}

/// Items: a payload that knows its range and whether it was dropped.
#[derive(Debug)]
struct Payload {
    first: u64,
    last: u64,
    check: u64,
    alive: AtomicBool,
}

impl Drop for Payload {
    fn drop(&mut self) {
        assert!(
            self.alive.swap(false, Ordering::SeqCst),
            "payload dropped twice"
        );
    }
}

fn check_entry(e: EntryRef<'_, Arc<Payload>>, i: u64) {
    match e {
        EntryRef::Value(v) => check_value(v, i),
        EntryRef::Item(r) => {
            let p = r.get();
            assert!(
                p.alive.load(Ordering::SeqCst),
                "dropped payload seen at {i:#x}"
            );
            assert_eq!(
                p.check,
                mix(p.first ^ p.last << 20),
                "torn payload at {i:#x}"
            );
            assert!(
                (p.first..=p.last).contains(&i),
                "item for {:#x}..={:#x} seen at {i:#x}",
                p.first,
                p.last
            );
        }
    }
}

/// The range the entry at `index` covers (lock held: stable), if any.
fn covered(xas: &mut XaState<'_, Arc<Payload>>, index: u64) -> Option<(u64, u64)> {
    xas.set_index(index);
    xas.load()?;
    let o = xas.get_order();
    let first = index & !((1u64 << o) - 1);
    Some((first, first + ((1u64 << o) - 1)))
}

fn index(rng: &mut Rng) -> u64 {
    match rng.below(8) {
        0..=4 => rng.below(1 << 10),
        5 | 6 => rng.below(1 << 14),
        _ => rng.below(SPACE),
    }
}

const ORDERS: [u32; 8] = [0, 0, 1, 2, 3, 6, 7, 9];

fn xarray_writer(xa: &XArray<Arc<Payload>>, seed: u64, ops: u64) {
    let mut rng = Rng::seeded(seed);
    let issue8 = issue8();
    for n in 0..ops {
        let order = ORDERS[rng.below(ORDERS.len() as u64) as usize];
        let at = index(&mut rng) & !((1u64 << order) - 1);
        match rng.below(16) {
            // store an item or a value, describing the range really covered
            0..=4 => {
                let lock = xa.lock();
                let guard = kxarray::pin();
                let mut xas = XaState::new(xa, &guard, at);
                let (mut first, mut o) = (at, order);
                if let Some((f, l)) = covered(&mut xas, at) {
                    if l - f + 1 > 1 << order {
                        o = (l - f + 1).trailing_zeros();
                        first = f;
                    }
                }
                let last = first + ((1u64 << o) - 1);
                let e = if rng.below(2) == 0 {
                    Entry::Item(Arc::new(Payload {
                        first,
                        last,
                        check: mix(first ^ last << 20),
                        alive: AtomicBool::new(true),
                    }))
                } else {
                    Entry::Value(pack_range(first, last))
                };
                lock.store_order(first, o, Some(e)).expect("store_order");
            }
            // a range store: the range grows to the entries it cuts into
            5..=7 => {
                let (mut first, mut last) = if issue8 {
                    let f = index(&mut rng);
                    (f, (f + rng.below(200)).min(SPACE - 1))
                } else {
                    (at, at + ((1u64 << order) - 1))
                };
                let lock = xa.lock();
                let guard = kxarray::pin();
                let mut xas = XaState::new(xa, &guard, first);
                if let Some((f, _)) = covered(&mut xas, first) {
                    first = first.min(f);
                }
                if let Some((_, l)) = covered(&mut xas, last) {
                    last = last.max(l);
                }
                let v = (rng.below(4) != 0).then(|| pack_range(first, last));
                lock.store_range(first, last, v).expect("store_range");
            }
            // a partial split, preallocated without the lock: the other
            // writer may replace the entry in between (then it must fail)
            8..=10 => {
                let guard = kxarray::pin();
                let target = index(&mut rng);
                let (v, o, base) = {
                    let lock = xa.lock();
                    let mut xas = XaState::new(xa, lock.guard(), target);
                    match xas.load() {
                        Some(EntryRef::Value(v)) => {
                            let o = xas.get_order();
                            (v, o, target & !((1u64 << o) - 1))
                        }
                        _ => continue,
                    }
                };
                if o == 0 {
                    continue;
                }
                let new = o.saturating_sub(1 + rng.below(o as u64) as u32);
                let mut xas = XaState::with_order(xa, &guard, target, new).unwrap();
                if xas.try_split_nodes(o) > 0 && !issue8 {
                    continue;
                }
                if xas.try_split_alloc(v, o).is_err() {
                    continue;
                }
                if rng.below(4) == 0 {
                    thread::yield_now();
                }
                let lock = xa.lock();
                let before = {
                    let mut probe = XaState::new(xa, lock.guard(), base);
                    probe.load().and_then(|e| e.value())
                };
                let r = xas.try_split(&lock, v, o);
                if before != Some(v) {
                    assert!(r.is_err(), "split of a replaced entry succeeded");
                }
            }
            11 | 12 => drop(xa.erase(index(&mut rng))),
            13 => xa.set_mark(index(&mut rng), Mark::M0),
            14 => xa.clear_mark(index(&mut rng), Mark::M0),
            _ => {
                // erase a small window so leaves empty and the tree shrinks
                let base = index(&mut rng) & !63;
                for i in (base..base + 64).step_by(1 + rng.below(8) as usize) {
                    drop(xa.erase(i));
                }
            }
        }
        if n % 2048 == 0 {
            xa.check_invariants().unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

fn xarray_reader(xa: &XArray<Arc<Payload>>, seed: u64, stop: &AtomicBool) -> u64 {
    let mut rng = Rng::seeded(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Acquire) {
        let guard = kxarray::pin();
        for _ in 0..64 {
            let i = index(&mut rng);
            if let Some(e) = xa.load(i, &guard) {
                check_entry(e, i);
            }
            n += 1;
        }
        if rng.below(4) == 0 {
            let start = index(&mut rng);
            let mut last = None;
            let marked = rng.below(2) == 0;
            let it: Box<dyn Iterator<Item = _>> = if marked {
                Box::new(xa.iter_marked(start.., Mark::M0, &guard))
            } else {
                Box::new(xa.range(start.., &guard))
            };
            for (i, e) in it.take(2000) {
                check_entry(e, i);
                if let Some(l) = last {
                    assert!(i > l, "iteration went backwards: {l:#x} then {i:#x}");
                }
                last = Some(i);
                n += 1;
            }
        }
        if rng.below(4) == 0 {
            // a cursor walk with a pause in the middle
            let mut xas = XaState::new(xa, &guard, index(&mut rng));
            let mut last = None;
            for k in 0..64 {
                let Some(e) = xas.find(SPACE) else { break };
                let i = xas.index();
                check_entry(e, i);
                if let Some(l) = last {
                    assert!(i > l, "cursor went backwards: {l:#x} then {i:#x}");
                }
                last = Some(i);
                if k == 32 {
                    xas.pause();
                }
                n += 1;
            }
        }
    }
    n
}

#[test]
fn two_writers_xarray() {
    let ops = 60_000 * scale();
    let xa = Arc::new(XArray::new());
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let xa = &xa;
                s.spawn(move || xarray_writer(xa, 0x5eed_0001 + w * 7919, ops))
            })
            .collect();
        for r in 0..2u64 {
            let (xa, stop, reads) = (&xa, &stop, &reads);
            s.spawn(move || {
                let n = xarray_reader(xa, 0xbeef_0001 + r * 104_729, stop);
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
        for w in writers {
            if let Err(e) = w.join() {
                stop.store(true, Ordering::Release);
                std::panic::resume_unwind(e);
            }
        }
        stop.store(true, Ordering::Release);
    });
    xa.check_invariants().unwrap();
    let guard = kxarray::pin();
    for (i, e) in xa.iter(&guard) {
        check_entry(e, i);
    }
    eprintln!(
        "two_writers_xarray: {} writer ops, {} reads, {} nodes",
        2 * ops,
        reads.load(Ordering::Relaxed),
        xa.node_count()
    );
    assert!(reads.load(Ordering::Relaxed) > 0);
}

// ----------------------------------------------------------------------
// The page cache
// ----------------------------------------------------------------------

/// A shadow for the folio range `first..=last`: 40 eviction bits hold the
/// range, the memcg bits a checksum.
fn shadow_for(first: u64, last: u64) -> Shadow {
    let body = (first << 20) | last;
    Shadow::pack(ShadowFields {
        eviction: body,
        memcg: (mix(body) & 0xffff) as u16,
        node: 0,
        workingset: false,
    })
    .unwrap()
}

/// The folio range a shadow was stored for; panics on one never stored.
fn shadow_range(s: Shadow) -> (u64, u64) {
    let f = s.unpack();
    assert_eq!(
        f.memcg as u64,
        mix(f.eviction) & 0xffff,
        "shadow {s:?} was never stored"
    );
    (f.eviction >> 20, f.eviction & (SPACE - 1))
}

fn check_shadow(s: Shadow, i: u64) {
    let (first, last) = shadow_range(s);
    assert!(
        (first..=last).contains(&i),
        "shadow for {first:#x}..={last:#x} seen at {i:#x}"
    );
}

/// A folio whose data starts with a checksum of its range.
fn new_folio(index: u64, order: u32) -> Arc<Folio> {
    let f = Folio::new(index, order).unwrap();
    f.fill(&mix(index << 8 | order as u64).to_le_bytes());
    Arc::new(f)
}

fn check_folio(f: &Folio, i: u64) {
    assert!(
        f.contains(i),
        "folio {}+{} seen at {i:#x}",
        f.index(),
        f.order()
    );
    let mut b = [0u8; 8];
    assert_eq!(f.read(0, &mut b), 8, "folio without data at {i:#x}");
    assert_eq!(
        u64::from_le_bytes(b),
        mix(f.index() << 8 | f.order() as u64),
        "folio at {i:#x} was never stored"
    );
}

/// Page-cache indices: a small file, so adds land on shadows and folios.
fn pindex(rng: &mut Rng) -> u64 {
    rng.below(1 << 12)
}

fn filemap_writer(m: &AddressSpace, seed: u64, ops: u64) {
    let mut rng = Rng::seeded(seed);
    let mut mine: Vec<Arc<Folio>> = Vec::new();
    for n in 0..ops {
        match rng.below(10) {
            0..=3 => {
                let order = [0, 0, 0, 1, 2, 4, 6, 9][rng.below(8) as usize];
                let at = pindex(&mut rng) & !((1u64 << order) - 1);
                let f = new_folio(at, order);
                if let Ok(old) = m.add_folio(&f) {
                    if let Some(s) = old {
                        // the last shadow the range held: of a folio that
                        // overlapped it
                        let (first, last) = shadow_range(s);
                        assert!(first < at + f.nr_pages() && last >= at);
                    }
                    mine.push(f);
                }
            }
            4 | 5 if !mine.is_empty() => {
                // evict one of ours, leaving a shadow of its range (mostly)
                let f = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                let last = f.index() + f.nr_pages() - 1;
                let s = (rng.below(5) != 0).then(|| shadow_for(f.index(), last));
                assert!(m.remove_folio(&f, s), "our folio vanished");
            }
            6 => {
                m.drop_shadow(pindex(&mut rng));
            }
            7 => {
                m.mark_dirty(pindex(&mut rng));
            }
            8 => {
                let a = pindex(&mut rng);
                m.tag_for_writeback(a, a + rng.below(512));
            }
            _ => {
                let i = pindex(&mut rng);
                if rng.below(2) == 0 {
                    m.start_writeback(i);
                } else {
                    m.end_writeback(i);
                }
            }
        }
        if n % 1024 == 0 {
            m.pages()
                .check_invariants()
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    for f in mine {
        assert!(m.remove_folio(&f, None));
    }
}

fn filemap_reader(m: &AddressSpace, seed: u64, stop: &AtomicBool) -> u64 {
    let mut rng = Rng::seeded(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Acquire) {
        for _ in 0..64 {
            let i = pindex(&mut rng);
            match m.lookup_entry(i) {
                Some(Lookup::Folio(f)) => check_folio(&f, i),
                Some(Lookup::Shadow(s)) => check_shadow(s, i),
                None => {}
            }
            n += 1;
        }
        let a = pindex(&mut rng);
        let b = a + rng.below(1024);
        let tag = [Tag::Dirty, Tag::Writeback, Tag::Towrite][rng.below(3) as usize];
        let mut last = None;
        for f in m.folios_tagged(a, b, tag) {
            let end = f.index() + f.nr_pages() - 1;
            assert!(end >= a && f.index() <= b, "tagged folio outside {a}..={b}");
            check_folio(&f, f.index().max(a));
            if let Some(l) = last {
                assert!(f.index() > l, "tagged folios out of order");
            }
            last = Some(f.index());
            n += 1;
        }
        let guard = kxarray::pin();
        let mut last = None;
        for (i, e) in m.pages().range(a..=b, &guard) {
            match e {
                EntryRef::Item(r) => check_folio(r.get(), i),
                EntryRef::Value(v) => check_shadow(Shadow::from_value(v), i),
            }
            if let Some(l) = last {
                assert!(i > l, "iteration went backwards: {l:#x} then {i:#x}");
            }
            last = Some(i);
        }
    }
    n
}

#[test]
fn two_writers_filemap() {
    let ops = 40_000 * scale();
    let m = AddressSpace::new();
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let start = Barrier::new(4);
    thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (m, start) = (&m, &start);
                s.spawn(move || {
                    start.wait();
                    filemap_writer(m, 0xf11e_0001 + w * 7919, ops)
                })
            })
            .collect();
        for r in 0..2u64 {
            let (m, stop, reads, start) = (&m, &stop, &reads, &start);
            s.spawn(move || {
                start.wait();
                let n = filemap_reader(m, 0xcafe_0001 + r * 104_729, stop);
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
        for w in writers {
            if let Err(e) = w.join() {
                stop.store(true, Ordering::Release);
                std::panic::resume_unwind(e);
            }
        }
        stop.store(true, Ordering::Release);
    });
    m.pages().check_invariants().unwrap();
    assert_eq!(m.nr_pages(), 0, "every folio was removed");
    let guard = kxarray::pin();
    let mut shadow_pages = 0;
    for (i, e) in m.pages().iter(&guard) {
        let EntryRef::Value(v) = e else {
            panic!("folio left at {i:#x}")
        };
        check_shadow(Shadow::from_value(v), i);
        shadow_pages += 1u64 << m.pages().get_order(i);
    }
    assert_eq!(m.nr_shadow_pages(), shadow_pages, "shadow accounting");
    eprintln!(
        "two_writers_filemap: {} writer ops, {} reads",
        2 * ops,
        reads.load(Ordering::Relaxed)
    );
}
