//! A Rust port of the behaviours checked by the Linux kernel's XArray test
//! suite (`lib/test_xarray.c`): same indices, orders and expectations,
//! adapted to this crate's API. Multi-index tests live in
//! `tests/kernel_multi.rs`.
//!
//! Geometry-dependent expectations use `kxarray::CHUNK_SHIFT`/`CHUNK_SIZE`,
//! so the suite also passes with `RUSTFLAGS="--cfg kxarray_small_nodes"`.
//! Every loop runs at the kernel's size (a few seconds in a debug build).
//! Kernel tests with no analog here: the RETRY-entry iteration at the end of
//! `check_xas_retry` (internal entries cannot be stored through this API)
//! and `check_align_1` (misaligned `char *` items cannot exist in a typed
//! array); see `tests/kernel_multi.rs` for the multi-index half.

use kxarray::{
    fault, CursorState, Entry, EntryRef, Error, Flags, Mark, XArray, XaState, CHUNK_SIZE,
};

mod kernel_common;
use kernel_common::*;

fn count_marked(xas: &mut XaState<'_, B>, max: u64, mark: Mark) -> usize {
    let mut n = 0;
    while xas.find_marked(max, mark).is_some() {
        n += 1;
    }
    n
}

// ---------------------------------------------------------------------
// check_xa_err
// ---------------------------------------------------------------------

