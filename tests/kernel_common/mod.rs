//! Helpers shared by the two halves of the `lib/test_xarray.c` port
//! (`tests/kernel_suite.rs`, `tests/kernel_multi.rs`): the kernel test
//! file's `xa_mk_index`, `xa_store_index`, `xa_erase_index`,
//! `xa_store_order` and friends.
#![allow(dead_code)] // each test file uses its own subset

use kxarray::{Entry, EntryRef, Error, XArray, XaState, MAX_VALUE};

pub(crate) type B = Box<u64>;
pub(crate) type XA = XArray<B>;

pub(crate) const MAX: u64 = u64::MAX;
/// What `ev` reports for an item (values never reach it: they are <= i64::MAX).
pub(crate) const ITEM: u64 = u64::MAX;

/// `xa_mk_index`: the value entry for an index.
pub(crate) fn mk(i: u64) -> u64 {
    i & MAX_VALUE
}

/// An entry as a comparable number: the value, or `ITEM` for an item.
pub(crate) fn ev(e: Option<EntryRef<'_, B>>) -> Option<u64> {
    e.map(|e| e.value().unwrap_or(ITEM))
}

pub(crate) fn ld(xa: &XA, i: u64) -> Option<u64> {
    let g = kxarray::pin();
    ev(xa.load(i, &g))
}

pub(crate) fn inv(xa: &XA) {
    xa.check_invariants()
        .unwrap_or_else(|e| panic!("{e}\n{}", xa.dump()));
}

/// `xa_store_index`: returns the old entry.
pub(crate) fn store_index(xa: &XA, i: u64) -> Option<u64> {
    xa.store(i, Entry::Value(mk(i)))
        .unwrap()
        .map(|r| r.value().unwrap_or(ITEM))
}

/// `xa_erase_index`: erase must return `mk(i)` and leave `i` empty.
pub(crate) fn erase_index(xa: &XA, i: u64) {
    let old = xa.erase(i).map(|r| r.value().unwrap_or(ITEM));
    assert_eq!(old, Some(mk(i)), "erase {i:#x}\n{}", xa.dump());
    assert_eq!(ld(xa, i), None, "load after erase {i:#x}");
}

pub(crate) fn item(v: u64) -> Entry<B> {
    Entry::Item(Box::new(v))
}

/// Store through a cursor under a fresh lock, retrying on memory shortage.
pub(crate) fn xas_store_locked<'a>(
    xas: &mut XaState<'a, B>,
    entry: Option<Entry<B>>,
) -> Option<u64> {
    let xa = xas.array();
    let mut entry = entry;
    loop {
        let lock = xa.lock();
        match xas.store(&lock, entry) {
            Ok(old) => return ev(old),
            Err(r) => {
                assert_eq!(r.error, Error::NoMemory);
                entry = r.entry;
                drop(lock);
                assert!(xas.nomem());
            }
        }
    }
}

/// The test file's `xa_store_order`: an order-`order` cursor (index rounded
/// down), lock, store, retry on memory shortage.
pub(crate) fn store_order(xa: &XA, index: u64, order: u32, entry: Option<Entry<B>>) -> Option<u64> {
    let g = kxarray::pin();
    let mut xas = XaState::with_order(xa, &g, index, order).unwrap();
    xas_store_locked(&mut xas, entry)
}
