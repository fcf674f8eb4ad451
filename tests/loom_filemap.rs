//! Loom models of the page cache's `add_folio` racing with itself, with a
//! lock-free reader, and with a shadow being replaced, on the real tree code
//! (under `cfg(loom)` the crate's atomics and writer lock are loom's and
//! nodes have 8 slots).
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_filemap --target-dir /tmp/kx-loom2`
//!
//! Layout used by every model: a shadow `S1` of order `SHADOW_ORDER`
//! (= `CHUNK_SHIFT` = 3) at index `BASE` = 8, i.e. exactly one slot of the
//! shift-3 root node, so splitting it for an order-0 folio needs exactly one
//! new node (a shift-0 child).

#[cfg(loom)]
mod tests {
    use kxarray::filemap::legacy::add_folio_legacy_stats;
    use kxarray::filemap::{AddError, AddStats, AddressSpace, Folio, Lookup, Shadow, ShadowFields};
    use kxarray::CHUNK_SHIFT;
    use loom::sync::Arc as LArc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// Order of the large shadow: one slot of a shift-`CHUNK_SHIFT` node.
    const SHADOW_ORDER: u32 = CHUNK_SHIFT;
    /// First index of the shadow (not 0, so the shadow is not the head).
    const BASE: u64 = 1 << SHADOW_ORDER;
    const END: u64 = BASE + (1 << SHADOW_ORDER);
    /// An order-0 index inside the shadow, in the upper half so that a
    /// partial split leaves order-2, order-1 and order-0 pieces around it.
    const SMALL: u64 = BASE + 5;

    fn shadow(n: u64) -> Shadow {
        Shadow::pack(ShadowFields {
            eviction: n,
            memcg: 1,
            node: 0,
            workingset: false,
        })
        .unwrap()
    }

    fn folio(index: u64, order: u32) -> Arc<Folio> {
        Arc::new(Folio::new(index, order).unwrap())
    }

    /// Preemption bounds when `LOOM_MAX_PREEMPTIONS` is unset (when set,
    /// loom's builder reads it and it applies to every model; CI sets 2):
    /// the writer-writer models are cheap (about 10k executions at 6), the
    /// reader model is not (lock-free lookups pin the epoch, ~160k at 4).
    const WRITERS: usize = 6;
    const READER: usize = 4;

    /// loom's builder, which reads `LOOM_MAX_PREEMPTIONS` and
    /// `LOOM_MAX_BRANCHES` itself; `preemption` and 100,000 branches are the
    /// defaults for when they are unset.
    fn builder(preemption: usize) -> loom::model::Builder {
        let mut b = loom::model::Builder::new();
        b.preemption_bound.get_or_insert(preemption);
        if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
            b.max_branches = 100_000;
        }
        b
    }

    /// Run `f` under loom with `preemption` as the bound, report how many
    /// executions were explored, and return how many of them `f` flagged
    /// (returned true for: the interleaving of interest was reached).
    fn check<F: Fn() -> bool + Sync + Send + 'static>(
        name: &str,
        preemption: usize,
        f: F,
    ) -> usize {
        let n = Arc::new(AtomicUsize::new(0));
        let hits = Arc::new(AtomicUsize::new(0));
        let (n2, hits2) = (n.clone(), hits.clone());
        let start = std::time::Instant::now();
        builder(preemption).check(move || {
            n2.fetch_add(1, Ordering::Relaxed);
            if f() {
                hits2.fetch_add(1, Ordering::Relaxed);
            }
        });
        let (n, hits) = (n.load(Ordering::Relaxed), hits.load(Ordering::Relaxed));
        eprintln!(
            "{name}: {n} executions ({hits} flagged) in {:?}",
            start.elapsed()
        );
        hits
    }

    /// `add_folio`, returning how often it dropped the lock to allocate.
    fn add_counting(
        m: &AddressSpace,
        f: &Arc<Folio>,
    ) -> (Result<Option<Shadow>, AddError>, AddStats) {
        let mut st = AddStats::default();
        let r = m.add_folio_stats(f, &mut st);
        (r, st)
    }

    /// A mapping holding only the order-`SHADOW_ORDER` shadow `s` at `BASE`
    /// (left by evicting a folio of that order, so the counters are right).
    fn mapping_with_shadow(s: Shadow) -> AddressSpace {
        assert_eq!(CHUNK_SHIFT, 3, "the models assume 8-slot nodes (cfg(loom))");
        let m = AddressSpace::new();
        let big = folio(BASE, SHADOW_ORDER);
        assert_eq!(m.add_folio(&big).unwrap(), None);
        assert!(m.remove_folio(&big, Some(s)));
        m.pages().check_invariants().unwrap();
        assert_eq!(m.pages().node_count(), 1);
        assert_eq!(m.nr_shadow_pages(), 1 << SHADOW_ORDER);
        m
    }

    fn is_folio(l: &Option<Lookup>, f: &Arc<Folio>) -> bool {
        matches!(l, Some(Lookup::Folio(g)) if Arc::ptr_eq(g, f))
    }

    fn is_shadow(l: &Option<Lookup>, s: Shadow) -> bool {
        matches!(l, Some(Lookup::Shadow(t)) if *t == s)
    }

    // ------------------------------------------------------------------
    // (a) full-order folio vs a small folio inside the same large shadow
    // ------------------------------------------------------------------

    #[test]
    fn add_full_vs_small_over_shadow() {
        // flagged: the small folio preallocated its split unlocked and then
        // lost to the big one (the re-check under the lock caught it)
        let hits = check("(a) full vs small", WRITERS, || {
            let s1 = shadow(11);
            let m = LArc::new(mapping_with_shadow(s1));
            let big = folio(BASE, SHADOW_ORDER);
            let small = folio(SMALL, 0);
            let t = {
                let (m, big) = (m.clone(), big.clone());
                loom::thread::spawn(move || m.add_folio(&big))
            };
            let (rs, small_relocks) = add_counting(&m, &small);
            let rb = t.join().unwrap();
            let flagged = rs.is_err() && small_relocks.relocks > 0;

            // The ranges overlap: exactly one wins, and it gets the shadow.
            match (&rb, &rs) {
                (Ok(Some(s)), Err(AddError::Exists)) => {
                    assert_eq!(*s, s1);
                    for i in BASE..END {
                        assert!(
                            Arc::ptr_eq(&m.lookup(i).expect("big folio"), &big),
                            "index {i}"
                        );
                    }
                    assert_eq!(m.nr_pages(), 1 << SHADOW_ORDER);
                    assert_eq!(m.nr_shadow_pages(), 0);
                    assert_eq!(m.pages().node_count(), 1);
                }
                (Err(AddError::Exists), Ok(Some(s))) => {
                    assert_eq!(*s, s1);
                    for i in BASE..END {
                        let l = m.lookup_entry(i);
                        if i == SMALL {
                            assert!(is_folio(&l, &small), "index {i}: {l:?}");
                        } else {
                            assert!(is_shadow(&l, s1), "index {i}: {l:?}");
                        }
                    }
                    assert_eq!(m.nr_pages(), 1);
                    assert_eq!(m.nr_shadow_pages(), (1 << SHADOW_ORDER) - 1);
                    // the split added exactly one node
                    assert_eq!(m.pages().node_count(), 2);
                }
                other => panic!("expected exactly one success with the shadow, got {other:?}"),
            }
            // also compares the node counter with the nodes reachable
            m.pages().check_invariants().unwrap();
            flagged
        });
        assert!(hits > 0, "the small folio never lost after preallocating");
    }

    // ------------------------------------------------------------------
    // (b) two small folios at the same index over a large shadow
    // ------------------------------------------------------------------

    #[test]
    fn add_same_small_index_over_shadow() {
        // flagged: the loser had preallocated too (both dropped the lock)
        let hits = check("(b) same small index", WRITERS, || {
            let s1 = shadow(12);
            let m = LArc::new(mapping_with_shadow(s1));
            let f1 = folio(SMALL, 0);
            let f2 = folio(SMALL, 0);
            let t = {
                let (m, f1) = (m.clone(), f1.clone());
                loom::thread::spawn(move || add_counting(&m, &f1))
            };
            let (r2, re2) = add_counting(&m, &f2);
            let (r1, re1) = t.join().unwrap();
            let flagged = re1.relocks > 0 && re2.relocks > 0;
            let winner = match (&r1, &r2) {
                (Ok(Some(s)), Err(AddError::Exists)) if *s == s1 => &f1,
                (Err(AddError::Exists), Ok(Some(s))) if *s == s1 => &f2,
                other => panic!("expected exactly one Ok(Some(shadow)), got {other:?}"),
            };
            for i in BASE..END {
                let l = m.lookup_entry(i);
                if i == SMALL {
                    assert!(is_folio(&l, winner), "index {i}: {l:?}");
                } else {
                    assert!(is_shadow(&l, s1), "index {i}: {l:?}");
                }
            }
            assert_eq!(m.nr_pages(), 1);
            assert_eq!(m.nr_shadow_pages(), (1 << SHADOW_ORDER) - 1);
            assert_eq!(m.pages().node_count(), 2);
            m.pages().check_invariants().unwrap();
            flagged
        });
        assert!(hits > 0, "the two adds never both preallocated");
    }

    // ------------------------------------------------------------------
    // (a') two small folios at different indices of the same shadow: both
    //      must succeed; the second split works on the pieces the first
    //      left (a smaller order than the one it preallocated for)
    // ------------------------------------------------------------------

    #[test]
    fn add_two_small_disjoint_over_shadow() {
        // flagged: one thread's preallocation went stale (the other split
        // first, leaving a piece of a smaller order) and was thrown away;
        // the smaller piece then splits inside its leaf without a relock
        let hits = check("(a') two small disjoint", WRITERS, || {
            let s1 = shadow(14);
            let m = LArc::new(mapping_with_shadow(s1));
            let f1 = folio(BASE, 0);
            let f2 = folio(SMALL, 0);
            let t = {
                let (m, f1) = (m.clone(), f1.clone());
                loom::thread::spawn(move || add_counting(&m, &f1))
            };
            let (r2, re2) = add_counting(&m, &f2);
            let (r1, re1) = t.join().unwrap();
            let flagged = re1.stale + re2.stale > 0;
            assert_eq!(r1, Ok(Some(s1)));
            assert_eq!(r2, Ok(Some(s1)));
            for i in BASE..END {
                let l = m.lookup_entry(i);
                if i == BASE {
                    assert!(is_folio(&l, &f1), "index {i}: {l:?}");
                } else if i == SMALL {
                    assert!(is_folio(&l, &f2), "index {i}: {l:?}");
                } else {
                    assert!(is_shadow(&l, s1), "index {i}: {l:?}");
                }
            }
            assert_eq!(m.nr_pages(), 2);
            assert_eq!(m.nr_shadow_pages(), (1 << SHADOW_ORDER) - 2);
            assert_eq!(m.pages().node_count(), 2);
            m.pages().check_invariants().unwrap();
            flagged
        });
        assert!(hits > 0, "no preallocation ever went stale");
    }

    // ------------------------------------------------------------------
    // (c) lock-free reader while a writer splits the shadow
    // ------------------------------------------------------------------

    #[test]
    fn reader_during_split() {
        // flagged: the reader saw the shadow, then the folio, at SMALL
        let hits = check("(c) reader during split", READER, || {
            let s1 = shadow(13);
            let m = LArc::new(mapping_with_shadow(s1));
            let f = folio(SMALL, 0);
            let reader = {
                let (m, f) = (m.clone(), f.clone());
                loom::thread::spawn(move || {
                    // The folio's own index: the shadow, then the folio.
                    let a = m.lookup_entry(SMALL);
                    assert!(
                        is_shadow(&a, s1) || is_folio(&a, &f),
                        "index {SMALL}: {a:?}"
                    );
                    // Its buddy (SMALL - 1 = 12), split off as an order-0
                    // piece: always S1.
                    let b = m.lookup_entry(SMALL - 1);
                    assert!(is_shadow(&b, s1), "index {}: {b:?}", SMALL - 1);
                    // Inside the order-2 piece 8..=11: always S1.
                    let c = m.lookup_entry(BASE + 2);
                    assert!(is_shadow(&c, s1), "index {}: {c:?}", BASE + 2);
                    // Once the folio was seen it stays.
                    let d = m.lookup(SMALL);
                    if is_folio(&a, &f) {
                        assert!(
                            matches!(&d, Some(g) if Arc::ptr_eq(g, &f)),
                            "folio vanished: {d:?}"
                        );
                    } else {
                        assert!(d.is_none() || Arc::ptr_eq(d.as_ref().unwrap(), &f), "{d:?}");
                    }
                    is_shadow(&a, s1) && d.is_some()
                })
            };
            assert_eq!(m.add_folio(&f).unwrap(), Some(s1));
            let flagged = reader.join().unwrap();
            m.pages().check_invariants().unwrap();
            assert_eq!(m.pages().node_count(), 2);
            flagged
        });
        assert!(hits > 0, "the reader never saw the split happen");
    }

    // ------------------------------------------------------------------
    // (d) the 2024 race: the shadow is replaced between the unlocked split
    //     preallocation and the locked split
    // ------------------------------------------------------------------

    type Add = fn(&AddressSpace, &Arc<Folio>, &mut AddStats) -> Result<Option<Shadow>, AddError>;

    fn optimised(
        m: &AddressSpace,
        f: &Arc<Folio>,
        st: &mut AddStats,
    ) -> Result<Option<Shadow>, AddError> {
        m.add_folio_stats(f, st)
    }

    /// Thread A adds an order-0 folio at `SMALL` inside the order-3 shadow
    /// `S1` with `add_a`. Thread B, with the optimised `add_folio`, adds the
    /// full order-3 folio over `S1` and evicts it again, leaving a
    /// DIFFERENT order-3 shadow `S2` (the shadow was "replaced").
    ///
    /// Returns A's lock drops for allocation, or `Err(description)` if the
    /// invariant breaks: after both threads, every index of the old shadow
    /// other than `SMALL` holds a shadow (`S1` or `S2`) or B's folio, A's
    /// folio is visible only at `SMALL`, and the tree is structurally sound.
    fn replaced_shadow_scenario(add_a: Add) -> Result<u64, String> {
        let s1 = shadow(21);
        let s2 = shadow(22);
        let m = LArc::new(mapping_with_shadow(s1));
        let fa = folio(SMALL, 0);
        let fb = folio(BASE, SHADOW_ORDER);
        let tb = {
            let (m, fb) = (m.clone(), fb.clone());
            loom::thread::spawn(move || {
                if m.add_folio(&fb).is_ok() {
                    assert!(m.remove_folio(&fb, Some(s2)));
                }
            })
        };
        let mut st = AddStats::default();
        let ra = add_a(&m, &fa, &mut st);
        tb.join().unwrap();

        let mut errs = Vec::new();
        for i in BASE..END {
            let l = m.lookup_entry(i);
            let ok = if i == SMALL {
                // A's folio if A succeeded; otherwise a shadow
                match &ra {
                    Ok(_) => is_folio(&l, &fa),
                    Err(_) => is_shadow(&l, s1) || is_shadow(&l, s2),
                }
            } else {
                is_shadow(&l, s1) || is_shadow(&l, s2) || is_folio(&l, &fb)
            };
            if !ok {
                let who = if is_folio(&l, &fa) {
                    " (A's folio outside its index)"
                } else {
                    ""
                };
                errs.push(format!("index {i}: {l:?}{who}"));
            }
        }
        if let Err(e) = m.pages().check_invariants() {
            errs.push(format!("check_invariants: {e}"));
        }
        match &ra {
            Ok(Some(s)) if *s == s1 || *s == s2 => {}
            Err(AddError::Exists) => {}
            other => errs.push(format!("A returned {other:?}")),
        }
        if errs.is_empty() {
            Ok(st.relocks)
        } else {
            Err(format!("A {ra:?}: {}", errs.join("; ")))
        }
    }

    #[test]
    fn replaced_shadow_optimised_holds() {
        // flagged: A's preallocation (for S1) went stale because B replaced
        // the shadow while A was unlocked; A noticed, dropped it and redid it
        let hits =
            check(
                "(d) replaced shadow, optimised",
                WRITERS,
                || match replaced_shadow_scenario(optimised) {
                    Ok(relocks) => relocks > 1,
                    Err(e) => panic!("optimised add_folio broke the invariant: {e}"),
                },
            );
        assert!(
            hits > 0,
            "the stale-preallocation interleaving was not reached"
        );
    }

    /// The pre-6.10 algorithm (`add_folio_legacy`) preallocates the split
    /// from an UNLOCKED look at the shadow (order 3, value S1). If thread B
    /// then replaces S1 by S2 (add the order-3 folio, evict it) before A
    /// takes the lock, A's locked conflict scan finds S2, re-reads the order
    /// (3 > 0) and calls `split(S2, 3)` with nodes prepared for `S1`: the
    /// split is refused (in the kernel, `xas_split` silently misbehaves),
    /// nothing checks that, and the store of the order-0 folio then replaces
    /// the whole order-3 entry. A's folio becomes visible at all eight
    /// indices BASE..END and the evicted range's shadow is gone: the 2024
    /// large-folio data-loss race. Loom must find that interleaving.
    ///
    /// The violation is recorded instead of panicking: a panic unwinding out
    /// of `loom::model` (`catch_unwind` or `#[should_panic]`) aborts the
    /// test process, because crossbeam-epoch's per-thread handle then
    /// unpins with loom atomics outside the model ("panic in a destructor
    /// during cleanup"). Counting also shows how many executions break.
    #[test]
    fn replaced_shadow_legacy_race_found() {
        static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);
        static VIOLATIONS: AtomicUsize = AtomicUsize::new(0);
        static FIRST: Mutex<Option<String>> = Mutex::new(None);
        check("(d) replaced shadow, legacy", WRITERS, || {
            EXECUTIONS.fetch_add(1, Ordering::Relaxed);
            match replaced_shadow_scenario(add_folio_legacy_stats) {
                Ok(_) => false,
                Err(e) => {
                    VIOLATIONS.fetch_add(1, Ordering::Relaxed);
                    // The only way it breaks is the race described above:
                    // the tree stays sound, A's folio just covers too much.
                    assert!(
                        e.contains("A's folio outside its index")
                            && !e.contains("check_invariants"),
                        "{e}"
                    );
                    FIRST.lock().unwrap().get_or_insert(e);
                    true
                }
            }
        });
        let (n, v) = (
            EXECUTIONS.load(Ordering::Relaxed),
            VIOLATIONS.load(Ordering::Relaxed),
        );
        let first = FIRST.lock().unwrap().clone();
        eprintln!("legacy race: {v} of {n} executions violate the invariant; first: {first:?}");
        assert!(
            v > 0,
            "loom found no violating interleaving of the legacy add ({n} executions)"
        );
        let first = first.unwrap();
        assert!(first.contains("A's folio outside its index"), "{first}");
    }
}