#[test]
fn xa_err() {
    let xa = XA::new();
    // index 0 lives in the head: no node, so no allocation can fail
    fault::fail_next_allocations(u64::MAX);
    assert_eq!(store_index(&xa, 0), None);
    assert_eq!(xa.erase(0).map(|r| r.value()), Some(Some(0)));
    // GFP_NOWAIT in the user-space harness: the allocation and the retry fail
    fault::fail_next_allocations(2);
    assert_eq!(
        xa.store(1, Entry::Value(1)).unwrap_err().error,
        Error::NoMemory
    );
    fault::fail_next_allocations(2);
    let r = xa.store(1, Entry::Value(1)).unwrap_err();
    assert_eq!(r.error, Error::NoMemory);
    assert_eq!(
        r.entry.and_then(|e| e.value()),
        Some(1),
        "entry handed back"
    );
    fault::fail_next_allocations(0);
    assert!(xa.is_empty());
    inv(&xa);
    // GFP_KERNEL
    assert_eq!(store_index(&xa, 1), None);
    assert_eq!(
        xa.store(1, Entry::Value(0)).unwrap().map(|r| r.value()),
        Some(Some(1))
    );
    assert_eq!(xa.erase(1).map(|r| r.value()), Some(Some(0)));
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_xas_retry
// ---------------------------------------------------------------------

#[test]
fn xas_retry() {
    let xa = XA::new();
    store_index(&xa, 0);
    store_index(&xa, 1);

    {
        let g = kxarray::pin();
        let mut xas = XaState::new(&xa, &g, 0);
        assert_eq!(ev(xas.find(MAX)), Some(0));
        // erasing 1 shrinks the tree: the cursor's node is gone (RETRY)
        erase_index(&xa, 1);
        assert!(xas.reload().is_err());
        xas.reset();
        assert!(xas.state() == CursorState::Restart);
        assert_eq!(ev(xas.find(MAX)), Some(0));
        assert!(xas.state() == CursorState::Head, "{xas:?}");
        // re-growing the tree puts a node in the head: reload sees internal
        assert_eq!(store_index(&xa, 1), None);
        assert!(xas.reload().is_err());
        xas.reset();
        assert_eq!(ev(xas.find(MAX)), Some(0));
    }
    inv(&xa);

    // Iterate under the lock and replace each entry while iterating (the
    // kernel stores RETRY entries first; those are not storable here).
    {
        let g = kxarray::pin();
        let lock = xa.lock();
        let mut xas = XaState::new(&xa, &g, 0);
        xas.store(&lock, Some(Entry::Value(100))).unwrap();
        xas.set_index(1);
        xas.store(&lock, Some(Entry::Value(101))).unwrap();
        xas.set_index(0);
        let mut seen = vec![];
        while let Some(e) = xas.find(MAX) {
            seen.push((xas.index(), e.value()));
            let i = xas.index();
            assert_eq!(
                xas.store(&lock, Some(Entry::Value(mk(i))))
                    .unwrap()
                    .and_then(|e| e.value()),
                Some(100 + i)
            );
        }
        assert_eq!(seen, [(0, Some(100)), (1, Some(101))]);
    }
    inv(&xa);
    erase_index(&xa, 0);
    erase_index(&xa, 1);
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_xa_load
// ---------------------------------------------------------------------

#[test]
fn xa_load() {
    let xa = XA::new();
    let g = kxarray::pin();
    for i in 0..1024u64 {
        for j in 0..1024u64 {
            let e = xa.load(j, &g).map(|e| e.value());
            if j < i {
                assert_eq!(e, Some(Some(j)));
            } else {
                assert!(e.is_none());
            }
        }
        assert_eq!(store_index(&xa, i), None);
    }
    inv(&xa);
    for i in 0..1024u64 {
        for j in 0..1024u64 {
            let e = xa.load(j, &g).map(|e| e.value());
            if j >= i {
                assert_eq!(e, Some(Some(j)));
            } else {
                assert!(e.is_none());
            }
        }
        erase_index(&xa, i);
    }
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_xa_mark_1 / _2 / _3
// ---------------------------------------------------------------------

fn check_xa_mark_1(xa: &XA, index: u64) {
    // NULL entries have no marks
    assert!(!xa.get_mark(index, Mark::M0));
    xa.set_mark(index, Mark::M0);
    assert!(!xa.get_mark(index, Mark::M0));

    // storing does not make a mark appear
    assert_eq!(store_index(xa, index), None);
    assert!(!xa.get_mark(index, Mark::M0));
    xa.set_mark(index, Mark::M0);
    assert!(xa.get_mark(index, Mark::M0));

    // one mark does not set another
    assert!(!xa.get_mark(index + 1, Mark::M0));
    assert!(!xa.get_mark(index, Mark::M1));

    // erasing clears marks; they cannot be set again
    erase_index(xa, index);
    assert!(xa.is_empty());
    assert!(!xa.get_mark(index, Mark::M0));
    xa.set_mark(index, Mark::M0);
    assert!(!xa.get_mark(index, Mark::M0));
    inv(xa);

    // a multi-index store over marked entries gets the union of the marks
    assert_eq!(index % 4, 0);
    for order in 2..8u32 {
        let base = index & !((1u64 << order) - 1);
        let next = base + (1u64 << order);

        assert_eq!(store_index(xa, index + 1), None);
        xa.set_mark(index + 1, Mark::M0);
        assert_eq!(store_index(xa, index + 2), None);
        xa.set_mark(index + 2, Mark::M2);
        assert_eq!(store_index(xa, next), None);
        store_order(xa, index, order, Some(Entry::Value(mk(index))));
        inv(xa);
        let g = kxarray::pin();
        for i in base..next {
            assert!(
                xa.get_mark(i, Mark::M0),
                "index {index} order {order} i {i}"
            );
            assert!(!xa.get_mark(i, Mark::M1));
            assert!(xa.get_mark(i, Mark::M2));

            // two entries in the array
            let mut xas = XaState::new(xa, &g, i);
            assert_eq!(
                xas.iter(MAX).count(),
                2,
                "index {index} order {order} i {i}"
            );
            // one of which is marked
            xas.set_index(0);
            assert_eq!(count_marked(&mut xas, MAX, Mark::M0), 1);
        }
        assert!(!xa.get_mark(next, Mark::M0));
        assert!(!xa.get_mark(next, Mark::M1));
        assert!(!xa.get_mark(next, Mark::M2));
        erase_index(xa, index);
        erase_index(xa, next);
        assert!(xa.is_empty());
        inv(xa);
    }
    assert!(xa.is_empty());
}

/// Every index in 0..16384 step 4, as in the kernel (a few seconds in a
/// debug build).
#[test]
fn xa_mark_1() {
    let xa = XA::new();
    for index in (0..16384).step_by(4) {
        check_xa_mark_1(&xa, index);
    }
}

#[test]
fn xa_mark_2() {
    let xa = XA::new();
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, 0);

    store_index(&xa, 0);
    xa.set_mark(0, Mark::M0);
    {
        let lock = xa.lock();
        xas.load();
        xas.init_marks(&lock);
    }
    assert!(!xa.get_mark(0, Mark::M0));

    for index in 3500..4500 {
        store_index(&xa, index);
        xa.set_mark(index, Mark::M0);
    }
    inv(&xa);

    xas.reset();
    assert_eq!(count_marked(&mut xas, MAX, Mark::M0), 1000);

    // The marked walk left the cursor out of bounds: a following
    // xas_for_each does not run its body.
    {
        let _lock = xa.lock();
        let mut body = 0;
        while xas.find(MAX).is_some() {
            body += 1;
        }
        assert_eq!(body, 0);
    }
    xa.clear();
    assert!(xa.is_empty());
    inv(&xa);
}

#[test]
fn xa_mark_3() {
    let xa = XA::new();
    store_order(&xa, 0x40, 2, Some(Entry::Value(mk(0x40))));
    xa.set_mark(0x41, Mark::M0);
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, 0x41);
    let mut count = 0;
    while let Some(e) = xas.find_marked(MAX, Mark::M0) {
        count += 1;
        assert_eq!(e.value(), Some(0x40));
    }
    assert_eq!(count, 1);
    xa.clear();
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_xa_shrink
// ---------------------------------------------------------------------

#[test]
fn xa_shrink() {
    let xa = XA::new();
    assert!(xa.is_empty());
    assert_eq!(store_index(&xa, 0), None);
    assert_eq!(store_index(&xa, 1), None);

    // erasing 1 shrinks the tree and retires the node
    {
        let g = kxarray::pin();
        // a reader positioned on slot 0 of the node that is about to go
        let mut reader = XaState::new(&xa, &g, 0);
        assert_eq!(ev(reader.load()), Some(0));
        assert_eq!(reader.node_shift(), Some(0));

        let lock = xa.lock();
        let mut xas = XaState::new(&xa, &g, 1);
        assert_eq!(ev(xas.load()), Some(1));
        assert_eq!(xas.node_counts(), Some((2, 2)));
        assert_eq!(ev(xas.store(&lock, None).unwrap()), Some(1));
        assert!(lock.load(1).is_none());
        assert!(xas.state() == CursorState::Bounds, "{xas:?}");
        // the old node's slot 0 now holds RETRY
        assert!(reader.reload().is_err());
        assert_eq!(ev(xas.load()), None);
    }
    assert_eq!(xa.node_count(), 0);
    assert_eq!(ld(&xa, 0), Some(0));
    erase_index(&xa, 0);
    assert!(xa.is_empty());
    inv(&xa);

    for order in 0..15u32 {
        let max = (1u64 << order) - 1;
        store_order(&xa, 0, order, Some(Entry::Value(0)));
        assert_eq!(ld(&xa, max), Some(0));
        assert_eq!(ld(&xa, max + 1), None);
        inv(&xa);
        let (height, nodes) = (xa.height(), xa.node_count());
        assert_eq!(store_index(&xa, MAX), None);
        assert!(xa.height() > height, "head must change");
        assert_eq!(ld(&xa, max + 1), None);
        let allocs = fault::allocations();
        erase_index(&xa, MAX);
        // shrinking gives back the very same top node: same shape, and
        // nothing was allocated to rebuild it
        assert_eq!(fault::allocations(), allocs);
        assert_eq!(
            (xa.height(), xa.node_count()),
            (height, nodes),
            "order {order}\n{}",
            xa.dump()
        );
        assert_eq!(ld(&xa, max), Some(0));
        inv(&xa);
        erase_index(&xa, 0);
        assert!(xa.is_empty());
    }
}

// ---------------------------------------------------------------------
// check_xas_erase
// ---------------------------------------------------------------------

#[test]
fn xas_erase() {
    let xa = XA::new();
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, 0);
    for i in 0..200u64 {
        for j in i..2 * i + 17 {
            xas.set_index(j);
            xas_store_locked(&mut xas, Some(Entry::Value(mk(j))));
        }
        xas.set_index(MAX);
        xas_store_locked(&mut xas, Some(Entry::Value(0)));

        let lock = xa.lock();
        xas.store(&lock, None).unwrap();
        xas.set_index(0);
        let mut j = i;
        while let Some(e) = xas.find(MAX) {
            assert_eq!(e.value(), Some(mk(j)), "i {i} at {}", xas.index());
            xas.store(&lock, None).unwrap();
            j += 1;
        }
        drop(lock);
        assert_eq!(j, 2 * i + 17);
        assert!(xa.is_empty(), "i {i}\n{}", xa.dump());
        inv(&xa);
    }
}

// ---------------------------------------------------------------------
// check_insert
// ---------------------------------------------------------------------

fn insert_index(xa: &XA, i: u64) {
    xa.insert(i, Some(Entry::Value(mk(i)))).unwrap();
}

#[test]
fn insert() {
    let xa = XA::new();
    for i in 0..1024u64 {
        insert_index(&xa, i);
        assert_eq!(ld(&xa, i.wrapping_sub(1)), None);
        assert_eq!(ld(&xa, i + 1), None);
        erase_index(&xa, i);
    }
    inv(&xa);
    for i in 10..64u32 {
        let p = 1u64 << i;
        insert_index(&xa, p);
        assert_eq!(ld(&xa, p - 1), None);
        assert_eq!(ld(&xa, p + 1), None);
        inv(&xa);
        erase_index(&xa, p);

        insert_index(&xa, p - 1);
        assert_eq!(ld(&xa, p - 2), None);
        assert_eq!(ld(&xa, p), None);
        inv(&xa);
        erase_index(&xa, p - 1);
    }
    insert_index(&xa, !0);
    assert_eq!(ld(&xa, 0), None);
    assert_eq!(ld(&xa, !1), None);
    erase_index(&xa, !0);
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_cmpxchg
// ---------------------------------------------------------------------

#[test]
fn cmpxchg() {
    const FIVE: u64 = 5;
    const SIX: u64 = 6;
    const LOTS: u64 = 12345678;
    let v = |x: u64| Some(EntryRef::<B>::Value(x));
    let xa = XA::new();
    let g = kxarray::pin();
    assert!(xa.is_empty());
    assert_eq!(store_index(&xa, 12345678), None);
    assert_eq!(
        xa.insert(12345678, Some(item(1))).unwrap_err().error,
        Error::Busy
    );
    // SIX -> FIVE fails: the current entry stays LOTS
    let r = xa
        .cmpxchg(12345678, v(SIX), Some(Entry::Value(FIVE)), &g)
        .unwrap_err();
    assert_eq!(r.error, Error::Mismatch);
    assert_eq!(r.entry.and_then(|e| e.value()), Some(FIVE));
    assert_eq!(ld(&xa, 12345678), Some(LOTS));
    assert_eq!(
        ev(xa
            .cmpxchg(12345678, v(LOTS), Some(Entry::Value(FIVE)), &g)
            .unwrap()),
        Some(LOTS)
    );
    assert_eq!(
        ev(xa
            .cmpxchg(12345678, v(FIVE), Some(Entry::Value(LOTS)), &g)
            .unwrap()),
        Some(FIVE)
    );
    // at 5: FIVE -> NULL finds NULL (mismatch, nothing there)
    assert_eq!(
        xa.cmpxchg(5, v(FIVE), None, &g).unwrap_err().error,
        Error::Mismatch
    );
    assert_eq!(ld(&xa, 5), None);
    assert_eq!(
        ev(xa.cmpxchg(5, None, Some(Entry::Value(FIVE)), &g).unwrap()),
        None
    );
    assert_eq!(ld(&xa, 5), Some(FIVE));
    assert_eq!(
        xa.insert(5, Some(Entry::Value(FIVE))).unwrap_err().error,
        Error::Busy
    );
    assert_eq!(ev(xa.cmpxchg(5, v(FIVE), None, &g).unwrap()), Some(FIVE));
    xa.insert(5, Some(Entry::Value(FIVE))).unwrap();
    inv(&xa);
    erase_index(&xa, 12345678);
    erase_index(&xa, 5);
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_reserve
// ---------------------------------------------------------------------

fn check_reserve(xa: &XA, allocating: bool) {
    let g = kxarray::pin();
    // an array with a reserved entry is not empty
    assert!(xa.is_empty());
    xa.reserve(12345678).unwrap();
    assert!(!xa.is_empty());
    assert_eq!(ld(xa, 12345678), None);
    xa.release(12345678);
    assert!(xa.is_empty());
    inv(xa);

    // releasing a used entry does nothing; a store into a reserved slot
    // needs no allocation (GFP_NOWAIT)
    xa.reserve(12345678).unwrap();
    fault::fail_next_allocations(u64::MAX);
    assert_eq!(store_index(xa, 12345678), None);
    fault::fail_next_allocations(0);
    xa.release(12345678);
    erase_index(xa, 12345678);
    assert!(xa.is_empty());
    inv(xa);

    // xa_cmpxchg(XA_ZERO_ENTRY -> value) replaces the reservation without
    // allocating; cmpxchg from NULL does not match it
    xa.reserve(12345678).unwrap();
    fault::fail_next_allocations(u64::MAX);
    assert_eq!(
        xa.cmpxchg(12345678, None, Some(Entry::Value(12345678)), &g)
            .unwrap_err()
            .error,
        Error::Mismatch
    );
    xa.cmpxchg_reserved(12345678, Some(Entry::Value(12345678)))
        .unwrap();
    assert_eq!(ld(xa, 12345678), Some(12345678));
    fault::fail_next_allocations(0);
    xa.release(12345678);
    erase_index(xa, 12345678);
    assert!(xa.is_empty());
    inv(xa);

    // insert treats it as busy
    xa.reserve(12345678).unwrap();
    assert_eq!(
        xa.insert(12345678, Some(Entry::Value(12345678)))
            .unwrap_err()
            .error,
        Error::Busy
    );
    assert!(!xa.is_empty());
    assert!(xa.erase(12345678).is_none());
    assert!(xa.is_empty());
    inv(xa);

    // iteration skips a reserved entry
    store_index(xa, 5);
    xa.reserve(6).unwrap();
    store_index(xa, 7);
    let seen: Vec<u64> = xa.iter(&g).map(|(i, _)| i).collect();
    assert_eq!(seen, [5, 7]);
    inv(xa);

    // a released reservation can be allocated again
    if allocating {
        assert_eq!(xa.alloc(5..=10, Some(Entry::Value(8))).unwrap(), 8);
        xa.release(6);
        assert_eq!(xa.alloc(5..=10, Some(Entry::Value(6))).unwrap(), 6);
        inv(xa);
    }
    xa.clear();
    inv(xa);
}

#[test]
fn reserve() {
    let plain = XA::new();
    check_reserve(&plain, false);
    assert_eq!(
        plain.alloc(0..=9, None).unwrap_err().error,
        Error::NotAllocating
    );
    check_reserve(&XA::with_flags(Flags::ALLOC), true);
}

// ---------------------------------------------------------------------
// check_xa_alloc_1 / _2 / _3
// ---------------------------------------------------------------------

const LIMIT_32B: core::ops::RangeInclusive<u64> = 0..=u32::MAX as u64;

fn alloc_index(xa: &XA, i: u64) {
    assert_eq!(xa.alloc(LIMIT_32B, Some(Entry::Value(mk(i)))).unwrap(), i);
}

fn check_xa_alloc_1(xa: &XA, base: u64) {
    assert!(xa.is_empty());
    // an empty array hands out `base` first
    alloc_index(xa, base);
    // erasing it empties the array again
    erase_index(xa, base);
    assert!(xa.is_empty());
    alloc_index(xa, base);

    // allocating and erasing a lot does not lose base
    for i in base + 1..2 * CHUNK_SIZE as u64 {
        alloc_index(xa, i);
    }
    inv(xa);
    for i in base..2 * CHUNK_SIZE as u64 {
        erase_index(xa, i);
    }
    inv(xa);
    alloc_index(xa, base);

    // destroying does the same as erasing
    xa.clear();
    alloc_index(xa, base);
    alloc_index(xa, base + 1);
    erase_index(xa, base + 1);

    // storing a value marks it used
    store_index(xa, base + 1);
    alloc_index(xa, base + 2);

    // erasing base frees it
    erase_index(xa, base);
    alloc_index(xa, base);

    erase_index(xa, base + 1);
    erase_index(xa, base + 2);

    for i in 1..5000 {
        alloc_index(xa, base + i);
    }
    inv(xa);
    xa.clear();

    // failing properly at the limit
    let lim = u32::MAX as u64 - 1..=u32::MAX as u64;
    assert_eq!(
        xa.alloc(lim.clone(), Some(Entry::Value(mk(u32::MAX as u64 - 1))))
            .unwrap(),
        0xffff_fffe
    );
    assert_eq!(
        xa.alloc(lim.clone(), Some(Entry::Value(mk(u32::MAX as u64))))
            .unwrap(),
        0xffff_ffff
    );
    let r = xa.alloc(lim, Some(Entry::Value(0))).unwrap_err();
    assert_eq!(r.error, Error::Busy);
    assert_eq!(r.entry.and_then(|e| e.value()), Some(0));
    inv(xa);
    xa.clear();

    #[allow(clippy::reversed_empty_ranges)]
    let empty = 10..=5;
    assert_eq!(
        xa.alloc(empty.clone(), Some(Entry::Value(10)))
            .unwrap_err()
            .error,
        Error::Busy
    );
    assert_eq!(store_index(xa, 3), None);
    assert_eq!(
        xa.alloc(empty, Some(Entry::Value(10))).unwrap_err().error,
        Error::Busy
    );
    erase_index(xa, 3);
    assert!(xa.is_empty());
    inv(xa);
}

fn check_xa_alloc_2(xa: &XA, base: u64) {
    let g = kxarray::pin();
    // allocate and free a NULL
    assert!(xa.is_empty());
    let id = xa.alloc(LIMIT_32B, None).unwrap();
    assert_eq!(id, base);
    assert!(!xa.is_empty());
    assert!(xa.erase(id).is_none());
    assert!(xa.is_empty());

    // ditto with destroy
    let id = xa.alloc(LIMIT_32B, None).unwrap();
    assert_eq!(id, base);
    assert!(!xa.is_empty());
    xa.clear();
    assert!(xa.is_empty());

    for i in base..base + 10 {
        assert_eq!(xa.alloc(LIMIT_32B, None).unwrap(), i);
    }
    inv(xa);

    assert!(xa.store(3, Entry::Value(mk(3))).unwrap().is_none());
    assert!(xa.store(4, Entry::Value(mk(4))).unwrap().is_none());
    {
        let lock = xa.lock();
        assert_eq!(ev(lock.store(4, None).unwrap()), Some(mk(4)));
    }
    assert!(xa.erase(5).is_none());
    assert_eq!(xa.alloc(LIMIT_32B, None).unwrap(), 5);
    inv(xa);

    let present: Vec<u64> = xa.iter(&g).map(|(i, _)| i).collect();
    for index in present {
        erase_index(xa, index);
    }

    for i in base..base + 9 {
        assert!(xa.erase(i).is_none());
        assert!(!xa.is_empty());
    }
    assert!(xa.erase(8).is_none());
    assert!(!xa.is_empty());
    assert!(xa.erase(base + 9).is_none());
    assert!(xa.is_empty(), "{}", xa.dump());
    inv(xa);
    xa.clear();
}

fn check_xa_alloc_3(xa: &XA, base: u64) {
    let g = kxarray::pin();
    let limit = 1..=0x3fffu64;
    let mut next = 0u64;
    let (id, _) = xa
        .alloc_cyclic(limit.clone(), &mut next, Some(Entry::Value(mk(1))))
        .unwrap();
    assert_eq!(id, 1);

    next = 0x3ffd;
    let (id, _) = xa
        .alloc_cyclic(limit.clone(), &mut next, Some(Entry::Value(mk(0x3ffd))))
        .unwrap();
    assert_eq!(id, 0x3ffd);
    erase_index(xa, 0x3ffd);
    erase_index(xa, 1);
    assert!(xa.is_empty());

    for i in 0x3ffeu64..0x4003 {
        let v = if i < 0x4000 { mk(i) } else { mk(i - 0x3fff) };
        let (id, _) = xa
            .alloc_cyclic(limit.clone(), &mut next, Some(Entry::Value(v)))
            .unwrap();
        assert_eq!(mk(id), v, "i {i:#x}");
    }
    inv(xa);

    // wrap-around
    if base != 0 {
        erase_index(xa, base);
    }
    erase_index(xa, base + 1);
    next = u32::MAX as u64;
    let (id, _) = xa
        .alloc_cyclic(
            LIMIT_32B,
            &mut next,
            Some(Entry::Value(mk(u32::MAX as u64))),
        )
        .unwrap();
    assert_eq!(id, u32::MAX as u64);
    let (id, _) = xa
        .alloc_cyclic(LIMIT_32B, &mut next, Some(Entry::Value(mk(base))))
        .unwrap();
    assert_eq!(id, base);
    let (id, _) = xa
        .alloc_cyclic(LIMIT_32B, &mut next, Some(Entry::Value(mk(base + 1))))
        .unwrap();
    assert_eq!(id, base + 1);
    inv(xa);

    let present: Vec<u64> = xa.iter(&g).map(|(i, _)| i).collect();
    for index in present {
        erase_index(xa, index);
    }
    assert!(xa.is_empty());

    // the locked variant reports the wrap (kernel: returns 1)
    next = u32::MAX as u64;
    xa.alloc_cyclic(
        LIMIT_32B,
        &mut next,
        Some(Entry::Value(mk(u32::MAX as u64))),
    )
    .unwrap();
    {
        let lock = xa.lock();
        let (id, wrapped) = lock
            .alloc_cyclic(LIMIT_32B, &mut next, Some(Entry::Value(mk(base))))
            .unwrap();
        assert_eq!(id, base);
        assert!(wrapped);
    }
    let present: Vec<u64> = xa.iter(&g).map(|(i, _)| i).collect();
    for index in present {
        erase_index(xa, index);
    }
    assert!(xa.is_empty());
    inv(xa);
}

#[test]
fn xa_alloc() {
    let xa0 = XA::with_flags(Flags::ALLOC);
    let xa1 = XA::with_flags(Flags::ALLOC1);
    check_xa_alloc_1(&xa0, 0);
    check_xa_alloc_1(&xa1, 1);
    check_xa_alloc_2(&xa0, 0);
    check_xa_alloc_2(&xa1, 1);
    check_xa_alloc_3(&xa0, 0);
    check_xa_alloc_3(&xa1, 1);
}

// ---------------------------------------------------------------------
// check_find_1 .. _4
// ---------------------------------------------------------------------

#[test]
fn find_1() {
    let xa = XA::new();
    let g = kxarray::pin();
    assert!(xa.is_empty());
    for i in 0..100u64 {
        assert_eq!(store_index(&xa, i), None);
        xa.set_mark(i, Mark::M0);
        for j in 0..i {
            assert_eq!(store_index(&xa, j), None);
            xa.set_mark(j, Mark::M0);
            for k in 0..100u64 {
                for filter in [None, Some(Mark::M0)] {
                    let found = xa.find(k, MAX, filter, &g).map(|(idx, _)| idx);
                    if k <= j {
                        assert_eq!(found, Some(j));
                    } else if k <= i {
                        assert_eq!(found, Some(i));
                    } else {
                        assert_eq!(found, None);
                    }
                }
            }
            erase_index(&xa, j);
            assert!(!xa.get_mark(j, Mark::M0));
            assert!(xa.get_mark(i, Mark::M0));
        }
        erase_index(&xa, i);
        assert!(!xa.get_mark(i, Mark::M0));
    }
    assert!(xa.is_empty());
    inv(&xa);
}

#[test]
fn find_2() {
    let xa = XA::new();
    let g = kxarray::pin();
    assert_eq!(xa.iter(&g).count(), 0);
    // The kernel stores at its for_each variable, which stays 0 ...
    for _ in 0..1024 {
        store_index(&xa, 0);
        for (j, (index, e)) in xa.iter(&g).enumerate() {
            assert_eq!(e.value(), Some(mk(index)));
            assert_eq!(index, j as u64);
        }
    }
    xa.clear();
    // ... and the evident intent: a growing run of consecutive indices.
    for i in 0..1024u64 {
        store_index(&xa, i);
        let mut j = 0;
        for (index, e) in xa.iter(&g) {
            assert_eq!(e.value(), Some(mk(index)));
            assert_eq!(index, j);
            j += 1;
        }
        assert_eq!(j, i + 1);
    }
    inv(&xa);
    xa.clear();
    assert!(xa.is_empty());
}

#[test]
fn find_3() {
    let xa = XA::new();
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, 0);
    for i in 0..100u64 {
        for j in 0..100u64 {
            for k in 0..100u64 {
                xas.set_index(j);
                while xas.find_marked(k, Mark::M0).is_some() {}
                if j > k {
                    assert!(
                        xas.state() == CursorState::Restart,
                        "i {i} j {j} k {k}: {xas:?}"
                    );
                }
            }
        }
        store_index(&xa, i);
        xa.set_mark(i, Mark::M0);
    }
    inv(&xa);
    xa.clear();
}

#[test]
fn find_4() {
    let xa = XA::new();
    let g = kxarray::pin();
    store_index(&xa, MAX);
    let (index, e) = xa.find_after(0, MAX, None, &g).unwrap();
    assert_eq!((index, e.value()), (MAX, Some(mk(MAX))));
    assert!(xa.find_after(index, MAX, None, &g).is_none());
    erase_index(&xa, MAX);
    assert!(xa.is_empty());
}

// ---------------------------------------------------------------------
// check_move
// ---------------------------------------------------------------------

fn check_move_tiny(xa: &XA) {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, 0);
    assert!(xa.is_empty());
    assert!(xas.next().is_none());
    assert!(xas.next().is_none());
    store_index(xa, 0);
    xas.set_index(0);
    assert_eq!(ev(xas.next()), Some(0));
    assert_eq!(ev(xas.next()), None);
    xas.set_index(0);
    assert_eq!(ev(xas.prev()), Some(0));
    assert_eq!(ev(xas.prev()), None);
    erase_index(xa, 0);
    assert!(xa.is_empty());
}

fn check_move_max(xa: &XA) {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, 0);
    store_index(xa, MAX);
    assert_eq!(ev(xas.find(MAX)), Some(mk(MAX)));
    assert_eq!(ev(xas.find(MAX)), None);

    xas.set_index(0);
    assert_eq!(ev(xas.find(MAX)), Some(mk(MAX)));
    xas.pause();
    assert_eq!(ev(xas.find(MAX)), None);

    erase_index(xa, MAX);
    assert!(xa.is_empty());
}

