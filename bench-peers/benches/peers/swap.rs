//! Tables 1 and 2 of the peer benchmark: the swap-like workload (one
//! `XArray` by device offset, the chunked index, and a flat per-cluster
//! table as upstream's "swap table"), and writer scalability.

use crate::{fmt_ns, keys_distinct, shuffled, time_ns, Cfg};
use kxarray::{ChunkedXArray, Entry, XArray};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Barrier;

/// Slots per cluster: 2 MiB of 4 KiB pages.
const CLUSTER_SLOTS: usize = 512;
type Cluster = [AtomicU64; CLUSTER_SLOTS];

/// A flat table of 512 `AtomicU64` slots per 2 MiB cluster behind a
/// lock-free directory of cluster pointers (clusters made on first store
/// with a compare-exchange, kept until the table drops: the bench never
/// empties a cluster). Slot value 0 means empty; values are stored plus 1.
pub struct ClusterTable {
    dir: Box<[AtomicPtr<Cluster>]>,
}

impl ClusterTable {
    pub fn new(slots: u64) -> Self {
        let n = slots.div_ceil(CLUSTER_SLOTS as u64) as usize;
        ClusterTable {
            dir: (0..n)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    #[inline]
    pub fn load(&self, slot: u64) -> Option<u64> {
        let p = self.dir.get((slot / CLUSTER_SLOTS as u64) as usize)?;
        let c = p.load(Ordering::Acquire);
        if c.is_null() {
            return None;
        }
        // SAFETY: a published cluster stays allocated until `self` drops.
        let v = unsafe { (*c)[slot as usize % CLUSTER_SLOTS].load(Ordering::Acquire) };
        v.checked_sub(1)
    }

    pub fn store(&self, slot: u64, v: u64) {
        let p = &self.dir[(slot / CLUSTER_SLOTS as u64) as usize];
        let mut c = p.load(Ordering::Acquire);
        if c.is_null() {
            let fresh: Box<Cluster> = Box::new(std::array::from_fn(|_| AtomicU64::new(0)));
            let fresh = Box::into_raw(fresh);
            match p.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => c = fresh,
                Err(won) => {
                    // SAFETY: `fresh` was never published.
                    drop(unsafe { Box::from_raw(fresh) });
                    c = won;
                }
            }
        }
        // SAFETY: as in `load`.
        unsafe { (*c)[slot as usize % CLUSTER_SLOTS].store(v + 1, Ordering::Release) };
    }

    pub fn clusters(&self) -> usize {
        self.dir
            .iter()
            .filter(|p| !p.load(Ordering::Relaxed).is_null())
            .count()
    }

    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.dir) + self.clusters() * std::mem::size_of::<Cluster>()
    }
}

impl Drop for ClusterTable {
    fn drop(&mut self) {
        for p in self.dir.iter() {
            let c = p.load(Ordering::Relaxed);
            if !c.is_null() {
                // SAFETY: made by `Box::into_raw` in `store`, unreachable now.
                drop(unsafe { Box::from_raw(c) });
            }
        }
    }
}

