//! [`RamDisk`]: the crate's `brd`, a fixed-size block device whose 4 KiB
//! pages live in an [`XArray`], allocated on first write.
//!
//! Owns the device's pages and the count of pages allocated.
//!
//! Invariants:
//! - a page is inserted only with `cmpxchg` against an empty slot, so racing
//!   writers to one index allocate at most one page that stays (a loser's
//!   page is dropped before it is ever visible);
//! - a missing page reads as zeros and reading never allocates;
//! - every byte of a page is held in an [`AtomicU64`] word, so concurrent
//!   reads and writes of one page are data-race free: each aligned 8-byte
//!   word is read or written atomically (a partial word with a
//!   compare-and-swap loop), and a read racing a write of the same range may
//!   see a mix of old and new words, as with real memory. Writes to disjoint
//!   byte ranges never disturb each other, even inside one word;
//! - `pages_allocated` equals the number of pages in the array.

use super::{checked_end, Backend};
use crate::sync::{AtomicU64, Ordering};
use crate::{pin, Entry, XArray};
use std::io;

/// Bytes per RAM disk page.
pub const RAMDISK_PAGE_SIZE: usize = 4096;
const WORDS: usize = RAMDISK_PAGE_SIZE / 8;
const PAGE: u64 = RAMDISK_PAGE_SIZE as u64;

/// One backing page: 512 atomic words (4 KiB).
struct Page([AtomicU64; WORDS]);

impl Page {
    fn zeroed() -> Box<Page> {
        Box::new(Page(std::array::from_fn(|_| AtomicU64::new(0))))
    }

    /// Copy bytes `off..off + out.len()` of the page into `out`.
    #[inline]
    fn read(&self, off: usize, out: &mut [u8]) {
        if off.is_multiple_of(8) && out.len().is_multiple_of(8) {
            // Whole words (every block-sized request): one load each.
            let words = &self.0[off / 8..(off + out.len()) / 8];
            for (w, o) in words.iter().zip(out.chunks_exact_mut(8)) {
                o.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            return;
        }
        let mut at = off;
        let mut done = 0;
        while done < out.len() {
            let w = at / 8;
            let within = at % 8;
            let n = (8 - within).min(out.len() - done);
            let bytes = self.0[w].load(Ordering::Relaxed).to_le_bytes();
            out[done..done + n].copy_from_slice(&bytes[within..within + n]);
            done += n;
            at += n;
        }
    }

    /// Copy `src` into bytes `off..off + src.len()` of the page.
    #[inline]
    fn write(&self, off: usize, src: &[u8]) {
        if off.is_multiple_of(8) && src.len().is_multiple_of(8) {
            // Whole words (every block-sized request): one store each.
            let words = &self.0[off / 8..(off + src.len()) / 8];
            for (w, c) in words.iter().zip(src.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                w.store(u64::from_le_bytes(b), Ordering::Relaxed);
            }
            return;
        }
        let mut at = off;
        let mut done = 0;
        while done < src.len() {
            let w = at / 8;
            let within = at % 8;
            let n = (8 - within).min(src.len() - done);
            if n == 8 {
                let v = u64::from_le_bytes(src[done..done + 8].try_into().unwrap_or([0; 8]));
                self.0[w].store(v, Ordering::Relaxed);
            } else {
                // A partial word: merge our bytes into whatever the word
                // holds now, so a racing writer's other bytes survive.
                let mut cur = self.0[w].load(Ordering::Relaxed);
                loop {
                    let mut bytes = cur.to_le_bytes();
                    bytes[within..within + n].copy_from_slice(&src[done..done + n]);
                    let new = u64::from_le_bytes(bytes);
                    match self.0[w].compare_exchange_weak(
                        cur,
                        new,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(actual) => cur = actual,
                    }
                }
            }
            done += n;
            at += n;
        }
    }
}

/// A RAM-backed block device of fixed size (the kernel's `brd`): pages are
/// allocated on first write, never-written ranges read as zeros, and
/// [`discard`](Backend::discard) frees whole pages.
///
/// Out-of-range I/O:
/// - a write whose end lies past the device's end fails with
///   [`io::ErrorKind::StorageFull`] (the block layer's `ENOSPC`) and writes
///   nothing;
/// - a read starting exactly at the end returns `Ok(0)`; a read starting
///   past the end fails with [`io::ErrorKind::InvalidInput`]; a read that
///   straddles the end is short (stops at the end);
/// - an `offset + len` that overflows `u64` is [`io::ErrorKind::InvalidInput`];
/// - [`set_len`](Backend::set_len) to any other size is
///   [`io::ErrorKind::Unsupported`].
///
/// ```
/// use kxarray::backend::{Backend, RamDisk};
///
/// let disk = RamDisk::new(1 << 20);
/// let mut buf = [1u8; 4];
/// disk.read_exact_at(&mut buf, 4096).unwrap();
/// assert_eq!(buf, [0; 4]);                 // never written: zeros
/// assert_eq!(disk.pages_allocated(), 0);   // ... and nothing allocated
/// disk.write_all_at(b"brd!", 4096).unwrap();
/// assert_eq!(disk.pages_allocated(), 1);
/// disk.read_exact_at(&mut buf, 4096).unwrap();
/// assert_eq!(&buf, b"brd!");
/// assert!(disk.write_at(b"x", 1 << 20).is_err()); // past the end
/// ```
pub struct RamDisk {
    pages: XArray<Box<Page>>,
    size: u64,
    allocated: AtomicU64,
}

impl std::fmt::Debug for RamDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamDisk")
            .field("size", &self.size)
            .field("pages_allocated", &self.pages_allocated())
            .finish()
    }
}

