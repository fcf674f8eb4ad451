//! Unit tests of the chunked index: chunk creation and retirement in the
//! flat table and the overflow directory, errors, and the owned API.

use super::*;
use crate::guard::pin;

type Cx = ChunkedXArray<Box<u64>>;

#[test]
fn shift_is_checked() {
    assert_eq!(
        Cx::with_shift(64).unwrap_err(),
        Error::InvalidChunkShift(64)
    );
    assert_eq!(
        Cx::with_capacity(70, 0).unwrap_err(),
        Error::InvalidChunkShift(70)
    );
    assert_eq!(Cx::with_shift(63).unwrap().shift(), 63);
    assert_eq!(Cx::with_shift(0).unwrap().shift(), 0);
    assert_eq!(
        Cx::with_capacity(14, (1 << 25) - 1)
            .unwrap()
            .direct_chunks(),
        2048
    );
    assert_eq!(
        Cx::with_capacity(0, u64::MAX).unwrap().direct_chunks(),
        MAX_DIRECT_CHUNKS
    );
}

#[test]
fn chunks_come_and_go() {
    // shift 6, a direct table of 4 chunks: chunks 0..4 direct, the rest
    // in the overflow directory.
    let xa = Cx::with_capacity(6, 255).unwrap();
    assert_eq!(xa.direct_chunks(), 4);
    for i in [1u64, 64, 65, 300, 1 << 40, u64::MAX] {
        assert!(xa.store(i, Entry::Value(i & MAX_VALUE)).unwrap().is_none());
    }
    assert_eq!(xa.chunk_count(), 5);
    assert!(xa.directory_node_count() > 0);
    xa.check_invariants().unwrap();
    let keys: Vec<u64> = xa.iter(&pin()).map(|(i, _)| i).collect();
    assert_eq!(keys, [1, 64, 65, 300, 1 << 40, u64::MAX]);
    assert_eq!(xa.erase(64).unwrap().value(), Some(64));
    assert_eq!(xa.chunk_count(), 5);
    xa.erase(65);
    xa.erase(u64::MAX);
    xa.erase(1 << 40);
    assert_eq!(xa.chunk_count(), 2);
    assert_eq!(xa.directory_node_count(), 1); // chunk 4 (index 300) remains
    xa.check_invariants().unwrap();
    xa.clear();
    assert!(xa.is_empty());
    assert_eq!(xa.chunk_count(), 0);
    assert_eq!(xa.directory_node_count(), 0);
}

#[test]
fn reservations_keep_chunks() {
    let xa = Cx::with_shift(4).unwrap();
    xa.reserve(100).unwrap();
    assert_eq!(xa.chunk_count(), 1);
    assert!(!xa.contains(100));
    assert_eq!(
        xa.insert(100, Some(Entry::Value(1))).unwrap_err().error,
        Error::Busy
    );
    xa.release(100);
    assert_eq!(xa.chunk_count(), 0);
    xa.insert(100, Some(Entry::Value(1))).unwrap();
    assert_eq!(xa.load_value(100), Some(1));
}

#[test]
fn cmpxchg_across_missing_chunks() {
    let xa = Cx::new();
    let g = pin();
    assert!(xa.cmpxchg(5, None, None, &g).unwrap().is_none());
    assert_eq!(
        xa.cmpxchg(5, Some(EntryRef::Value(1)), None, &g)
            .unwrap_err()
            .error,
        Error::Mismatch
    );
    assert!(xa
        .cmpxchg(5, None, Some(Entry::Value(1)), &g)
        .unwrap()
        .is_none());
    let old = xa.cmpxchg(5, Some(EntryRef::Value(1)), None, &g).unwrap();
    assert_eq!(old.and_then(EntryRef::value), Some(1));
    assert_eq!(xa.chunk_count(), 0);
}

#[test]
fn items_come_back() {
    let mut xa = Cx::with_shift(8).unwrap();
    xa.store(7, Entry::Item(Box::new(70))).unwrap();
    let old = xa.store(7, Entry::Item(Box::new(71))).unwrap().unwrap();
    assert_eq!(*old.get().item().unwrap(), 70);
    drop(old);
    *xa.get_mut(7).unwrap() += 1;
    assert_eq!(
        xa.remove(7).and_then(Entry::into_item).map(|b| *b),
        Some(72)
    );
    assert_eq!(xa.chunk_count(), 0);
    assert!(xa
        .replace(1 << 50, Entry::Item(Box::new(1)))
        .unwrap()
        .is_none());
    assert_eq!(xa.chunk_count(), 1);
}

#[test]
fn no_memory_leaves_no_chunk() {
    let xa = Cx::with_capacity(6, 63).unwrap();
    crate::fault::fail_next_allocations(u64::MAX);
    // chunk 10 needs the overflow directory, which cannot grow
    let err = xa.store(640, Entry::Value(3)).unwrap_err();
    assert_eq!(err.error, Error::NoMemory);
    assert_eq!(err.entry, Some(Entry::Value(3)));
    // chunk 0 is in the table, but its tree cannot get a node
    assert_eq!(
        xa.store(5, Entry::Value(3)).unwrap_err().error,
        Error::NoMemory
    );
    crate::fault::fail_next_allocations(0);
    assert_eq!(xa.chunk_count(), 0);
    xa.check_invariants().unwrap();
}

#[test]
fn an_emptied_direct_chunk_costs_only_its_table_entry() {
    // Direct chunks sit inline in the table: emptying one frees its nodes
    // and it stops counting as a chunk, while the table stays as it was.
    let xa = Cx::with_capacity(12, (1 << 14) - 1).unwrap();
    assert_eq!(xa.direct_chunks(), 4);
    let empty_bytes = xa.memory_usage();
    for i in (1u64 << 12..2 << 12).step_by(7) {
        xa.store(i, Entry::Value(i)).unwrap();
    }
    assert_eq!(xa.chunk_count(), 1);
    assert!(xa.node_count() > 1);
    assert!(xa.memory_usage() > empty_bytes);
    let guard = pin();
    assert_eq!(
        xa.load(1 << 12, &guard).and_then(|e| e.value()),
        Some(1 << 12)
    );
    assert!(xa.load(0, &guard).is_none(), "chunk 0 is empty");
    drop(guard);
    xa.check_invariants().unwrap();
    for i in (1u64 << 12..2 << 12).step_by(7) {
        assert_eq!(xa.erase(i).and_then(|e| e.value()), Some(i));
    }
    assert_eq!(xa.chunk_count(), 0);
    assert_eq!(xa.node_count(), 0);
    assert_eq!(xa.memory_usage(), empty_bytes);
    assert!(xa.is_empty());
    xa.check_invariants().unwrap();
    // A remove through `&mut` on an empty direct chunk finds nothing.
    let mut xa = xa;
    assert!(xa.remove(5 << 10).is_none());
    assert_eq!(xa.chunk_count(), 0);
}
