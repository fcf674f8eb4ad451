//! The multi-index half of the port of the Linux kernel's `lib/test_xarray.c`
//! (the `CONFIG_XARRAY_MULTI` tests): multi-index stores, orders, conflicts,
//! finds across multi-index entries, pause, node accounting, create_range,
//! store_range, store_iter and split. Same indices and orders as the kernel.
//!
//! Every loop runs at the kernel's size except `check_multi_store_advanced`
//! (orders 0..14 instead of 0..20: the full run, `multi_store_advanced_full`,
//! is ignored unless asked for (`-- --ignored`): it takes about a minute in
//! a debug build).
//! No analog here: `check_split_2` (`xas_try_split`) and
//! `check_create_range_3` (a cursor put into an error state by hand).

use kxarray::{Entry, EntryRef, Error, Mark, XaState, CHUNK_SHIFT};

mod kernel_common;
use kernel_common::*;

fn erase_all(xa: &XA) {
    let lock = xa.lock();
    lock.store_order(0, 63, None).unwrap();
}

// ---------------------------------------------------------------------
// check_cmpxchg_order
// ---------------------------------------------------------------------

#[test]
fn cmpxchg_order() {
    const FIVE: u64 = 5;
    let order = 3u32;
    let xa = XA::new();
    let g = kxarray::pin();

    assert_eq!(store_order(&xa, 0, order, Some(Entry::Value(FIVE))), None);
    // the order is recorded
    assert_eq!(xa.get_order(FIVE), order);
    for i in 0..1u64 << order {
        assert_eq!(ld(&xa, i), Some(FIVE));
        assert_eq!(xa.get_order(i), order);
    }
    assert_eq!(ld(&xa, 1 << order), None);

    assert_eq!(
        store_order(&xa, 1 << order, order, Some(Entry::Value(FIVE))),
        None
    );
    for i in 1u64 << order..(1 << order) + (1 << order) - 1 {
        assert_eq!(ld(&xa, i), Some(FIVE));
        assert_eq!(xa.get_order(i), order);
    }
    inv(&xa);

    // conditionally replace the entry at 0 with NULL
    let old = xa
        .cmpxchg(0, Some(EntryRef::Value(FIVE)), None, &g)
        .unwrap();
    assert_eq!(ev(old), Some(FIVE));
    inv(&xa);
    assert_eq!(xa.get_order(FIVE), 0);
    for i in 0..1u64 << order {
        assert_eq!(ld(&xa, i), None);
        assert_eq!(xa.get_order(i), 0);
    }
    for i in 1u64 << order..(1 << order) + (1 << order) - 1 {
        assert_eq!(ld(&xa, i), Some(FIVE));
        assert_eq!(xa.get_order(i), order);
    }

    store_order(&xa, 0, 63, None);
    assert!(xa.is_empty());
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_multi_store and its helpers
// ---------------------------------------------------------------------

fn head_counts(xa: &XA) -> Option<(u32, u32)> {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, 0);
    xas.load();
    xas.node_counts()
}

fn check_multi_store_1(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, index);
    let min = index & !((1u64 << order) - 1);
    let max = min + (1u64 << order);

    store_order(xa, index, order, Some(Entry::Value(mk(index))));
    inv(xa);
    assert_eq!(ld(xa, min), Some(mk(index)));
    assert_eq!(ld(xa, max - 1), Some(mk(index)));
    assert_eq!(ld(xa, max), None);
    assert_eq!(ld(xa, min.wrapping_sub(1)), None);

    // an order-0 store inside the entry replaces the whole entry
    assert_eq!(
        xas_store_locked(&mut xas, Some(Entry::Value(mk(min)))),
        Some(mk(index))
    );
    inv(xa);
    assert_eq!(ld(xa, min), Some(mk(min)));
    assert_eq!(ld(xa, max - 1), Some(mk(min)));
    assert_eq!(ld(xa, max), None);
    assert_eq!(ld(xa, min.wrapping_sub(1)), None);

    erase_index(xa, min);
    assert!(xa.is_empty());
}