fn check_move_small(xa: &XA, idx: u64) {
    store_index(xa, 0);
    store_index(xa, idx);
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, 0);
    let mut i = 0u64;
    while i < idx * 4 {
        let e = ev(xas.next());
        if i <= idx {
            assert!(xas.state() != CursorState::Restart);
        }
        assert_eq!(xas.index(), i, "idx {idx}");
        if i == 0 || i == idx {
            assert_eq!(e, Some(mk(i)));
        } else {
            assert_eq!(e, None, "idx {idx} i {i}");
        }
        i += 1;
    }
    xas.next();
    assert_eq!(xas.index(), i);

    loop {
        let e = ev(xas.prev());
        i -= 1;
        if i <= idx {
            assert!(xas.state() != CursorState::Restart);
        }
        assert_eq!(xas.index(), i, "idx {idx}");
        if i == 0 || i == idx {
            assert_eq!(e, Some(mk(i)));
        } else {
            assert_eq!(e, None, "idx {idx} i {i}");
        }
        if i == 0 {
            break;
        }
    }

    xas.set_index(MAX);
    assert_eq!(ev(xas.next()), None);
    assert_eq!(xas.index(), MAX);
    assert_eq!(ev(xas.next()), Some(0));
    assert_eq!(xas.index(), 0);
    assert_eq!(ev(xas.prev()), None);
    assert_eq!(xas.index(), MAX);
    drop(xas);

    erase_index(xa, 0);
    erase_index(xa, idx);
    assert!(xa.is_empty());
}

