//! kxarray against the std collections, side by side.
//!
//! 2^20 keys in three shapes:
//! - `dense`: the keys `0..2^20`;
//! - `sparse40`: 2^20 distinct random keys below 2^40 (page offsets of a
//!   large file);
//! - `sparse64`: 2^20 distinct random keys over the whole `u64` range.
//!
//! Operations (each case walks through all 2^20 keys in chunks of 2^16 ops,
//! one chunk per criterion iteration, reported per op; see `CHUNK`):
//! - `load_hit` / `load_miss`: random-order lookups of present / absent keys
//!   (kxarray: one guard pinned for the whole batch);
//! - `store`: insert every key into an empty structure (kxarray: through one
//!   held lock, `lock.store`, and through `&mut self`, `xa.replace`). Dense
//!   keys are inserted in ascending order, sparse keys in random order. The
//!   heap is faulted in first (a full tree built and dropped, untimed), so
//!   no case pays page faults the others do not;
//! - `erase`: remove every key (same order as `store`) from a full structure
//!   (kxarray: `lock.erase` under one held lock);
//! - `iter`: a full ordered iteration (kxarray: `xa.iter(&g)` and a raw
//!   `XaState::find` loop). HashMap iteration is unordered (shown for
//!   reference only).
//!
//! Competitors: `BTreeMap<u64, u64>`, `HashMap<u64, u64>` with std's default
//! SipHash and with a no-op integer hasher, and for the dense shape a plain
//! `Vec<Option<u64>>` (the floor).
//!
//! After criterion's groups a markdown summary table is printed: median
//! ns/op over the measured calls, the ratio to kxarray (other / kxarray, so > 1
//! means kxarray is faster), and bytes per entry.
//!
//! `KXARRAY_BENCH_QUICK=1 cargo bench --bench xarray` skips criterion and only
//! prints the table (a few chunks per case).
//! `KXARRAY_BENCH_SHAPES=dense,sparse40` restricts the shapes.

use criterion::{Criterion, SamplingMode, Throughput};
use kxarray::{Entry, XArray, XaState, MAX_VALUE};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// A counting allocator: live heap bytes as requested by the program (no
// malloc headers or size-class rounding). Used only to cross-check the memory
// column; the cost is one relaxed atomic add per (de)allocation.
// ---------------------------------------------------------------------------

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's `GlobalAlloc` contract, forwarded unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's `GlobalAlloc` contract, forwarded unchanged.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's `GlobalAlloc` contract, forwarded unchanged.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's `GlobalAlloc` contract, forwarded unchanged.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// Structures
// ---------------------------------------------------------------------------

type Kx = XArray<Box<u64>>;

/// A no-op hasher for integer keys: the hash is the key itself.
#[derive(Default)]
struct NoHash(u64);

impl Hasher for NoHash {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type NoHashMap = HashMap<u64, u64, BuildHasherDefault<NoHash>>;

const N: usize = 1 << 20;

#[inline]
fn val(k: u64) -> u64 {
    k & MAX_VALUE
}

struct Shape {
    name: &'static str,
    dense: bool,
    /// Insertion (and erase) order.
    keys: Vec<u64>,
    /// Present keys, random order.
    hits: Vec<u64>,
    /// Absent keys, random order.
    misses: Vec<u64>,
}

fn make_shape(name: &'static str, seed: u64) -> Shape {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (dense, keys, misses) = match name {
        "dense" => {
            let keys: Vec<u64> = (0..N as u64).collect();
            // misses: the next 2^20 indices (beyond the populated range)
            let misses: Vec<u64> = (N as u64..2 * N as u64).collect();
            (true, keys, misses)
        }
        _ => {
            let mask = if name == "sparse40" {
                (1u64 << 40) - 1
            } else {
                u64::MAX
            };
            let mut set = HashSet::with_capacity(N);
            let mut keys = Vec::with_capacity(N);
            while keys.len() < N {
                let k = rng.random::<u64>() & mask;
                if set.insert(k) {
                    keys.push(k);
                }
            }
            let mut misses = Vec::with_capacity(N);
            while misses.len() < N {
                let k = rng.random::<u64>() & mask;
                if !set.contains(&k) {
                    misses.push(k);
                }
            }
            (false, keys, misses)
        }
    };
    let mut hits = keys.clone();
    hits.shuffle(&mut rng);
    let mut misses = misses;
    misses.shuffle(&mut rng);
    Shape {
        name,
        dense,
        keys,
        hits,
        misses,
    }
}

