//! A tour of kxarray: items and values, a multi-index entry, marks,
//! iteration, a cursor and its walk count, and lock-free readers running
//! while one writer stores.
//!
//! `cargo run --release --example quickstart`

use kxarray::{Entry, Mark, XArray, XaState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    // ---- items and value entries ----
    let xa: XArray<Arc<String>> = XArray::new();
    xa.store(1, Entry::Item(Arc::new("one".to_string())))
        .unwrap();
    xa.store(4096, Entry::Item(Arc::new("page 4096".to_string())))
        .unwrap();
    xa.store(7, Entry::Value(42)).unwrap();
    {
        let g = kxarray::pin();
        let one = xa.load(1, &g).unwrap().item().unwrap();
        println!("store: index 1 holds the item {:?}", &**one);
        println!(
            "store: index 7 holds the value {:?}",
            xa.load(7, &g).unwrap().value()
        );
        println!("load:  index 8 is empty: {}", xa.load(8, &g).is_none());
    }

    // ---- a multi-index entry: one entry covering 64..=127 ----
    xa.store_order(64, 6, Entry::Value(9)).unwrap();
    println!(
        "store_order(64, order 6): index 100 reads {:?}, its order is {}",
        xa.load_value(100),
        xa.get_order(100)
    );

    // ---- marks ----
    xa.set_mark(4096, Mark::M0);
    xa.set_mark(7, Mark::M0);
    let g = kxarray::pin();
    let marked: Vec<u64> = xa.iter_marked(.., Mark::M0, &g).map(|(i, _)| i).collect();
    println!(
        "marks: entries with M0: {marked:?} (any marked: {})",
        xa.marked(Mark::M0)
    );

    // ---- ordered iteration (a multi-index entry is visited once) ----
    let all: Vec<(u64, String)> = xa
        .iter(&g)
        .map(|(i, e)| match e.value() {
            Some(v) => (i, format!("value {v}")),
            None => (i, format!("item {:?}", &**e.item().unwrap())),
        })
        .collect();
    println!("iter: {all:?}");
    drop(g);

    // ---- a cursor: operations continue from where the last one stopped ----
    let nums: XArray<Box<u64>> = XArray::new();
    {
        let lock = nums.lock();
        for i in 0..1000 {
            lock.store(i, Some(Entry::Value(i * i))).unwrap();
        }
    }
    let g = kxarray::pin();
    let mut xas = XaState::new(&nums, &g, 500);
    let v = xas.load().and_then(|e| e.value());
    let mut sum = 0;
    for _ in 0..10 {
        sum += xas.next().and_then(|e| e.value()).unwrap();
    }
    println!(
        "cursor: load(500) = {v:?}, then 10 x next() summed to {sum} at index {}; walks from the root: {}",
        xas.index(),
        xas.walks()
    );
    let mut xas = XaState::new(&nums, &g, 0);
    let mut n = 0;
    while xas.find(u64::MAX).is_some() {
        n += 1;
    }
    println!(
        "cursor: find() visited {n} entries with {} walk(s)",
        xas.walks()
    );
    drop(g);

    // ---- lock-free readers while one writer stores ----
    let shared: Arc<XArray<Box<u64>>> = Arc::new(XArray::new());
    const KEYS: u64 = 1 << 16;
    let stop = Arc::new(AtomicBool::new(false));
    let loads = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (xa, stop, loads) = (shared.clone(), stop.clone(), loads.clone());
            std::thread::spawn(move || {
                let mut seen = 0u64;
                let mut k = r as u64;
                while !stop.load(Ordering::Relaxed) {
                    let g = kxarray::pin(); // no lock: an epoch pin per batch
                    for _ in 0..1024 {
                        k = (k * 6364136223846793005 + 1442695040888963407) % KEYS;
                        if let Some(v) = xa.load(k, &g).and_then(|e| e.value()) {
                            assert_eq!(v, k * 3, "a reader saw a torn or wrong value");
                            seen += 1;
                        }
                    }
                    loads.fetch_add(1024, Ordering::Relaxed);
                }
                seen
            })
        })
        .collect();
    // the writer: three rounds of store everything, erase the odd keys
    for _round in 0..3 {
        let lock = shared.lock();
        for k in 0..KEYS {
            lock.store(k, Some(Entry::Value(k * 3))).unwrap();
        }
        drop(lock); // let readers' epochs advance between rounds
        let lock = shared.lock();
        for k in (1..KEYS).step_by(2) {
            lock.erase(k);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let hits: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    println!(
        "concurrency: 1 writer stored/erased {} entries while 3 readers did {} lock-free loads ({} hits) in {:.0?}",
        3 * (KEYS + KEYS / 2),
        loads.load(Ordering::Relaxed),
        hits,
        start.elapsed()
    );
    shared.check_invariants().unwrap();
    println!(
        "final: {} entries, {} nodes, height {}, {} bytes",
        shared.iter(&kxarray::pin()).count(),
        shared.node_count(),
        shared.height(),
        shared.memory_usage()
    );
}
