//! Loom models of `ChunkedXArray`'s chunk life cycle on the real code:
//! under `cfg(loom)` the chunks' trees, the chunk locks and
//! crossbeam-epoch are loom's, and nodes have 8 slots.
//!
//! Run with:
//! `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_chunked --target-dir target/loom`
//!
//! Geometry: chunks of 8 indices (shift 3) and a flat directory table of
//! two chunks (`with_capacity(3, 15)`), so chunk 1 (indices 8..16) is in the
//! flat table and chunk 5 (indices 40..48) in the overflow `XArray`.
//!
//! Items are `Box<Tracked>` holding a `loom::sync::Arc`, so loom's leak
//! check fails a model whose displaced item is never dropped or dropped
//! twice. A chunk freed while a reader still used it would be a
//! use-after-free of loom objects (its lock and atomics), which loom
//! reports.
//!
//! Models:
//! (a) a reader loads an index of chunk 1 while a writer erases that
//!     chunk's only entry, which empties the chunk (a flat-table chunk is
//!     inline and never retired: its tree's nodes go through the epoch):
//!     the reader sees the item or nothing.
//! (b) the same with chunk 5, which lives in the overflow directory and is
//!     retired (unlinked, freed through the epoch).
//! (c) a store into chunk 1 races the erase that empties it: afterwards
//!     exactly the stored entry is there and chunk 1 counts once.
//! (d) the same with chunk 5, whose erase retires it: the store must land
//!     in a live chunk (never in the dead one).
//! (e) `load_value` (a light pin in a flat-table chunk, a crossbeam guard
//!     in an overflow one) against the erase that empties the chunk and
//!     frees its tree's node: the reader sees the value or nothing.

#[cfg(loom)]
mod tests {
    use kxarray::{ChunkedXArray, Entry, EntryRef};
    use loom::sync::Arc as LArc;
    use loom::thread;

    struct Tracked {
        v: u64,
        _live: LArc<()>,
    }

    type Cx = ChunkedXArray<Box<Tracked>>;

    fn item(v: u64) -> Entry<Box<Tracked>> {
        Entry::Item(Box::new(Tracked {
            v,
            _live: LArc::new(()),
        }))
    }

    fn seen(e: Option<EntryRef<'_, Box<Tracked>>>) -> Option<u64> {
        e.map(|e| match e {
            EntryRef::Item(r) => r.get().v,
            EntryRef::Value(v) => 1_000_000 + v,
        })
    }

    fn new_cx() -> Cx {
        let cx = Cx::with_capacity(3, 15).unwrap();
        assert_eq!(cx.direct_chunks(), 2);
        cx
    }

    /// loom's builder; `LOOM_MAX_PREEMPTIONS` (read by loom) overrides the
    /// default bound of 3.
    fn builder() -> loom::model::Builder {
        let mut b = loom::model::Builder::new();
        b.preemption_bound.get_or_insert(3);
        if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
            b.max_branches = 100_000;
        }
        b
    }

    /// A reader of `index` against the erase that empties its chunk.
    fn reader_vs_retire(index: u64) {
        builder().check(move || {
            let cx = LArc::new(new_cx());
            cx.store(index, item(index)).unwrap();
            // An entry in chunk 0 that stays, so the index is not empty.
            cx.store(2, item(2)).unwrap();
            assert_eq!(cx.chunk_count(), 2);

            let r = {
                let cx = cx.clone();
                thread::spawn(move || {
                    let g = kxarray::pin();
                    let a = seen(cx.load(index, &g));
                    let b = seen(cx.find(8, u64::MAX, None, &g).map(|(_, e)| e));
                    (a, b)
                })
            };
            let old = cx.erase(index);
            assert_eq!(old.as_ref().map(|o| o.get().item().unwrap().v), Some(index));
            drop(old);

            let (a, b) = r.join().unwrap();
            assert!(a == Some(index) || a.is_none(), "reader saw {a:?}");
            assert!(b == Some(index) || b.is_none(), "find saw {b:?}");
            assert_eq!(cx.chunk_count(), 1, "the emptied chunk is still linked");
            cx.check_invariants().unwrap();
            let g = kxarray::pin();
            assert_eq!(seen(cx.load(2, &g)), Some(2));
        });
    }

    #[test]
    fn a_reader_vs_emptying_flat_chunk() {
        reader_vs_retire(9);
    }

    #[test]
    fn b_reader_vs_retiring_overflow_chunk() {
        reader_vs_retire(41);
    }

    /// `load_value(index)` against the erase that empties its chunk.
    fn value_reader_vs_retire(index: u64) {
        builder().check(move || {
            let cx = LArc::new(new_cx());
            // two values, so the chunk's tree has a node to free
            cx.store(index, Entry::Value(index)).unwrap();
            cx.store(index + 1, Entry::Value(index + 1)).unwrap();
            cx.store(2, item(2)).unwrap();
            let r = {
                let cx = cx.clone();
                thread::spawn(move || cx.load_value(index))
            };
            assert_eq!(cx.erase(index).and_then(|o| o.value()), Some(index));
            assert_eq!(cx.erase(index + 1).and_then(|o| o.value()), Some(index + 1));
            let a = r.join().unwrap();
            assert!(a == Some(index) || a.is_none(), "load_value saw {a:?}");
            assert_eq!(cx.load_value(index), None);
            cx.check_invariants().unwrap();
        });
    }

    #[test]
    fn e_value_reader_vs_emptying_flat_chunk() {
        value_reader_vs_retire(9);
    }

    #[test]
    fn e_value_reader_vs_retiring_overflow_chunk() {
        value_reader_vs_retire(41);
    }

    /// A store of `other` against the erase of `index`, the only entry of
    /// the same chunk.
    fn store_vs_retire(index: u64, other: u64) {
        builder().check(move || {
            let cx = LArc::new(new_cx());
            cx.store(index, item(index)).unwrap();

            let t = {
                let cx = cx.clone();
                thread::spawn(move || {
                    drop(cx.erase(index));
                })
            };
            drop(cx.store(other, item(other)).unwrap());
            t.join().unwrap();

            let g = kxarray::pin();
            assert_eq!(seen(cx.load(index, &g)), None);
            assert_eq!(seen(cx.load(other, &g)), Some(other), "a store was lost");
            assert_eq!(cx.chunk_count(), 1);
            cx.check_invariants().unwrap();
        });
    }

    #[test]
    fn c_store_vs_emptying_flat_chunk() {
        store_vs_retire(9, 12);
    }

    #[test]
    fn d_store_vs_retiring_overflow_chunk() {
        store_vs_retire(41, 44);
    }
}