fn build_kx(keys: &[u64]) -> Kx {
    let mut xa = Kx::new();
    for &k in keys {
        xa.replace(k, Entry::Value(val(k))).unwrap();
    }
    xa
}
fn build_btree(keys: &[u64]) -> BTreeMap<u64, u64> {
    keys.iter().map(|&k| (k, val(k))).collect()
}
fn build_hash(keys: &[u64]) -> HashMap<u64, u64> {
    let mut m = HashMap::new();
    for &k in keys {
        m.insert(k, val(k));
    }
    m
}
fn build_nohash(keys: &[u64]) -> NoHashMap {
    let mut m = NoHashMap::default();
    for &k in keys {
        m.insert(k, val(k));
    }
    m
}
fn build_vec(keys: &[u64]) -> Vec<Option<u64>> {
    let mut v = Vec::new();
    for &k in keys {
        vec_set(&mut v, k);
    }
    v
}
#[inline]
fn vec_set(v: &mut Vec<Option<u64>>, k: u64) {
    let i = k as usize;
    if i >= v.len() {
        v.resize(i + 1, None);
    }
    v[i] = Some(val(k));
}

/// Let the epoch reclaim what the last batches retired (outside timing).
fn settle_epoch() {
    for _ in 0..4 {
        kxarray::pin().flush();
    }
}

// ---------------------------------------------------------------------------
// Bytes per entry, estimated from capacity and layout
// ---------------------------------------------------------------------------

/// `Vec<Option<u64>>`: capacity * size_of::<Option<u64>>() (16 bytes).
fn vec_bytes(v: &Vec<Option<u64>>) -> usize {
    v.capacity() * core::mem::size_of::<Option<u64>>()
}

/// hashbrown (std's HashMap): `buckets` slots of (K, V) plus one control byte
/// per bucket and one trailing SIMD group (16 bytes). For buckets >= 8 the
/// reported capacity is 7/8 of the buckets, which is a power of two.
fn hash_bytes(capacity: usize) -> usize {
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets * (core::mem::size_of::<(u64, u64)>() + 1) + 16
}

/// std's BTreeMap does not expose its node count; the estimate uses its
/// node layout (B = 6): a leaf is 192 bytes (parent pointer, index, length,
/// 11 keys, 11 values), an internal node 288 (plus 12 edges). The benchmark's
/// maps are built with `collect()`, which sorts and bulk-loads full nodes:
/// 11 pairs per leaf plus one separator pair in the parent per leaf, i.e.
/// len / 12 leaves and len / 144 internal nodes (a map built by random
/// inserts is ~69% full instead). The allocator column measures it.
fn btree_bytes_estimate(len: usize) -> usize {
    let leaves = len.div_ceil(12);
    let internal = leaves.div_ceil(12) + leaves.div_ceil(144);
    leaves * 192 + internal * 288
}

// ---------------------------------------------------------------------------
// Measurement plumbing
// ---------------------------------------------------------------------------

/// Operations per criterion iteration. Every case walks through its 2^20
/// keys in consecutive chunks of this size and keeps its state between
/// iterations: a store case keeps filling the same structure until all 2^20
/// keys are in (then drops it, untimed, and starts again from empty); an
/// erase case keeps emptying one full structure (rebuilt, untimed, when
/// empty); iteration resumes where the previous chunk stopped. So the per-op
/// figures are those of whole 2^20-key batches, while one criterion
/// iteration stays short enough for the sparse shapes (where a single kxarray
/// store batch takes seconds) to fit the time budget.
const CHUNK: usize = 1 << 16;
const CHUNKS: usize = N / CHUNK;

