//! Loom model of the page cache's miss path: two threads miss on the same
//! page at once. Exactly one backend read happens, one folio ends up
//! cached, and both readers see the backend's bytes (the loser of
//! `add_folio` finds the winner's folio and waits on its data lock until
//! the read finished). A second model: a block written again while its
//! writeback is in flight keeps the new bytes (dirty again, written by the
//! next sync), in every interleaving. Then the folio byte protocol: a
//! zero-copy reference racing a writer to the same folio keeps the bytes
//! it pinned and never blocks the writer (the writer copies when it sees
//! the pin, or the pinner sees the write and pins after it: the Dekker
//! handshake of `filemap::mem`), and a lock-free read racing a writer
//! returns the old or the new bytes, never a mix.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release --test loom_pagecache --target-dir target/loom`

#[cfg(loom)]
mod tests {
    use kxarray::backend::Backend;
    use kxarray::pagecache::{CacheConfig, PageCache};
    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A 4 KiB device of byte 0x5A that counts reads.
    #[derive(Debug, Default)]
    struct Counting {
        reads: AtomicUsize,
    }

    impl Backend for Counting {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let n = buf.len().min(4096usize.saturating_sub(offset as usize));
            buf[..n].fill(0x5A);
            Ok(n)
        }
        fn write_at(&self, buf: &[u8], _offset: u64) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(4096)
        }
        fn set_len(&self, _len: u64) -> io::Result<()> {
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    /// A model thread with room for the read path (loom's default stack,
    /// 32 KiB, is too small for it and the folio protocol together).
    fn spawn_big<F: FnOnce() + Send + 'static>(f: F) -> loom::thread::JoinHandle<()> {
        loom::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(f)
            .unwrap()
    }

    /// Run a model's body on a thread with room (see `spawn_big`).
    fn big(f: impl FnOnce() + Send + 'static) {
        spawn_big(f).join().unwrap();
    }

    fn builder() -> loom::model::Builder {
        builder_bound(3)
    }

    /// Loom's builder with `bound` preemptions unless LOOM_MAX_PREEMPTIONS
    /// says otherwise.
    fn builder_bound(bound: usize) -> loom::model::Builder {
        let mut b = loom::model::Builder::new();
        b.preemption_bound.get_or_insert(bound);
        if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
            b.max_branches = 100_000;
        }
        b
    }

    #[test]
    fn racing_misses_read_the_backend_once() {
        builder().check(|| {
            big(|| {
                let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
                let backend = Arc::new(Counting::default());
                let file = cache.open(Arc::clone(&backend)).unwrap();
                let other = file.clone();
                let t = spawn_big(move || {
                    let mut buf = [0u8; 16];
                    assert_eq!(other.read_at(&mut buf, 100).unwrap(), 16);
                    assert_eq!(buf, [0x5A; 16]);
                });
                let mut buf = [0u8; 16];
                assert_eq!(file.read_at(&mut buf, 200).unwrap(), 16);
                assert_eq!(buf, [0x5A; 16]);
                t.join().unwrap();
                assert_eq!(backend.reads.load(Ordering::SeqCst), 1, "one backend read");
                let s = cache.stats();
                assert_eq!(s.cached_pages, 1, "one folio");
                assert_eq!((s.misses, s.hits), (1, 1));
            })
        });
    }

    /// A 4 KiB device that keeps its bytes (a std mutex held across no
    /// loom operation, so the model cannot block on it).
    #[derive(Debug)]
    struct Mem(std::sync::Mutex<Vec<u8>>);

    impl Backend for Mem {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let d = self.0.lock().unwrap();
            let at = (offset as usize).min(d.len());
            let n = buf.len().min(d.len() - at);
            buf[..n].copy_from_slice(&d[at..at + n]);
            Ok(n)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
            let mut d = self.0.lock().unwrap();
            d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(4096)
        }
        fn set_len(&self, _len: u64) -> io::Result<()> {
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    #[test]
    fn a_block_redirtied_during_writeback_is_not_lost() {
        builder().check(|| {
            big(|| {
                let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
                let backend = Arc::new(Mem(std::sync::Mutex::new(vec![0; 4096])));
                let opts = kxarray::pagecache::FileOptions::default().block_size(512);
                let file = cache.open_with(Arc::clone(&backend), opts).unwrap();
                file.write_at(&[1u8; 512], 512).unwrap();
                let other = file.clone();
                let t = spawn_big(move || {
                    other.write_at(&[2u8; 512], 512).unwrap();
                });
                file.sync().unwrap();
                t.join().unwrap();
                file.sync().unwrap();
                assert_eq!(&backend.0.lock().unwrap()[512..1024], &[2u8; 512][..]);
                assert_eq!(cache.stats().dirty_bytes, 0);
            })
        });
    }

    /// The same with a folio whose every block is dirty (a write to it
    /// skips the block map on the folio's hint): whichever side of the
    /// writeback the rewrite lands on, it reaches the backend.
    #[test]
    fn a_wholly_dirty_folio_rewritten_during_writeback_is_not_lost() {
        builder().check(|| {
            big(|| {
                let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
                let backend = Arc::new(Mem(std::sync::Mutex::new(vec![0; 4096])));
                let file = cache.open(Arc::clone(&backend)).unwrap();
                file.write_at(&[1u8; 4096], 0).unwrap();
                let other = file.clone();
                let t = spawn_big(move || {
                    other.write_at(&[2u8; 64], 0).unwrap();
                });
                file.sync().unwrap();
                t.join().unwrap();
                file.sync().unwrap();
                assert_eq!(&backend.0.lock().unwrap()[..64], &[2u8; 64][..]);
                assert_eq!(cache.stats().dirty_bytes, 0);
            })
        });
    }

    /// A reference taken while another thread rewrites the same folio:
    /// whichever runs first, the referenced bytes are one whole version and
    /// stay that version after the writer is done, and the writer's bytes
    /// are what later reads see.
    #[test]
    fn a_pinned_folio_keeps_its_bytes_while_a_writer_rewrites_it() {
        builder().check(|| {
            big(|| {
                let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
                let backend = Arc::new(Mem(std::sync::Mutex::new(vec![1; 4096])));
                let file = cache.open(Arc::clone(&backend)).unwrap();
                file.write_at(&[1u8; 64], 0).unwrap(); // cached, version 1
                let other = file.clone();
                let t = spawn_big(move || {
                    other.write_at(&[2u8; 64], 0).unwrap();
                });
                let r = file.read_folio(0).unwrap();
                let first = r[0];
                assert!(first == 1 || first == 2);
                assert!(r[..64].iter().all(|&b| b == first), "torn pin");
                t.join().unwrap();
                assert!(r[..64].iter().all(|&b| b == first), "pinned bytes changed");
                let mut now = [0u8; 64];
                file.read_at(&mut now, 0).unwrap();
                assert_eq!(now, [2u8; 64]);
            })
        });
    }

    /// A borrow under a guard (`read_folio_in`) taken while another thread
    /// rewrites the folio: one whole version, kept after the writer is
    /// done (the borrow count on the folio against the writer's check).
    #[test]
    fn a_borrowed_folio_keeps_its_bytes_while_a_writer_rewrites_it() {
        builder().check(|| {
            big(|| {
                let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
                let backend = Arc::new(Mem(std::sync::Mutex::new(vec![1; 4096])));
                let file = cache.open(Arc::clone(&backend)).unwrap();
                file.write_at(&[1u8; 64], 0).unwrap();
                let other = file.clone();
                let t = spawn_big(move || {
                    other.write_at(&[2u8; 64], 0).unwrap();
                });
                let guard = kxarray::pin();
                let b = file.read_folio_in(0, &guard).unwrap();
                let first = b[0];
                assert!(first == 1 || first == 2);
                assert!(b[..64].iter().all(|&x| x == first), "torn borrow");
                t.join().unwrap();
                assert!(
                    b[..64].iter().all(|&x| x == first),
                    "borrowed bytes changed"
                );
            })
        });
    }

    /// A lock-free read racing a writer to the same bytes: all old or all
    /// new.
    #[test]
    fn an_optimistic_read_sees_one_version() {
        builder().check(|| {
            big(|| {
                let cache = PageCache::new(CacheConfig::default().capacity(1 << 20).flusher(false));
                let backend = Arc::new(Mem(std::sync::Mutex::new(vec![1; 4096])));
                let file = cache.open(Arc::clone(&backend)).unwrap();
                file.write_at(&[1u8; 64], 0).unwrap();
                let other = file.clone();
                let t = spawn_big(move || {
                    other.write_at(&[2u8; 64], 0).unwrap();
                });
                let mut got = [0u8; 64];
                file.read_at(&mut got, 0).unwrap();
                assert!(got.iter().all(|&b| b == got[0]), "torn read {got:?}");
                t.join().unwrap();
            })
        });
    }

    /// Two read-only pages: page 0 of byte 1, page 1 of byte 2.
    #[derive(Debug)]
    struct TwoPages;

    impl Backend for TwoPages {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let n = buf.len().min(8192usize.saturating_sub(offset as usize));
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = 1 + u8::from(offset as usize + i >= 4096);
            }
            Ok(n)
        }
        fn write_at(&self, buf: &[u8], _offset: u64) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(8192)
        }
        fn set_len(&self, _len: u64) -> io::Result<()> {
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    /// A miss whose reclaim isolates and evicts the other cached folio
    /// while a second reader reads that folio (a hit, or a miss after the
    /// eviction): both get the backend's bytes, a busy victim is put back
    /// (the cache may stay over its one page), and the page counts agree.
    #[test]
    fn reclaim_races_a_reader_of_its_victim() {
        // Two misses, an eviction and crossbeam's collection make a large
        // model: one preemption takes seconds, two take minutes (399 s), so
        // CI runs this model alone with LOOM_MAX_PREEMPTIONS=1 (.ci/run).
        builder_bound(1).check(|| {
            big(|| {
                // The file is larger than the capacity: a sequential read
                // would pass the cache by, and this model is of reclaim.
                let config = CacheConfig::default()
                    .capacity(4096)
                    .max_folio_order(0)
                    .passthrough(false)
                    .flusher(false);
                let cache = PageCache::new(config);
                let file = cache.open(TwoPages).unwrap();
                let mut b = [0u8; 8];
                file.read_at(&mut b, 0).unwrap();
                let other = file.clone();
                let t = spawn_big(move || {
                    let mut b = [0u8; 8];
                    other.read_at(&mut b, 0).unwrap();
                    assert_eq!(b, [1; 8]);
                });
                file.read_at(&mut b, 4096).unwrap(); // a miss: reclaim takes page 0
                assert_eq!(b, [2; 8]);
                t.join().unwrap();
                let s = cache.stats();
                assert_eq!(s.cached_pages, file.cached_pages());
                assert!((1..=2).contains(&s.cached_pages), "{s:?}");
                file.read_at(&mut b, 0).unwrap();
                assert_eq!(b, [1; 8]);
            })
        });
    }
}
