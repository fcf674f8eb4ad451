//! Loom models of the light readers (`src/lightpin/`): `load_value` takes a
//! light pin instead of a crossbeam guard, so a node it reads is held back
//! only by the light grace period that `Dying::retire` adds after
//! crossbeam's. Here the writer frees the very nodes the light reader
//! descends through, and drives crossbeam (`pin().flush()`) until their
//! deferred frees have run, and retires again, which moves them into the
//! light limbo (under loom a deferred free queues its node for the next
//! retirement, `limbo::Arrivals`; the limbo then tries to free every object
//! as soon as it arrives), all while the reader runs.
//!
//! A premature free shows through the node quarantine (`src/sync.rs`,
//! `Quarantine`): every slot read checks that its node was not freed.
//! Under loom the light readers use the fence mode (`fence(SeqCst)` on both
//! sides). Making `limbo::reclaim` free every sealed batch without its scan
//! (`partition(|_| true)`) makes `l1` fail with "a node was read after it
//! was freed", and so does removing the reader's fence
//! (`barrier::light`). Removing the reclaimer's fence (`barrier::heavy`)
//! does not: loom does not produce the store-buffering outcome that fence
//! forbids (its bump and the registry lock order the scan here).
//!
//! Run with:
//! `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_lightpin --target-dir target/loom`

#[cfg(loom)]
mod tests {
    use kxarray::{Entry, XArray, CHUNK_SHIFT};
    use loom::sync::Arc;
    use loom::thread;

    fn model<F: Fn() + Sync + Send + 'static>(name: &str, f: F) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound.get_or_insert(2);
        b.max_branches = 100_000;
        let start = std::time::Instant::now();
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n2 = n.clone();
        b.check(move || {
            n2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            f()
        });
        eprintln!(
            "{name}: {} executions in {:?}",
            n.load(std::sync::atomic::Ordering::Relaxed),
            start.elapsed()
        );
    }

    /// A light reader loads index 8 (top node, then leaf) while the writer
    /// erases it, which frees the leaf and the top node (the tree shrinks
    /// to the head), then flushes until the frees have gone through
    /// crossbeam and the light limbo. The reader sees the value or nothing,
    /// never a freed node; index 0 stays readable.
    #[test]
    fn l1_erase_frees_nodes_under_light_reader() {
        assert_eq!(CHUNK_SHIFT, 3, "the model assumes 8-slot nodes (cfg(loom))");
        model("l1 light reader vs erase+shrink", || {
            let xa: Arc<XArray<Box<u64>>> = Arc::new(XArray::new());
            xa.store(0, Entry::Value(10)).unwrap();
            xa.store(8, Entry::Value(18)).unwrap();
            assert_eq!(xa.node_count(), 3);
            let r = {
                let xa = xa.clone();
                thread::spawn(move || {
                    let v = xa.load_value(8);
                    assert!(v == Some(18) || v.is_none(), "index 8 read {v:?}");
                    assert_eq!(xa.load_value(0), Some(10));
                })
            };
            assert!(xa.erase(8).is_some());
            for _ in 0..2 {
                kxarray::pin().flush();
            }
            // The next retirement moves the nodes crossbeam let go of into
            // the light limbo (under loom they wait for it), which tries to
            // free them at once, while the reader may still be inside.
            xa.store(8, Entry::Value(18)).unwrap();
            assert!(xa.erase(8).is_some());
            r.join().unwrap();
            assert_eq!(xa.node_count(), 0);
            assert_eq!(xa.load_value(0), Some(10));
        });
    }
}