fn check_multi_store_2(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, index);
    store_order(xa, index, order, Some(Entry::Value(0)));
    let lock = xa.lock();
    assert_eq!(
        ev(xas.store(&lock, Some(Entry::Value(1))).unwrap()),
        Some(0)
    );
    assert_eq!(xas.index(), index);
    assert_eq!(ev(xas.store(&lock, None).unwrap()), Some(1));
    drop(lock);
    assert!(xa.is_empty());
    inv(xa);
}

fn check_multi_store_3(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, 0);
    store_order(xa, index, order, Some(Entry::Value(mk(index))));
    let _lock = xa.lock();
    let mut n = 0;
    while let Some(e) = xas.find(MAX) {
        assert_eq!(e.value(), Some(mk(index)));
        n += 1;
    }
    assert_eq!(n, 1);
    xas.set_index(index + 1);
    while let Some(e) = xas.find(MAX) {
        assert_eq!(e.value(), Some(mk(index)));
        n += 1;
    }
    assert_eq!(n, 2, "index {index} order {order}");
    drop(_lock);
    xa.clear();
}

#[test]
fn multi_store() {
    let xa = XA::new();
    let max_order = 60u32;

    // loading from any position returns the same value
    store_order(&xa, 0, 1, Some(Entry::Value(0)));
    assert_eq!(ld(&xa, 0), Some(0));
    assert_eq!(ld(&xa, 1), Some(0));
    assert_eq!(ld(&xa, 2), None);
    assert_eq!(head_counts(&xa), Some((2, 2)));
    inv(&xa);

    // storing next to the value does not alter it
    xa.store(3, item(3)).unwrap();
    assert_eq!(ld(&xa, 0), Some(0));
    assert_eq!(ld(&xa, 1), Some(0));
    assert_eq!(ld(&xa, 2), None);
    assert_eq!(head_counts(&xa), Some((3, 2)));
    inv(&xa);

    // overwriting several indices
    store_order(&xa, 0, 2, Some(Entry::Value(1)));
    for i in 0..4 {
        assert_eq!(ld(&xa, i), Some(1));
    }
    assert_eq!(ld(&xa, 4), None);
    assert_eq!(head_counts(&xa), Some((4, 4)));
    inv(&xa);

    // erasing several values with one store
    store_order(&xa, 0, 63, None);
    assert!(xa.is_empty());

    // even when the first slot is empty but the others are not
    store_index(&xa, 1);
    store_index(&xa, 2);
    store_order(&xa, 0, 2, None);
    assert!(xa.is_empty());
    inv(&xa);

    for i in 0..max_order {
        for j in 0..max_order {
            store_order(&xa, 0, i, Some(Entry::Value(mk(i as u64))));
            store_order(&xa, 0, j, Some(Entry::Value(mk(j as u64))));
            for k in 0..max_order {
                let e = ld(&xa, (1u64 << k) - 1);
                if i < k && j < k {
                    assert_eq!(e, None, "i {i} j {j} k {k}");
                } else {
                    assert_eq!(e, Some(mk(j as u64)), "i {i} j {j} k {k}");
                }
            }
            xa.erase(0);
            assert!(xa.is_empty(), "i {i} j {j}\n{}", xa.dump());
        }
    }
    inv(&xa);

    for i in 0..20u32 {
        check_multi_store_1(&xa, 200, i);
        check_multi_store_1(&xa, 0, i);
        check_multi_store_1(&xa, (1u64 << i) + 1, i);
    }
    check_multi_store_2(&xa, 4095, 9);

    for i in 1..20u32 {
        check_multi_store_3(&xa, 0, i);
        check_multi_store_3(&xa, 1u64 << i, i);
    }
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_multi_store_advanced (page-cache mimic)
// ---------------------------------------------------------------------

const SOME_VAL: u64 = 0xdeadbeef;
const SOME_VAL_2: u64 = 0xdeaddead;
const PAGE_SHIFT: u32 = 12;

/// `__filemap_add_folio` mimic: only memory shortage may fail.
fn adv_add(xa: &XA, index: u64, order: u32, v: u64) {
    assert_eq!(index & ((1u64 << order) - 1), 0);
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, index);
    xas.set_order(index, order).unwrap();
    xas_store_locked(&mut xas, Some(item(v)));
    assert_eq!(get_entry(xa, index), Some(v));
}

/// `page_cache_delete` mimic.
fn adv_delete(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let lock = xa.lock();
    let mut xas = XaState::new(xa, &g, index);
    xas.set_order(index, order).unwrap();
    xas.store(&lock, None).unwrap();
    xas.init_marks(&lock);
}

