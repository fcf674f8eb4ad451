//! Loom models of the lock-free reader protocol and the writer lock, on the
//! real tree code: under `cfg(loom)` the crate's atomics and writer lock are
//! loom's (src/sync.rs), crossbeam-epoch runs on loom, and nodes have 8
//! slots (`CHUNK_SHIFT` = 3), so index 8 is in the second leaf.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_xarray --target-dir /tmp/kx-loom`
//! (preemption bound: `LOOM_MAX_PREEMPTIONS=n` as loom reads it, default 3
//! when unset; CI sets 2).
//!
//! Items are `Box<Tracked>`, each holding a `loom::sync::Arc`, so loom's
//! leak check fails the model if an item displaced from the array is never
//! dropped (its drop is deferred through the epoch and must run when the
//! model's collector goes away) or if it is dropped twice.
//!
//! Models:
//! (a) a reader loads index 8 while the writer erases it, the last entry of
//!     the second leaf: the leaf is freed and the tree shrinks to one leaf
//!     (its top node is freed too). The reader sees the old item or nothing.
//! (b) a reader iterates while the writer stores far away, forcing the tree
//!     to grow two levels: the reader sees the old entries, in order, and
//!     the new one or not.
//! (c) two writers race `insert` on the same index: exactly one wins, the
//!     other gets `Error::Busy` and its entry back.
//! (d) a reader loads index 9 while the writer stores one multi-index entry
//!     over the whole second leaf: the leaf is detached and freed with RETRY
//!     left in its slots, so the reader sees the old item or the new one,
//!     never a hole.
//! (e) a reader loads index 12 while the writer stores it into a leaf with
//!     empty slots around it, then searches (the iterator's leaf scan and a
//!     cursor `find`), both of which skip empty slots by the node's
//!     occupancy word: once the load saw the entry, neither search may skip
//!     it. Fails if the writer sets the occupancy bit after publishing the
//!     slot instead of before.

#[cfg(loom)]
mod tests {
    use kxarray::{Entry, EntryRef, Error, Mark, XArray, XaState, CHUNK_SHIFT};
    use loom::sync::Arc as LArc;
    use loom::thread;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An item whose liveness loom tracks.
    struct Tracked {
        v: u64,
        _live: LArc<()>,
    }

    type Xa = XArray<Box<Tracked>>;

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

