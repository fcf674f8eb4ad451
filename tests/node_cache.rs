//! The node cache gives regions back: a tree built and dropped on a thread
//! that then exits leaves only the one spare region (this binary has no
//! other test, so no other tree holds a region).

mod harness;

use kxarray::{node_cache, Entry, XArray};

fn regions_come_and_go_back_but_the_spare() {
    let s = node_cache::stats();
    if !s.cached {
        harness::skip_now("nodes come from the global allocator in this build");
    }
    assert_eq!(s.regions, 0, "no tree yet");
    let per_region = s.region_bytes / s.node_stride - 1;
    let (peak, nodes) = std::thread::spawn(move || {
        let mut xa: XArray<Box<u64>> = XArray::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut i = 0u64;
        // sparse keys: about four nodes each, over more than five regions
        while xa.node_count() < 5 * per_region + 100 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            xa.replace(x & ((1 << 40) - 1), Entry::Value(i)).unwrap();
            i += 1;
        }
        xa.check_invariants().unwrap();
        let peak = node_cache::stats().regions;
        let nodes = xa.node_count();
        assert_eq!(node_cache::thread_node_balance(), nodes as isize);
        drop(xa); // owned: every node is freed here, at once
        assert_eq!(node_cache::thread_node_balance(), 0);
        (peak, nodes)
    })
    .join()
    .unwrap();
    // the thread's magazine went back at its exit
    let after = node_cache::stats().regions;
    assert!(
        peak > nodes / per_region,
        "{peak} regions for {nodes} nodes"
    );
    assert_eq!(
        after, 1,
        "{peak} regions at the peak, {after} after the drop"
    );
    // and the spare is used again
    let mut xa: XArray<Box<u64>> = XArray::new();
    for i in 0..10_000u64 {
        xa.replace(i, Entry::Value(i)).unwrap();
    }
    assert_eq!(node_cache::stats().regions, 1);
    drop(xa);
}

harness::main!(
    tests: [
        regions_come_and_go_back_but_the_spare,
    ],
);
