//! A process's hints in front of the shared index: for a page, the
//! frame that held it when this process last found it there.
//!
//! Owns [`Hints`]: a direct-mapped table of frame numbers in the process's
//! own memory, indexed by [`Tag::hint_key`](super::frame::Tag::hint_key):
//! a file's pages sit side by side, so a process holding hints for a file
//! of N pages has N × 4 bytes of the table in memory (a 26 MB database:
//! 7 pages), whatever the region's size; the table is reserved for the
//! region's most and allocated by the kernel as it is first touched. (It is
//! advised against huge pages: one would cost each process 2 MiB for a
//! small database.) A hit whose hint names a frame that still holds its
//! page skips the shared bucket, one dependent cache miss (and, on 4 KiB
//! pages, a TLB miss) of the three a hit through the index takes.
//!
//! Invariants: a hint is only a hint. It is never trusted for anything but
//! where to look first: the frame it names is accepted only as the index's
//! entries are, by its tag and `VALID` read inside the frame's version
//! window, and the copy only if the version did not move. A stale hint (a
//! frame evicted and reused) fails that check and the caller looks in the
//! shared index. Entries are relaxed atomics (threads of the process race
//! on them harmlessly); a child after fork gets a copy that is as good.

use crate::sync::{AtomicU32, Ordering};

/// Entries at most: 4 MiB of table per process (a member's own memory;
/// a region of more frames shares slots, and a hint overwritten is a look
/// in the index).
const MAX_ENTRIES: usize = 1 << 20;

/// The hint table (see the module notes).
#[derive(Debug)]
pub(crate) struct Hints {
    /// The mapping's start and length (for `munmap`).
    base: *mut libc::c_void,
    map_len: usize,
    /// The table: `mask + 1` entries of frame number plus one (0: none),
    /// inside the mapping.
    table: *const AtomicU32,
    mask: usize,
}

// SAFETY: the table is private memory of this process read and written
// only through atomics; the pointers are never handed out.
unsafe impl Send for Hints {}
// SAFETY: as above.
unsafe impl Sync for Hints {}

impl Hints {
    /// A table for a region of `max_frames` frames (one entry per frame,
    /// rounded up to a power of two, at most [`MAX_ENTRIES`]); an empty
    /// one (every lookup a miss) if the memory cannot be mapped.
    pub(crate) fn new(max_frames: u64) -> Hints {
        let entries = (max_frames.max(1) as usize)
            .next_power_of_two()
            .min(MAX_ENTRIES);
        let map_len = entries * 4;
        // SAFETY: a new private anonymous mapping; no memory of ours is
        // touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Hints {
                base: std::ptr::null_mut(),
                map_len: 0,
                table: std::ptr::null(),
                mask: 0,
            };
        }
        // SAFETY: advice on the mapping just made, which the kernel may
        // ignore: small pages even where huge ones are the default.
        unsafe { libc::madvise(base, map_len, libc::MADV_NOHUGEPAGE) };
        Hints {
            base,
            map_len,
            table: base as *const AtomicU32,
            mask: entries - 1,
        }
    }

    fn entry(&self, key: u64) -> Option<&AtomicU32> {
        if self.table.is_null() {
            return None;
        }
        let i = key as usize & self.mask;
        // SAFETY: `i <= mask`, and the table holds `mask + 1` entries:
        // the offset stays inside the mapping.
        let p = unsafe { self.table.add(i) };
        // SAFETY: `p` is an entry of zero-initialised anonymous memory (a
        // valid `AtomicU32`), mapped for the life of `self`.
        Some(unsafe { &*p })
    }

    /// The frame the hint for `key` names, if any.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        self.entry(key)?.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Remember that frame `frame` held the page of `key`.
    #[inline]
    pub(crate) fn set(&self, key: u64, frame: u32) {
        if let Some(e) = self.entry(key) {
            let v = frame.wrapping_add(1);
            if e.load(Ordering::Relaxed) != v {
                e.store(v, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Hints {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: the mapping made in `new`, unmapped once; no
            // reference into it outlives `self`.
            unsafe { libc::munmap(self.base, self.map_len) };
        }
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn hints_remember_the_last_frame_per_slot() {
        let h = Hints::new(1000);
        assert_eq!(h.get(5), None);
        h.set(5, 0);
        assert_eq!(h.get(5), Some(0));
        h.set(5 + 1024, 77); // the same slot: the newer wins
        assert_eq!(h.get(5), Some(77));
        assert_eq!(h.get(6), None);
    }
}