/// `filemap_get_entry` mimic: the item's payload.
fn get_entry(xa: &XA, index: u64) -> Option<u64> {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, index);
    xas.reset();
    xas.load().map(|e| *e.item().expect("an item").get())
}

fn check_multi_store_adv(xa: &XA, pos: u64, order: u32) {
    let nrpages = 1u64 << order;
    let index = pos >> PAGE_SHIFT;
    let base = index & !(nrpages - 1);
    let next = (base + nrpages) & !(nrpages - 1);
    let next_next = (next + nrpages) & !(nrpages - 1);

    adv_add(xa, base, order, SOME_VAL);
    for i in 0..nrpages {
        assert_eq!(get_entry(xa, base + i), Some(SOME_VAL));
    }
    assert_eq!(get_entry(xa, next), None);

    // order 0 for the next item
    adv_add(xa, next, 0, SOME_VAL_2);
    assert_eq!(get_entry(xa, next), Some(SOME_VAL_2));
    adv_delete(xa, next, 0);

    // now `order` for a new item there
    adv_add(xa, next, order, SOME_VAL_2);
    for i in 0..nrpages {
        assert_eq!(get_entry(xa, next + i), Some(SOME_VAL_2));
    }
    inv(xa);
    adv_delete(xa, next, order);
    adv_delete(xa, base, order);
    assert!(xa.is_empty(), "pos {pos} order {order}\n{}", xa.dump());

    // holes at base and next_next
    adv_add(xa, next, order, SOME_VAL_2);
    for i in 0..nrpages {
        assert_eq!(get_entry(xa, base + i), None);
        assert_eq!(get_entry(xa, next + i), Some(SOME_VAL_2));
        assert_eq!(get_entry(xa, next_next + i), None);
    }
    adv_delete(xa, next, order);
    assert!(xa.is_empty());

    // holes at base and next
    adv_add(xa, next_next, order, SOME_VAL_2);
    for i in 0..nrpages {
        assert_eq!(get_entry(xa, base + i), None);
        assert_eq!(get_entry(xa, next + i), None);
        assert_eq!(get_entry(xa, next_next + i), Some(SOME_VAL_2));
    }
    adv_delete(xa, next_next, order);
    assert!(xa.is_empty());
    inv(xa);
}

fn multi_store_advanced_upto(max_order: u32) {
    let xa = XA::new();
    let end = MAX / 2;
    let mut pos = 7u64;
    let mut positions = 0;
    while pos < end {
        for i in 0..max_order {
            check_multi_store_adv(&xa, pos, i);
            check_multi_store_adv(&xa, pos + 157, i);
        }
        positions += 1;
        pos = pos.wrapping_mul(pos).wrapping_add(564);
    }
    assert_eq!(positions, 7);
}

/// Kernel: orders 0..20 ("about 117 million tests"); reduced to 0..14
/// (the full run takes about a minute in a debug build).
#[test]
fn multi_store_advanced() {
    multi_store_advanced_upto(14);
}

#[test]
#[ignore = "the kernel's full orders 0..20, about a minute in a debug build: \
            cargo test --release --test kernel_multi -- --ignored"]
fn multi_store_advanced_full() {
    multi_store_advanced_upto(20);
}

// ---------------------------------------------------------------------
// check_get_order / check_xas_get_order / check_xas_conflict_get_order
// ---------------------------------------------------------------------

#[test]
fn get_order() {
    let xa = XA::new();
    for i in 0..3 {
        assert_eq!(xa.get_order(i), 0);
    }
    for order in 0..20u32 {
        for i in 0..10u64 {
            store_order(&xa, i << order, order, Some(Entry::Value(mk(i << order))));
            for j in i << order..(i + 1) << order {
                assert_eq!(xa.get_order(j), order, "order {order} i {i} j {j}");
            }
            xa.erase(i << order);
            assert!(xa.is_empty());
        }
    }
    inv(&xa);
}