fn check_move_big(xa: &XA, n: u64, hole: (u64, u64)) {
    for i in 0..n {
        assert_eq!(store_index(xa, i), None);
    }
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, n - 1);
    let mut i = n;
    loop {
        let e = ev(xas.prev());
        i -= 1;
        assert_eq!(e, Some(mk(i)));
        assert_eq!(xas.index(), i);
        if i == 0 {
            break;
        }
    }
    assert_eq!(ev(xas.prev()), None);
    assert_eq!(xas.index(), MAX);
    loop {
        let e = ev(xas.next());
        assert_eq!(e, Some(mk(i)));
        assert_eq!(xas.index(), i);
        i += 1;
        if i >= n {
            break;
        }
    }

    for k in hole.0..hole.1 {
        erase_index(xa, k);
    }
    inv(xa);
    let in_hole = |k: u64| k >= hole.0 && k < hole.1;

    let mut i = xas.index();
    loop {
        let e = ev(xas.prev());
        i -= 1;
        if in_hole(i) {
            assert_eq!(e, None, "i {i}");
        } else {
            assert_eq!(e, Some(mk(i)), "i {i}");
        }
        assert_eq!(xas.index(), i);
        if i == 0 {
            break;
        }
    }
    assert_eq!(ev(xas.prev()), None);
    assert_eq!(xas.index(), MAX);
    loop {
        let e = ev(xas.next());
        if in_hole(i) {
            assert_eq!(e, None, "i {i}");
        } else {
            assert_eq!(e, Some(mk(i)), "i {i}");
        }
        assert_eq!(xas.index(), i);
        i += 1;
        if i >= n {
            break;
        }
    }
    drop(xas);
    xa.clear();
    assert!(xa.is_empty());
}

