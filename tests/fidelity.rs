//! Regression tests for kernel fidelity and contract breaks: cmpxchg's raw comparison and range checks, erasing
//! through cmpxchg on allocating arrays, alloc_cyclic's array-wide wrap flag
//! and 32-bit wrap, the read-only page-cache array, and loom models that
//! honour `LOOM_MAX_PREEMPTIONS`.
//!
//! Each test failed on the code before these fixes (commit 98b4317), either
//! at run time or, where the fix adds an API (`cmpxchg_reserved`, `XaView`),
//! by not compiling.

use kxarray::filemap::{AddressSpace, Folio, Shadow, ShadowFields};
use kxarray::{Entry, EntryRef, Error, Flags, XArray, XaState, XaView, MAX_VALUE};
use std::sync::Arc;

type Xa = XArray<Box<u64>>;

const TOO_BIG: u64 = 1 << 63;

fn inv<T: kxarray::Item>(xa: &XArray<T>) {
    xa.check_invariants().unwrap_or_else(|e| panic!("{e}"));
}

// ---------------------------------------------------------------------
// cmpxchg: `old` is range-checked (section 3)
// ---------------------------------------------------------------------

/// `EntryRef::Value(1 << 63)` used to encode to the same entry as
/// `Value(0)` (release) or panic (debug); it is a typed error now, on the
/// array and on the lock, with `new` handed back and nothing changed.
#[test]
fn cmpxchg_old_value_out_of_range_is_a_typed_error() {
    let xa = Xa::new();
    let g = kxarray::pin();
    xa.store(1, Entry::Value(0)).unwrap();
    let r = xa
        .cmpxchg(1, Some(EntryRef::Value(TOO_BIG)), Some(Entry::Value(5)), &g)
        .unwrap_err();
    assert_eq!(r.error, Error::ValueOutOfRange(TOO_BIG));
    assert_eq!(r.entry.and_then(|e| e.value()), Some(5));
    assert_eq!(xa.load_value(1), Some(0));

    let lock = xa.lock();
    let r = lock
        .cmpxchg(1, Some(EntryRef::Value(u64::MAX)), None)
        .unwrap_err();
    assert_eq!(r.error, Error::ValueOutOfRange(u64::MAX));
    drop(lock);
    assert_eq!(xa.load_value(1), Some(0));
    // the largest valid value still compares normally
    xa.store(2, Entry::Value(MAX_VALUE)).unwrap();
    let old = xa
        .cmpxchg(2, Some(EntryRef::Value(MAX_VALUE)), None, &g)
        .unwrap();
    assert_eq!(old.and_then(|e| e.value()), Some(MAX_VALUE));
    assert_eq!(xa.load_value(2), None);
    inv(&xa);
}

/// Every API taking a value refuses one above `MAX_VALUE` with
/// `ValueOutOfRange`, hands the entry back, and leaves the array unchanged.
#[test]
fn out_of_range_values_are_typed_errors_everywhere() {
    let bad = || Entry::<Box<u64>>::Value(TOO_BIG);
    let want = Error::ValueOutOfRange(TOO_BIG);
    let back = |e: Option<Entry<Box<u64>>>| e.and_then(|e| e.value());
    let g = kxarray::pin();

    let mut xa = Xa::new();
    xa.store(0, Entry::Value(1)).unwrap();
    let r = xa.store(1, bad()).unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
    let r = xa.store_order(64, 6, bad()).unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
    let r = xa.insert(1, Some(bad())).unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
    let r = xa.cmpxchg(1, None, Some(bad()), &g).unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
    assert_eq!(xa.store_range(5, 9, Some(TOO_BIG)), Err(want));
    {
        let lock = xa.lock();
        let r = lock.store(1, Some(bad())).unwrap_err();
        assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
        let r = lock.store_order(64, 6, Some(bad())).unwrap_err();
        assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
        let r = lock.insert(1, Some(bad())).unwrap_err();
        assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
        assert_eq!(lock.store_range(5, 9, Some(TOO_BIG)), Err(want));
        let mut xas = XaState::new(&xa, &g, 1);
        let r = xas.store(&lock, Some(bad())).unwrap_err();
        assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
        let mut xas = XaState::with_order(&xa, &g, 0, 0).unwrap();
        assert_eq!(xas.split_alloc(TOO_BIG, 6), Err(want));
        assert_eq!(xas.try_split_alloc(TOO_BIG, 6).unwrap_err(), want);
    }
    assert_eq!(xa.cmpxchg_reserved(1, Some(bad())).unwrap_err().error, want);
    let r = xa.replace(1, bad()).unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));

    let ids = Xa::with_flags(Flags::ALLOC);
    let r = ids.alloc(0..=10, Some(bad())).unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
    let mut next = 0;
    let r = ids
        .alloc_cyclic(0..=10, &mut next, Some(bad()))
        .unwrap_err();
    assert_eq!((r.error, back(r.entry)), (want, Some(TOO_BIG)));
    assert!(ids.is_empty());

    let g = kxarray::pin();
    let all: Vec<(u64, Option<u64>)> = xa.iter(&g).map(|(i, e)| (i, e.value())).collect();
    assert_eq!(all, [(0, Some(1))]);
    inv(&xa);
}