impl RamDisk {
    /// A zero-filled device of `size` bytes; nothing is allocated yet.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    ///
    /// let disk = RamDisk::new(1 << 30); // 1 GiB
    /// assert_eq!(disk.memory_bytes(), 0); // nothing allocated until written
    /// let mut b = [1u8; 8];
    /// disk.read_exact_at(&mut b, (1 << 30) - 8).unwrap();
    /// assert_eq!(b, [0; 8]);
    /// ```
    pub fn new(size: u64) -> RamDisk {
        RamDisk {
            pages: XArray::new(),
            size,
            allocated: AtomicU64::new(0),
        }
    }

    /// The device size in bytes, fixed ([`Backend::len`] too).
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    ///
    /// let disk = RamDisk::new(8192);
    /// assert_eq!((disk.size(), disk.len().unwrap()), (8192, 8192));
    /// assert!(disk.set_len(4096).is_err()); // the size never changes
    /// assert_eq!(disk.size(), 8192);
    /// ```
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Pages currently allocated.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    ///
    /// let disk = RamDisk::new(1 << 20);
    /// disk.write_all_at(&[1; 3 * 4096], 0).unwrap();
    /// assert_eq!(disk.pages_allocated(), 3);
    /// disk.discard(0, 8192).unwrap(); // frees the two whole pages
    /// assert_eq!(disk.pages_allocated(), 1);
    /// ```
    pub fn pages_allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Bytes of page memory currently allocated.
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk, RAMDISK_PAGE_SIZE};
    ///
    /// let disk = RamDisk::new(1 << 20);
    /// disk.write_all_at(b"x", 100_000).unwrap(); // one byte: one whole page
    /// assert_eq!(disk.memory_bytes(), RAMDISK_PAGE_SIZE as u64);
    /// ```
    pub fn memory_bytes(&self) -> u64 {
        self.pages_allocated() * PAGE
    }

    /// The page at `index`, allocating it if absent. Racing callers get the
    /// same page: the insert is a `cmpxchg` against an empty slot.
    fn page_for_write<'g>(&'g self, index: u64, guard: &'g crate::Guard) -> io::Result<&'g Page> {
        loop {
            if let Some(e) = self.pages.load(index, guard) {
                if let Some(r) = e.item() {
                    return Ok(r.get());
                }
            }
            match self
                .pages
                .cmpxchg(index, None, Some(Entry::Item(Page::zeroed())), guard)
            {
                Ok(_) => {
                    self.allocated.fetch_add(1, Ordering::Relaxed);
                    // Loop: the load above now finds the page we stored.
                }
                Err(r) if r.error == crate::Error::Mismatch => {
                    // Another writer won; our page was handed back and is
                    // dropped here. Load theirs.
                }
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        "ram disk: page index allocation failed",
                    ))
                }
            }
        }
    }

    fn check_write(&self, offset: u64, len: usize) -> io::Result<u64> {
        let end = checked_end(offset, len as u64)?;
        if end > self.size {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "ram disk: write of {len} bytes at {offset} runs past the end ({})",
                    self.size
                ),
            ));
        }
        Ok(end)
    }
}