    /// loom's builder, which reads `LOOM_MAX_PREEMPTIONS` and
    /// `LOOM_MAX_BRANCHES` itself; only the defaults for when they are unset
    /// are ours (loom's own would be an unbounded search and 1,000 branches).
    fn builder() -> loom::model::Builder {
        let mut b = loom::model::Builder::new();
        b.preemption_bound.get_or_insert(3);
        if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
            b.max_branches = 100_000;
        }
        b
    }

    fn check<F: Fn() + Sync + Send + 'static>(name: &str, f: F) {
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        let start = std::time::Instant::now();
        builder().check(move || {
            n2.fetch_add(1, Ordering::Relaxed);
            f();
        });
        eprintln!(
            "{name}: {} executions in {:?}",
            n.load(Ordering::Relaxed),
            start.elapsed()
        );
    }

    #[test]
    fn a_load_vs_erase_freeing_leaf_and_shrinking() {
        assert_eq!(CHUNK_SHIFT, 3, "the models assume 8-slot nodes (cfg(loom))");
        check("load vs erase+shrink", || {
            let xa: LArc<Xa> = LArc::new(XArray::new());
            xa.store(0, item(100)).unwrap();
            xa.store(8, item(108)).unwrap();
            assert_eq!(xa.height(), 2);
            assert_eq!(xa.node_count(), 3);

            let r = {
                let xa = xa.clone();
                thread::spawn(move || {
                    let g = kxarray::pin();
                    let a = seen(xa.load(8, &g));
                    // a cursor walk too: it may start in a node being freed
                    let mut xas = XaState::new(&*xa, &g, 8);
                    let b = seen(xas.load());
                    // index 0 is never touched: always visible
                    let c = seen(xa.load(0, &g));
                    (a, b, c)
                })
            };

            let old = xa.erase(8);
            assert_eq!(old.as_ref().map(|o| o.get().item().unwrap().v), Some(108));
            drop(old);

            let (a, b, c) = r.join().unwrap();
            assert!(a == Some(108) || a.is_none(), "reader saw {a:?}");
            assert!(b == Some(108) || b.is_none(), "cursor saw {b:?}");
            assert!(
                !(a.is_none() && b == Some(108)),
                "went back in time: {a:?} then {b:?}"
            );
            assert_eq!(c, Some(100));

            // the second leaf and the top node were freed, and the first
            // leaf too: its lone entry at index 0 moved into the head
            xa.check_invariants().unwrap();
            assert_eq!(xa.node_count(), 0, "tree did not shrink to the head");
            let g = kxarray::pin();
            assert_eq!(seen(xa.load(0, &g)), Some(100));
            assert_eq!(seen(xa.load(8, &g)), None);
        });
    }

    #[test]
    fn b_iterate_vs_expanding_store() {
        check("iterate vs expand", || {
            let xa: LArc<Xa> = LArc::new(XArray::new());
            xa.store(1, item(1)).unwrap();
            xa.store(5, item(5)).unwrap();
            xa.set_mark(5, Mark::M1);
            assert_eq!(xa.height(), 1);

            let r = {
                let xa = xa.clone();
                thread::spawn(move || {
                    let g = kxarray::pin();
                    let all: Vec<(u64, Option<u64>)> =
                        xa.iter(&g).map(|(i, e)| (i, seen(Some(e)))).collect();
                    let marked: Vec<u64> =
                        xa.iter_marked(.., Mark::M1, &g).map(|(i, _)| i).collect();
                    (all, marked)
                })
            };

            // 100 > 63: the tree grows from one leaf to three levels
            xa.store(100, item(100)).unwrap();

            let (all, marked) = r.join().unwrap();
            let old = vec![(1, Some(1)), (5, Some(5))];
            let mut new = old.clone();
            new.push((100, Some(100)));
            assert!(all == old || all == new, "iteration saw {all:?}");
            assert_eq!(marked, vec![5]);
            xa.check_invariants().unwrap();
            assert_eq!(xa.height(), 3);
        });
    }

    #[test]
    fn c_insert_race() {
        check("insert vs insert", || {
            let xa: LArc<Xa> = LArc::new(XArray::new());
            // something elsewhere so the insert has to create a leaf under a
            // node (not just swap the head)
            xa.store(9, item(9)).unwrap();

            let t = {
                let xa = xa.clone();
                thread::spawn(move || xa.insert(3, Some(item(1))))
            };
            let mine = xa.insert(3, Some(item(2)));
            let theirs = t.join().unwrap();

            let g = kxarray::pin();
            let now = seen(xa.load(3, &g));
            match (&mine, &theirs) {
                (Ok(()), Err(r)) => {
                    assert_eq!(r.error, Error::Busy);
                    assert!(r.entry.is_some(), "loser's entry not handed back");
                    assert_eq!(now, Some(2));
                }
                (Err(r), Ok(())) => {
                    assert_eq!(r.error, Error::Busy);
                    assert!(r.entry.is_some(), "loser's entry not handed back");
                    assert_eq!(now, Some(1));
                }
                _ => panic!("insert race: {:?} / {:?}", mine.is_ok(), theirs.is_ok()),
            }
            drop(g);
            drop(mine);
            drop(theirs);
            xa.check_invariants().unwrap();
        });
    }

    #[test]
    fn d_load_vs_multi_index_store_over_leaf() {
        check("load vs store_order over a leaf", || {
            let xa: LArc<Xa> = LArc::new(XArray::new());
            xa.store(0, item(100)).unwrap();
            xa.store(8, item(108)).unwrap();
            xa.store(9, item(109)).unwrap();
            assert_eq!(xa.node_count(), 3);

            let r = {
                let xa = xa.clone();
                thread::spawn(move || {
                    let g = kxarray::pin();
                    seen(xa.load(9, &g))
                })
            };

            // order 3 = one slot of the shift-3 top node: the leaf goes away
            drop(xa.store_order(8, CHUNK_SHIFT, item(200)).unwrap());

            let s = r.join().unwrap();
            assert!(s == Some(109) || s == Some(200), "reader saw {s:?}");
            xa.check_invariants().unwrap();
            assert_eq!(xa.node_count(), 2);
            assert_eq!(xa.get_order(15), CHUNK_SHIFT);
        });
    }
    #[test]
    fn e_search_after_load_sees_the_entry() {
        check(
            "find/iter skip empty slots after a load saw the entry",
            || {
                let xa: LArc<Xa> = LArc::new(XArray::new());
                xa.store(0, item(100)).unwrap();
                xa.store(8, item(108)).unwrap();
                xa.store(10, item(110)).unwrap();

                let r = {
                    let xa = xa.clone();
                    thread::spawn(move || {
                        let g = kxarray::pin();
                        let loaded = seen(xa.load(12, &g));
                        let iterated: Vec<u64> = xa.iter(&g).map(|(i, _)| i).collect();
                        let mut xas = XaState::new(&*xa, &g, 11);
                        let found = xas.find(u64::MAX).map(|_| xas.index());
                        (loaded, iterated, found)
                    })
                };

                drop(xa.store(12, item(112)).unwrap());

                let (loaded, iterated, found) = r.join().unwrap();
                if loaded == Some(112) {
                    assert_eq!(iterated, [0, 8, 10, 12], "iteration skipped a loaded entry");
                    assert_eq!(found, Some(12), "find skipped a loaded entry");
                } else {
                    assert_eq!(loaded, None);
                    assert!(
                        iterated == [0, 8, 10] || iterated == [0, 8, 10, 12],
                        "iteration saw {iterated:?}"
                    );
                }
                xa.check_invariants().unwrap();
            },
        );
    }
}