// ---------------------------------------------------------------------
// cmpxchg compares the raw entry (section 4)
// ---------------------------------------------------------------------

/// After `reserve(10)`, `cmpxchg(10, None, v)` used to store `v`: the kernel
/// compares against the raw entry, and NULL is not XA_ZERO_ENTRY.
#[test]
fn cmpxchg_none_does_not_match_a_reservation() {
    let xa = Xa::new();
    let g = kxarray::pin();
    xa.reserve(10).unwrap();
    let r = xa.cmpxchg(10, None, Some(Entry::Value(7)), &g).unwrap_err();
    assert_eq!(r.error, Error::Mismatch);
    assert_eq!(r.entry.and_then(|e| e.value()), Some(7));
    assert_eq!(xa.load_value(10), None);
    // still reserved: the array is not empty and insert finds it busy
    assert!(!xa.is_empty());
    assert_eq!(
        xa.insert(10, Some(Entry::Value(1))).unwrap_err().error,
        Error::Busy
    );
    // (None -> None) on a reservation does not match either: it stays
    assert_eq!(
        xa.cmpxchg(10, None, None, &g).unwrap_err().error,
        Error::Mismatch
    );
    assert!(!xa.is_empty());
    // the same through the lock
    {
        let lock = xa.lock();
        let r = lock.cmpxchg(10, None, Some(Entry::Value(7))).unwrap_err();
        assert_eq!(r.error, Error::Mismatch);
    }
    // an empty index still matches None
    assert!(xa
        .cmpxchg(11, None, Some(Entry::Value(3)), &g)
        .unwrap()
        .is_none());
    assert_eq!(xa.load_value(11), Some(3));
    inv(&xa);
}

/// The kernel's `xa_cmpxchg(xa, i, XA_ZERO_ENTRY, v)`: replaces a
/// reservation only, and stores nothing on an empty or occupied index.
#[test]
fn cmpxchg_reserved_matches_only_a_reservation() {
    let xa = Xa::new();
    assert_eq!(
        xa.cmpxchg_reserved(4, Some(Entry::Value(9)))
            .unwrap_err()
            .error,
        Error::Mismatch
    );
    assert!(xa.is_empty(), "nothing stored on an empty index");
    xa.store(5, Entry::Value(1)).unwrap();
    let r = xa.cmpxchg_reserved(5, Some(Entry::Value(9))).unwrap_err();
    assert_eq!(
        (r.error, r.entry.and_then(|e| e.value())),
        (Error::Mismatch, Some(9))
    );
    assert_eq!(xa.load_value(5), Some(1));

    xa.reserve(4).unwrap();
    // a store over a reservation needs no allocation (as the kernel's
    // GFP_NOWAIT cmpxchg in check_reserve)
    kxarray::fault::fail_next_allocations(u64::MAX);
    let r = xa.cmpxchg_reserved(4, Some(Entry::Value(9)));
    kxarray::fault::fail_next_allocations(0);
    r.unwrap();
    assert_eq!(xa.load_value(4), Some(9));
    // None releases the reservation
    xa.reserve(6).unwrap();
    xa.lock().cmpxchg_reserved(6, None).unwrap();
    xa.erase(4);
    xa.erase(5);
    assert!(xa.is_empty());
    inv(&xa);
}

