//! No node is leaked: a counting global allocator (items, folios, buffers)
//! and the node cache's per-thread balance (nodes) check that split
//! preallocations that are abandoned or refused, failed allocations, and
//! whole arrays give back every byte; and the node cache gives emptied
//! regions back to the global allocator.

use kxarray::filemap::{AddError, AddressSpace, Folio, Shadow, ShadowFields};
use kxarray::{Entry, Error, XArray, XaState};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

struct Counting;

thread_local! {
    /// Live bytes allocated minus freed by this thread: the test harness
    /// and other tests allocate on their own threads, so a process-wide
    /// count would be noisy. Everything measured here is allocated and
    /// freed synchronously on the test's thread.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}
/// Serialize the tests anyway (the fault injector is per thread, the epoch
/// is global).
static SERIAL: Mutex<()> = Mutex::new(());

/// The node cache's regions (2 MiB, aligned to their size) are not
/// counted: nodes are counted one by one through the cache's own balance
/// (`live`), so a node kept in a region or a thread's magazine after it is
/// freed does not look like a leak, and one never freed does.
fn counted(l: Layout) -> bool {
    l.align() < (2 << 20)
}

fn count(d: isize) {
    // `try_with`: allocations during thread teardown are not counted.
    let _ = LIVE.try_with(|l| l.set(l.get() + d));
}

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if counted(l) {
            count(l.size() as isize);
        }
        // SAFETY: same layout, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if counted(l) {
            count(l.size() as isize);
        }
        // SAFETY: same layout, forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if counted(l) {
            count(-(l.size() as isize));
        }
        // SAFETY: allocated above with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count(n as isize - l.size() as isize);
        // SAFETY: forwarded.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Live bytes of this thread: what the global allocator counted, plus the
/// nodes this thread took from the node cache and did not give back (when
/// nodes come from the global allocator instead, they are already in the
/// count).
fn live() -> isize {
    let s = kxarray::node_cache::stats();
    let nodes = if s.cached {
        kxarray::node_cache::thread_node_balance() * s.node_stride as isize
    } else {
        0
    };
    LIVE.with(|l| l.get()) + nodes
}

fn shadow(n: u64) -> Shadow {
    Shadow::pack(ShadowFields {
        eviction: n,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn abandoned_and_refused_split_preallocations_are_freed() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let xa: XArray<Box<u64>> = XArray::new();
    xa.store_order(512, 9, Entry::Value(7)).unwrap();
    let guard = kxarray::pin();
    let before = live();
    {
        // abandoned: preallocated, never used
        let mut xas = XaState::with_order(&xa, &guard, 700, 0).unwrap();
        assert_eq!(
            xas.try_split_alloc(7, 9).unwrap() as u64,
            u64::from(9 / kxarray::CHUNK_SHIFT)
        );
        assert!(xas.preallocated() > 0);
        assert!(live() > before);
    }
    assert_eq!(live(), before, "dropped cursor freed its preallocation");
    {
        // refused: the entry is not the one the nodes were made for
        let lock = xa.lock();
        let mut xas = XaState::with_order(&xa, lock.guard(), 700, 0).unwrap();
        xas.try_split_alloc(8, 9).unwrap();
        assert_eq!(xas.try_split(&lock, 8, 9), Err(Error::InvalidSplit));
        assert_eq!(xas.preallocated(), 0, "refusal frees at once");
        // uniform split, wrong order
        xas.split_alloc(7, 8).ok();
        assert!(xas.split(&lock, 7, 9).is_err());
        assert_eq!(xas.preallocated(), 0);
    }
    assert_eq!(live(), before);
    assert_eq!(xa.get_order(600), 9, "nothing changed");
    xa.check_invariants().unwrap();
}

#[test]
fn failed_adds_and_dropped_arrays_free_everything() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = AddressSpace::new();
    let big = Arc::new(Folio::new(512, 9).unwrap());
    m.add_folio(&big).unwrap();
    assert!(m.remove_folio(&big, Some(shadow(1))));
    let big_gone = Arc::downgrade(&big);
    drop(big);
    let guard = kxarray::pin(); // keep the epoch machinery's allocations steady
    let mid = live();
    // the split's node cannot be had: the add fails, nothing stays
    kxarray::fault::fail_next_allocations(u64::MAX);
    let f = Arc::new(Folio::new(700, 0).unwrap());
    assert_eq!(m.add_folio(&f), Err(AddError::NoMemory));
    kxarray::fault::fail_next_allocations(0);
    drop(f);
    assert_eq!(live(), mid, "failed add leaves no allocation behind");
    // a conflicting add allocates nothing either
    let g = Arc::new(Folio::new(600, 0).unwrap());
    m.add_folio(&g).unwrap();
    let mid = live();
    let h = Arc::new(Folio::new(600, 0).unwrap());
    assert_eq!(m.add_folio(&h), Err(AddError::Exists));
    drop(h);
    assert_eq!(live(), mid);
    m.pages().check_invariants().unwrap();
    drop(guard);
    // Dropping the mapping frees its nodes at once, exactly.
    let nodes = m.pages().node_count();
    assert!(nodes > 0);
    let before_drop = live();
    drop(m);
    assert_eq!(
        before_drop - live(),
        (nodes * XArray::<Box<u64>>::NODE_BYTES) as isize
    );
    assert_eq!(
        Arc::strong_count(&g),
        1,
        "the tree's reference to g was dropped"
    );
    // The evicted folio was retired through the epoch: it goes once readers
    // are done (bounded wait: other tests may hold guards).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while big_gone.upgrade().is_some() && std::time::Instant::now() < deadline {
        kxarray::pin().flush();
        std::thread::yield_now();
    }
    assert!(big_gone.upgrade().is_none(), "the evicted folio was freed");
}

