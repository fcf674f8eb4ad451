//! A cache missing at a fixed capacity recycles its evicted frames without
//! a page fault (eight processes once made their cgroup count 1.22 million
//! page faults for kx against 6,200 for the unix VFS). A 64 MiB cache reads a 256 MiB file sequentially three times (every read a
//! miss once the cache is full); after the first pass, which faults the
//! cache's memory in once, the minor faults of the whole process
//! (`getrusage`) stay under one per 256 KiB read. Before the fix, the free
//! frames the cache's transient overshoot left behind were released
//! (`MADV_DONTNEED`) and faulted in again by the next misses: 35-40
//! faults per MiB read.
//!
//! Then the capacity is halved and restored between passes: the shrink
//! still gives the memory back (the pool holds at most the new capacity
//! plus its headroom), and the pass after it faults in at most the
//! regrown half once (not the whole file).
//!
//! One test in its own binary: minor faults are counted for the whole
//! process. Linux only; not under `--cfg kxarray_system_alloc`, where
//! every frame is a global allocation freed when given back (no pool to
//! recycle from).

#![cfg(all(target_os = "linux", not(kxarray_system_alloc)))]

use kxarray::backend::FileBackend;
use kxarray::pagecache::{CacheConfig, PageCache};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// The process's minor page faults so far.
fn minor_faults() -> u64 {
    // SAFETY: an all-zero `rusage` is a valid value (integers).
    let mut u: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    u.ru_minflt as u64
}

/// Read all of `file` (`len` bytes) sequentially in `buf`-sized reads;
/// returns the minor faults taken.
fn pass(file: &kxarray::pagecache::CachedFile, len: u64, buf: &mut [u8]) -> u64 {
    let before = minor_faults();
    for off in (0..len).step_by(buf.len()) {
        let n = file.read_at(buf, off).unwrap();
        assert_eq!(n, buf.len());
    }
    minor_faults() - before
}

#[test]
fn misses_at_a_fixed_capacity_recycle_frames_without_page_faults() {
    let capacity = 64 * MIB;
    let len = 4 * capacity;
    let f = tempfile::tempfile().unwrap();
    f.set_len(len).unwrap();
    let cache = PageCache::new(CacheConfig::default().capacity(capacity));
    let file = cache.open(FileBackend::from_file(f)).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let first = pass(&file, len, &mut buf);
    println!("first pass: {first} minor faults (the cache's memory, once)");
    // One fault per 256 KiB read: 64 pages per MiB of misses.
    let bound = len / MIB * 4;
    for n in 1..3 {
        let faults = pass(&file, len, &mut buf);
        let s = cache.stats();
        println!(
            "pass {n}: {faults} minor faults for {} MiB read ({:.2} per MiB); bound {bound}; \
             backend read {} MiB so far",
            len / MIB,
            faults as f64 / (len / MIB) as f64,
            s.backend_read_bytes / MIB
        );
        assert!(
            faults <= bound,
            "pass {n}: {faults} minor faults reading {} MiB through a full {} MiB cache, \
             more than {bound}: evicted frames are not recycled",
            len / MIB,
            capacity / MIB
        );
    }

    // A shrink still releases: the free frames beyond the new limit go.
    cache.set_capacity(capacity / 2).unwrap();
    let fs = kxarray::filemap::frame_stats();
    println!("after the shrink to {} MiB: {fs:?}", capacity / 2 / MIB);
    let held = (fs.bytes_in_use + fs.bytes_free) as u64;
    assert!(
        held <= capacity / 2 + 8 * MIB + 2 * MIB,
        "{held} bytes of frames held after shrinking to {} MiB",
        capacity / 2 / MIB
    );
    // Growing back faults in the regrown half once, not every miss.
    cache.set_capacity(capacity).unwrap();
    let faults = pass(&file, len, &mut buf);
    let regrown = capacity / 2 / PAGE;
    println!(
        "pass after the shrink and regrowth: {faults} minor faults (regrown: {regrown} pages)"
    );
    assert!(
        faults <= regrown + regrown / 2 + bound,
        "{faults} minor faults in the pass after regrowing {} MiB",
        capacity / 2 / MIB
    );
}