/// On allocating arrays `cmpxchg(i, Some(old), None)` erases, as the kernel
/// does (it used to leave a reservation, so a later `alloc` skipped `i`),
/// and `cmpxchg(i, None, None)` does not reserve.
#[test]
fn cmpxchg_to_none_erases_on_allocating_arrays() {
    for flags in [Flags::ALLOC, Flags::ALLOC1] {
        let base = if flags == Flags::ALLOC { 0 } else { 1 };
        let ids = Xa::with_flags(flags);
        let g = kxarray::pin();
        let id = ids.alloc(0..=100, Some(Entry::Value(42))).unwrap();
        assert_eq!(id, base);
        let old = ids
            .cmpxchg(id, Some(EntryRef::Value(42)), None, &g)
            .unwrap();
        assert_eq!(old.and_then(|e| e.value()), Some(42));
        assert!(ids.is_empty(), "{flags:?}: erased, not reserved");
        assert_eq!(
            ids.alloc(0..=100, None).unwrap(),
            base,
            "{flags:?}: id free again"
        );
        ids.erase(base);

        // an item, through the lock
        let id = ids.alloc(0..=100, Some(Entry::Item(Box::new(7)))).unwrap();
        {
            let lock = ids.lock();
            let cur = lock.load(id);
            let old = lock.cmpxchg(id, cur, None).unwrap();
            assert_eq!(old.and_then(|e| e.item()).map(|r| *r), Some(7));
        }
        assert!(ids.is_empty());

        // (None -> None) on an empty index stores nothing
        ids.cmpxchg(3, None, None, &g).unwrap();
        assert!(ids.is_empty(), "{flags:?}: no reservation left at 3");
        assert_eq!(ids.alloc(0..=100, None).unwrap(), base);
        inv(&ids);
    }
}

// ---------------------------------------------------------------------
// alloc_cyclic (section 4)
// ---------------------------------------------------------------------

const LIMIT_32B: std::ops::RangeInclusive<u64> = 0..=u32::MAX as u64;

/// A 32-bit range wraps `next` to 0 after `u32::MAX`, as the kernel's u32
/// does, and the next allocation reports the wrap.
#[test]
fn alloc_cyclic_32bit_range_wraps_next_to_zero() {
    for (flags, base) in [(Flags::ALLOC, 0u64), (Flags::ALLOC1, 1)] {
        let ids = Xa::with_flags(flags);
        let mut next = u32::MAX as u64;
        let r = ids.alloc_cyclic(LIMIT_32B, &mut next, None).unwrap();
        assert_eq!(r, (u32::MAX as u64, false));
        assert_eq!(next, 0, "{flags:?}: next wraps like the kernel's u32");
        let r = ids.alloc_cyclic(LIMIT_32B, &mut next, None).unwrap();
        assert_eq!(r, (base, true), "{flags:?}: the wrap is reported");
        assert_eq!(next, base + 1);
        let r = ids.alloc_cyclic(LIMIT_32B, &mut next, None).unwrap();
        assert_eq!(r, (base + 1, false), "{flags:?}: reported once");
        inv(&ids);
    }
    // a smaller range wraps through the search, as before
    let ids = Xa::with_flags(Flags::ALLOC1);
    let mut next = 0x3fff;
    assert_eq!(
        ids.alloc_cyclic(1..=0x3fff, &mut next, None).unwrap(),
        (0x3fff, false)
    );
    assert_eq!(next, 0x4000);
    assert_eq!(
        ids.alloc_cyclic(1..=0x3fff, &mut next, None).unwrap(),
        (1, true)
    );
}

/// The wrap flag is the array's (`XA_FLAGS_ALLOC_WRAPPED`): the allocation
/// after the one that wrapped reports it even through another `next`.
#[test]
fn alloc_cyclic_wrap_flag_belongs_to_the_array() {
    let ids = Xa::with_flags(Flags::ALLOC);
    let mut next_a = u32::MAX as u64;
    let mut next_b = 5;
    assert_eq!(
        ids.alloc_cyclic(LIMIT_32B, &mut next_a, None).unwrap(),
        (u32::MAX as u64, false)
    );
    assert_eq!(
        ids.alloc_cyclic(LIMIT_32B, &mut next_b, None).unwrap(),
        (5, true),
        "the array's flag reports the earlier wrap"
    );
    assert_eq!(
        ids.alloc_cyclic(LIMIT_32B, &mut next_b, None).unwrap(),
        (6, false)
    );
    // a plain alloc neither sets nor clears it
    let mut next_c = u32::MAX as u64 - 1;
    ids.alloc_cyclic(LIMIT_32B, &mut next_c, None).unwrap();
    assert_eq!(next_c, u32::MAX as u64);
    ids.erase(u32::MAX as u64);
    ids.alloc_cyclic(LIMIT_32B, &mut next_c, None).unwrap();
    assert_eq!(next_c, 0);
    ids.alloc(0..=100, None).unwrap();
    let (_, wrapped) = ids.alloc_cyclic(LIMIT_32B, &mut next_c, None).unwrap();
    assert!(wrapped);
    // 64-bit ranges wrap after u64::MAX the same way
    let wide = Xa::with_flags(Flags::ALLOC);
    let mut next = u64::MAX;
    assert_eq!(
        wide.alloc_cyclic(0..=u64::MAX, &mut next, None).unwrap(),
        (u64::MAX, false)
    );
    assert_eq!(next, 0);
    assert_eq!(
        wide.alloc_cyclic(0..=u64::MAX, &mut next, None).unwrap(),
        (0, true)
    );
    inv(&ids);
    inv(&wide);
}

