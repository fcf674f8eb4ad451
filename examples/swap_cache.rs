//! A swap cache on [`ChunkedXArray`]: one index keyed by swap slot, cut
//! into chunks of 2^14 slots (64 MiB of 4 KiB pages, the kernel's
//! `SWAP_ADDRESS_SPACE_SHIFT`), with shadow entries as in the page cache
//! (`mm/workingset.c`): reclaim replaces a page by a value entry packing the
//! eviction clock, and a later swap-in over that shadow computes the
//! refault distance.
//!
//! ```text
//! cargo run --release --example swap_cache -- [--seconds S] [--threads T] [--slots-log2 N] [--cache-pct P]
//! ```
//!
//! Threads fault random slots of a swap device of 2^N slots (default 2^20,
//! a 4 GiB device). A fault looks the slot up lock-free; on a miss it
//! "reads" the page (a deterministic pattern of the slot) and adds it with
//! `cmpxchg` over the empty slot or the shadow it saw, so two threads
//! faulting the same slot add one page and the loser uses the winner's. A
//! newly added page is marked dirty (`Mark::M0`); when the cache holds more
//! than P% (default 5) of the device, the thread reclaims its oldest pages:
//! each is replaced by its shadow with `cmpxchg` (so a concurrent re-add is
//! never overwritten). Every few thousand faults a thread frees a random
//! run of slots (`swap_free`: `store_range(.., None)`), which drops chunks
//! that become empty, and a writeback pass walks the dirty pages in slot
//! order (`iter_marked`) and clears the mark. Every hit checks the page's
//! bytes; any mismatch, a lost page or a broken invariant makes the exit code
//! non-zero.

use kxarray::filemap::{Shadow, ShadowFields};
use kxarray::{ChunkedXArray, Entry, EntryRef, Error, Mark};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;
const DIRTY: Mark = Mark::M0;

/// A swapped-in page.
struct SwapPage {
    slot: u64,
    data: Box<[u64]>,
}

/// Word `i` of the device's page at `slot`.
fn pattern(slot: u64, i: usize) -> u64 {
    slot.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64
}

impl SwapPage {
    fn read_from_device(slot: u64) -> Arc<SwapPage> {
        let data = (0..WORDS).map(|i| pattern(slot, i)).collect();
        Arc::new(SwapPage { slot, data })
    }
    fn verify(&self, slot: u64) -> bool {
        self.slot == slot
            && self
                .data
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(slot, i))
    }
}

struct SwapCache {
    slots: ChunkedXArray<Arc<SwapPage>>,
    /// The non-resident age: bumped by every eviction (`lruvec->nonresident_age`).
    clock: AtomicU64,
    resident: AtomicUsize,
}

#[derive(Default)]
struct Stats {
    faults: u64,
    hits: u64,
    misses: u64,
    refaults: u64,
    refault_distance_sum: u64,
    lost_races: u64,
    evictions: u64,
    frees: u64,
    writeback: u64,
    bad: u64,
}

impl SwapCache {
    /// Swap-in: the page at `slot`, reading it on a miss
    /// (`swap_cache_get_folio` then `add_to_swap_cache`).
    fn fault(&self, slot: u64, st: &mut Stats, mine: &mut VecDeque<u64>) {
        st.faults += 1;
        let guard = kxarray::pin();
        let seen = self.slots.load(slot, &guard);
        if let Some(EntryRef::Item(page)) = seen {
            st.hits += 1;
            if !page.verify(slot) {
                st.bad += 1;
            }
            return;
        }
        st.misses += 1;
        let page = SwapPage::read_from_device(slot);
        match self
            .slots
            .cmpxchg(slot, seen, Some(Entry::Item(page)), &guard)
        {
            Ok(old) => {
                self.resident.fetch_add(1, Ordering::Relaxed);
                self.slots.set_mark(slot, DIRTY);
                if let Some(EntryRef::Value(v)) = old {
                    // A refault over a shadow: how many evictions ago.
                    let then = Shadow::from_value(v).unpack().eviction;
                    let now = self.clock.load(Ordering::Relaxed);
                    st.refaults += 1;
                    st.refault_distance_sum += now.wrapping_sub(then);
                }
                mine.push_back(slot);
            }
            Err(r) if r.error == Error::Mismatch => {
                // Another thread added (or evicted) it first: use what is there.
                st.lost_races += 1;
                if let Some(EntryRef::Item(p)) = self.slots.load(slot, &guard) {
                    if !p.verify(slot) {
                        st.bad += 1;
                    }
                }
            }
            Err(r) => panic!("swap-in of slot {slot}: {:?}", r.error),
        }
    }

    /// Reclaim `slot` if it still holds a page: leave its shadow.
    fn evict(&self, slot: u64, st: &mut Stats) {
        let guard = kxarray::pin();
        let Some(cur @ EntryRef::Item(_)) = self.slots.load(slot, &guard) else {
            return;
        };
        let eviction = self.clock.fetch_add(1, Ordering::Relaxed);
        let shadow = Shadow::pack(ShadowFields {
            eviction,
            memcg: 1,
            node: 0,
            workingset: false,
        })
        .expect("node 0 fits");
        if self
            .slots
            .cmpxchg(
                slot,
                Some(cur),
                Some(Entry::Value(shadow.to_value())),
                &guard,
            )
            .is_ok()
        {
            self.resident.fetch_sub(1, Ordering::Relaxed);
            st.evictions += 1;
        }
    }