/// Table 1: random slots over a 128 GiB device of 4 KiB pages.
pub fn swap_table(cfg: &Cfg) {
    let slots: u64 = 128 << 18; // 128 GiB / 4 KiB = 2^25
    let n = cfg.swap_entries;
    let keys = keys_distinct(n, slots, 0x5a9);
    let probes = shuffled(&keys, 0x77);
    println!(
        "\n### 1. Swap-like workload: {} random slots of a 128 GiB device (2^25 4 KiB slots)\n",
        keys.len()
    );

    // Chunk shifts: 12 (two levels per chunk), 14 (the swap cache's 64 MiB,
    // three levels with a 4-way root), 18 (three full levels).
    const SHIFTS: [u32; 3] = [12, 14, 18];
    const K: usize = SHIFTS.len() + 2;
    let mut ins = [f64::MAX; K];
    let mut look = [f64::MAX; K];
    let mut stats = Vec::new();
    // Every lookup pass checks that it found every key (a lookup that
    // misses would be cheaper and must not count).
    let checked = |s: u64, hits: usize| {
        assert_eq!(hits, probes.len(), "a lookup missed");
        std::hint::black_box(s);
    };
    let lookups_kx = |xa: &XArray<Box<u64>>| {
        time_ns(probes.len(), || {
            let g = kxarray::pin();
            let (mut s, mut hits) = (0u64, 0usize);
            for &k in &probes {
                if let Some(v) = xa.load(k, &g).and_then(|e| e.value()) {
                    s = s.wrapping_add(v);
                    hits += 1;
                }
            }
            checked(s, hits);
        })
    };
    let lookups_cx = |cx: &ChunkedXArray<Box<u64>>| {
        time_ns(probes.len(), || {
            let g = kxarray::pin();
            let (mut s, mut hits) = (0u64, 0usize);
            for &k in &probes {
                if let Some(v) = cx.load(k, &g).and_then(|e| e.value()) {
                    s = s.wrapping_add(v);
                    hits += 1;
                }
            }
            checked(s, hits);
        })
    };
    let lookups_ft = |ft: &ClusterTable| {
        time_ns(probes.len(), || {
            let (mut s, mut hits) = (0u64, 0usize);
            for &k in &probes {
                if let Some(v) = ft.load(k) {
                    s = s.wrapping_add(v);
                    hits += 1;
                }
            }
            checked(s, hits);
        })
    };
    for rep in 0..cfg.reps {
        let xa: XArray<Box<u64>> = XArray::new();
        let cxs: Vec<ChunkedXArray<Box<u64>>> = SHIFTS
            .iter()
            .map(|&sh| ChunkedXArray::with_capacity(sh, slots - 1).expect("shift"))
            .collect();
        let ft = ClusterTable::new(slots);
        // Structure `j` in the table's order: 0 the XArray, 1..K-1 the
        // chunked ones, K-1 the flat table. The build order and the lookup
        // order rotate from rep to rep (odd reps run backwards), so that no
        // structure always gets the first (or last) pick of fresh memory
        // or the first pass: in one process the figures depended on that
        // order more than on the structure.
        let order: Vec<usize> = (0..K)
            .map(|j| {
                let j = (j + rep) % K;
                if rep % 2 == 1 {
                    K - 1 - j
                } else {
                    j
                }
            })
            .collect();
        // Inserts, one structure after the other (each a fresh build).
        for &j in &order {
            let ns = time_ns(keys.len(), || {
                for &k in &keys {
                    match j {
                        0 => xa.store(k, Entry::Value(k)).map(drop).expect("store"),
                        j if j == K - 1 => ft.store(k, k),
                        j => cxs[j - 1]
                            .store(k, Entry::Value(k))
                            .map(drop)
                            .expect("store"),
                    }
                }
            });
            ins[j] = ins[j].min(ns);
        }
        // Lookups, interleaved.
        for _ in 0..2 {
            for &j in &order {
                let ns = match j {
                    0 => lookups_kx(&xa),
                    j if j == K - 1 => lookups_ft(&ft),
                    j => lookups_cx(&cxs[j - 1]),
                };
                look[j] = look[j].min(ns);
            }
        }
        if rep == 0 {
            // Every structure holds every key with its value.
            for &k in keys.iter().step_by(97) {
                assert_eq!(xa.load_value(k), Some(k));
                for cx in &cxs {
                    assert_eq!(cx.load_value(k), Some(k));
                }
                assert_eq!(ft.load(k), Some(k));
            }
            stats.push((xa.height(), xa.node_count(), xa.memory_usage()));
            for cx in &cxs {
                stats.push((
                    cx.height(),
                    cx.node_count() + cx.directory_node_count(),
                    cx.memory_usage(),
                ));
                let g = kxarray::pin();
                assert_eq!(cx.iter(&g).count(), keys.len());
                assert!(cx.iter(&g).map(|(i, _)| i).is_sorted());
            }
            stats.push((2, ft.clusters(), ft.bytes()));
            println!(
                "(chunks: {} at shift 12, {} at shift 14, {} at shift 18; flat table: {} clusters of 512 slots)\n",
                cxs[0].chunk_count(),
                cxs[1].chunk_count(),
                cxs[2].chunk_count(),
                ft.clusters()
            );
        }
    }
    let names = [
        "one XArray (by device offset)",
        "ChunkedXArray, 2^12 per chunk",
        "ChunkedXArray, 2^14 per chunk (default)",
        "ChunkedXArray, 2^18 per chunk",
        "flat cluster table (512 x AtomicU64 per 2 MiB)",
    ];
    println!("| structure | height (levels) | nodes (clusters) | bytes | bytes/entry | lookup ns | lookup vs XArray | lookup vs flat | insert ns | insert vs flat |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for i in 0..K {
        let (h, nodes, bytes) = stats[i];
        println!(
            "| {} | {} | {} | {} | {:.1} | {} | {:.2}x | {:.2}x | {} | {:.2}x |",
            names[i],
            h,
            nodes,
            bytes,
            bytes as f64 / keys.len() as f64,
            fmt_ns(look[i]),
            look[i] / look[0],
            look[i] / look[K - 1],
            fmt_ns(ins[i]),
            ins[i] / ins[K - 1],
        );
    }
}