// ---------------------------------------------------------------------
// AddressSpace::pages() is read-only (section 3)
// ---------------------------------------------------------------------

/// `pages()` used to hand out `&XArray`, so a direct `store_order` made
/// `nr_shadow_pages()` wrap to `u64::MAX` on the next `add_folio` (the
/// write itself is now rejected at compile time: see the `compile_fail`
/// example on `AddressSpace::pages`). What remains is a view with every read,
/// and the counters match the tree after a workload with shadows.
#[test]
fn pages_is_a_read_only_view_and_counters_match_the_tree() {
    let m = AddressSpace::new();
    let shadow = |n| {
        Shadow::pack(ShadowFields {
            eviction: n,
            ..Default::default()
        })
        .unwrap()
    };
    let f = Arc::new(Folio::new(512, 9).unwrap());
    m.add_folio(&f).unwrap();
    assert!(m.remove_folio(&f, Some(shadow(1))));
    let small = Arc::new(Folio::new(700, 2).unwrap());
    assert_eq!(m.add_folio(&small).unwrap(), Some(shadow(1)));
    let other = Arc::new(Folio::new(4, 2).unwrap());
    m.add_folio(&other).unwrap();
    assert!(m.remove_folio(&other, Some(shadow(2))));

    let pages: XaView<'_, Arc<Folio>> = m.pages();
    let g = kxarray::pin();
    let (mut folio_pages, mut shadow_pages) = (0u64, 0u64);
    for (i, e) in pages.iter(&g) {
        let n = 1u64 << pages.get_order(i);
        match e {
            EntryRef::Item(_) => folio_pages += n,
            EntryRef::Value(_) => shadow_pages += n,
        }
    }
    assert_eq!(m.nr_pages(), folio_pages);
    assert_eq!(m.nr_shadow_pages(), shadow_pages);
    assert_eq!(shadow_pages, 512 - 4 + 4);
    pages.check_invariants().unwrap();
}

// ---------------------------------------------------------------------
// Loom models honour LOOM_MAX_PREEMPTIONS (section 3)
// ---------------------------------------------------------------------

/// The loom models used to set `preemption_bound` from their own variable
/// (`KX_LOOM_PREEMPT`, default 3 to 6), overriding what loom's
/// `Builder::new()` reads from `LOOM_MAX_PREEMPTIONS`, so the bound CI sets
/// had no effect. A source check (the models only run under `cfg(loom)`):
/// every loom test builds on `loom::model::Builder::new()` and only fills in
/// a bound when loom found none.
#[test]
fn loom_models_take_the_bound_from_loom_max_preemptions() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("loom_") && name.ends_with(".rs")) {
            continue;
        }
        seen += 1;
        let mut src = std::fs::read_to_string(&path).unwrap();
        if src.contains("shared::loom_models::") {
            // the models live in the crate (they reach its private
            // protocol code): check them there
            src = std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/shared/loom_models.rs"
            ))
            .unwrap();
        }
        assert!(
            src.contains("loom::model::Builder::new()"),
            "{name}: models must start from loom's builder"
        );
        for line in src.lines() {
            let code = line.split("//").next().unwrap();
            assert!(
                !code.contains("preemption_bound =") && !code.contains("KX_LOOM_PREEMPT"),
                "{name}: the preemption bound is overridden: {line}"
            );
        }
        assert!(
            src.contains("preemption_bound.get_or_insert("),
            "{name}: a default bound for when LOOM_MAX_PREEMPTIONS is unset"
        );
    }
    assert!(seen >= 2, "loom tests not found in {dir}");
}