    /// `swap_free` of a run of slots: pages and shadows go, and chunks left
    /// empty are dropped.
    fn free_range(&self, first: u64, last: u64, st: &mut Stats) {
        let guard = kxarray::pin();
        let pages = self
            .slots
            .range(first..=last, &guard)
            .filter(|(_, e)| !e.is_value())
            .count();
        self.slots
            .store_range(first, last, None)
            .expect("erasing a range cannot fail");
        // Approximate under concurrency; exact when quiescent.
        self.resident.fetch_sub(
            pages.min(self.resident.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        st.frees += 1;
    }

    /// Write back dirty pages in slot order and clear their mark.
    fn writeback(&self, st: &mut Stats) {
        let guard = kxarray::pin();
        let dirty: Vec<u64> = self
            .slots
            .iter_marked(.., DIRTY, &guard)
            .take(4096)
            .map(|(i, _)| i)
            .collect();
        debug_assert!(dirty.is_sorted());
        for slot in dirty {
            self.slots.clear_mark(slot, DIRTY);
            st.writeback += 1;
        }
    }
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number")))
        .unwrap_or(default)
}

fn main() {
    let seconds = arg("--seconds", 2);
    let threads = arg("--threads", 2) as usize;
    let slots_log2 = arg("--slots-log2", 20).min(40) as u32;
    let cache_pct = arg("--cache-pct", 5).clamp(1, 100);
    let nslots = 1u64 << slots_log2;
    let cap = (nslots * cache_pct / 100) as usize;
    let cache = SwapCache {
        slots: ChunkedXArray::with_capacity(14, nslots - 1).expect("shift 14"),
        clock: AtomicU64::new(0),
        resident: AtomicUsize::new(0),
    };
    println!(
        "swap device: 2^{slots_log2} slots ({} MiB), cache {cache_pct}% ({cap} pages), {threads} threads, {seconds} s",
        (nslots * PAGE as u64) >> 20
    );
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let per_thread_cap = (cap / threads).max(1);
    let totals: Vec<Stats> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let cache = &cache;
                s.spawn(move || {
                    let mut st = Stats::default();
                    let mut mine = VecDeque::new();
                    let mut x = 0x2545_f491_4f6c_dd1du64 ^ (t as u64 + 1);
                    let mut rnd = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        for _ in 0..1024 {
                            // Skewed: half the faults in the first 1/8 of the device.
                            let r = rnd();
                            let slot = if r & 1 == 0 {
                                (r >> 1) % (nslots / 8).max(1)
                            } else {
                                (r >> 1) % nslots
                            };
                            cache.fault(slot, &mut st, &mut mine);
                            while mine.len() > per_thread_cap {
                                let victim = mine.pop_front().expect("non-empty");
                                cache.evict(victim, &mut st);
                            }
                            n += 1;
                            if n.is_multiple_of(8192) {
                                let first = rnd() % nslots;
                                let last = (first + 255).min(nslots - 1);
                                cache.free_range(first, last, &mut st);
                                cache.writeback(&mut st);
                            }
                        }
                    }
                    st
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("worker")).collect()
    });
    let mut t = Stats::default();
    for s in &totals {
        t.faults += s.faults;
        t.hits += s.hits;
        t.misses += s.misses;
        t.refaults += s.refaults;
        t.refault_distance_sum += s.refault_distance_sum;
        t.lost_races += s.lost_races;
        t.evictions += s.evictions;
        t.frees += s.frees;
        t.writeback += s.writeback;
        t.bad += s.bad;
    }
    let guard = kxarray::pin();
    let (mut pages, mut shadows) = (0u64, 0u64);
    let mut ok = true;
    for (slot, e) in cache.slots.iter(&guard) {
        match e {
            EntryRef::Item(p) => {
                pages += 1;
                ok &= p.verify(slot);
            }
            EntryRef::Value(_) => shadows += 1,
        }
    }
    drop(guard);
    println!(
        "faults {} ({:.2} M/s), hits {:.1}%, refaults over a shadow {} (mean distance {:.0} evictions), lost add races {}, evictions {}, range frees {}, written back {}",
        t.faults,
        t.faults as f64 / seconds.max(1) as f64 / 1e6,
        100.0 * t.hits as f64 / t.faults.max(1) as f64,
        t.refaults,
        t.refault_distance_sum as f64 / t.refaults.max(1) as f64,
        t.lost_races,
        t.evictions,
        t.frees,
        t.writeback
    );
    println!(
        "now: {pages} pages, {shadows} shadows in {} chunks; height {}, {} nodes, {} KiB",
        cache.slots.chunk_count(),
        cache.slots.height(),
        cache.slots.node_count(),
        cache.slots.memory_usage() >> 10
    );
    let mut failures = Vec::new();
    if t.bad > 0 || !ok {
        failures.push(format!("{} pages with wrong bytes", t.bad));
    }
    if let Err(e) = cache.slots.check_invariants() {
        failures.push(format!("invariants: {e}"));
    }
    if t.misses > 0 && t.hits == 0 {
        failures.push("no fault ever hit the cache".into());
    }
    // swapoff: free every slot; every chunk must go.
    let mut st = Stats::default();
    cache.free_range(0, nslots - 1, &mut st);
    if cache.slots.chunk_count() != 0 || !cache.slots.is_empty() {
        failures.push(format!(
            "{} chunks left after freeing every slot",
            cache.slots.chunk_count()
        ));
    }
    if failures.is_empty() {
        println!("ok: every page verified, invariants hold, swapoff left no chunk");
    } else {
        for f in &failures {
            eprintln!("FAIL: {f}");
        }
        std::process::exit(1);
    }
}