/// (shape, op, structure) -> ns/op of every call (criterion sample or
/// warm-up step); the first (cold) call is left out. The table shows the
/// median: this 2-core machine is shared, and a median of per-call figures
/// shrugs off the calls that were preempted, where a mean would not.
type Acc = (String, String, String, Vec<f64>);
static RESULTS: Mutex<Vec<Acc>> = Mutex::new(Vec::new());
/// (shape, structure, estimated bytes/entry, allocator-measured bytes/entry)
static MEMORY: Mutex<Vec<(String, String, f64, f64)>> = Mutex::new(Vec::new());

fn record(shape: &str, op: &str, st: &str, d: Duration, ops: u64) {
    let ns = d.as_nanos() as f64 / ops as f64;
    let mut r = RESULTS.lock().unwrap();
    if let Some(e) = r
        .iter_mut()
        .find(|e| e.0 == shape && e.1 == op && e.2 == st)
    {
        e.3.push(ns);
    } else {
        // first (cold) call: not counted
        r.push((shape.into(), op.into(), st.into(), Vec::new()));
    }
}

fn result(shape: &str, op: &str, st: &str) -> Option<f64> {
    let r = RESULTS.lock().unwrap();
    let e = r
        .iter()
        .find(|e| e.0 == shape && e.1 == op && e.2 == st && !e.3.is_empty())?;
    let mut v = e.3.clone();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Some(v[v.len() / 2])
}

/// A benchmark: its name, the ops one iteration performs, and the routine
/// (`iters` iterations, returning only the timed part).
type Case<'a> = (&'static str, u64, Box<dyn FnMut(u64) -> Duration + 'a>);

enum Mode {
    Criterion(Box<Criterion>),
    Quick,
}

/// Iterations per case in quick mode (the first is a warm-up).
const QUICK_ITERS: usize = 8;

impl Mode {
    fn run(&mut self, shape: &str, op: &str, cases: Vec<Case<'_>>) {
        match self {
            Mode::Criterion(c) => {
                let mut g = c.benchmark_group(format!("{shape}/{op}"));
                g.sampling_mode(SamplingMode::Flat)
                    .sample_size(10)
                    .warm_up_time(Duration::from_millis(300))
                    .measurement_time(Duration::from_millis(1500));
                for (name, elems, mut f) in cases {
                    g.throughput(Throughput::Elements(elems));
                    g.bench_function(name, |b| {
                        b.iter_custom(|iters| {
                            let d = f(iters);
                            record(shape, op, name, d, iters * elems);
                            d
                        })
                    });
                }
                g.finish();
            }
            Mode::Quick => {
                for (name, elems, mut f) in cases {
                    for _ in 0..QUICK_ITERS {
                        let d = f(1);
                        record(shape, op, name, d, elems);
                    }
                    eprintln!(
                        "{shape}/{op}/{name}: {:.2} ns/op",
                        result(shape, op, name).unwrap()
                    );
                }
            }
        }
    }
}

/// A rotating chunk of `keys`.
struct Chunks<'k> {
    keys: &'k [u64],
    next: usize,
}
impl<'k> Chunks<'k> {
    fn new(keys: &'k [u64]) -> Self {
        Chunks { keys, next: 0 }
    }
    fn next(&mut self) -> &'k [u64] {
        let c = &self.keys[self.next * CHUNK..(self.next + 1) * CHUNK];
        self.next = (self.next + 1) % CHUNKS;
        c
    }
}

/// A store case: `insert` one chunk of keys (timed) into the structure
/// `fresh` makes, starting over (untimed) after all 2^20 keys went in.
fn store_case<'a, S: 'a>(
    keys: &'a [u64],
    fresh: impl Fn() -> S + 'a,
    after_drop: fn(),
    mut insert: impl FnMut(&mut S, &[u64]) + 'a,
) -> Box<dyn FnMut(u64) -> Duration + 'a> {
    let mut state: Option<S> = None;
    let mut chunks = Chunks::new(keys);
    Box::new(move |iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            if chunks.next == 0 {
                drop(state.take());
                after_drop();
                state = Some(fresh());
            }
            let s = state.as_mut().unwrap();
            let c = chunks.next();
            let t = Instant::now();
            insert(s, c);
            total += t.elapsed();
        }
        total
    })
}

