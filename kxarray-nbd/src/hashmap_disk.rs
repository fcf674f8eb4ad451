//! The baseline RAM disk: 4 KiB pages in a `Mutex<HashMap<u64, page>>`,
//! the "before" of brd's move to an XArray (its pages indexed under one lock).
//!
//! Owns the map from page index to page. Invariants: a page is allocated
//! on the first write that touches it; a missing page reads as zeros;
//! discarding or zeroing a whole page removes it, a partial page is
//! zeroed in place; every access takes the one lock, once per page.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use kxarray::backend::{checked_end, Backend};

/// Page size of the baseline disk.
pub const PAGE_SIZE: usize = 4096;

type Page = Box<[u8; PAGE_SIZE]>;

/// A fixed-size RAM disk of lazily allocated 4 KiB pages indexed by a
/// `HashMap` under one `Mutex`.
///
/// ```
/// use kxarray::backend::Backend;
/// use kxarray_nbd::HashMapDisk;
///
/// let disk = HashMapDisk::new(1 << 20);
/// disk.write_all_at(b"hello", 4094).unwrap();
/// let mut buf = [0u8; 7];
/// disk.read_exact_at(&mut buf, 4093).unwrap();
/// assert_eq!(&buf, b"\0hello\0");
/// assert_eq!(disk.pages(), 2);
/// ```
#[derive(Debug)]
pub struct HashMapDisk {
    size: u64,
    pages: Mutex<HashMap<u64, Page>>,
}

impl HashMapDisk {
    /// A zero-filled disk of `size` bytes that allocates nothing yet.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            pages: Mutex::new(HashMap::new()),
        }
    }

    /// How many pages are allocated.
    pub fn pages(&self) -> usize {
        self.map().len()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Page>> {
        // A panic while the lock was held cannot leave a page half-inserted
        // (insertions are single map operations), so a poisoned map is
        // still consistent.
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Check `offset..offset + len` against the size.
    fn check(&self, offset: u64, len: u64, past_end: io::ErrorKind) -> io::Result<u64> {
        let end = checked_end(offset, len)?;
        if end > self.size {
            return Err(io::Error::new(
                past_end,
                format!(
                    "bytes {offset}..{end} past the end of a {}-byte disk",
                    self.size
                ),
            ));
        }
        Ok(end)
    }

    /// Call `f(page index, offset in page, range in the request)` for every
    /// page piece of `offset..end`.
    fn pieces(offset: u64, end: u64, mut f: impl FnMut(u64, usize, std::ops::Range<usize>)) {
        let mut at = offset;
        while at < end {
            let index = at / PAGE_SIZE as u64;
            // Below PAGE_SIZE, so the casts are lossless.
            let in_page = (at % PAGE_SIZE as u64) as usize;
            let n = (PAGE_SIZE - in_page).min((end - at) as usize);
            let start = (at - offset) as usize;
            f(index, in_page, start..start + n);
            at += n as u64;
        }
    }
}

impl Backend for HashMapDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if offset >= self.size {
            return Ok(0);
        }
        let n = (self.size - offset).min(buf.len() as u64);
        Self::pieces(offset, offset + n, |index, in_page, range| {
            let len = range.len();
            match self.map().get(&index) {
                Some(page) => buf[range].copy_from_slice(&page[in_page..in_page + len]),
                None => buf[range].fill(0),
            }
        });
        // At most buf.len(), so the cast is lossless.
        Ok(n as usize)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let end = self.check(offset, buf.len() as u64, io::ErrorKind::StorageFull)?;
        Self::pieces(offset, end, |index, in_page, range| {
            let len = range.len();
            let mut map = self.map();
            let page = map
                .entry(index)
                .or_insert_with(|| Box::new([0u8; PAGE_SIZE]));
            page[in_page..in_page + len].copy_from_slice(&buf[range]);
        });
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
    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the RAM disk has a fixed size",
        ))
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = self.check(offset, len, io::ErrorKind::StorageFull)?;
        Self::pieces(offset, end, |index, in_page, range| {
            let mut map = self.map();
            if range.len() == PAGE_SIZE {
                map.remove(&index);
            } else if let Some(page) = map.get_mut(&index) {
                page[in_page..in_page + range.len()].fill(0);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_reads_writes_and_holes() {
        let d = HashMapDisk::new(5 * PAGE_SIZE as u64 + 100);
        let mut buf = vec![1u8; 3 * PAGE_SIZE];
        d.read_exact_at(&mut buf, 10).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(d.pages(), 0);

        let data: Vec<u8> = (0..2 * PAGE_SIZE + 10).map(|i| (i % 251) as u8).collect();
        d.write_all_at(&data, PAGE_SIZE as u64 - 5).unwrap();
        assert_eq!(d.pages(), 4);
        let mut back = vec![0u8; data.len()];
        d.read_exact_at(&mut back, PAGE_SIZE as u64 - 5).unwrap();
        assert_eq!(back, data);

        // Zero page 1 whole (freed) and a piece of page 2 (zeroed in place).
        d.write_zeroes(PAGE_SIZE as u64, PAGE_SIZE as u64 + 3)
            .unwrap();
        assert_eq!(d.pages(), 3);
        d.read_exact_at(&mut back, PAGE_SIZE as u64 - 5).unwrap();
        assert_eq!(back[..5], data[..5]);
        assert!(back[5..5 + PAGE_SIZE + 3].iter().all(|&b| b == 0));
        assert_eq!(back[5 + PAGE_SIZE + 3..], data[5 + PAGE_SIZE + 3..]);
    }

    #[test]
    fn bounds() {
        let d = HashMapDisk::new(8192);
        assert_eq!(
            d.write_at(&[1; 2], 8191).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        assert_eq!(
            d.write_zeroes(u64::MAX, 2).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let mut b = [0u8; 4];
        assert_eq!(d.read_at(&mut b, 8190).unwrap(), 2);
        assert_eq!(d.read_at(&mut b, 9000).unwrap(), 0);
        assert_eq!(d.set_len(1).unwrap_err().kind(), io::ErrorKind::Unsupported);
        assert_eq!(d.len().unwrap(), 8192);
        assert_eq!(d.pages(), 0);
    }
}
