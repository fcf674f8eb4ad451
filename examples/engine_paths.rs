//! Runs one hot path of the engine `N` times, for instruction counting under
//! callgrind (`scripts/engine-compare.sh` runs it at two iteration counts and
//! differences the totals, so the setup cancels out).
//!
//! ```text
//! cargo run --release --example engine_paths -- <PATH> <N>
//! ```
//!
//! The array holds the value entries `0..KEYS` (a three-level tree of
//! 64-slot nodes). PATH is one of:
//! - `load`: `XArray::load` of a pseudo-random present index, one guard;
//! - `next`: one `XaState::next` step of a cursor walking `0..KEYS`
//!   (restarted at 0 with `set_index` after the last key);
//! - `conflicts`: a conflict scan (`XaState::conflicts`) of one aligned
//!   order-6 block (one full leaf, 64 conflicts), under one held lock, with a
//!   fresh cursor per scan;
//! - `iter`: one step of `XArray::iter` (a new iterator after the last key);
//! - `store`: one `XArray::store` of a value over a present value (the
//!   one-call API: lock, walk, store, unlock; no allocation);
//! - `add_folio`: one refault cycle of the page cache: `add_folio` of an
//!   order-0 folio over an order-0 shadow, then `remove_folio` leaving the
//!   shadow again (2^12 folios spread over a three-level tree, reused).
//!
//! It uses only API that the engine redesign keeps (`XaState` may become an
//! alias of the new cursor types), so the same file builds against both
//! revisions being compared. It prints a checksum so nothing is optimised
//! away.

use kxarray::filemap::{AddressSpace, Folio, Shadow, ShadowFields};
use kxarray::{Entry, XArray, XaState};
use std::hint::black_box;
use std::sync::Arc;

/// Keys present in the array: `0..KEYS`.
const KEYS: u64 = 1 << 16;
/// Order of the block one conflict scan covers.
const SCAN_ORDER: u32 = 6;

fn usage() -> ! {
    eprintln!("usage: engine_paths <load|next|conflicts|iter|store|add_folio> <iterations>");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, n] = args.as_slice() else { usage() };
    let Ok(n) = n.parse::<u64>() else { usage() };

    let xa: XArray<Box<u64>> = XArray::new();
    for i in 0..KEYS {
        xa.store(i, Entry::Value(i))
            .expect("a value entry below MAX_VALUE is accepted");
    }

    let mut sum = 0u64;
    match path.as_str() {
        "load" => {
            let g = kxarray::pin();
            // An odd multiplier permutes 0..KEYS: every present key once per
            // KEYS iterations, in scattered order.
            let mut k = 0u64;
            for _ in 0..n {
                k = k.wrapping_add(0x9e37_79b9) & (KEYS - 1);
                if let Some(v) = xa.load(black_box(k), &g).and_then(|e| e.value()) {
                    sum = sum.wrapping_add(v);
                }
            }
        }
        "next" => {
            let g = kxarray::pin();
            let mut xas = XaState::new(&xa, &g, 0);
            for _ in 0..n {
                if xas.index() == KEYS - 1 {
                    xas.set_index(0);
                }
                if let Some(v) = xas.next().and_then(|e| e.value()) {
                    sum = sum.wrapping_add(v);
                }
            }
        }
        "conflicts" => {
            let lock = xa.lock();
            let g = kxarray::pin();
            let blocks = KEYS >> SCAN_ORDER;
            for i in 0..n {
                let base = (i % blocks) << SCAN_ORDER;
                let mut xas = XaState::with_order(&xa, &g, black_box(base), SCAN_ORDER)
                    .expect("order 6 is a valid order");
                for e in xas.conflicts(&lock) {
                    sum = sum.wrapping_add(e.value().unwrap_or(1));
                }
            }
        }
        "iter" => {
            let g = kxarray::pin();
            let mut it = xa.iter(&g);
            for _ in 0..n {
                let (i, e) = match it.next() {
                    Some(x) => x,
                    None => {
                        it = xa.iter(&g);
                        it.next().expect("the array is not empty")
                    }
                };
                sum = sum.wrapping_add(i).wrapping_add(e.value().unwrap_or(1));
            }
        }
        "store" => {
            let mut k = 0u64;
            for i in 0..n {
                k = k.wrapping_add(0x9e37_79b9) & (KEYS - 1);
                let old = xa
                    .store(black_box(k), Entry::Value(i & 0xffff))
                    .expect("a value entry is accepted");
                if let Some(v) = old.and_then(|r| r.value()) {
                    sum = sum.wrapping_add(v);
                }
            }
        }
        "add_folio" => sum = add_folio_cycles(n),
        _ => usage(),
    }
    println!("{path} x{n}: checksum {sum}");
}

/// `n` refault cycles over 2^12 order-0 folios spread over `0..2^18`.
fn add_folio_cycles(n: u64) -> u64 {
    const FOLIOS: u64 = 1 << 12;
    let space = AddressSpace::new();
    let shadow = Shadow::pack(ShadowFields {
        eviction: 5,
        ..Default::default()
    })
    .expect("a small eviction counter fits");
    let folios: Vec<Arc<Folio>> = (0..FOLIOS)
        .map(|i| Arc::new(Folio::new(i * 64 + (i % 61), 0).expect("order 0 is valid")))
        .collect();
    for f in &folios {
        space.add_folio(f).expect("the slot is empty");
        space.remove_folio(f, Some(shadow));
    }
    let mut sum = 0u64;
    for i in 0..n {
        let f = &folios[(i % FOLIOS) as usize];
        let old = space.add_folio(f).expect("a shadow is replaced");
        sum = sum.wrapping_add(old.map_or(1, |s| s.unpack().eviction));
        assert!(space.remove_folio(f, Some(shadow)));
    }
    sum
}