/// An erase case: `erase` one chunk of keys (timed) from the full structure
/// `build` makes, rebuilding it (untimed) once it is empty.
fn erase_case<'a, S: 'a>(
    keys: &'a [u64],
    build: impl Fn(&[u64]) -> S + 'a,
    after_drop: fn(),
    mut erase: impl FnMut(&mut S, &[u64]) + 'a,
) -> Box<dyn FnMut(u64) -> Duration + 'a> {
    let mut state: Option<S> = None;
    let mut chunks = Chunks::new(keys);
    Box::new(move |iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            if chunks.next == 0 {
                drop(state.take());
                after_drop();
                state = Some(build(keys));
            }
            let s = state.as_mut().unwrap();
            let c = chunks.next();
            let t = Instant::now();
            erase(s, c);
            total += t.elapsed();
        }
        total
    })
}

fn nothing() {}

/// A load case: look up one chunk of `keys` per iteration.
fn load_case<'a>(
    keys: &'a [u64],
    mut look: impl FnMut(&[u64]) + 'a,
) -> Box<dyn FnMut(u64) -> Duration + 'a> {
    let mut chunks = Chunks::new(keys);
    Box::new(move |iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let c = chunks.next();
            let t = Instant::now();
            look(c);
            total += t.elapsed();
        }
        total
    })
}

/// An ordered-iteration case: `walk(start)` visits CHUNK entries from `start`
/// on (wrapping to the first entry at the end) and returns where the next
/// chunk starts.
fn iter_case<'a>(mut walk: impl FnMut(u64) -> u64 + 'a) -> Box<dyn FnMut(u64) -> Duration + 'a> {
    let mut start = 0u64;
    Box::new(move |iters| {
        let t = Instant::now();
        for _ in 0..iters {
            start = walk(start);
        }
        t.elapsed()
    })
}

// ---------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------