#[test]
fn xas_get_order() {
    let xa = XA::new();
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, 0);
    for order in 0..20u32 {
        for i in 0..10u64 {
            xas.set_order(i << order, order).unwrap();
            xas_store_locked(&mut xas, Some(Entry::Value(i)));
            for j in i << order..(i + 1) << order {
                xas.set_order(j, 0).unwrap();
                assert_eq!(ev(xas.load()), Some(i));
                assert_eq!(xas.get_order(), order, "order {order} i {i} j {j}");
            }
            let lock = xa.lock();
            xas.set_order(i << order, order).unwrap();
            xas.store(&lock, None).unwrap();
            drop(lock);
            assert!(xa.is_empty());
        }
    }
    inv(&xa);
}

#[test]
fn xas_conflict_get_order() {
    let xa = XA::new();
    let g = kxarray::pin();
    let mut xas = XaState::new(&xa, &g, 0);
    let max_order = 20u32;
    for order in 0..max_order {
        for i in 0..10u64 {
            xas.set_order(i << order, order).unwrap();
            xas_store_locked(&mut xas, Some(Entry::Value(i)));

            // get_order works inside the conflict loop
            let j = i << order;
            for k in 0..order {
                let mut only_once = 0;
                xas.set_order(j + (1 << k), k).unwrap();
                let lock = xa.lock();
                while let Some(e) = xas.find_conflict(&lock) {
                    assert_eq!(e.value(), Some(i));
                    assert_eq!(xas.get_order(), order, "order {order} i {i} k {k}");
                    only_once += 1;
                }
                assert_eq!(only_once, 1, "order {order} i {i} k {k}");
            }

            if order < max_order - 1 {
                let mut only_once = 0;
                xas.set_order((i & !1) << order, order + 1).unwrap();
                let lock = xa.lock();
                while let Some(e) = xas.find_conflict(&lock) {
                    assert_eq!(e.value(), Some(i));
                    assert_eq!(
                        xas.get_order(),
                        order,
                        "order {order} i {i} (order+1 range)"
                    );
                    only_once += 1;
                }
                assert_eq!(only_once, 1, "order {order} i {i} (order+1 range)");
            }

            xas.set_order(i << order, order).unwrap();
            let lock = xa.lock();
            xas.store(&lock, None).unwrap();
            drop(lock);
            assert!(xa.is_empty());
        }
    }
    inv(&xa);
}

// ---------------------------------------------------------------------
// check_multi_find_1 / _2 / _3
// ---------------------------------------------------------------------

fn check_multi_find_1(xa: &XA, order: u32) {
    let g = kxarray::pin();
    let multi = 3u64 << order;
    let next = 4u64 << order;

    store_order(xa, multi, order, Some(Entry::Value(multi)));
    assert_eq!(store_index(xa, next), None);
    assert_eq!(store_index(xa, next + 1), None);
    inv(xa);

    let (index, e) = xa.find(0, MAX, None, &g).unwrap();
    assert_eq!((index, e.value()), (multi, Some(multi)));
    let (index, e) = xa.find(multi + 1, MAX, None, &g).unwrap();
    assert_eq!(e.value(), Some(multi));
    assert!(index >= multi && index < next, "index {index}");
    let (index, e) = xa.find_after(index, MAX, None, &g).unwrap();
    assert_eq!((index, e.value()), (next, Some(next)));
    assert!(xa.find_after(index, next, None, &g).is_none());

    erase_index(xa, multi);
    erase_index(xa, next);
    erase_index(xa, next + 1);
    assert!(xa.is_empty());
}

fn check_multi_find_2(xa: &XA) {
    for i in 0..10u32 {
        let index = 1u64 << i;
        for j in 0..index {
            let g = kxarray::pin();
            let mut xas = XaState::new(xa, &g, j + index);
            store_index(xa, index - 1);
            store_order(xa, index, i, Some(Entry::Value(mk(index))));
            while xas.find(MAX).is_some() {
                erase_index(xa, index);
            }
            erase_index(xa, index - 1);
            assert!(xa.is_empty());
        }
    }
}

fn check_multi_find_3(xa: &XA) {
    let g = kxarray::pin();
    for order in 5..64u32 {
        let index = 1u64 << (order - 5);
        assert!(xa.is_empty());
        store_order(xa, 0, order - 4, Some(Entry::Value(0)));
        assert!(
            xa.find_after(index, MAX, None, &g).is_none(),
            "order {order}"
        );
        erase_index(xa, 0);
    }
}