/// Table 2: one and two writer threads on disjoint key ranges.
pub fn scalability_table(cfg: &Cfg) {
    let per = cfg.scal_keys;
    println!(
        "\n### 2. Writer scalability: {per} stores per thread, threads on disjoint ranges (thread t: keys t*2^32 + 0..{per}, in order)\n"
    );
    // In order, as the kernel's swap allocator hands out the slots of a
    // per-CPU cluster: each thread's working set stays in its own cache, so
    // the table shows lock sharing, not the memory bandwidth of random stores.
    let offsets: Vec<u64> = (0..per as u64).collect();
    // Per run: wall ns per store over all threads, and CPU ns per store
    // (the threads' own CPU time, summed), best wall of `reps`.
    // mode 0: one XArray; 1: ChunkedXArray; 2: one XArray per thread (no
    // shared lock at all: what the machine allows right now).
    let run = |threads: usize, mode: u8| -> (f64, f64) {
        (0..cfg.reps.max(1))
            .map(|_| {
                let xa: XArray<Box<u64>> = XArray::new();
                let own: Vec<XArray<Box<u64>>> = (0..threads).map(|_| XArray::new()).collect();
                let cx: ChunkedXArray<Box<u64>> = ChunkedXArray::new();
                let barrier = Barrier::new(threads);
                let t = std::time::Instant::now();
                let cpu: f64 = std::thread::scope(|s| {
                    let hs: Vec<_> = own
                        .iter()
                        .enumerate()
                        .map(|(th, mine)| {
                            let (xa, cx, barrier, offsets) = (&xa, &cx, &barrier, &offsets);
                            s.spawn(move || {
                                let base = (th as u64) << 32;
                                barrier.wait();
                                let c0 = thread_cpu_ns();
                                for &o in offsets.iter() {
                                    let k = base + o;
                                    match mode {
                                        0 => xa.store(k, Entry::Value(o)).expect("store"),
                                        1 => cx.store(k, Entry::Value(o)).expect("store"),
                                        _ => mine.store(k, Entry::Value(o)).expect("store"),
                                    };
                                }
                                thread_cpu_ns() - c0
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).sum()
                });
                let ns = t.elapsed().as_nanos() as f64;
                let stores = (threads * per) as f64;
                (ns / stores, cpu / stores)
            })
            .fold((f64::MAX, 0.0), |a, b| if b.0 < a.0 { b } else { a })
    };
    println!("| structure | 1 thread ns/store | 2 threads ns/store (wall / total stores) | speedup (2 vs 1) | cores the 2 threads got (CPU / wall) | CPU ns/store, 1 / 2 threads |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, mode) in [
        ("one XArray", 0),
        ("ChunkedXArray", 1),
        ("one XArray per thread (the machine's ceiling)", 2),
    ] {
        let mut one = (f64::MAX, 0.0);
        let mut two = (f64::MAX, 0.0);
        // Interleave 1- and 2-thread runs so machine noise hits both.
        for _ in 0..2 {
            let a = run(1, mode);
            let b = run(2, mode);
            if a.0 < one.0 {
                one = a;
            }
            if b.0 < two.0 {
                two = b;
            }
        }
        // CPU per store times stores per wall ns: the cores in use.
        let cores = two.1 / two.0;
        println!(
            "| {name} | {} | {} | {:.2}x | {cores:.2} | {} / {} |",
            fmt_ns(one.0),
            fmt_ns(two.0),
            one.0 / two.0,
            fmt_ns(one.1),
            fmt_ns(two.1),
        );
    }
    println!(
        "\nSpeedup is bounded by the cores the machine gave the two threads; \
         CPU ns per store rising from 1 to 2 threads is the cost of sharing (lock \
         hand-offs, cache lines moving between cores)."
    );
}

/// This thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}
