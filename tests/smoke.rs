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