#[test]
fn move_() {
    let xa = XA::new();
    check_move_big(&xa, 1 << 16, (1 << 8, 1 << 15));
    check_move_tiny(&xa);
    check_move_max(&xa);
    for i in 0..16 {
        check_move_small(&xa, 1u64 << i);
    }
    for i in 2..16 {
        check_move_small(&xa, (1u64 << i) - 1);
    }
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_destroy
// ---------------------------------------------------------------------

#[test]
fn destroy() {
    let xa = XA::new();
    assert!(xa.is_empty());
    xa.clear();
    assert!(xa.is_empty());

    for index in 0..1000u64 {
        store_index(&xa, index);
        assert!(!xa.is_empty());
        xa.clear();
        assert!(xa.is_empty());
        assert_eq!(xa.node_count(), 0);
    }

    xa.store(MAX, item(1)).unwrap();
    assert!(!xa.is_empty());
    xa.clear();
    assert!(xa.is_empty());
    assert_eq!(xa.node_count(), 0);

    xa.store_order(1 << 11, 11, item(2)).unwrap();
    assert!(!xa.is_empty());
    xa.clear();
    assert!(xa.is_empty());
    assert_eq!(xa.node_count(), 0);
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_align_2 (the part that applies to typed items): a reserved slot
// takes a store without allocating
// ---------------------------------------------------------------------

#[test]
fn align_2() {
    let xa = XA::with_flags(Flags::ALLOC);
    for i in 0..8u64 {
        assert!(xa.store(0, item(i)).unwrap().is_none());
        xa.erase(0);
    }
    for i in 0..8u64 {
        xa.reserve(0).unwrap();
        fault::fail_next_allocations(u64::MAX);
        assert!(xa.store(0, item(i)).unwrap().is_none());
        fault::fail_next_allocations(0);
        xa.erase(0);
    }
    assert!(xa.is_empty());
    // and ids handed out for items start at 0 and count up
    for i in 0..8u64 {
        assert_eq!(xa.alloc(LIMIT_32B, Some(item(i))).unwrap(), i);
    }
    let g = kxarray::pin();
    assert_eq!(xa.iter(&g).filter(|(_, e)| e.item().is_some()).count(), 8);
    drop(g);
    xa.clear();
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_workingset: no update callback here, so the "shadow node" test
// (a node whose entries are all values) is read through node_counts()
// ---------------------------------------------------------------------

fn check_workingset(index: u64) {
    let xa = XA::new();
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, index);
    let is_shadow = |c: Option<(u32, u32)>| matches!(c, Some((n, v)) if n != 0 && n == v);
    {
        let lock = xa.lock();
        xas.store(&lock, Some(Entry::Value(0))).unwrap();
        xas.next();
        xas.store(&lock, Some(Entry::Value(1))).unwrap();
        assert!(is_shadow(xas.node_counts()), "{:?}", xas.node_counts());
    }
    {
        let lock = xa.lock();
        xas.next();
        xas.store(&lock, Some(item(0))).unwrap();
        assert!(!is_shadow(xas.node_counts()), "{:?}", xas.node_counts());
        xas.store(&lock, Some(Entry::Value(2))).unwrap();
        assert!(is_shadow(xas.node_counts()), "{:?}", xas.node_counts());
        assert_eq!(xas.node_counts(), Some((3, 3)));
    }
    inv(&xa);
    // shadow_remove: delete the node's entries
    for i in index..index + 3 {
        assert_eq!(xa.erase(i).and_then(|r| r.value()), Some(i - index));
    }
    assert!(xa.is_empty());
    assert_eq!(xa.node_count(), 0);
    inv(&xa);
}

#[test]
fn workingset() {
    check_workingset(0);
    check_workingset(64);
    check_workingset(4096);
}

/// Regression: a successful cmpxchg over a *value* entry used to hand the
/// value's bit pattern to the deferred item destructor, which freed a bogus
/// pointer once the epoch advanced.
#[test]
fn cmpxchg_value_is_not_freed() {
    let xa = XA::new();
    for i in 0..64u64 {
        store_index(&xa, i);
        let g = kxarray::pin();
        let old = xa
            .cmpxchg(
                i,
                Some(EntryRef::Value(mk(i))),
                Some(Entry::Value(i + 1)),
                &g,
            )
            .unwrap();
        assert_eq!(ev(old), Some(mk(i)));
        let old = xa
            .cmpxchg(i, Some(EntryRef::Value(i + 1)), None, &g)
            .unwrap();
        assert_eq!(ev(old), Some(i + 1));
    }
    // drive the epoch so every deferred destructor runs
    for _ in 0..4096 {
        kxarray::pin().flush();
    }
    assert!(xa.is_empty());
    // items replaced by cmpxchg are still dropped
    let arcs: XArray<std::sync::Arc<u64>> = XArray::new();
    let a = std::sync::Arc::new(7u64);
    arcs.store(3, Entry::Item(a.clone())).unwrap();
    {
        let g = kxarray::pin();
        let cur = arcs.load(3, &g);
        assert_eq!(std::sync::Arc::strong_count(&a), 2);
        arcs.cmpxchg(3, cur, Some(Entry::Value(1)), &g).unwrap();
    }
    // Other tests in this process may hold guards for a while and keep the
    // epoch from advancing: flush until the deferred drop runs (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::sync::Arc::strong_count(&a) != 1 && std::time::Instant::now() < deadline {
        kxarray::pin().flush();
        std::thread::yield_now();
    }
    assert_eq!(std::sync::Arc::strong_count(&a), 1);
}
