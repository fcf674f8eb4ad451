//! kxarray side by side with the structures a user would pick instead, in
//! one run:
//!
//! 1. the swap-like workload: one `XArray` vs `ChunkedXArray` vs a flat
//!    per-cluster table (`peers/swap.rs`);
//! 2. writer scalability, 1 vs 2 threads on disjoint ranges;
//! 3. peers: point lookups (dense, sparse within 2^40, sparse over all of
//!    `u64`), inserts, ordered iteration, bytes per entry, and lookups while
//!    one writer stores and erases; plus kxarray's own write paths (locked
//!    store, one lock per batch, `&mut` replace) and its per-call read path.
//!
//! `cargo bench -p kxarray-bench-peers --bench peers` (about 1-3 minutes on
//! 2 cores). `KXARRAY_PEERS_QUICK=1` (or `-- --quick`) runs everything on
//! small sizes in seconds, for CI. `KXARRAY_PEERS_TABLES=1,2,3` picks tables
//! (`kx`: only kxarray's own read/write paths); `KXARRAY_PEERS_SPARSE_LOG2`
//! sets the sparse key count (default 17). Lookup and iteration figures are the best
//! of several interleaved passes; every lookup pass checks that it found
//! every key. Bytes come from a counting global allocator (the bytes live
//! after a build, divided by the entries).

#[path = "peers/maps.rs"]
mod maps;
#[path = "peers/swap.rs"]
mod swap;

use maps::{
    kx_per_call, kx_pin_per_call, BTree, Chunked, ConcMap, Congee, Flat, HashNo, HashSip, Kx,
    Locked, Map, Papaya, SccHash, SccTree, Skip,
};
use rand09::rngs::SmallRng;
use rand09::seq::SliceRandom;
use rand09::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
// SAFETY: forwards to `System`, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

/// Sizes and repetitions.
pub struct Cfg {
    pub dense: usize,
    pub sparse: usize,
    pub swap_entries: usize,
    pub scal_keys: usize,
    pub reps: usize,
}

/// Nanoseconds per op of one run of `f` doing `ops` operations.
pub fn time_ns(ops: usize, f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64 / ops.max(1) as f64
}

/// The least of `reps` runs.
pub fn min_of(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..reps.max(1)).map(|_| f()).fold(f64::MAX, f64::min)
}

pub fn fmt_ns(ns: f64) -> String {
    if ns >= 100.0 {
        format!("{ns:.0}")
    } else {
        format!("{ns:.1}")
    }
}

/// `n` distinct random keys below `bound` (0 = all of `u64`), in random
/// order.
pub fn keys_distinct(n: usize, bound: u64, seed: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = if bound == 0 {
            rng.random::<u64>()
        } else {
            rng.random_range(0..bound)
        };
        if seen.insert(k) {
            out.push(k);
        }
    }
    out
}

pub fn shuffled(keys: &[u64], seed: u64) -> Vec<u64> {
    let mut v = keys.to_vec();
    v.shuffle(&mut SmallRng::seed_from_u64(seed));
    v
}

/// One shape of table 3.
struct Shape {
    name: &'static str,
    /// Insertion order.
    keys: Vec<u64>,
    max_key: u64,
    dense: bool,
}

/// The figures of one structure on one shape (`None`: not applicable).
#[derive(Clone, Default)]
struct Row {
    name: &'static str,
    insert: Option<f64>,
    lookup: Option<f64>,
    iter: Option<f64>,
    bytes: Option<f64>,
    conc: Option<f64>,
}

/// A batch of lookups: (sum of values, keys found).
type LookFn = Box<dyn Fn(&[u64]) -> (u64, usize)>;
/// A full ordered walk: (sum of values, entries).
type IterFn = Box<dyn Fn() -> (u64, usize)>;

/// A built structure, type-erased per batch (never per op).
struct Built {
    name: &'static str,
    look: LookFn,
    iter: Option<IterFn>,
    insert: f64,
    bytes: f64,
}

/// Build `M` over the shape's keys, timing the inserts.
fn build<M: Map + 'static>(shape: &Shape) -> Option<Built> {
    if M::DENSE_ONLY && !shape.dense {
        return None;
    }
    let before = LIVE.load(Ordering::Relaxed);
    let mut m = M::with_keys(shape.max_key);
    let insert = time_ns(shape.keys.len(), || {
        for &k in &shape.keys {
            m.insert(k, k & 0xffff_ffff);
        }
    });
    kxarray::pin().flush();
    // kxarray's nodes come from its node cache, which takes whole 2 MiB
    // regions from the allocator and reuses free nodes of regions it
    // already holds: its own count is the fair one (nodes x 576 bytes plus
    // the head, the slab's equivalent of the bytes a peer asked for).
    let bytes = match m.own_bytes() {
        Some(b) => b as f64,
        None => (LIVE.load(Ordering::Relaxed) - before) as f64,
    } / shape.keys.len() as f64;
    let iterates = m.can_iterate();
    let m = Arc::new(m);
    let m2 = Arc::clone(&m);
    Some(Built {
        name: M::NAME,
        look: Box::new(move |p| m.lookups(p)),
        iter: iterates.then(|| Box::new(move || m2.iterate()) as IterFn),
        insert,
        bytes,
    })
}