impl Backend for RamDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        checked_end(offset, buf.len() as u64)?;
        if offset > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ram disk: read at {offset} past the end ({})", self.size),
            ));
        }
        // Bounded by buf.len(), so the cast back is lossless.
        let n = (self.size - offset).min(buf.len() as u64) as usize;
        let guard = pin();
        let mut done = 0usize;
        while done < n {
            let at = offset + done as u64;
            let index = at / PAGE;
            let within = (at % PAGE) as usize;
            let len = (RAMDISK_PAGE_SIZE - within).min(n - done);
            let out = &mut buf[done..done + len];
            match self.pages.load(index, &guard).and_then(|e| e.item()) {
                Some(p) => p.get().read(within, out),
                None => out.fill(0),
            }
            done += len;
        }
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.check_write(offset, buf.len())?;
        let guard = pin();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let index = at / PAGE;
            let within = (at % PAGE) as usize;
            let len = (RAMDISK_PAGE_SIZE - within).min(buf.len() - done);
            self.page_for_write(index, &guard)?
                .write(within, &buf[done..done + len]);
            done += len;
        }
        Ok(buf.len())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.size)
    }

    fn in_memory(&self) -> bool {
        true
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if len == self.size {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "ram disk: the size is fixed",
        ))
    }

    /// Frees every whole page in the range and zeroes the partial pages at
    /// its edges (allocated ones only; missing pages already read as zeros).
    ///
    /// ```
    /// use kxarray::backend::{Backend, RamDisk};
    ///
    /// let disk = RamDisk::new(4 * 4096);
    /// disk.write_all_at(&[0xAA; 4 * 4096], 0).unwrap();
    /// disk.discard(2048, 2 * 4096).unwrap(); // half of page 0, page 1, half of page 2
    /// assert_eq!(disk.pages_allocated(), 3); // page 1 freed
    /// let mut b = [0u8; 4];
    /// disk.read_exact_at(&mut b, 2046).unwrap();
    /// assert_eq!(b, [0xAA, 0xAA, 0, 0]);
    /// assert!(disk.discard(3 * 4096, 8192).is_err()); // past the end
    /// ```
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = checked_end(offset, len)?;
        if end > self.size {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("ram disk: discard of {len} bytes at {offset} runs past the end"),
            ));
        }
        let first_whole = offset.div_ceil(PAGE);
        let end_whole = end / PAGE;
        if first_whole >= end_whole {
            return self.zero_allocated(offset, end);
        }
        self.zero_allocated(offset, first_whole * PAGE)?;
        for index in first_whole..end_whole {
            if self.pages.erase(index).is_some() {
                self.allocated.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.zero_allocated(end_whole * PAGE, end)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.discard(offset, len)
    }
}

