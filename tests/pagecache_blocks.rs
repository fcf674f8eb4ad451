//! Per-block dirty tracking: a proptest against a byte model with a
//! counting backend (after every `sync` the backend equals the model and
//! the bytes written since the previous `sync` are at most the bytes of
//! the blocks dirtied since then), typed errors for bad block sizes, a
//! write fault that leaves exactly the failed blocks dirty, and a block
//! dirtied again while its writeback is in flight (deterministic, then a
//! two-thread stress).

mod pagecache_common;

use kxarray::backend::{Backend, RamDisk};
use kxarray::pagecache::{CacheConfig, FileOptions, OpenError, PageCache};
use pagecache_common::MemBackend;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

const BLOCK: u64 = 512;
const FOLIO: u64 = 64 << 10;
const SPAN: u64 = 4 * FOLIO;

fn opts() -> FileOptions {
    FileOptions::default()
        .block_size(BLOCK as u32)
        .folio_size(FOLIO)
}

#[derive(Debug, Clone)]
enum Op {
    Read(u64, usize),
    Write(u64, usize, u8),
    Sync,
    SetLen(u64),
    Evict(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SPAN, 1..3000usize).prop_map(|(o, l)| Op::Read(o, l)),
        5 => (0..SPAN, 1..3000usize, any::<u8>()).prop_map(|(o, l, b)| Op::Write(o, l, b)),
        2 => Just(Op::Sync),
        1 => (0..SPAN).prop_map(Op::SetLen),
        1 => (0..SPAN, 0..SPAN).prop_map(|(a, b)| Op::Evict(a, b)),
    ]
}

fn run(ops: Vec<Op>, initial: usize) -> Result<(), TestCaseError> {
    // Large enough that reclaim never writes back: every backend write is
    // a sync's (evictions are `invalidate`, which drops clean folios).
    let cache = PageCache::new(CacheConfig::default().capacity(4 * SPAN).flusher(false));
    let backend = Arc::new(MemBackend::new());
    let mut model: Vec<u8> = (0..initial).map(|i| (i * 7 % 251) as u8).collect();
    *backend.data.lock().unwrap() = model.clone();
    let file = cache.open_with(Arc::clone(&backend), opts()).unwrap();
    let mut dirty: BTreeSet<u64> = BTreeSet::new();
    let mut written_before = 0;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Read(o, l) => {
                let mut buf = vec![0xAAu8; l];
                let n = file.read_at(&mut buf, o).unwrap();
                let want = (model.len() as u64).saturating_sub(o).min(l as u64) as usize;
                prop_assert_eq!(n, want, "step {} short count", step);
                if n > 0 {
                    let at = o as usize;
                    prop_assert!(buf[..n] == model[at..at + n], "step {} data", step);
                }
            }
            Op::Write(o, l, b) => {
                let data: Vec<u8> = (0..l).map(|i| b.wrapping_add(i as u8)).collect();
                prop_assert_eq!(file.write_at(&data, o).unwrap(), l);
                let end = o as usize + l;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[o as usize..end].copy_from_slice(&data);
                dirty.extend(o / BLOCK..=(end as u64 - 1) / BLOCK);
            }
            Op::Sync => {
                file.sync().unwrap();
                prop_assert!(
                    backend.contents() == model,
                    "step {}: backend != model",
                    step
                );
                let written = backend.written.load(Ordering::Relaxed);
                prop_assert!(
                    written - written_before <= dirty.len() as u64 * BLOCK,
                    "step {}: wrote {} bytes for {} dirty blocks",
                    step,
                    written - written_before,
                    dirty.len()
                );
                prop_assert_eq!(cache.stats().dirty_bytes, 0);
                written_before = written;
                dirty.clear();
            }
            Op::SetLen(n) => {
                file.set_len(n).unwrap();
                model.resize(n as usize, 0);
            }
            Op::Evict(a, b) => {
                file.invalidate(a..b).unwrap();
            }
        }
        prop_assert_eq!(file.len(), model.len() as u64);
    }
    file.sync().unwrap();
    prop_assert!(backend.contents() == model, "final sync");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn block_writeback_matches_model_and_writes_only_dirty_blocks(
        ops in prop::collection::vec(op(), 1..60),
        initial in prop_oneof![Just(0usize), Just(SPAN as usize), 0..SPAN as usize],
    ) {
        run(ops, initial)?;
    }
}

#[test]
fn bad_block_and_folio_sizes_are_typed_errors() {
    let cache = PageCache::new(CacheConfig::default().flusher(false));
    for b in [0u32, 256, 1000, 3000, 8192] {
        let r = cache.open_with(RamDisk::new(4096), FileOptions::default().block_size(b));
        assert!(matches!(r, Err(OpenError::BlockSize(x)) if x == b), "{b}");
    }
    for f in [0u64, 2048, 48 << 10, 4 << 20] {
        let r = cache.open_with(RamDisk::new(4096), FileOptions::default().folio_size(f));
        assert!(matches!(r, Err(OpenError::FolioSize(x)) if x == f), "{f}");
    }
    for b in [512u32, 1024, 2048, 4096] {
        let o = FileOptions::default().block_size(b).folio_size(2 << 20);
        assert!(cache.open_with(RamDisk::new(4096), o).is_ok(), "{b}");
    }
}

#[test]
fn a_4k_write_in_a_64k_folio_writes_4k_and_whole_folio_writes_64k() {
    for (whole, want) in [(false, 4096u64), (true, FOLIO)] {
        let cache = PageCache::new(CacheConfig::default().flusher(false));
        let backend = Arc::new(MemBackend::new());
        *backend.data.lock().unwrap() = vec![0; 1 << 20];
        let o = FileOptions::default().folio_size(FOLIO).whole_folio(whole);
        let file = cache.open_with(Arc::clone(&backend), o).unwrap();
        file.write_at(&[9u8; 4096], 5 * 4096).unwrap();
        assert_eq!(cache.stats().dirty_bytes, want);
        file.sync().unwrap();
        assert_eq!(
            backend.written.load(Ordering::Relaxed),
            want,
            "whole={whole}"
        );
        assert_eq!(backend.writes.load(Ordering::Relaxed), 1);
    }
}

