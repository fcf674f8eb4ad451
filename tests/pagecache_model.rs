//! Proptest: random reads, writes, syncs, truncations and invalidations on
//! a page cache of a few pages (so eviction and refaults happen all the
//! time) against a `Vec<u8>` model. Every read matches the model, and after
//! every `sync` the backend holds exactly the model.

mod pagecache_common;

use kxarray::pagecache::{CacheConfig, PageCache};
use pagecache_common::MemBackend;
use proptest::prelude::*;
use std::sync::Arc;

const SPAN: u64 = 24 * 4096;

#[derive(Debug, Clone)]
enum Op {
    Read(u64, usize),
    Write(u64, usize, u8),
    Sync,
    SetLen(u64),
    Invalidate(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SPAN, 1..9000usize).prop_map(|(o, l)| Op::Read(o, l)),
        4 => (0..SPAN, 1..9000usize, any::<u8>()).prop_map(|(o, l, b)| Op::Write(o, l, b)),
        1 => Just(Op::Sync),
        1 => (0..SPAN).prop_map(Op::SetLen),
        1 => (0..SPAN, 0..SPAN).prop_map(|(a, b)| Op::Invalidate(a, b)),
    ]
}

fn run(ops: Vec<Op>, cap_pages: u64, order: u32, flusher: bool) -> Result<(), TestCaseError> {
    let cache = PageCache::new(
        CacheConfig::default()
            .capacity(cap_pages * 4096)
            .max_folio_order(order)
            .dirty_expire(std::time::Duration::from_millis(2))
            .flusher(flusher),
    );
    let backend = Arc::new(MemBackend::new());
    let file = cache.open(Arc::clone(&backend)).unwrap();
    let mut model: Vec<u8> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Read(o, l) => {
                let mut buf = vec![0xAAu8; l];
                let n = file.read_at(&mut buf, o).unwrap();
                let want = (model.len() as u64).saturating_sub(o).min(l as u64) as usize;
                prop_assert_eq!(n, want, "step {} short count", step);
                if n > 0 {
                    prop_assert!(
                        buf[..n] == model[o as usize..o as usize + n],
                        "step {} data",
                        step
                    );
                }
            }
            Op::Write(o, l, b) => {
                let data: Vec<u8> = (0..l).map(|i| b.wrapping_add(i as u8)).collect();
                prop_assert_eq!(file.write_at(&data, o).unwrap(), l);
                let end = o as usize + l;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[o as usize..end].copy_from_slice(&data);
            }
            Op::Sync => {
                file.sync().unwrap();
                prop_assert!(
                    backend.contents() == model,
                    "step {}: backend != model after sync",
                    step
                );
            }
            Op::SetLen(n) => {
                file.set_len(n).unwrap();
                model.resize(n as usize, 0);
            }
            Op::Invalidate(a, b) => {
                file.invalidate(a..b).unwrap();
            }
        }
        prop_assert_eq!(file.len(), model.len() as u64);
    }
    file.sync().unwrap();
    prop_assert!(backend.contents() == model, "final sync");
    let s = cache.stats();
    prop_assert!(s.cached_pages <= cap_pages.max(1 << order) + 16, "{:?}", s);
    prop_assert_eq!(s.dirty_bytes, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn small_cache_matches_model(ops in prop::collection::vec(op(), 1..80), cap in 1u64..12) {
        run(ops, cap, 4, false)?;
    }

    #[test]
    fn with_flusher_and_large_folios(ops in prop::collection::vec(op(), 1..60), cap in 4u64..40) {
        run(ops, cap, 5, true)?;
    }
}