impl RamDisk {
    /// Zero `start..end` inside pages that exist (no allocation).
    fn zero_allocated(&self, start: u64, end: u64) -> io::Result<()> {
        let guard = pin();
        let zeros = [0u8; RAMDISK_PAGE_SIZE];
        let mut at = start;
        while at < end {
            let index = at / PAGE;
            let within = (at % PAGE) as usize;
            // Bounded by the page size.
            let len = (PAGE - within as u64).min(end - at) as usize;
            if let Some(p) = self.pages.load(index, &guard).and_then(|e| e.item()) {
                p.get().write(within, &zeros[..len]);
            }
            at += len as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn unwritten_reads_zero_without_allocating() {
        let d = RamDisk::new(64 * 1024);
        let mut b = vec![7u8; 10_000];
        assert_eq!(d.read_at(&mut b, 100).unwrap(), 10_000);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(d.pages_allocated(), 0);
    }

    #[test]
    fn write_read_across_pages_and_words() {
        let d = RamDisk::new(64 * 1024);
        let data: Vec<u8> = (0..9000u32).map(|i| (i * 7 + 3) as u8).collect();
        d.write_all_at(&data, 4093).unwrap(); // pages 0..=3
        assert_eq!(d.pages_allocated(), 4);
        let mut b = vec![0u8; 9000];
        d.read_exact_at(&mut b, 4093).unwrap();
        assert_eq!(b, data);
        let mut edge = [9u8; 3];
        d.read_exact_at(&mut edge, 4090).unwrap();
        assert_eq!(edge, [0, 0, 0]);
    }

    /// Aligned whole-word I/O (the fast path) and unaligned I/O (the
    /// word-merging path) interleaved, against a plain byte vector.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of interpreted page copies; too slow under Miri"
    )]
    fn aligned_and_unaligned_io_agree_with_a_byte_model() {
        const SIZE: usize = 5 * RAMDISK_PAGE_SIZE;
        let d = RamDisk::new(SIZE as u64);
        let mut model = vec![0u8; SIZE];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as usize
        };
        // Miri runs every byte copy interpreted: fewer, shorter rounds.
        let (rounds, words, bytes) = if cfg!(miri) {
            (40, 80, 700)
        } else {
            (2000, 1024, 9000)
        };
        for round in 0..rounds {
            let aligned = round % 2 == 0;
            let (off, len) = if aligned {
                (next(SIZE / 8) * 8, (next(words) + 1) * 8)
            } else {
                (next(SIZE), next(bytes) + 1)
            };
            let len = len.min(SIZE - off);
            if round % 3 == 0 {
                let mut got = vec![0xeeu8; len];
                d.read_exact_at(&mut got, off as u64).unwrap();
                assert_eq!(got, model[off..off + len], "read {off}+{len}");
            } else {
                let data: Vec<u8> = (0..len).map(|i| (i as u32 ^ round) as u8).collect();
                d.write_all_at(&data, off as u64).unwrap();
                model[off..off + len].copy_from_slice(&data);
            }
        }
        let mut all = vec![0u8; SIZE];
        d.read_exact_at(&mut all, 0).unwrap();
        assert_eq!(all, model);
    }

    #[test]
    fn bounds_and_overflow() {
        let d = RamDisk::new(8192);
        assert_eq!(
            d.write_at(b"ab", 8191).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        assert_eq!(d.pages_allocated(), 0, "a refused write writes nothing");
        assert_eq!(
            d.write_at(b"ab", u64::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let mut b = [0u8; 16];
        assert_eq!(d.read_at(&mut b, 8192).unwrap(), 0);
        assert_eq!(d.read_at(&mut b, 8184).unwrap(), 8);
        assert_eq!(
            d.read_at(&mut b, 9000).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            d.read_at(&mut b, u64::MAX - 3).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(d.write_at(&[], 8192).unwrap(), 0);
        assert_eq!(
            d.set_len(4096).unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
        d.set_len(8192).unwrap();
    }

    #[test]
    fn discard_frees_whole_pages_and_zeroes_edges() {
        let d = RamDisk::new(5 * PAGE);
        d.write_all_at(&vec![0xAA; 5 * RAMDISK_PAGE_SIZE], 0)
            .unwrap();
        assert_eq!(d.pages_allocated(), 5);
        // From the middle of page 0 to the middle of page 3: pages 1 and 2
        // are freed, the halves zeroed.
        d.discard(2048, 3 * PAGE).unwrap();
        assert_eq!(d.pages_allocated(), 3);
        let mut all = vec![0u8; 5 * RAMDISK_PAGE_SIZE];
        d.read_exact_at(&mut all, 0).unwrap();
        for (i, &b) in all.iter().enumerate() {
            let want = if (2048..2048 + 3 * RAMDISK_PAGE_SIZE).contains(&i) {
                0
            } else {
                0xAA
            };
            assert_eq!(b, want, "byte {i}");
        }
        assert!(d.discard(4 * PAGE, 2 * PAGE).is_err());
    }

    #[test]
    fn racing_writers_allocate_one_page_and_keep_disjoint_bytes() {
        let d = Arc::new(RamDisk::new(16 * PAGE));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    // Each thread owns bytes t, t+4, t+8, ... of page 3: all
                    // in shared words, so partial-word merges must not lose
                    // a neighbour's byte.
                    for i in (t as usize..RAMDISK_PAGE_SIZE).step_by(4) {
                        d.write_all_at(&[t + 1], 3 * PAGE + i as u64).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(d.pages_allocated(), 1);
        let mut b = vec![0u8; RAMDISK_PAGE_SIZE];
        d.read_exact_at(&mut b, 3 * PAGE).unwrap();
        for (i, &x) in b.iter().enumerate() {
            assert_eq!(x, (i % 4) as u8 + 1, "byte {i}");
        }
    }
}