#[test]
fn nodes_retired_through_shared_refs_are_freed_after_both_grace_periods() {
    // Nodes emptied by `erase` through `&self` go through crossbeam's grace
    // period and then the light readers' limbo (`load_value` takes light
    // pins); driving the epoch as a running program does must give back
    // every byte, so the limbo drains.
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let warm: XArray<Box<u64>> = XArray::new();
    warm.store(1, Entry::Value(1)).unwrap();
    assert_eq!(warm.load_value(1), Some(1)); // this thread's light reader
                                             // Let garbage of earlier tests go first, so that its frees do not
                                             // count against this test's allocations.
    for _ in 0..1000 {
        kxarray::pin().flush();
    }
    let before = live();
    let nodes_before = kxarray::node_cache::thread_node_balance();
    let xa: XArray<Box<u64>> = XArray::new();
    let n = 64 * 64 * 3;
    for i in 0..n {
        xa.store(i, Entry::Value(i)).unwrap();
    }
    let nodes = xa.node_count();
    assert!(nodes > 64, "{nodes}");
    let grown = live() - before;
    // The stores pin, and a pin may run crossbeam's deferred work on this
    // thread: the light limbo's drain of earlier tests' garbage (folios
    // and buffers of the page cache go through it too) frees its batch
    // vectors here, a few KiB below the nodes' bytes.
    let slack = 16 << 10;
    assert!(
        grown >= (nodes * XArray::<Box<u64>>::NODE_BYTES) as isize - slack,
        "{grown} bytes for {nodes} nodes"
    );
    for i in 0..n {
        assert_eq!(xa.load_value(i), Some(i));
        assert!(xa.erase(i).is_some());
    }
    assert_eq!(xa.node_count(), 0);
    // The values are not items, so what the tree allocated is its nodes:
    // count them back one by one (the node cache's balance; the global
    // allocator's count also moves with crossbeam's own bags, sealed and
    // freed as the epoch turns, so it is not compared here).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while kxarray::node_cache::thread_node_balance() != nodes_before
        && std::time::Instant::now() < deadline
    {
        kxarray::pin().flush();
    }
    assert_eq!(
        kxarray::node_cache::thread_node_balance(),
        nodes_before,
        "retired nodes still held after 20 s of flushes"
    );
}