fn bench_shape(mode: &mut Mode, s: &Shape) {
    let n = s.keys.len() as u64;
    let c = CHUNK as u64;
    // Prebuilt structures for loads and iteration, with memory accounting.
    let before = live();
    let xa = build_kx(&s.keys);
    let kx_measured = (live() - before) as f64 / n as f64;
    let kx_est = xa.memory_usage() as f64 / n as f64;
    let before = live();
    let bt = build_btree(&s.keys);
    let bt_measured = (live() - before) as f64 / n as f64;
    let before = live();
    let hm = build_hash(&s.keys);
    let hm_measured = (live() - before) as f64 / n as f64;
    let before = live();
    let nh = build_nohash(&s.keys);
    let nh_measured = (live() - before) as f64 / n as f64;
    let vec = if s.dense {
        let before = live();
        let v = build_vec(&s.keys);
        let m = (live() - before) as f64 / n as f64;
        Some((v, m))
    } else {
        None
    };
    {
        let mut mem = MEMORY.lock().unwrap();
        let sh = s.name.to_string();
        mem.push((sh.clone(), "kxarray".into(), kx_est, kx_measured));
        let bt_est = btree_bytes_estimate(bt.len()) as f64 / n as f64;
        mem.push((sh.clone(), "BTreeMap".into(), bt_est, bt_measured));
        mem.push((
            sh.clone(),
            "HashMap".into(),
            hash_bytes(hm.capacity()) as f64 / n as f64,
            hm_measured,
        ));
        mem.push((
            sh.clone(),
            "HashMap+NoHash".into(),
            hash_bytes(nh.capacity()) as f64 / n as f64,
            nh_measured,
        ));
        if let Some((v, m)) = &vec {
            mem.push((sh, "Vec".into(), vec_bytes(v) as f64 / n as f64, *m));
        }
    }
    let vec = vec.map(|(v, _)| v);
    let (xa, bt, hm, nh) = (&xa, &bt, &hm, &nh);

    // ---- loads ----
    for (op, keys) in [("load_hit", &s.hits), ("load_miss", &s.misses)] {
        let mut cases: Vec<Case<'_>> = vec![
            (
                "kxarray",
                c,
                load_case(keys, move |keys| {
                    let g = kxarray::pin();
                    for &k in keys {
                        black_box(xa.load(k, &g));
                    }
                }),
            ),
            (
                // the kernel's xa_load: a fresh cursor per key, whose walk
                // counter is kept (shows what cursor + counter cost)
                "kxarray/cursor",
                c,
                load_case(keys, move |keys| {
                    let g = kxarray::pin();
                    for &k in keys {
                        let mut xas = XaState::new(xa, &g, k);
                        black_box(xas.load());
                        black_box(xas.walks());
                    }
                }),
            ),
            (
                "BTreeMap",
                c,
                load_case(keys, move |keys| {
                    for &k in keys {
                        black_box(bt.get(&k));
                    }
                }),
            ),
            (
                "HashMap",
                c,
                load_case(keys, move |keys| {
                    for &k in keys {
                        black_box(hm.get(&k));
                    }
                }),
            ),
            (
                "HashMap+NoHash",
                c,
                load_case(keys, move |keys| {
                    for &k in keys {
                        black_box(nh.get(&k));
                    }
                }),
            ),
        ];
        if let Some(v) = &vec {
            cases.push((
                "Vec",
                c,
                load_case(keys, move |keys| {
                    for &k in keys {
                        black_box(v.get(k as usize).copied().flatten());
                    }
                }),
            ));
        }
        mode.run(s.name, op, cases);
    }

    // ---- ordered iteration, CHUNK entries per criterion iteration ----
    {
        let mut cases: Vec<Case<'_>> = vec![
            (
                "kxarray",
                c,
                iter_case(move |start| {
                    let g = kxarray::pin();
                    let mut it = xa.range(start.., &g);
                    let (mut acc, mut last, mut seen) = (0u64, 0u64, 0usize);
                    while seen < CHUNK {
                        match it.next() {
                            Some((i, e)) => {
                                acc = acc.wrapping_add(i ^ e.value().unwrap_or(0));
                                last = i;
                                seen += 1;
                            }
                            None => it = xa.iter(&g),
                        }
                    }
                    black_box(acc);
                    last.wrapping_add(1)
                }),
            ),
            (
                "kxarray/cursor",
                c,
                iter_case(move |start| {
                    let g = kxarray::pin();
                    let mut xas = XaState::new(xa, &g, start);
                    let (mut acc, mut seen) = (0u64, 0usize);
                    while seen < CHUNK {
                        match xas.find(u64::MAX) {
                            Some(e) => {
                                acc = acc.wrapping_add(xas.index() ^ e.value().unwrap_or(0));
                                seen += 1;
                            }
                            None => xas = XaState::new(xa, &g, 0),
                        }
                    }
                    black_box(acc);
                    xas.index().wrapping_add(1)
                }),
            ),
            (
                "BTreeMap",
                c,
                iter_case(move |start| {
                    let mut it = bt.range(start..);
                    let (mut acc, mut last, mut seen) = (0u64, 0u64, 0usize);
                    while seen < CHUNK {
                        match it.next() {
                            Some((&k, &v)) => {
                                acc = acc.wrapping_add(k ^ v);
                                last = k;
                                seen += 1;
                            }
                            None => it = bt.range(0..),
                        }
                    }
                    black_box(acc);
                    last.wrapping_add(1)
                }),
            ),
            // unordered; a whole table walk per iteration
            (
                "HashMap",
                n,
                iter_case(move |_| {
                    let mut acc = 0u64;
                    for (&k, &v) in hm.iter() {
                        acc = acc.wrapping_add(k ^ v);
                    }
                    black_box(acc);
                    0
                }),
            ),
            (
                "HashMap+NoHash",
                n,
                iter_case(move |_| {
                    let mut acc = 0u64;
                    for (&k, &v) in nh.iter() {
                        acc = acc.wrapping_add(k ^ v);
                    }
                    black_box(acc);
                    0
                }),
            ),
        ];
        if let Some(v) = &vec {
            cases.push((
                "Vec",
                c,
                iter_case(move |start| {
                    let start = start as usize % v.len();
                    let mut acc = 0u64;
                    for (i, o) in v[start..start + CHUNK].iter().enumerate() {
                        if let Some(x) = *o {
                            acc = acc.wrapping_add((start + i) as u64 ^ x);
                        }
                    }
                    black_box(acc);
                    (start + CHUNK) as u64
                }),
            ));
        }
        mode.run(s.name, "iter", cases);
    }

    let keys = &s.keys[..];
    // ---- store: insert every key into an empty structure ----
    // Fault the heap in first: build a full tree and drop it (untimed), so
    // that every store case allocates from memory the process already
    // touched. Without this the first case pays the kernel's page faults for
    // the whole tree (a sparse tree is about 1.6 KB per key; on this
    // machine's VM a fault costs microseconds) and the cases after it do
    // not, which is what once showed `lock.store` at 4x `replace`.
    drop(build_kx(keys));
    settle_epoch();
    {
        let mut cases: Vec<Case<'_>> = vec![
            (
                "kxarray",
                c,
                store_case(keys, Kx::new, settle_epoch, |xa, keys| {
                    let lock = xa.lock();
                    for &k in keys {
                        black_box(lock.store(k, Some(Entry::Value(val(k)))).is_ok());
                    }
                }),
            ),
            (
                "kxarray/replace",
                c,
                store_case(keys, Kx::new, nothing, |xa, keys| {
                    for &k in keys {
                        black_box(xa.replace(k, Entry::Value(val(k))).is_ok());
                    }
                }),
            ),
            (
                "BTreeMap",
                c,
                store_case(keys, BTreeMap::new, nothing, |m, keys| {
                    for &k in keys {
                        black_box(m.insert(k, val(k)));
                    }
                }),
            ),
            (
                "HashMap",
                c,
                store_case(keys, HashMap::new, nothing, |m, keys| {
                    for &k in keys {
                        black_box(m.insert(k, val(k)));
                    }
                }),
            ),
            (
                "HashMap+NoHash",
                c,
                store_case(keys, NoHashMap::default, nothing, |m, keys| {
                    for &k in keys {
                        black_box(m.insert(k, val(k)));
                    }
                }),
            ),
        ];
        if s.dense {
            cases.push((
                "Vec",
                c,
                store_case(keys, Vec::new, nothing, |v, keys| {
                    for &k in keys {
                        vec_set(v, k);
                    }
                    black_box(&v);
                }),
            ));
        }
        mode.run(s.name, "store", cases);
    }

    // ---- erase: remove every key from a full structure ----
    {
        let mut cases: Vec<Case<'_>> = vec![
            (
                "kxarray",
                c,
                erase_case(keys, build_kx, settle_epoch, |xa, keys| {
                    let lock = xa.lock();
                    for &k in keys {
                        black_box(lock.erase(k).is_some());
                    }
                }),
            ),
            (
                "BTreeMap",
                c,
                erase_case(keys, build_btree, nothing, |m, keys| {
                    for &k in keys {
                        black_box(m.remove(&k));
                    }
                }),
            ),
            (
                "HashMap",
                c,
                erase_case(keys, build_hash, nothing, |m, keys| {
                    for &k in keys {
                        black_box(m.remove(&k));
                    }
                }),
            ),
            (
                "HashMap+NoHash",
                c,
                erase_case(keys, build_nohash, nothing, |m, keys| {
                    for &k in keys {
                        black_box(m.remove(&k));
                    }
                }),
            ),
        ];
        if s.dense {
            cases.push((
                "Vec",
                c,
                erase_case(keys, build_vec, nothing, |v, keys| {
                    for &k in keys {
                        black_box(v[k as usize].take());
                    }
                }),
            ));
        }
        mode.run(s.name, "erase", cases);
    }
    settle_epoch();
}