#[test]
fn multi_find() {
    let xa = XA::new();
    for i in 2..10 {
        check_multi_find_1(&xa, i);
    }
    check_multi_find_2(&xa);
    check_multi_find_3(&xa);
    inv(&xa);
}

// ---------------------------------------------------------------------
// xa_find_entry / check_find_entry (mm/shmem.c's find_swap_entry)
// ---------------------------------------------------------------------

/// The index of the first entry equal to value `item` (None: never
/// matches), pausing every 4th mismatch; `u64::MAX` (-1) if not found.
fn find_entry(xa: &XA, item: Option<u64>) -> u64 {
    let g = kxarray::pin();
    let mut xas = XaState::new(xa, &g, 0);
    let mut checked = 0u32;
    while let Some(e) = xas.find(MAX) {
        if item.is_some() && e.value() == item {
            return xas.index();
        }
        checked += 1;
        if !checked.is_multiple_of(4) {
            continue;
        }
        xas.pause();
    }
    MAX
}

#[test]
fn find_entry_() {
    let xa = XA::new();
    for order in 0..20u32 {
        let mut offset = 0u64;
        while offset < 1u64 << (order + 3) {
            let mut index = 0u64;
            while index < 1u64 << (order + 5) {
                store_order(&xa, index, order, Some(Entry::Value(mk(index))));
                assert_eq!(ld(&xa, index), Some(mk(index)));
                assert_eq!(
                    find_entry(&xa, Some(mk(index))),
                    index,
                    "order {order} index {index}"
                );
                index += 1 << order;
            }
            assert_eq!(find_entry(&xa, None), MAX);
            inv(&xa);
            xa.clear();
            offset += 1 << order;
        }
    }

    assert_eq!(find_entry(&xa, None), MAX);
    store_index(&xa, MAX);
    assert_eq!(find_entry(&xa, None), MAX);
    assert_eq!(find_entry(&xa, Some(mk(MAX))), MAX); // found, at -1
    erase_index(&xa, MAX);
    assert!(xa.is_empty());
}

// ---------------------------------------------------------------------
// check_pause
// ---------------------------------------------------------------------

#[test]
fn pause() {
    let xa = XA::new();
    let g = kxarray::pin();
    let order_limit = 64u32;

    let mut index = 1u64;
    for order in 0..order_limit {
        assert_eq!(
            store_order(&xa, index, order, Some(Entry::Value(mk(index)))),
            None
        );
        index = index.wrapping_add(1u64 << order);
    }
    inv(&xa);

    let mut xas = XaState::new(&xa, &g, 0);
    let mut count = 0u32;
    while let Some(e) = xas.find(MAX) {
        assert_eq!(e.value(), Some(mk(1u64 << count)));
        count += 1;
    }
    assert_eq!(count, order_limit);

    count = 0;
    xas.set_index(0);
    while let Some(e) = xas.find(MAX) {
        assert_eq!(e.value(), Some(mk(1u64 << count)));
        count += 1;
        xas.pause();
    }
    assert_eq!(count, order_limit);
    drop(xas);
    xa.clear();

    let mut index = 0u64;
    for order in (0..order_limit).rev() {
        assert_eq!(
            store_order(&xa, index, order, Some(Entry::Value(mk(index)))),
            None
        );
        index = index.wrapping_add(1u64 << order);
    }
    inv(&xa);

    let mut xas = XaState::new(&xa, &g, 0);
    let mut index = 0u64;
    count = 0;
    while let Some(e) = xas.find(MAX) {
        assert_eq!(e.value(), Some(mk(index)));
        index = index.wrapping_add(1u64 << (order_limit - count - 1));
        count += 1;
    }
    assert_eq!(count, order_limit);

    // unaligned start
    index = 0;
    count = 0;
    xas.set_index(1 % (1u64 << (order_limit - 1)));
    while let Some(e) = xas.find(MAX) {
        assert_eq!(e.value(), Some(mk(index)));
        index = index.wrapping_add(1u64 << (order_limit - count - 1));
        count += 1;
        xas.pause();
    }
    assert_eq!(count, order_limit);
    drop(xas);
    xa.clear();
    assert!(xa.is_empty());
}

// ---------------------------------------------------------------------
// check_account
// ---------------------------------------------------------------------

