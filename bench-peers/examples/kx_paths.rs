//! One kxarray path over 2^n keys, for instruction counts and for timing
//! the write paths in one process:
//!
//! ```text
//! cargo build --release -p kxarray-bench-peers --example kx_paths
//! valgrind --tool=callgrind target/release/examples/kx_paths lock 14 s40
//! target/release/examples/kx_paths seq 20 s40
//! ```
//!
//! Modes: `store` (lock per call), `cstore` (`ChunkedXArray::store`, default
//! shift, flat directory sized to the largest key), `cload` (fill a
//! `ChunkedXArray` as `cstore` does, then `ChunkedXArray::load` of every key
//! under one guard), `cvalue` (the same with `ChunkedXArray::load_value`
//! per key), `lock` (one lock, every store under it),
//! `replace` (`&mut`), `load` (fill with `replace`, then every key under one
//! guard), `load_value` (fill, then `load_value` per key: a light pin),
//! `load_pin` (fill, then `kxarray::pin()` and `load` per key: the per-call
//! path before the light pins), `seq` (lock, replace,
//! lock, replace: a fresh tree each, timed, and its drop timed), `churn`
//! (32 rounds of: store every key, erase every key through `&self`, so
//! every node is retired through the epoch, then `pin().flush()`; timed per
//! retired node, the frees included), `reads` (fill, then 15 rounds of
//! batched `load`, `load_value` and `pin()` + `load` per key, interleaved,
//! over the keys shuffled; prints each path's median and the ratios),
//! `creads` (the same over a `ChunkedXArray` filled as `cstore` does). Keys:
//! `dense` (0..2^n in order), `s25` / `s40` / `s64` (xorshift, below 2^25
//! (the swap table's 128 GiB device of 4 KiB slots) / 2^40 / any).
use kxarray::{ChunkedXArray, Entry, XArray};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!(
            "usage: kx_paths <store|cstore|cload|cvalue|lock|replace|load|load_value|load_pin|seq|churn|reads|creads> <log2 n> <dense|s25|s40|s64>"
        );
        std::process::exit(2);
    }
    let mode = a[1].as_str();
    let n = 1usize << a[2].parse::<u32>().unwrap();
    let mut x = 0x9e3779b97f4a7c15u64;
    let keys: Vec<u64> = (0..n as u64)
        .map(|i| match a[3].as_str() {
            "dense" => i,
            s => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match s {
                    "s25" => x & ((1 << 25) - 1),
                    "s40" => x & ((1 << 40) - 1),
                    _ => x,
                }
            }
        })
        .collect();
    if mode == "seq" {
        // lock, replace, lock, replace: fresh tree each, timed, in one process
        for round in 0..4 {
            let mut xa: XArray<Box<u64>> = XArray::new();
            let t = std::time::Instant::now();
            if round % 2 == 0 {
                let l = xa.lock();
                for &k in &keys {
                    l.store(k, Some(Entry::Value(k & 0xffff))).unwrap();
                }
            } else {
                for &k in &keys {
                    xa.replace(k, Entry::Value(k & 0xffff)).unwrap();
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / n as f64;
            println!(
                "{} {:.0} ns/store",
                if round % 2 == 0 { "lock   " } else { "replace" },
                ns
            );
            let t = std::time::Instant::now();
            drop(xa);
            println!(
                "   drop {:.0} ns/entry",
                t.elapsed().as_nanos() as f64 / n as f64
            );
        }
        return;
    }
    if mode == "reads" || mode == "creads" {
        // the keys in a random order (xorshift-driven Fisher-Yates)
        let mut probes = keys.clone();
        let mut y = 0x2545f4914f6cdd1du64;
        for i in (1..probes.len()).rev() {
            y ^= y << 13;
            y ^= y >> 7;
            y ^= y << 17;
            probes.swap(i, (y % (i as u64 + 1)) as usize);
        }
        if mode == "reads" {
            let mut xa: XArray<Box<u64>> = XArray::new();
            for &k in &keys {
                xa.replace(k, Entry::Value(k & 0xffff)).unwrap();
            }
            compare_reads(
                "reads",
                &probes,
                |ks| {
                    let g = kxarray::pin();
                    ks.iter()
                        .map(|&k| xa.load(k, &g).and_then(|e| e.value()).unwrap_or(0))
                        .sum()
                },
                |ks| ks.iter().map(|&k| xa.load_value(k).unwrap_or(0)).sum(),
                |ks| {
                    ks.iter()
                        .map(|&k| {
                            let g = kxarray::pin();
                            xa.load(k, &g).and_then(|e| e.value()).unwrap_or(0)
                        })
                        .sum()
                },
            );
        } else {
            let max = keys.iter().copied().max().unwrap_or(0);
            let cx: ChunkedXArray<Box<u64>> =
                ChunkedXArray::with_capacity(kxarray::chunked::DEFAULT_SHIFT, max).unwrap();
            for &k in &keys {
                cx.store(k, Entry::Value(k & 0xffff)).unwrap();
            }
            compare_reads(
                "creads (ChunkedXArray)",
                &probes,
                |ks| {
                    let g = kxarray::pin();
                    ks.iter()
                        .map(|&k| cx.load(k, &g).and_then(|e| e.value()).unwrap_or(0))
                        .sum()
                },
                |ks| ks.iter().map(|&k| cx.load_value(k).unwrap_or(0)).sum(),
                |ks| {
                    ks.iter()
                        .map(|&k| {
                            let g = kxarray::pin();
                            cx.load(k, &g).and_then(|e| e.value()).unwrap_or(0)
                        })
                        .sum()
                },
            );
        }
        return;
    }
    if mode == "churn" {
        let xa: XArray<Box<u64>> = XArray::new();
        let (mut retired, rounds) = (0usize, 32);
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            for &k in &keys {
                xa.store(k, Entry::Value(k & 0xffff)).unwrap();
            }
            retired += xa.node_count();
            for &k in &keys {
                xa.erase(k);
            }
            kxarray::pin().flush();
        }
        // let the last rounds' frees run before stopping the clock
        for _ in 0..256 {
            kxarray::pin().flush();
        }
        let ns = t.elapsed().as_nanos() as f64;
        println!(
            "churn: {retired} nodes retired, {:.1} ns per retired node, {:.1} ns per store+erase",
            ns / retired as f64,
            ns / (rounds * n) as f64
        );
        return;
    }
    let mut xa: XArray<Box<u64>> = XArray::new();
    let mut sum = 0u64;
    match mode {
        "cstore" | "cload" | "cvalue" => {
            let max = keys.iter().copied().max().unwrap_or(0);
            let cx: ChunkedXArray<Box<u64>> =
                ChunkedXArray::with_capacity(kxarray::chunked::DEFAULT_SHIFT, max).unwrap();
            for &k in &keys {
                cx.store(k, Entry::Value(k & 0xffff)).unwrap();
            }
            if mode == "cload" {
                let t = std::time::Instant::now();
                let g = kxarray::pin();
                for &k in &keys {
                    sum += cx.load(k, &g).and_then(|e| e.value()).unwrap_or(0);
                }
                println!("{:.1} ns/load", t.elapsed().as_nanos() as f64 / n as f64);
            }
            if mode == "cvalue" {
                let t = std::time::Instant::now();
                for &k in &keys {
                    sum += cx.load_value(k).unwrap_or(0);
                }
                println!(
                    "{:.1} ns/load_value",
                    t.elapsed().as_nanos() as f64 / n as f64
                );
            }
            println!(
                "chunked: {} chunks, height {}",
                cx.chunk_count(),
                cx.height()
            );
        }
        "store" => {
            for &k in &keys {
                xa.store(k, Entry::Value(k & 0xffff)).unwrap();
            }
        }
        "lock" => {
            let l = xa.lock();
            for &k in &keys {
                l.store(k, Some(Entry::Value(k & 0xffff))).unwrap();
            }
        }
        "replace" => {
            for &k in &keys {
                xa.replace(k, Entry::Value(k & 0xffff)).unwrap();
            }
        }
        _ => {
            for &k in &keys {
                xa.replace(k, Entry::Value(k & 0xffff)).unwrap();
            }
            if mode == "load" {
                let t = std::time::Instant::now();
                let g = kxarray::pin();
                for &k in &keys {
                    sum += xa.load(k, &g).and_then(|e| e.value()).unwrap_or(0);
                }
                println!("{:.1} ns/load", t.elapsed().as_nanos() as f64 / n as f64);
            } else if mode == "load_pin" {
                for &k in &keys {
                    let g = kxarray::pin();
                    sum += xa.load(k, &g).and_then(|e| e.value()).unwrap_or(0);
                }
            } else {
                for &k in &keys {
                    sum += xa.load_value(k).unwrap_or(0);
                }
            }
        }
    }
    println!("{mode} {} nodes {} sum {sum}", n, xa.node_count());
}

/// 15 interleaved rounds of the batched, `load_value` and `pin()` + `load`
/// paths over `probes`; prints each path's median and the ratios.
fn compare_reads(
    name: &str,
    probes: &[u64],
    batched: impl Fn(&[u64]) -> u64,
    value: impl Fn(&[u64]) -> u64,
    pinned: impl Fn(&[u64]) -> u64,
) {
    let time = |f: &dyn Fn(&[u64]) -> u64| {
        let t = std::time::Instant::now();
        std::hint::black_box(f(probes));
        t.elapsed().as_nanos() as f64 / probes.len() as f64
    };
    let (mut b, mut v, mut p) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..15 {
        b.push(time(&batched));
        v.push(time(&value));
        p.push(time(&pinned));
    }
    let med = |x: &mut Vec<f64>| {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let (b, v, p) = (med(&mut b), med(&mut v), med(&mut p));
    println!(
        "{name} (median of 15, ns/key): batched load {b:.1}, load_value {v:.1} ({:.2}x), pin()+load {p:.1} ({:.2}x)",
        v / b,
        p / b
    );
}
