//! Errors are reported, never swallowed or retyped: `collect()` into an
//! `XArray` panics (as std collections do on allocation failure) instead of
//! dropping entries, `XArray::try_from_iter` hands the failure back, and
//! `AddError` keeps XArray errors other than `NoMemory` as they are. Also:
//! every public iterator and cursor helper type has a `Debug` that says
//! what it is.

use kxarray::filemap::AddError;
use kxarray::{fault, ChunkedXArray, Entry, Error, Mark, XArray, XaState};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        String::new()
    }
}

#[test]
fn collect_panics_on_no_memory_instead_of_dropping_entries() {
    // Index 1000 needs nodes; every allocation fails (the retry too).
    fault::fail_next_allocations(u64::MAX);
    let r = catch_unwind(AssertUnwindSafe(|| {
        [(0, Entry::Value(1)), (1000, Entry::Value(2))]
            .into_iter()
            .collect::<XArray<Box<u32>>>()
    }));
    fault::fail_next_allocations(0);
    let msg = panic_message(r.expect_err("collect must not drop an entry silently"));
    assert!(msg.contains("index 1000"), "{msg}");
    assert!(msg.contains("try_from_iter"), "{msg}");
}

#[test]
fn collect_panics_on_value_out_of_range() {
    let r = catch_unwind(|| {
        [(5, Entry::<Box<u32>>::Value(u64::MAX))]
            .into_iter()
            .collect::<XArray<Box<u32>>>()
    });
    let msg = panic_message(r.expect_err("an unstorable value must not vanish"));
    assert!(msg.contains("index 5"), "{msg}");
}

#[test]
fn try_from_iter_hands_back_the_failed_entry() {
    fault::fail_next_allocations(u64::MAX);
    let r = XArray::<Box<u32>>::try_from_iter([
        (0, Entry::Value(1)),
        (1000, Entry::Item(Box::new(77))),
    ]);
    fault::fail_next_allocations(0);
    let (index, rejected) = r.expect_err("allocation failed");
    assert_eq!(index, 1000);
    assert_eq!(rejected.error, Error::NoMemory);
    match rejected.entry {
        Some(Entry::Item(b)) => assert_eq!(*b, 77),
        other => panic!("entry not handed back: {:?}", other.is_some()),
    }
}

#[test]
fn try_from_iter_builds_and_later_pairs_replace_earlier_ones() {
    let xa = XArray::<Box<u32>>::try_from_iter([
        (3, Entry::Value(1)),
        (4096, Entry::Item(Box::new(9))),
        (3, Entry::Value(2)),
    ])
    .unwrap();
    assert_eq!(xa.load_value(3), Some(2));
    let guard = kxarray::pin();
    assert_eq!(*xa.load(4096, &guard).unwrap().item().unwrap(), 9);
    xa.check_invariants().unwrap();
}

#[test]
fn add_error_keeps_errors_other_than_no_memory() {
    assert_eq!(AddError::from(Error::NoMemory), AddError::NoMemory);
    assert_eq!(
        AddError::from(Error::InvalidSplit),
        AddError::Array(Error::InvalidSplit)
    );
    assert_eq!(AddError::from(Error::Busy), AddError::Array(Error::Busy));
    assert_eq!(
        AddError::from(Error::ValueOutOfRange(u64::MAX)),
        AddError::Array(Error::ValueOutOfRange(u64::MAX))
    );
    assert_eq!(
        AddError::from(Error::Misaligned { index: 3, order: 2 }),
        AddError::Misaligned { index: 3, order: 2 }
    );
    let e = AddError::from(Error::InvalidSplit);
    let src = std::error::Error::source(&e).expect("the XArray error is the source");
    assert_eq!(src.to_string(), Error::InvalidSplit.to_string());
    assert!(std::error::Error::source(&AddError::NoMemory).is_none());
}

#[test]
fn public_iterators_and_cursor_helpers_have_debug() {
    let xa: XArray<Box<u32>> = XArray::new();
    xa.store(7, Entry::Value(1)).unwrap();
    xa.set_mark(7, Mark::M0);
    let guard = kxarray::pin();

    let it = xa.range(5..=9, &guard);
    let s = format!("{it:?}");
    assert!(s.starts_with("Iter {") && s.contains("max: 9"), "{s}");

    let it = xa.iter_marked(.., Mark::M0, &guard);
    assert!(format!("{it:?}").contains("M0"), "{it:?}");

    let mut xas = XaState::new(&xa, &guard, 0);
    let ci = xas.iter(100);
    let s = format!("{ci:?}");
    assert!(
        s.starts_with("CursorIter {") && s.contains("max: 100"),
        "{s}"
    );

    let lock = xa.lock();
    let mut xas = lock.cursor(7);
    let c = xas.conflicts(&lock);
    let s = format!("{c:?}");
    assert!(s.starts_with("Conflicts {") && s.contains("cursor"), "{s}");
    drop(lock);

    let s = format!("{:?}", xa.into_iter());
    assert!(
        s.starts_with("IntoIter {") && s.contains("next: Some(0)"),
        "{s}"
    );

    let cx: ChunkedXArray<Box<u32>> = ChunkedXArray::new();
    let s = format!("{:?}", cx.range(10..20, &guard));
    assert!(s.starts_with("Iter {") && s.contains("start: 10"), "{s}");
}