#[test]
fn account() {
    let xa = XA::new();
    for order in 1..12u32 {
        let g = kxarray::pin();
        let mut xas = XaState::new(&xa, &g, 1 << order);

        store_order(&xa, 0, order, Some(item(order as u64)));
        xas.load();
        let (count, values) = xas.node_counts().expect("in a node");
        assert!(count != 0);
        assert!(count as u64 <= 1u64 << order);
        assert_eq!(values, 0);

        store_order(&xa, 1 << order, order, Some(Entry::Value(mk(1 << order))));
        let (count, values) = xas.node_counts().unwrap();
        assert_eq!(count, values * 2, "order {order}");
        inv(&xa);

        xa.erase(1 << order);
        assert_eq!(xas.node_counts().unwrap().1, 0);

        xa.erase(0);
        assert!(xa.is_empty());
        inv(&xa);
    }
}

// ---------------------------------------------------------------------
// check_create_range
// ---------------------------------------------------------------------

fn store_many_order(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::with_order(xa, &g, index, order).unwrap();
    loop {
        let lock = xa.lock();
        assert!(xas.find_conflict(&lock).is_none());
        match xas.create_range(&lock) {
            Ok(()) => {
                for i in 0..1u64 << order {
                    let old = xas.store(&lock, Some(Entry::Value(mk(index + i)))).unwrap();
                    assert!(old.is_none());
                    xas.next();
                }
                return;
            }
            Err(e) => {
                assert_eq!(e, Error::NoMemory);
                drop(lock);
                assert!(xas.nomem());
            }
        }
    }
}

fn check_create_range_1(xa: &XA, index: u64, order: u32) {
    store_many_order(xa, index, order);
    inv(xa);
    for i in index..index + (1u64 << order) {
        erase_index(xa, i);
    }
    assert!(xa.is_empty());
}

fn check_create_range_2(xa: &XA, order: u32) {
    let nr = 1u64 << order;
    let mut i = 0;
    while i < nr * nr {
        store_many_order(xa, i, order);
        i += nr;
    }
    inv(xa);
    for i in 0..nr * nr {
        erase_index(xa, i);
    }
    assert!(xa.is_empty());
}

fn check_create_range_4(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::with_order(xa, &g, index, order).unwrap();
    let base = xas.index();
    store_index(xa, index);
    loop {
        let lock = xa.lock();
        match xas.create_range(&lock) {
            Ok(()) => {
                for i in 0..1u64 << order {
                    let old = ev(xas.store(&lock, Some(Entry::Value(mk(base + i)))).unwrap());
                    if xas.index() == index {
                        assert_eq!(old, Some(mk(base + i)));
                    } else {
                        assert_eq!(old, None, "index {index} order {order} at {}", xas.index());
                    }
                    xas.next();
                }
                break;
            }
            Err(e) => {
                assert_eq!(e, Error::NoMemory);
                drop(lock);
                assert!(xas.nomem());
            }
        }
    }
    inv(xa);
    for i in base..base + (1u64 << order) {
        erase_index(xa, i);
    }
    assert!(xa.is_empty());
}

fn check_create_range_5(xa: &XA, index: u64, order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::with_order(xa, &g, index, order).unwrap();
    store_order(xa, index, order, Some(Entry::Value(mk(index))));
    for _ in 0..order + 10 {
        loop {
            let lock = xa.lock();
            match xas.create_range(&lock) {
                Ok(()) => break,
                Err(e) => {
                    assert_eq!(e, Error::NoMemory);
                    drop(lock);
                    assert!(xas.nomem());
                }
            }
        }
    }
    inv(xa);
    assert_eq!(ld(xa, index), Some(mk(index)));
    xa.clear();
    assert_eq!(xa.node_count(), 0);
}

