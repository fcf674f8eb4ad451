//! A file's read-through ring: one buffer of [`RING_BYTES`] (PostgreSQL's
//! `BAS_BULKREAD` ring is 256 KB) that small reads passing the cache by
//! (`passthrough`) are served from, so that a scan in 4 KiB reads costs one
//! backend read per 256 KiB instead of one per page, and no frame.
//!
//! Owns the buffer, the file range it holds and the count of finished
//! backend writes taken before it was read (`inode`'s `BackendWrites`).
//! It only stores: which of its bytes may be served is `passthrough`'s
//! rule (a page no folio covers now, no backend write since the fill).
//!
//! Invariants: `len` bytes from `start` are what the backend held when
//! the ring was filled (zeros past its end); the buffer is allocated on
//! the first fill and kept with the file.

use crate::aio::AlignedBuf;
use crate::sync::{Lock, LockGuard};

/// The ring's size: PostgreSQL's bulk-read ring.
pub(crate) const RING_BYTES: usize = 256 << 10;

/// The ring's contents ([`Ring::lock`]).
pub(crate) struct Held {
    /// Page-aligned: the kernel's copy into a buffer that `malloc` offset
    /// by 16 bytes ran at a quarter of the speed on this project's
    /// machine (`rep movsb` to an unaligned destination).
    buf: Option<AlignedBuf>,
    /// File offset of `buf[0]`.
    start: u64,
    /// Bytes held (0: nothing).
    len: usize,
    /// Backend writes finished before the fill began.
    pub(crate) writes: u64,
}

/// One file's ring.
pub(crate) struct Ring(Lock<Held>);

impl Ring {
    pub(crate) fn new() -> Ring {
        Ring(Lock::new(Held {
            buf: None,
            start: 0,
            len: 0,
            writes: 0,
        }))
    }

    /// The ring, locked.
    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_, Held> {
        self.0.lock()
    }
}

impl Held {
    /// The bytes it holds from `pos` on, at most `n` (empty when it holds
    /// no byte at `pos`).
    #[inline]
    pub(crate) fn get(&self, pos: u64, n: usize) -> &[u8] {
        if pos < self.start || pos >= self.start + self.len as u64 {
            return &[];
        }
        let at = (pos - self.start) as usize;
        match &self.buf {
            Some(b) => &b[at..self.len.min(at + n)],
            None => &[],
        }
    }

    /// Make it hold `len` bytes from `start` (at most [`RING_BYTES`]) that
    /// `fill` writes into the buffer it is given, with `writes` the
    /// finished backend writes counted before. On an error it holds
    /// nothing.
    ///
    /// # Errors
    /// `fill`'s.
    pub(crate) fn fill<E>(
        &mut self,
        start: u64,
        len: usize,
        writes: u64,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let len = len.min(RING_BYTES);
        self.len = 0;
        let buf = self.buf.get_or_insert_with(|| AlignedBuf::new(RING_BYTES));
        fill(&mut buf[..len])?;
        (self.start, self.len, self.writes) = (start, len, writes);
        Ok(())
    }

    /// Hold nothing (its bytes may be stale).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Bytes of memory it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_it_was_filled_with() {
        let r = Ring::new();
        let mut h = r.lock();
        assert!(h.get(0, 10).is_empty());
        h.fill(8192, 100, 7, |b| {
            b.fill(5);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!((h.get(8192, 10), h.writes), (&[5u8; 10][..], 7));
        assert_eq!(h.get(8192 + 95, 10).len(), 5, "up to its end");
        assert!(h.get(8191, 10).is_empty() && h.get(8292, 1).is_empty());
        assert!(h.fill(0, 10, 8, |_| Err(())).is_err());
        assert!(h.get(8192, 1).is_empty(), "a failed fill holds nothing");
        h.clear();
        assert_eq!(h.bytes(), RING_BYTES);
    }
}