#[test]
fn a_write_fault_leaves_exactly_the_failed_blocks_dirty() {
    let cache = PageCache::new(CacheConfig::default().flusher(false));
    let backend = Arc::new(MemBackend::new());
    *backend.data.lock().unwrap() = vec![0; 1 << 17];
    let file = cache.open_with(Arc::clone(&backend), opts()).unwrap();
    // Two runs in one folio: blocks 1 and 4..=5.
    file.write_at(&[1u8; 512], 512).unwrap();
    file.write_at(&[2u8; 1024], 2048).unwrap();
    *backend.fail_range.lock().unwrap() = Some(2048..2049);
    assert!(file.sync().is_err());
    assert_eq!(cache.stats().dirty_bytes, 1024, "only the failed run");
    assert_eq!(&backend.contents()[512..1024], &[1u8; 512][..]);
    *backend.fail_range.lock().unwrap() = None;
    let before = backend.written.load(Ordering::Relaxed);
    file.sync().unwrap();
    assert_eq!(backend.written.load(Ordering::Relaxed) - before, 1024);
    assert_eq!(&backend.contents()[2048..3072], &[2u8; 1024][..]);
    assert_eq!(cache.stats().dirty_bytes, 0);
}

/// A backend that runs a hook (once) inside its first write.
struct Hooked {
    inner: Arc<MemBackend>,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooked")
    }
}

impl Backend for Hooked {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(h) = hook {
            h();
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

#[test]
fn a_block_redirtied_during_its_writeback_stays_dirty() {
    let cache = PageCache::new(CacheConfig::default().flusher(false));
    let inner = Arc::new(MemBackend::new());
    *inner.data.lock().unwrap() = vec![0; 1 << 17];
    let slot: Arc<Mutex<Option<kxarray::pagecache::CachedFile>>> = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    let backend = Hooked {
        inner: Arc::clone(&inner),
        // While the old bytes are in flight, another thread writes the
        // same block (the writeback holds no folio lock now).
        hook: Mutex::new(Some(Box::new(move || {
            let f = s2.lock().unwrap().take().unwrap();
            std::thread::spawn(move || f.write_at(&[2u8; 512], 1024).unwrap())
                .join()
                .unwrap();
        }))),
    };
    let file = cache.open_with(backend, opts()).unwrap();
    *slot.lock().unwrap() = Some(file.clone());
    file.write_at(&[1u8; 512], 1024).unwrap();
    file.sync().unwrap();
    assert_eq!(&inner.contents()[1024..1536], &[1u8; 512][..], "old bytes");
    assert_eq!(cache.stats().dirty_bytes, 512, "the new bytes stay dirty");
    file.sync().unwrap();
    assert_eq!(&inner.contents()[1024..1536], &[2u8; 512][..], "new bytes");
    assert_eq!(cache.stats().dirty_bytes, 0);
}

#[test]
fn stress_redirty_during_writeback_loses_nothing() {
    let cache = PageCache::new(CacheConfig::default().flusher(false));
    let backend = Arc::new(MemBackend::new());
    *backend.data.lock().unwrap() = vec![0; 1 << 18];
    let file = cache.open_with(Arc::clone(&backend), opts()).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (file, stop) = (file.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                file.sync().unwrap();
            }
        })
    };
    let mut model = vec![0u8; 1 << 18];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..20_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % (1 << 18)) as usize & !7;
        let len = (1 + (x >> 40) % 700) as usize;
        let len = len.min(model.len() - off);
        let byte = (round % 251) as u8 + 1;
        file.write_at(&vec![byte; len], off as u64).unwrap();
        model[off..off + len].fill(byte);
    }
    stop.store(true, Ordering::Relaxed);
    syncer.join().unwrap();
    file.sync().unwrap();
    assert!(backend.contents() == model, "a redirtied block was lost");
    assert_eq!(cache.stats().dirty_bytes, 0);
}

#[test]
fn a_2m_folio_of_512_byte_blocks_writes_back_one_block() {
    let cache = PageCache::new(CacheConfig::default().flusher(false));
    let backend = Arc::new(MemBackend::new());
    *backend.data.lock().unwrap() = vec![7; 4 << 20];
    let o = FileOptions::default().block_size(512).folio_size(2 << 20);
    let file = cache.open_with(Arc::clone(&backend), o).unwrap();
    // Bytes 100..400 of block 2049: the block is read, then written whole.
    file.write_at(&[1u8; 300], (1 << 20) + 512 + 100).unwrap();
    assert_eq!(cache.stats().dirty_bytes, 512);
    assert_eq!(
        cache.stats().backend_read_bytes,
        512,
        "only the partial block"
    );
    file.sync().unwrap();
    assert_eq!(backend.written.load(Ordering::Relaxed), 512);
    let d = backend.contents();
    let at = (1 << 20) + 512;
    assert!(d[at..at + 100].iter().all(|&b| b == 7));
    assert!(d[at + 100..at + 400].iter().all(|&b| b == 1));
    assert!(d[at + 400..at + 512].iter().all(|&b| b == 7));
    // A read elsewhere in the folio fills only what it reads.
    let mut buf = [0u8; 10];
    file.read_at(&mut buf, 5000).unwrap();
    assert_eq!(buf, [7u8; 10]);
    assert_eq!(cache.stats().backend_read_bytes, 1024);
}