// ---------------------------------------------------------------------------
// The summary table
// ---------------------------------------------------------------------------

const COLUMNS: [(&str, &str); 6] = [
    ("kxarray", "kxarray"),
    ("kxarray alt", ""),
    ("BTreeMap", "BTreeMap"),
    ("HashMap (SipHash)", "HashMap"),
    ("HashMap (NoHash)", "HashMap+NoHash"),
    ("Vec<Option<u64>>", "Vec"),
];

fn print_table(shapes: &[&str]) {
    let ops = ["load_hit", "load_miss", "store", "erase", "iter"];
    println!();
    println!("## kxarray vs std: ns/op (median over the measured calls, chunks of 2^16 ops), ratio = other / kxarray (> 1: kxarray faster)");
    println!();
    let mut header = String::from("| shape | op |");
    let mut rule = String::from("|---|---|");
    for (title, _) in COLUMNS {
        header += &format!(" {title} |");
        rule += "---:|";
    }
    println!("{header}");
    println!("{rule}");
    for &shape in shapes {
        for op in ops {
            let Some(kx) = result(shape, op, "kxarray") else {
                continue;
            };
            let mut row = format!("| {shape} | {op} |");
            for (title, st) in COLUMNS {
                let cell = if title == "kxarray" {
                    format!("{kx:.2}")
                } else if title == "kxarray alt" {
                    let alt = match op {
                        "store" => Some(("replace", "kxarray/replace")),
                        "iter" | "load_hit" | "load_miss" => Some(("cursor", "kxarray/cursor")),
                        _ => None,
                    };
                    match alt.and_then(|(label, st)| result(shape, op, st).map(|v| (label, v))) {
                        Some((label, v)) => format!("{label} {v:.2} ({:.2}x)", v / kx),
                        None => "—".into(),
                    }
                } else {
                    match result(shape, op, st) {
                        Some(v) => format!("{v:.2} ({:.2}x)", v / kx),
                        None => "—".into(),
                    }
                };
                row += &format!(" {cell} |");
            }
            println!("{row}");
        }
    }
    println!();
    println!("kxarray: `load` under one pinned guard; store = `lock.store` under one held lock (alt: `xa.replace`); erase = `lock.erase`; iter = `xa.iter(&g)` (alt: `XaState::find` loop); load alt = a fresh `XaState` per key with its walk counter (the kernel's `xa_load`). HashMap iteration is unordered.");
    println!();
    println!("## Bytes per entry (2^20 entries)");
    println!();
    println!("| shape | structure | estimated (layout) | measured (allocator) |");
    println!("|---|---|---:|---:|");
    let mem = MEMORY.lock().unwrap();
    for &shape in shapes {
        for (sh, st, est, measured) in mem.iter() {
            if sh == shape {
                println!("| {sh} | {st} | {est:.2} | {measured:.2} |");
            }
        }
    }
    println!();
    println!("kxarray estimate = `xa.memory_usage()` (nodes * {} B + the array); HashMap = buckets * 17 B + 16 from `capacity()`; Vec = `capacity()` * 16 B; BTreeMap = 192 B leaves / 288 B internal nodes, bulk-loaded full by `collect()`. Measured = live bytes requested from the allocator (no malloc overhead).", Kx::NODE_BYTES);
}

fn main() {
    let quick = std::env::var("KXARRAY_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let shapes: Vec<&'static str> = match std::env::var("KXARRAY_BENCH_SHAPES") {
        Ok(list) => ["dense", "sparse40", "sparse64"]
            .into_iter()
            .filter(|s| list.split(',').any(|x| x.trim() == *s))
            .collect(),
        Err(_) => vec!["dense", "sparse40", "sparse64"],
    };
    let mut mode = if quick {
        Mode::Quick
    } else {
        Mode::Criterion(Box::new(Criterion::default().configure_from_args()))
    };
    let start = Instant::now();
    for (i, &name) in shapes.iter().enumerate() {
        let shape = make_shape(name, 0x5eed + i as u64);
        bench_shape(&mut mode, &shape);
    }
    if let Mode::Criterion(c) = &mode {
        c.final_summary();
    }
    print_table(&shapes);
    eprintln!("\n(total {:.1}s)", start.elapsed().as_secs_f64());
}
