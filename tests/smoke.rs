use kxarray::{Entry, Mark, XArray, XaState};

fn val(xa: &XArray<Box<u64>>, i: u64) -> Option<u64> {
    xa.load_value(i)
}

#[test]
fn basic_store_load_erase() {
    let xa: XArray<Box<u64>> = XArray::new();
    for &i in &[
        0u64,
        1,
        63,
        64,
        4095,
        4096,
        u32::MAX as u64,
        u64::MAX - 1,
        u64::MAX,
    ] {
        xa.store(i, Entry::Value(i & kxarray::MAX_VALUE)).unwrap();
        xa.check_invariants().unwrap();
        assert_eq!(val(&xa, i), Some(i & kxarray::MAX_VALUE), "index {i}");
    }
    for &i in &[
        0u64,
        1,
        63,
        64,
        4095,
        4096,
        u32::MAX as u64,
        u64::MAX - 1,
        u64::MAX,
    ] {
        assert!(xa.erase(i).is_some());
        xa.check_invariants()
            .unwrap_or_else(|e| panic!("{e}\n{}", xa.dump()));
        assert_eq!(val(&xa, i), None);
    }
    assert!(xa.is_empty());
    assert_eq!(xa.node_count(), 0);
}

#[test]
fn multi_index_and_marks() {
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_order(512, 9, Entry::Value(5)).unwrap();
    xa.check_invariants().unwrap();
    for i in 512..1024 {
        assert_eq!(val(&xa, i), Some(5));
        assert_eq!(xa.get_order(i), 9);
    }
    assert_eq!(val(&xa, 511), None);
    assert_eq!(val(&xa, 1024), None);
    xa.set_mark(700, Mark::M1);
    assert!(xa.get_mark(512, Mark::M1));
    let g = kxarray::pin();
    let v: Vec<_> = xa.iter(&g).map(|(i, _)| i).collect();
    assert_eq!(v, [512]);
    drop(g);
    xa.erase(600);
    xa.check_invariants().unwrap();
    assert!(xa.is_empty());
}

#[test]
fn cursor_walks() {
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store(5, Entry::Value(1)).unwrap();
    let g = kxarray::pin();
    let lock = xa.lock();
    let mut xas = XaState::with_order(&xa, &g, 64, 2).unwrap();
    assert!(xas.find_conflict(&lock).is_none());
    assert_eq!(xas.get_order(), 0);
    xas.store(&lock, Some(Entry::Value(9))).unwrap();
    assert_eq!(xas.walks(), 1);
    drop(lock);
    xa.check_invariants().unwrap();
    assert_eq!(val(&xa, 66), Some(9));
}

/// `store_range` over part of an existing entry stores every index of the
/// range. A block that starts on a sibling slot (or an entry that starts
/// inside a block and runs past it) is replaced whole first, as `store`
/// into any index of a multi-index entry does; the kernel's
/// `xa_store_range` stores such a block from the straddler's canonical
/// slot and leaves the rest of the range unstored.
#[test]
fn store_range_over_part_of_an_entry() {
    let vals = |xa: &XArray<Box<u64>>, r: std::ops::RangeInclusive<u64>| -> Vec<Option<u64>> {
        r.map(|i| val(xa, i)).collect()
    };
    // an order-2 entry at 4..=7, the range 6..=9 starts on its sibling
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_order(4, 2, Entry::Value(1)).unwrap();
    xa.set_mark(4, Mark::M0);
    xa.store_range(6, 9, Some(2)).unwrap();
    let two = Some(2);
    assert_eq!(
        vals(&xa, 3..=10),
        [None, two, two, two, two, two, two, None]
    );
    assert!(
        xa.get_mark(5, Mark::M0),
        "the replaced entry keeps its marks"
    );
    xa.check_invariants().unwrap();

    // entries from an earlier store_range (aligned blocks 1, 2..=3, 4..=5,
    // 6), overlapped: the block 4..=5 straddles the range start and is
    // replaced whole
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_range(1, 6, Some(1)).unwrap();
    xa.store_range(5, 10, Some(2)).unwrap();
    let one = Some(1);
    assert_eq!(
        vals(&xa, 0..=11),
        [None, one, one, one, two, two, two, two, two, two, two, None]
    );
    xa.check_invariants().unwrap();
    xa.store_range(8, 12, Some(3)).unwrap(); // 8..=12 starts inside the run 5..=10
    assert!(vals(&xa, 8..=12).iter().all(|v| *v == Some(3)));
    assert_eq!(val(&xa, 13), None);
    xa.check_invariants().unwrap();

    // an entry that starts inside the block and ends after it
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_range(8, 11, Some(1)).unwrap();
    xa.store_range(6, 9, Some(2)).unwrap();
    assert_eq!(
        vals(&xa, 5..=12),
        [None, two, two, two, two, two, two, None]
    );
    xa.check_invariants().unwrap();

    // erasing part of an entry erases it whole, and every index of the range
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_range(1, 6, Some(1)).unwrap();
    xa.store_range(9, 20, Some(4)).unwrap();
    xa.store_range(5, 10, None).unwrap();
    assert!(vals(&xa, 5..=10).iter().all(Option::is_none));
    xa.check_invariants().unwrap();
    // 4..=5 and 10..=11 were erased whole; 1..=3 and 12..=20 stay
    assert_eq!(vals(&xa, 0..=4), [None, one, one, one, None]);
    assert_eq!(val(&xa, 11), None);
    assert!(vals(&xa, 12..=20).iter().all(|v| *v == Some(4)));

    // a larger aligned entry covering the whole range: replaced whole
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_order(0, 12, Entry::Value(1)).unwrap();
    xa.store_range(100, 200, Some(2)).unwrap();
    assert_eq!(val(&xa, 150), Some(2));
    assert_eq!(val(&xa, 4095), Some(2));
    assert_eq!(val(&xa, 4096), None);
    xa.check_invariants().unwrap();
}

/// A failed node allocation inside `store_range` is retried through the
/// same cursor (`nomem` preallocates, then the step runs again), so the
/// preallocated node is used, not dropped and allocated again.
#[test]
fn store_range_retries_after_a_failed_allocation() {
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store(0, Entry::Value(0)).unwrap();
    let before = kxarray::fault::allocations();
    kxarray::fault::fail_next_allocations(1);
    xa.store_range(1000, 5000, Some(7)).unwrap();
    assert!([1000, 3000, 5000].iter().all(|&i| val(&xa, i) == Some(7)));
    assert_eq!(val(&xa, 999), None);
    assert_eq!(val(&xa, 5001), None);
    xa.check_invariants().unwrap();
    let used = kxarray::fault::allocations() - before;
    assert_eq!(
        used as usize,
        xa.node_count(),
        "the node `nomem` preallocated is the one used"
    );
}
