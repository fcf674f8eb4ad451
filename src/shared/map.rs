//! The region's mapping: the unsafe engine under the shared cache.
//!
//! Owns the one `mmap` of the region file and every view into it. All a
//! caller gets are references to atomics ([`FrameHeader`], [`Bucket`],
//! [`FileSlot`], [`MemberSlot`], the header's words) and [`FrameBytes`],
//! a frame's bytes behind byte-wise atomic copies: never a `&[u8]` or a
//! `&T` of plain data over memory another process may write, as Rust's
//! rules for shared memory require (atomics are fine between cooperating
//! processes; the bytes of a frame are only ever read and written byte-wise
//! atomically, by this process, or by the kernel's `pread`/`pwrite`).
//!
//! Invariants:
//! - the mapping covers the whole region ([`Geometry::len`]) for as long
//!   as the [`Mapping`] lives; every view borrows the mapping, so none
//!   outlives it;
//! - every index a view is asked for is checked against the geometry
//!   (frame numbers come from other processes' words: a bad one is `None`,
//!   never an access outside the mapping);
//! - the structs viewed are `repr(C)`, made only of atomics, and their
//!   offsets are the geometry's, so any bit pattern another process leaves
//!   is a valid value.
//!
//! The file may be shortened by a process of the same user (nothing stops
//! it): touching the lost part then raises `SIGBUS`, as with any shared
//! mapping. Members never do it; the region's files live in a directory
//! only the user can reach.

use super::frame::FrameHeader;
use super::index::{Bucket, Frames};
use super::layout::{Geometry, DIRTY_MAX, FILES, HEADER_WORDS, MEMBERS, MEMBER_META, PATH_BYTES};
use crate::bytewise;
use crate::sync::{AtomicU32, AtomicU64};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// The header page's words.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct HeaderPage {
    pub(crate) words: [AtomicU64; HEADER_WORDS],
}

/// A file slot's words (see `files` for their meaning).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct FileSlot {
    pub(crate) words: [AtomicU64; 24],
}

/// A member slot: its fixed words and its dirty list.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct MemberSlot {
    pub(crate) words: [AtomicU64; MEMBER_META / 8],
    pub(crate) dirty: [AtomicU64; DIRTY_MAX],
}

#[cfg(not(loom))]
const _: () = {
    assert!(core::mem::size_of::<HeaderPage>() == super::layout::PAGE);
    assert!(core::mem::size_of::<FileSlot>() == super::layout::FILE_BYTES);
    assert!(core::mem::size_of::<MemberSlot>() == super::layout::MEMBER_BYTES);
};

/// The region mapped into this process.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    geo: Geometry,
}