/// Lookups from this thread while one writer stores and erases keys that
/// the probes never ask for; ns per lookup (best of `reps`).
fn under_writer<M: ConcMap + 'static>(m: M, shape: &Shape, probes: &[u64], reps: usize) -> f64 {
    for &k in &shape.keys {
        m.put(k, k & 0xffff_ffff);
    }
    let m = Arc::new(m);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    // Writer keys: beside the read keys (dense: just above them; sparse:
    // the read keys plus one, so they share the tree's upper levels).
    let wkeys: Vec<u64> = if shape.dense {
        (shape.max_key + 1..shape.max_key + 1 + 4096).collect()
    } else {
        let set: HashSet<u64> = shape.keys.iter().copied().collect();
        shape.keys[..4096.min(shape.keys.len())]
            .iter()
            .map(|k| k ^ 1)
            .filter(|k| !set.contains(k))
            .collect()
    };
    let writer = {
        let (m, stop, writes) = (Arc::clone(&m), Arc::clone(&stop), Arc::clone(&writes));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for &k in &wkeys {
                    m.put(k, 7);
                }
                for &k in &wkeys {
                    m.del(k);
                }
                n += 2 * wkeys.len() as u64;
            }
            writes.store(n, Ordering::Relaxed);
        })
    };
    let ns = min_of(reps, || {
        time_ns(probes.len(), || {
            let (s, n) = m.lookups(probes);
            assert_eq!(n, probes.len(), "{}: lost keys under a writer", M::NAME);
            std::hint::black_box(s);
        })
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    ns
}

fn shapes(cfg: &Cfg) -> Vec<Shape> {
    let dense: Vec<u64> = (0..cfg.dense as u64).collect();
    let s40 = keys_distinct(cfg.sparse, 1 << 40, 40);
    let s64 = keys_distinct(cfg.sparse, 0, 64);
    vec![
        Shape {
            name: "dense",
            max_key: cfg.dense as u64 - 1,
            keys: dense,
            dense: true,
        },
        Shape {
            name: "sparse in 2^40",
            max_key: (1 << 40) - 1,
            keys: s40,
            dense: false,
        },
        Shape {
            name: "sparse in 2^64",
            max_key: u64::MAX,
            keys: s64,
            dense: false,
        },
    ]
}

fn peers_table(cfg: &Cfg) {
    println!(
        "\n### 3. Peers: dense = keys 0..{} inserted in order; sparse = {} random distinct keys, inserted in random order; lookups are random hits under one guard/pin per batch\n",
        cfg.dense, cfg.sparse
    );
    #[cfg(not(feature = "nightly-xarray"))]
    println!(
        "(the `xarray` crate is skipped: it needs nightly; run `cargo +nightly bench -p kxarray-bench-peers --features nightly-xarray --bench peers` to include it)\n"
    );
    let mut all: Vec<(&'static str, Vec<Row>)> = Vec::new();
    let mut kx_extra = Vec::new();
    for shape in shapes(cfg) {
        let probes = shuffled(&shape.keys, 0xbeef);
        // Inserts: the best of `reps` builds, every structure once per
        // round in an order rotated from round to round, so that no
        // structure always pays the first touch of fresh memory; the last
        // round's builds are kept for the lookups.
        let makers: Vec<fn(&Shape) -> Option<Built>> = vec![
            build::<Kx>,
            build::<Chunked>,
            build::<BTree>,
            build::<HashSip>,
            build::<HashNo>,
            build::<Congee>,
            build::<SccTree>,
            build::<SccHash>,
            build::<Skip>,
            build::<Papaya>,
            build::<Flat>,
            #[cfg(feature = "nightly-xarray")]
            build::<maps::Aster>,
        ];
        let mut best_insert: HashMap<&'static str, f64> = HashMap::new();
        for round in 1..cfg.reps.max(1) {
            for i in 0..makers.len() {
                if let Some(b) = makers[(i + round) % makers.len()](&shape) {
                    let best = best_insert.entry(b.name).or_insert(f64::MAX);
                    *best = best.min(b.insert);
                }
            }
        }
        let mut built: Vec<Built> = makers.iter().filter_map(|make| make(&shape)).collect();
        let mut rows: Vec<Row> = built
            .iter()
            .map(|b| Row {
                name: b.name,
                insert: Some(
                    best_insert
                        .get(b.name)
                        .map_or(b.insert, |&w| w.min(b.insert)),
                ),
                bytes: Some(b.bytes),
                lookup: Some(f64::MAX),
                iter: b.iter.as_ref().map(|_| f64::MAX),
                conc: None,
            })
            .collect();
        // Interleaved passes: every structure once per pass.
        for _ in 0..cfg.reps {
            for (b, r) in built.iter().zip(rows.iter_mut()) {
                let ns = time_ns(probes.len(), || {
                    let (s, n) = (b.look)(&probes);
                    assert_eq!(n, probes.len(), "{}: lookups missed", b.name);
                    std::hint::black_box(s);
                });
                r.lookup = r.lookup.map(|x| x.min(ns));
                if let Some(it) = &b.iter {
                    let ns = time_ns(shape.keys.len(), || {
                        let (s, n) = it();
                        assert_eq!(n, shape.keys.len(), "{}: iteration count", b.name);
                        std::hint::black_box(s);
                    });
                    r.iter = r.iter.map(|x| x.min(ns));
                }
            }
        }
        built.clear();
        // kxarray's own paths: per-call load vs batched, and the write paths.
        kx_extra.push(kx_paths(cfg, &shape, &probes));
        // Lookups under one concurrent writer (fresh structures).
        let nconc = probes.len().min(1 << 18);
        let cprobes = &probes[..nconc];
        let conc: Vec<(&str, f64)> = vec![
            (
                "kxarray",
                under_writer(Kx::with_keys(0), &shape, cprobes, cfg.reps),
            ),
            (
                "kx chunked",
                under_writer(Chunked::with_keys(shape.max_key), &shape, cprobes, cfg.reps),
            ),
            (
                "BTreeMap",
                under_writer(
                    Locked(parking_lot::RwLock::new(BTreeMap::new())),
                    &shape,
                    cprobes,
                    cfg.reps,
                ),
            ),
            (
                "HashMap nohash",
                under_writer(
                    Locked(parking_lot::RwLock::new(HashMap::<u64, u64, _>::default())),
                    &shape,
                    cprobes,
                    cfg.reps,
                ),
            ),
            (
                "congee",
                under_writer(Congee::with_keys(0), &shape, cprobes, cfg.reps),
            ),
            (
                "scc TreeIndex",
                under_writer(SccTree::with_keys(0), &shape, cprobes, cfg.reps),
            ),
            (
                "scc HashIndex",
                under_writer(SccHash::with_keys(0), &shape, cprobes, cfg.reps),
            ),
            (
                "SkipMap",
                under_writer(Skip::with_keys(0), &shape, cprobes, cfg.reps),
            ),
            (
                "papaya",
                under_writer(Papaya::with_keys(0), &shape, cprobes, cfg.reps),
            ),
        ];
        for (name, ns) in conc {
            if let Some(r) = rows.iter_mut().find(|r| r.name == name) {
                r.conc = Some(ns);
            }
        }
        all.push((shape.name, rows));
    }
    print_peers(&all);
    print_kx_paths(&kx_extra);
}

fn cell(x: Option<f64>, base: Option<f64>) -> String {
    match (x, base) {
        (Some(x), Some(b)) if x != f64::MAX => format!("{} ({:.2}x)", fmt_ns(x), x / b),
        _ => "—".into(),
    }
}

fn print_peers(all: &[(&'static str, Vec<Row>)]) {
    let names: Vec<&str> = all[0].1.iter().map(|r| r.name).collect();
    println!("ns/op (ratio = peer / kxarray; above 1 means kxarray is faster or smaller). \"under writer\" = lookups while another thread stores and erases; BTreeMap and HashMap then sit behind a parking_lot RwLock.\n");
    println!("| shape | op | {} |", names.join(" | "));
    println!("|---|---|{}", "---:|".repeat(names.len()));
    for (shape, rows) in all {
        let base = &rows[0];
        type Pick = fn(&Row) -> Option<f64>;
        let ops: [(&str, Pick); 5] = [
            ("lookup", |r| r.lookup),
            ("insert", |r| r.insert),
            ("iteration ns/entry", |r| r.iter),
            ("lookup under writer", |r| r.conc),
            ("bytes/entry", |r| r.bytes),
        ];
        for (op, pick) in ops {
            let cells: Vec<String> = names
                .iter()
                .map(|n| {
                    let r = rows.iter().find(|r| r.name == *n);
                    cell(r.and_then(pick), pick(base))
                })
                .collect();
            println!("| {shape} | {op} | {} |", cells.join(" | "));
        }
    }
}

/// kxarray's read and write paths on one shape: (shape, batched load,
/// per-call load_value, per-call `pin()` + load, locked store per call,
/// one lock for the batch, &mut replace).
type KxPaths = (&'static str, f64, f64, f64, f64, f64, f64);

fn kx_paths(cfg: &Cfg, shape: &Shape, probes: &[u64]) -> KxPaths {
    let (mut store, mut batch, mut repl) = (f64::MAX, f64::MAX, f64::MAX);
    let (mut batched, mut per_call, mut pinned) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..cfg.reps.min(2) {
        let xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
        store = store.min(time_ns(shape.keys.len(), || {
            for &k in &shape.keys {
                xa.store(k, kxarray::Entry::Value(k & 0xffff))
                    .expect("store");
            }
        }));
        drop(xa);
        let xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
        batch = batch.min(time_ns(shape.keys.len(), || {
            let l = xa.lock();
            for &k in &shape.keys {
                l.store(k, Some(kxarray::Entry::Value(k & 0xffff)))
                    .expect("store");
            }
        }));
        drop(xa);
        let mut xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
        repl = repl.min(time_ns(shape.keys.len(), || {
            for &k in &shape.keys {
                xa.replace(k, kxarray::Entry::Value(k & 0xffff))
                    .expect("replace");
            }
        }));
        let kx = Kx(xa);
        for _ in 0..2 {
            batched = batched.min(time_ns(probes.len(), || {
                let (s, n) = Map::lookups(&kx, probes);
                assert_eq!(n, probes.len());
                std::hint::black_box(s);
            }));
            per_call = per_call.min(time_ns(probes.len(), || {
                let (s, n) = kx_per_call(&kx.0, probes);
                assert_eq!(n, probes.len());
                std::hint::black_box(s);
            }));
            pinned = pinned.min(time_ns(probes.len(), || {
                let (s, n) = kx_pin_per_call(&kx.0, probes);
                assert_eq!(n, probes.len());
                std::hint::black_box(s);
            }));
        }
    }
    (shape.name, batched, per_call, pinned, store, batch, repl)
}

fn print_kx_paths(v: &[KxPaths]) {
    println!(
        "\n#### kxarray's own paths (same run): reads and writes the issue's targets are about\n"
    );
    println!("| shape | load, one guard per batch | load_value (light pin per call) | per-call / batched | pin() + load per call | pinned / batched | store (lock per call) | lock once, store all | &mut replace | store / replace |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &(name, batched, per_call, pinned, store, batch, repl) in v {
        println!(
            "| {name} | {} | {} | {:.2}x | {} | {:.2}x | {} | {} | {} | {:.2}x |",
            fmt_ns(batched),
            fmt_ns(per_call),
            per_call / batched,
            fmt_ns(pinned),
            pinned / batched,
            fmt_ns(store),
            fmt_ns(batch),
            fmt_ns(repl),
            store / repl
        );
    }
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.parse().ok()
}

fn main() {
    let quick = std::env::var_os("KXARRAY_PEERS_QUICK").is_some_and(|v| v != "0")
        || std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; nothing else is recognised.
    let mut cfg = if quick {
        Cfg {
            dense: 1 << 12,
            sparse: 1 << 10,
            swap_entries: 1 << 12,
            scal_keys: 1 << 12,
            reps: 1,
        }
    } else {
        Cfg {
            dense: 1 << 20,
            sparse: 1 << 17,
            swap_entries: 1 << 21,
            scal_keys: 1 << 19,
            reps: 3,
        }
    };
    if let Some(l) = env_u32("KXARRAY_PEERS_SPARSE_LOG2") {
        cfg.sparse = 1 << l.min(24);
    }
    let tables = std::env::var("KXARRAY_PEERS_TABLES").unwrap_or_else(|_| "1,2,3".into());
    let want = |t: &str| tables.split(',').any(|x| x.trim() == t);
    let t = Instant::now();
    println!(
        "kxarray peers benchmark ({} mode; {} cores)",
        if quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if want("1") {
        swap::swap_table(&cfg);
    }
    if want("2") {
        swap::scalability_table(&cfg);
    }
    if want("3") {
        peers_table(&cfg);
    }
    if want("kx") {
        // Only kxarray's own paths (`KXARRAY_PEERS_TABLES=kx`).
        let v: Vec<KxPaths> = shapes(&cfg)
            .iter()
            .map(|s| kx_paths(&cfg, s, &shuffled(&s.keys, 0xbeef)))
            .collect();
        print_kx_paths(&v);
    }
    println!("\n(total {:.0} s)", t.elapsed().as_secs_f64());
}
