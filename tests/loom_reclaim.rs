//! Loom models in which memory is really reclaimed while readers run.
//!
//! crossbeam-epoch keeps up to 64 deferred frees per thread before it even
//! tries to advance the epoch, so in the other models nothing displaced is
//! freed before the model ends, and a free racing a reader cannot show.
//! Here every writer calls `kxarray::pin().flush()` twice after its write
//! (each flush pushes the thread's deferred frees to the global queue and
//! tries to advance the epoch; two advances free them), so the frees happen
//! inside the model, while the reader runs. Each model counts the
//! executions in which the writer saw the displaced item (or the folio's
//! reference) released before it joined the reader, and asserts that there
//! were some: the races between a free and a reader are really explored.
//!
//! A premature free is observable two ways:
//! - items are `Box<Tracked>`: dropping one sets its flag in a shared
//!   [`Registry`] (a loom atomic, so loom interleaves it with the reader);
//!   a reader that holds a reference asserts, under its guard, that the flag
//!   is still clear, before and after reading the item;
//! - nodes: under loom the crate keeps freed nodes in quarantine
//!   (`src/sync.rs`, `Quarantine`) and every slot or mark read checks that
//!   the node was not freed.
//!
//! Removing the epoch deferral from `dispose_item` or `free_node`
//! (`src/cursor.rs`: run the closure at once instead of
//! `guard.defer_unchecked`) makes these models fail.
//!
//! Run with (the preemption bound is loom's `LOOM_MAX_PREEMPTIONS`, default
//! 2 here):
//! `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_reclaim --target-dir target/loom`

#[cfg(loom)]
mod tests {
    use kxarray::filemap::{AddressSpace, Folio, Lookup, Shadow, ShadowFields};
    use kxarray::{Entry, EntryRef, XArray, XaState, CHUNK_SHIFT};
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc as LArc;
    use loom::thread;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Drop flags of every item a model creates.
    struct Registry {
        dropped: Vec<AtomicBool>,
    }

    impl Registry {
        fn new(n: usize) -> LArc<Registry> {
            LArc::new(Registry {
                dropped: (0..n).map(|_| AtomicBool::new(false)).collect(),
            })
        }
        fn is_dropped(&self, id: usize) -> bool {
            self.dropped[id].load(Ordering::SeqCst)
        }
    }

