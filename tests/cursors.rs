//! The typed cursors: `Cursor` reads, `CursorMut` writes under the lock it
//! came from, `XArray::update` runs the allocate-outside-the-lock retry,
//! and `CursorState` reports where a cursor is.

use kxarray::{fault, CursorState, Entry, Error, Mark, XArray};

#[test]
fn update_retries_outside_the_lock_then_reports_no_memory() {
    let xa: XArray<Box<u32>> = XArray::new();
    // One failure: the retry after allocating outside the lock succeeds.
    let mut runs = 0;
    fault::fail_next_allocations(1);
    let r = xa.update(1 << 30, |cur| {
        runs += 1;
        cur.store(Some(Entry::Value(5)))
            .map(|_| ())
            .map_err(|r| r.error)
    });
    fault::fail_next_allocations(0);
    assert_eq!(r, Ok(()));
    assert_eq!(runs, 2);
    assert_eq!(xa.load_value(1 << 30), Some(5));

    // Every allocation fails: NoMemory comes back and nothing changed.
    let mut runs = 0;
    fault::fail_next_allocations(u64::MAX);
    let r = xa.update(1 << 40, |cur| {
        runs += 1;
        let r = cur.store(Some(Entry::Value(6))).map(|_| ());
        assert!(matches!(cur.state(), CursorState::Error(_)) == r.is_err());
        r.map_err(|r| r.error)
    });
    fault::fail_next_allocations(0);
    assert_eq!(r, Err(Error::NoMemory));
    assert_eq!(runs, 1, "no retry once allocating outside the lock failed");
    assert_eq!(xa.load_value(1 << 40), None);
    xa.check_invariants().unwrap();
}

#[test]
fn cursor_mut_writes_what_readers_then_see() {
    let xa: XArray<Box<u32>> = XArray::new();
    {
        let lock = xa.lock();
        let mut cur = lock.cursor_mut(0);
        for i in 0..200u64 {
            cur.set_index(i * 3);
            cur.store(Some(Entry::Value(i))).unwrap();
            if i.is_multiple_of(2) {
                cur.set_mark(Mark::M0);
            }
        }
        assert_eq!(cur.state(), CursorState::Node);
    }
    xa.check_invariants().unwrap();
    let guard = kxarray::pin();
    let mut cur = xa.cursor(&guard, 0);
    let mut seen = 0;
    while let Some(e) = cur.find(u64::MAX) {
        assert_eq!(e.value(), Some(cur.index() / 3));
        assert_eq!(cur.get_mark(Mark::M0), (cur.index() / 3).is_multiple_of(2));
        seen += 1;
        cur.set_index(cur.index() + 1);
    }
    assert_eq!(seen, 200);
    assert_eq!(cur.state(), CursorState::Bounds);
}

#[test]
fn cursor_state_reports_errors_until_reset() {
    let xa: XArray<Box<u32>> = XArray::new();
    let lock = xa.lock();
    let mut cur = lock.cursor_mut(1 << 50);
    fault::fail_next_allocations(u64::MAX);
    let r = cur.store(Some(Entry::Value(1)));
    fault::fail_next_allocations(0);
    assert_eq!(r.unwrap_err().error, Error::NoMemory);
    assert_eq!(cur.state(), CursorState::Error(Error::NoMemory));
    cur.reset();
    assert_eq!(cur.state(), CursorState::Restart);
    cur.store(Some(Entry::Value(1))).unwrap();
    assert_eq!(cur.load().and_then(|e| e.value()), Some(1));
}
