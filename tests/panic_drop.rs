//! Panic safety: an item whose `Drop` panics. Items
//! are dropped when the epoch collects, which crossbeam runs inside any
//! later `pin` on any thread, so this test has a binary of its own: its
//! panics must not surface in unrelated tests.

use kxarray::{Entry, XArray};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

fn inv<T: kxarray::Item>(xa: &XArray<T>) {
    if let Err(e) = xa.check_invariants() {
        panic!("invariants: {e}\n{}", xa.dump());
    }
}

static DROPS: AtomicUsize = AtomicUsize::new(0);

/// An item whose drop panics if `explode` is set.
struct Bomb {
    id: u64,
    explode: bool,
}
impl Drop for Bomb {
    fn drop(&mut self) {
        DROPS.fetch_add(1, Ordering::SeqCst);
        if self.explode && !std::thread::panicking() {
            panic!("Bomb({}) dropped", self.id);
        }
    }
}

#[test]
fn panicking_item_drop_leaves_the_array_consistent() {
    let xa: XArray<Box<Bomb>> = XArray::new();
    let n = 300u64;
    for i in 0..n {
        let b = Box::new(Bomb {
            id: i,
            explode: true,
        });
        xa.store(i * 7, Entry::Item(b)).unwrap();
    }
    // Replace them all: the old items are dropped later, when the epoch
    // collects, which happens inside some later `pin` (in `lock`, in
    // `load_value`, ...): wherever it panics, the tree must stay whole.
    let mut panics = 0;
    for i in 0..n {
        // A collection inside `store` may panic before the store happened
        // (in `lock`'s pin) or after it (when the lock's guard unpins):
        // retry until the entry is in.
        loop {
            let r = catch_unwind(AssertUnwindSafe(|| {
                let b = Box::new(Bomb {
                    id: 1000 + i,
                    explode: false,
                });
                let _ = xa.store(i * 7, Entry::Item(b));
            }));
            panics += r.is_err() as usize;
            let done = catch_unwind(AssertUnwindSafe(|| {
                let g = kxarray::pin();
                xa.load(i * 7, &g).and_then(|e| e.item().map(|b| b.id)) == Some(1000 + i)
            }));
            match done {
                Ok(true) => break,
                Ok(false) => {}
                Err(_) => panics += 1,
            }
        }
        let r = catch_unwind(AssertUnwindSafe(|| xa.load_value(i)));
        panics += r.is_err() as usize;
    }
    for _ in 0..100_000 {
        if panics as u64 >= n {
            break;
        }
        let r = catch_unwind(|| drop(kxarray::pin()));
        panics += r.is_err() as usize;
    }
    assert!(panics > 0, "no drop panicked: the test exercised nothing");
    inv(&xa);
    let g = kxarray::pin();
    for i in 0..n {
        let e = xa.load(i * 7, &g).expect("entry lost");
        assert_eq!(e.item().unwrap().id, 1000 + i);
    }
    assert_eq!(xa.iter(&g).count(), n as usize);
    drop(g);
    // the array is still usable for writes
    xa.store(1, Entry::Value(1)).unwrap();
    inv(&xa);
    // and dropping it drops each of its items once, inline (no pin, so no
    // deferred Bomb can run in between)
    let before = DROPS.load(Ordering::SeqCst);
    drop(xa);
    assert_eq!(DROPS.load(Ordering::SeqCst) - before, n as usize);
}

#[test]
fn panicking_drop_during_array_teardown_drops_nothing_twice() {
    use std::sync::Mutex;
    static SEEN: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    struct Once(u64);
    impl Drop for Once {
        fn drop(&mut self) {
            let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
            assert!(!seen.contains(&self.0), "item {} dropped twice", self.0);
            seen.push(self.0);
            drop(seen);
            if self.0 == 40 {
                panic!("Once(40) dropped");
            }
        }
    }
    let mut xa: XArray<Box<Once>> = XArray::new();
    for i in 0..100 {
        xa.replace(i * 3, Entry::Item(Box::new(Once(i)))).unwrap();
    }
    // the `&mut` paths hand the old item back: nothing is dropped inline
    let old = xa.remove(0).unwrap();
    drop(old);
    assert_eq!(SEEN.lock().unwrap().len(), 1);
    let r = catch_unwind(AssertUnwindSafe(move || drop(xa)));
    assert!(r.is_err(), "the panicking Drop did not surface");
    let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    assert!(seen.contains(&40));
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "an item was dropped twice");
}