#[test]
fn create_range() {
    let xa = XA::new();
    for order in 0..12u32 {
        check_create_range_1(&xa, 0, order);
        check_create_range_1(&xa, 1 << order, order);
        check_create_range_1(&xa, 2 << order, order);
        check_create_range_1(&xa, 3 << order, order);
        check_create_range_1(&xa, 1 << 24, order);
        if order < 10 {
            check_create_range_2(&xa, order);
        }

        check_create_range_4(&xa, 0, order);
        check_create_range_4(&xa, 1 << order, order);
        check_create_range_4(&xa, 2 << order, order);
        check_create_range_4(&xa, 3 << order, order);
        check_create_range_4(&xa, 1 << 24, order);

        check_create_range_4(&xa, 1, order);
        check_create_range_4(&xa, (1 << order) + 1, order);
        check_create_range_4(&xa, (2 << order) + 1, order);
        check_create_range_4(&xa, (2 << order) - 1, order);
        check_create_range_4(&xa, (3 << order) + 1, order);
        check_create_range_4(&xa, (3 << order) - 1, order);
        check_create_range_4(&xa, (1 << 24) + 1, order);

        check_create_range_5(&xa, 0, order);
        check_create_range_5(&xa, 1 << order, order);
    }
    // check_create_range_3 (a cursor already in an error state stays in it)
    // has no analog: the Rust cursor's error state cannot be set by hand.
}

// ---------------------------------------------------------------------
// check_store_range
// ---------------------------------------------------------------------

fn check_store_range_1(xa: &XA, first: u64, last: u64) {
    xa.store_range(first, last, Some(mk(first))).unwrap();
    assert_eq!(ld(xa, first), Some(mk(first)));
    assert_eq!(ld(xa, last), Some(mk(first)));
    assert_eq!(ld(xa, first.wrapping_sub(1)), None);
    assert_eq!(ld(xa, last + 1), None);
    xa.store_range(first, last, None).unwrap();
    assert!(xa.is_empty(), "{first}..={last}\n{}", xa.dump());
}

fn store_range_upto(n: u64, step: usize) {
    let xa = XA::new();
    for i in 0..n {
        for j in (i..n).step_by(step) {
            for base in [0u64, 128, 4095, 4096, 123456, 1 << 24] {
                check_store_range_1(&xa, base + i, base + j);
            }
        }
        inv(&xa);
    }
}

/// Kernel: 0 <= i <= j < 128 at each base (about a second in debug).
#[test]
fn store_range() {
    store_range_upto(128, 1);
}

// ---------------------------------------------------------------------
// __check_store_iter / check_store_iter
// ---------------------------------------------------------------------

fn check_store_iter_1(xa: &XA, start: u64, order: u32, present: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::with_order(xa, &g, start, order).unwrap();
    let mut count;
    loop {
        count = 0;
        let lock = xa.lock();
        for e in xas.conflicts(&lock) {
            let v = e.value().expect("a value entry");
            assert!(v >= mk(start));
            assert!(v <= mk(start + (1u64 << order) - 1));
            count += 1;
        }
        match xas.store(&lock, Some(Entry::Value(mk(start)))) {
            Ok(_) => break,
            Err(r) => {
                assert_eq!(r.error, Error::NoMemory);
                drop(lock);
                assert!(xas.nomem());
            }
        }
    }
    assert_eq!(count, present, "start {start} order {order}");
    assert_eq!(ld(xa, start), Some(mk(start)));
    assert_eq!(ld(xa, start + (1u64 << order) - 1), Some(mk(start)));
    erase_index(xa, start);
}

fn store_iter_upto(max_order: u32) {
    let xa = XA::new();
    for i in 0..max_order {
        let min = 1u64 << i;
        let max = (2u64 << i) - 1;
        check_store_iter_1(&xa, 0, i, 0);
        assert!(xa.is_empty());
        check_store_iter_1(&xa, min, i, 0);
        assert!(xa.is_empty());

        store_index(&xa, min);
        check_store_iter_1(&xa, min, i, 1);
        assert!(xa.is_empty());
        store_index(&xa, max);
        check_store_iter_1(&xa, min, i, 1);
        assert!(xa.is_empty());

        for j in 0..min {
            store_index(&xa, j);
        }
        check_store_iter_1(&xa, 0, i, min as u32);
        assert!(xa.is_empty());
        for j in 0..min {
            store_index(&xa, min + j);
        }
        check_store_iter_1(&xa, min, i, min as u32);
        assert!(xa.is_empty());
        inv(&xa);
    }
    store_index(&xa, 63);
    store_index(&xa, 65);
    check_store_iter_1(&xa, 64, 2, 1);
    erase_index(&xa, 63);
    assert!(xa.is_empty());
    inv(&xa);
}