// SAFETY: the mapping is plain shared memory; every access through it is
// atomic (the views) or byte-wise atomic (`FrameBytes`), so threads may
// share and send it freely.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map the region file `fd` with layout `geo` (`MAP_SHARED`, read and
    /// write). The file must be at least `geo.len` bytes.
    ///
    /// # Errors
    /// The `mmap` error.
    pub(crate) fn map(fd: BorrowedFd<'_>, geo: Geometry) -> io::Result<Mapping> {
        let len =
            usize::try_from(geo.len).map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a new mapping of `len` bytes chosen by the kernel; it
        // aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Mapping { base, geo })
    }

    /// The layout.
    #[inline]
    pub(crate) fn geo(&self) -> &Geometry {
        &self.geo
    }

    /// A view of the `T` at byte offset `off`.
    ///
    /// # Safety
    /// - `off + size_of::<T>() <= geo.len` and `off` is aligned for `T`;
    /// - `T` is `repr(C)` and made only of atomics (any bit pattern valid,
    ///   every access atomic).
    #[inline]
    unsafe fn at<T>(&self, off: u64) -> &T {
        debug_assert!(off + core::mem::size_of::<T>() as u64 <= self.geo.len);
        debug_assert_eq!(off % core::mem::align_of::<T>() as u64, 0);
        let p = self.base.as_ptr().wrapping_add(off as usize).cast::<T>();
        // SAFETY: as above: `p` is in bounds, aligned, mapped while `self`
        // lives, and a `T` of atomics only.
        unsafe { &*p }
    }

    /// The header page.
    #[inline]
    pub(crate) fn header(&self) -> &HeaderPage {
        // SAFETY: offset 0, one page, inside every geometry; atomics only.
        unsafe { self.at(0) }
    }

    /// Header word `i` as a 32-bit futex word (its low half).
    #[inline]
    pub(crate) fn header_u32(&self, i: usize) -> &AtomicU32 {
        assert!(i < HEADER_WORDS);
        // SAFETY: inside the header page, 8-byte aligned; an `AtomicU32`
        // over the low half of a word only ever accessed as that.
        unsafe { self.at((i * 8) as u64) }
    }

    /// Member slot `m`.
    #[inline]
    pub(crate) fn member(&self, m: usize) -> &MemberSlot {
        assert!(m < MEMBERS);
        // SAFETY: member slots lie inside the geometry (layout's tests),
        // page aligned; atomics only.
        unsafe { self.at(self.geo.member_off(m)) }
    }

    /// File slot `s`.
    #[inline]
    pub(crate) fn file(&self, s: usize) -> &FileSlot {
        assert!(s < FILES);
        // SAFETY: file slots lie inside the geometry, 128-byte aligned;
        // atomics only.
        unsafe { self.at(self.geo.files_off + (s * super::layout::FILE_BYTES) as u64) }
    }

    /// File slot `s`'s path area: its length word, then its bytes.
    pub(crate) fn path_words(&self, s: usize) -> &[AtomicU64; PATH_BYTES / 8] {
        assert!(s < FILES);
        // SAFETY: inside the paths table, page aligned; atomics only.
        unsafe { self.at(self.geo.path_off(s)) }
    }

    /// Bucket `b` (masked to the table).
    #[inline]
    pub(crate) fn bucket(&self, b: u64) -> &Bucket {
        let b = b & (self.geo.buckets - 1);
        // SAFETY: `b < buckets`, so inside the index; 128-byte aligned;
        // atomics only.
        unsafe { self.at(self.geo.index_off + b * core::mem::size_of::<Bucket>() as u64) }
    }

    /// Frame `f`'s header, if `f` is a frame of the region.
    #[inline]
    pub(crate) fn frame(&self, f: u32) -> Option<&FrameHeader> {
        if u64::from(f) >= self.geo.max_frames {
            return None;
        }
        let off = self.geo.headers_off + u64::from(f) * super::layout::FRAME_HEADER_BYTES as u64;
        // SAFETY: `f < max_frames`: inside the header table, 32-byte
        // aligned; atomics only.
        Some(unsafe { self.at(off) })
    }

    /// Frame `f`'s bytes, if `f` is a frame of the region.
    #[inline]
    pub(crate) fn bytes(&self, f: u32) -> Option<FrameBytes<'_>> {
        if u64::from(f) >= self.geo.max_frames {
            return None;
        }
        // SAFETY: `f < max_frames`: the frame's page is inside the mapping.
        let ptr = unsafe { self.base.as_ptr().add(self.geo.frame_off(f) as usize) };
        Some(FrameBytes {
            ptr,
            _m: core::marker::PhantomData,
        })
    }

    /// The address of frame `f`'s first byte (for `madvise` and the kernel's
    /// I/O), if `f` is a frame.
    pub(crate) fn frame_addr(&self, f: u32) -> Option<*mut u8> {
        self.bytes(f).map(|b| b.ptr)
    }
}

impl Frames for Mapping {
    #[inline]
    fn header(&self, f: u32) -> Option<&FrameHeader> {
        self.frame(f)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length; every view
        // borrowed `self`, so none is left.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.geo.len as usize);
        }
    }
}

/// One frame's 4 KiB of bytes, read and written byte-wise atomically.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameBytes<'a> {
    ptr: *mut u8,
    _m: core::marker::PhantomData<&'a Mapping>,
}

impl FrameBytes<'_> {
    /// Copy `dst.len()` bytes from offset `off` of the frame.
    ///
    /// # Panics
    /// If `off + dst.len()` exceeds the frame.
    #[inline]
    pub(crate) fn load(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= super::layout::PAGE);
        // SAFETY: the range is inside the frame, mapped while `'a` lives;
        // every write to a frame's bytes is `store`'s byte-wise atomic one
        // or the kernel's (outside this process's memory model), so the
        // byte-wise atomic load races with nothing non-atomic.
        unsafe { bytewise::load(dst, self.ptr.wrapping_add(off)) }
    }

    /// Copy `src` to offset `off` of the frame. Callers hold the frame's
    /// lock inside a change (memory safety does not depend on it: every
    /// access is byte-wise atomic; what readers see does).
    ///
    /// # Panics
    /// If `off + src.len()` exceeds the frame.
    #[inline]
    pub(crate) fn store(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= super::layout::PAGE);
        // SAFETY: inside the frame (checked), mapped while `'a` lives, not
        // overlapping `src` (a Rust slice cannot point into the region:
        // no `&[u8]` over it is ever made); concurrent readers use `load`.
        unsafe { bytewise::store(self.ptr.wrapping_add(off), src) }
    }

    /// Zero `len` bytes from offset `off`.
    ///
    /// # Panics
    /// If the range exceeds the frame.
    pub(crate) fn zero(&self, off: usize, len: usize) {
        assert!(off + len <= super::layout::PAGE);
        // SAFETY: as for `store`.
        unsafe { bytewise::fill(self.ptr.wrapping_add(off), len, 0) }
    }

    /// The first byte's address, for the kernel's I/O (`pread` into,
    /// `pwrite` from).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}
