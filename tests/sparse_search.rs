//! Searches over sparse trees: the occupancy word each node keeps (searches
//! skip empty slots with it) and the lookahead that prefetches small
//! subtrees before a search descends into them (`engine/lookahead.rs`).
//!
//! Sparse random keys make chains of one-child nodes several levels deep,
//! the shape both mechanisms are for. Every search is checked against a
//! `BTreeMap`, and the tree's invariants (which include "the occupancy word
//! is exactly the set of non-empty slots") after every phase.

use kxarray::{Entry, XArray, XaState};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

type Xa = XArray<Box<u64>>;

fn keys(rng: &mut StdRng, n: usize, shape: &str) -> Vec<u64> {
    let mut base = 0;
    (0..n)
        .map(|i| match shape {
            "2^40" => rng.random::<u64>() & ((1 << 40) - 1),
            "u64" => rng.random::<u64>(),
            // clusters of 7 keys, 3 apart, in leaves scattered over a wide
            // range: leaves with gaps at the bottom of sparse chains
            _ => {
                if i % 7 == 0 {
                    base = rng.random::<u64>() & ((1 << 36) - 1) & !63;
                }
                base + (i as u64 % 7) * 3
            }
        })
        .collect()
}

fn check_searches(xa: &Xa, model: &BTreeMap<u64, u64>) {
    xa.check_invariants().unwrap();
    let g = kxarray::pin();
    let all: Vec<(u64, u64)> = xa.iter(&g).map(|(i, e)| (i, e.value().unwrap())).collect();
    let want: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(all, want, "iter");

    let mut xas = XaState::new(xa, &g, 0);
    let mut found = Vec::new();
    while let Some(e) = xas.find(u64::MAX) {
        found.push((xas.index(), e.value().unwrap()));
    }
    assert_eq!(found, want, "XaState::find loop");

    // ranged iteration and find_after from points between the keys
    let ks: Vec<u64> = model.keys().copied().collect();
    for w in ks.windows(2).step_by(97) {
        let (lo, hi) = (w[0] + 1, w[1]);
        let got: Vec<u64> = xa.range(lo..=hi, &g).map(|(i, _)| i).collect();
        assert_eq!(got, [w[1]], "range {lo:#x}..={hi:#x}");
        assert_eq!(
            xa.find_after(w[0], u64::MAX, None, &g).map(|(i, _)| i),
            Some(w[1])
        );
    }
}

#[test]
fn sparse_searches_agree_with_a_btreemap() {
    for (seed, shape) in [(1u64, "2^40"), (2, "u64"), (3, "clusters")] {
        let mut rng = StdRng::seed_from_u64(seed);
        let ks = keys(&mut rng, 20_000, shape);
        let xa = Xa::new();
        let mut model = BTreeMap::new();
        for &k in &ks {
            let v = k & 0xffff_ffff;
            xa.store(k, Entry::Value(v)).unwrap();
            model.insert(k, v);
        }
        check_searches(&xa, &model);
        // erase every other key: chains go away, nodes shrink
        for &k in ks.iter().step_by(2) {
            xa.erase(k);
            model.remove(&k);
        }
        check_searches(&xa, &model);
        // and fill back some neighbours of the survivors
        for &k in ks.iter().skip(1).step_by(4) {
            let n = k ^ 1;
            xa.store(n, Entry::Value(7)).unwrap();
            model.insert(n, 7);
        }
        check_searches(&xa, &model);
    }
}

/// A reader iterating a sparse tree while a writer stores and erases other
/// keys (growing and pruning chains): every key present throughout is seen,
/// in order, every time.
#[test]
fn entries_present_throughout_are_never_skipped_under_a_writer() {
    let mut rng = StdRng::seed_from_u64(9);
    let stable: Vec<u64> = {
        let mut v = keys(&mut rng, 4_000, "2^40");
        v.sort_unstable();
        v.dedup();
        v
    };
    let churn = keys(&mut rng, 4_000, "2^40");
    let xa = Xa::new();
    for &k in &stable {
        xa.store(k, Entry::Value(1)).unwrap();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..6 {
                for &k in &churn {
                    if stable.binary_search(&k).is_err() {
                        if round % 2 == 0 {
                            xa.store(k, Entry::Value(2)).unwrap();
                        } else {
                            xa.erase(k);
                        }
                    }
                }
            }
            done.store(true, Ordering::Release);
        });
        let mut passes = 0;
        while !done.load(Ordering::Acquire) || passes < 3 {
            let g = kxarray::pin();
            let seen: Vec<u64> = xa
                .iter(&g)
                .filter(|(_, e)| e.value() == Some(1))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(seen, stable, "pass {passes} skipped a stable entry");
            passes += 1;
        }
    });
    xa.check_invariants().unwrap();
}