/// Kernel: orders 0..20 (about 3 s in a debug build).
#[test]
fn store_iter() {
    store_iter_upto(20);
}

// ---------------------------------------------------------------------
// check_split_1 (xas_split_alloc + xas_split). The kernel splits an entry
// holding a pointer; this crate splits value entries (an item has one
// owner), so the entry is a value here.
// ---------------------------------------------------------------------

const SPLIT_VAL: u64 = 0x5a5a;

fn check_split_1(xa: &XA, index: u64, order: u32, new_order: u32) {
    let g = kxarray::pin();
    let mut xas = XaState::with_order(xa, &g, index, new_order).unwrap();

    store_order(xa, index, order, Some(Entry::Value(SPLIT_VAL)));
    xa.set_mark(index, Mark::M1);

    xas.split_alloc(SPLIT_VAL, order).unwrap();
    {
        let lock = xa.lock();
        xas.split(&lock, SPLIT_VAL, order)
            .unwrap_or_else(|e| panic!("split {index} {order}->{new_order}: {e}"));
        let mut i = 0u64;
        while i < 1u64 << order {
            xas.set_order(index + i, new_order).unwrap();
            // split_alloc + split made every node: no allocation here
            xas.store(&lock, Some(Entry::Value(mk(index + i))))
                .unwrap_or_else(|r| panic!("store after split: {}", r.error));
            i += 1 << new_order;
        }
    }
    // Like the kernel's xas_split, a split does not shrink the tree: an
    // order-k*CHUNK_SHIFT entry at index 0 sits alone in slot 0 of the top
    // node, and splitting it leaves that top node holding only a child in
    // slot 0 (the next erase shrinks it). check_invariants calls that "not
    // minimal"; accept exactly that case here.
    if let Err(e) = xa.check_invariants() {
        assert!(
            index == 0 && e.starts_with("tree not minimal"),
            "{e}\n{}",
            xa.dump()
        );
    }

    for i in 0..1u64 << order {
        let val = index + (i & !((1u64 << new_order) - 1));
        assert_eq!(
            ld(xa, index + i),
            Some(mk(val)),
            "index {index} order {order}->{new_order} i {i}"
        );
    }

    xa.set_mark(index, Mark::M0);
    assert!(xa.get_mark(index, Mark::M0));

    xas.set_order(index, 0).unwrap();
    let mut found = 0u64;
    while xas.find_marked(MAX, Mark::M1).is_some() {
        found += 1;
    }
    assert_eq!(
        found,
        1 << (order - new_order),
        "index {index} order {order}->{new_order}"
    );

    let mut i = 0u64;
    while i < 1u64 << order {
        xa.erase(index + i);
        i += 1 << new_order;
    }
    assert!(xa.is_empty(), "{}", xa.dump());
    inv(xa);
    xa.clear();
}

#[test]
fn split() {
    let xa = XA::new();
    assert!(xa.is_empty());
    for order in 1..2 * CHUNK_SHIFT {
        for new_order in 0..order {
            check_split_1(&xa, 0, order, new_order);
            check_split_1(&xa, 1 << order, order, new_order);
            check_split_1(&xa, 3 << order, order, new_order);
        }
    }
    // check_split_2 (xas_try_split) has no analog in this crate.
}

/// The revalidation the 6.10 page cache relies on: a preallocation made for
/// one entry/order is refused for another and the array is left unchanged.
#[test]
fn split_revalidates() {
    let xa = XA::new();
    let g = kxarray::pin();
    let order = CHUNK_SHIFT + 1;
    store_order(&xa, 0, order, Some(Entry::Value(1)));
    let mut xas = XaState::with_order(&xa, &g, 0, 0).unwrap();
    xas.split_alloc(1, order).unwrap();
    // the entry changes between the unlocked allocation and the split
    store_order(&xa, 0, order, Some(Entry::Value(2)));
    {
        let lock = xa.lock();
        assert_eq!(xas.split(&lock, 1, order), Err(Error::InvalidSplit));
    }
    assert_eq!(xas.preallocated(), 0);
    for i in 0..1u64 << order {
        assert_eq!(ld(&xa, i), Some(2));
    }
    assert_eq!(xa.get_order(0), order);
    inv(&xa);
    erase_all(&xa);
    assert!(xa.is_empty());
}