    /// An item that records its drop (exactly once) in the registry.
    struct Tracked {
        id: usize,
        reg: LArc<Registry>,
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            let twice = self.reg.dropped[self.id].swap(true, Ordering::SeqCst);
            assert!(!twice, "item {} dropped twice", self.id);
        }
    }

    type Xa = XArray<Box<Tracked>>;

    fn item(reg: &LArc<Registry>, id: usize) -> Entry<Box<Tracked>> {
        Entry::Item(Box::new(Tracked {
            id,
            reg: reg.clone(),
        }))
    }

    /// Check a reference a reader holds: the item is alive (before and after
    /// reading it, so a free in between is caught too) and is `want`.
    fn check_alive(reg: &Registry, e: EntryRef<'_, Box<Tracked>>, want: usize) {
        let EntryRef::Item(r) = e else {
            panic!("expected item {want}, found a value entry")
        };
        assert!(
            !reg.is_dropped(want),
            "item {want} freed while a reader held it"
        );
        let id = r.get().id;
        assert!(
            !reg.is_dropped(want),
            "item {want} freed while a reader held it"
        );
        assert_eq!(id, want);
    }

    /// Pin-flush cycles: push this thread's deferred frees and advance the
    /// epoch (a free needs two advances past the epoch it was deferred in).
    fn reclaim(rounds: usize) {
        for _ in 0..rounds {
            kxarray::pin().flush();
        }
    }

    /// Run `f` under loom and return in how many executions it returned
    /// true (the interleaving of interest was reached).
    fn check<F: Fn() -> bool + Sync + Send + 'static>(name: &str, f: F) -> usize {
        let mut b = loom::model::Builder::new();
        // loom reads LOOM_MAX_PREEMPTIONS; 2 when it is unset
        b.preemption_bound.get_or_insert(2);
        b.max_branches = 100_000;
        let n = Arc::new(AtomicUsize::new(0));
        let hits = Arc::new(AtomicUsize::new(0));
        let (n2, hits2) = (n.clone(), hits.clone());
        let start = std::time::Instant::now();
        b.check(move || {
            n2.fetch_add(1, Ordering::Relaxed);
            if f() {
                hits2.fetch_add(1, Ordering::Relaxed);
            }
        });
        let hits = hits.load(Ordering::Relaxed);
        eprintln!(
            "{name}: {} executions ({hits} flagged) in {:?}",
            n.load(Ordering::Relaxed),
            start.elapsed()
        );
        hits
    }

    /// A reader holds item 8 (and a cursor in its leaf) while the writer
    /// erases it, which frees the item, the leaf, and the top node (the
    /// tree shrinks to the head), then flushes. Flagged: the reader held
    /// item 8 and the writer saw it freed before joining the reader.
    #[test]
    fn r1_erase_frees_item_and_nodes_under_reader() {
        assert_eq!(CHUNK_SHIFT, 3, "the models assume 8-slot nodes (cfg(loom))");
        let hits = check("r1 erase+shrink, reclaimed", || {
            let reg = Registry::new(2);
            let xa: LArc<Xa> = LArc::new(XArray::new());
            xa.store(0, item(&reg, 0)).unwrap();
            xa.store(8, item(&reg, 1)).unwrap();
            assert_eq!(xa.node_count(), 3);
            let held = LArc::new(AtomicBool::new(false));

            let r = {
                let (xa, reg, held) = (xa.clone(), reg.clone(), held.clone());
                thread::spawn(move || {
                    let g = kxarray::pin();
                    let mut xas = XaState::new(&*xa, &g, 8);
                    if let Some(e) = xas.load() {
                        held.store(true, Ordering::SeqCst);
                        check_alive(&reg, e, 1);
                        // back into the (maybe detached) leaf
                        if let Ok(Some(e)) = xas.reload() {
                            check_alive(&reg, e, 1);
                        }
                        check_alive(&reg, e, 1);
                    }
                    match xa.load(0, &g) {
                        Some(e) => check_alive(&reg, e, 0),
                        None => panic!("index 0 vanished"),
                    }
                })
            };

            drop(xa.erase(8).expect("item 8"));
            reclaim(2);
            let flagged = reg.is_dropped(1) && held.load(Ordering::SeqCst);
            r.join().unwrap();

            assert!(!reg.is_dropped(0), "item 0 is still stored");
            assert_eq!(xa.node_count(), 0);
            xa.check_invariants().unwrap();
            flagged
        });
        assert!(hits > 0, "no execution reclaimed the item a reader held");
    }

    /// A reader's cursor sits in the second leaf while the writer replaces
    /// the whole leaf with one multi-index entry (the leaf is detached with
    /// RETRY in its slots and freed, and items 8 and 9 are dropped), then
    /// flushes. The reader re-reads through the cursor and sees the old item
    /// or the new one, never freed memory. Flagged: the reader held item 9
    /// and the writer saw it freed before joining the reader.
    #[test]
    fn r2_store_over_leaf_frees_it_under_cursor() {
        let hits = check("r2 store_order over a leaf, reclaimed", || {
            let reg = Registry::new(4);
            let xa: LArc<Xa> = LArc::new(XArray::new());
            xa.store(0, item(&reg, 0)).unwrap();
            xa.store(8, item(&reg, 1)).unwrap();
            xa.store(9, item(&reg, 2)).unwrap();
            let held = LArc::new(AtomicBool::new(false));

            let r = {
                let (xa, reg, held) = (xa.clone(), reg.clone(), held.clone());
                thread::spawn(move || {
                    let id = |e: EntryRef<'_, Box<Tracked>>| match e {
                        EntryRef::Item(r) => r.get().id,
                        EntryRef::Value(_) => usize::MAX,
                    };
                    let g = kxarray::pin();
                    let mut xas = XaState::new(&*xa, &g, 9);
                    let first = xas.load().expect("entry at 9");
                    if id(first) == 2 {
                        held.store(true, Ordering::SeqCst);
                    }
                    match id(first) {
                        2 | 3 => check_alive(&reg, first, id(first)),
                        other => panic!("reader saw {other}"),
                    }
                    // re-read in place (the leaf may be detached by now)
                    match xas.reload() {
                        Ok(Some(e)) => {
                            assert!(id(e) == 2 || id(e) == 3, "reload saw {}", id(e));
                            check_alive(&reg, e, id(e));
                        }
                        Ok(None) => panic!("reload saw a hole"),
                        Err(_) => {
                            xas.reset();
                            check_alive(&reg, xas.load().expect("entry at 9"), 3);
                        }
                    }
                    check_alive(&reg, first, id(first));
                })
            };

            drop(xa.store_order(8, CHUNK_SHIFT, item(&reg, 3)).unwrap());
            reclaim(2);
            let flagged = reg.is_dropped(2) && held.load(Ordering::SeqCst);
            r.join().unwrap();

            assert!(!reg.is_dropped(0) && !reg.is_dropped(3));
            xa.check_invariants().unwrap();
            flagged
        });
        assert!(hits > 0, "no execution reclaimed the item a reader held");
    }

    fn shadow(n: u64) -> Shadow {
        Shadow::pack(ShadowFields {
            eviction: n,
            memcg: 1,
            node: 0,
            workingset: false,
        })
        .unwrap()
    }

    /// The page cache: an order-0 folio at 13 sits in a leaf made by
    /// splitting an order-3 shadow at 8 (order-2, order-0 and order-1
    /// shadows around it). A reader looks it up lock-free while the writer
    /// evicts it without a shadow and drops the three shadows: the leaf and
    /// the top node are freed and the array's reference to the folio is
    /// released, then the writer flushes.
    ///
    /// Flagged: before joining the reader, which has not finished, the
    /// writer saw the array's reference to the folio released.
    #[test]
    fn r3_filemap_evict_frees_leaf_under_lookup() {
        let hits = check("r3 filemap eviction, reclaimed", || {
            let m = LArc::new(AddressSpace::new());
            let big = Arc::new(Folio::new(8, CHUNK_SHIFT).unwrap());
            m.add_folio(&big).unwrap();
            assert!(m.remove_folio(&big, Some(shadow(5))));
            drop(big);
            let f = Arc::new(Folio::new(13, 0).unwrap());
            assert_eq!(m.add_folio(&f).unwrap(), Some(shadow(5)));
            assert_eq!(m.pages().node_count(), 2);

            let done = LArc::new(AtomicBool::new(false));
            let addr = Arc::as_ptr(&f) as usize;
            let r = {
                let (m, done) = (m.clone(), done.clone());
                thread::spawn(move || {
                    match m.lookup_entry(13) {
                        Some(Lookup::Folio(g)) => {
                            assert_eq!(Arc::as_ptr(&g) as usize, addr);
                            assert!(g.contains(13));
                        }
                        None => {}
                        Some(Lookup::Shadow(s)) => panic!("lookup(13) saw shadow {s:?}"),
                    }
                    done.store(true, Ordering::SeqCst);
                })
            };

            assert!(m.remove_folio(&f, None));
            for i in [8, 12, 14] {
                assert!(m.drop_shadow(i), "no shadow at {i}");
            }
            reclaim(2);
            let flagged = !done.load(Ordering::SeqCst) && Arc::strong_count(&f) == 1;
            r.join().unwrap();

            assert_eq!(m.pages().node_count(), 0);
            assert!(m.pages().is_empty());
            assert_eq!((m.nr_pages(), m.nr_shadow_pages()), (0, 0));
            m.pages().check_invariants().unwrap();
            flagged
        });
        assert!(hits > 0, "no execution released the folio during a lookup");
    }
}
