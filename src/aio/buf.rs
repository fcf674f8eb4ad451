//! I/O buffers the engine may hand to the kernel: [`IoBuf`] (the source of
//! a write), [`IoBufMut`] (the destination of a read) and [`AlignedBuf`]
//! (an owned, zeroed buffer aligned for `O_DIRECT`).
//!
//! Owns the contract that makes submission sound: a buffer is passed *by
//! value*, so the engine owns it from submission until its completion is
//! reaped, and the traits are `unsafe` to implement because the engine
//! relies on their pointers. Invariants an implementation promises:
//! - the pointer and length describe bytes that stay allocated, and at the
//!   same address, for as long as the value exists, even when the value
//!   itself is moved (the bytes live in a separate allocation: a `Vec`'s
//!   heap block, not an array inside the value);
//! - nothing but the holder of the value reads or writes those bytes, so
//!   the kernel (or a pool thread) may write them while the engine holds
//!   the value;
//! - the answers do not change while the value is not accessed through
//!   `&mut`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::ptr::NonNull;

/// A buffer a write may take its bytes from: owned, `Send`, `'static`, with
/// bytes at a stable address.
///
/// # Safety
/// An implementation promises what the module notes say: the bytes at
/// [`stable_ptr`](IoBuf::stable_ptr), [`bytes_len`](IoBuf::bytes_len) of
/// them, stay allocated, initialised and at the same address while the
/// value exists, even if the value is moved, and are not written while the
/// engine holds the value.
pub unsafe trait IoBuf: Any + Send + 'static {
    /// The first byte.
    fn stable_ptr(&self) -> *const u8;

    /// How many bytes a transfer may use.
    fn bytes_len(&self) -> usize;

    /// The bytes, as a slice.
    fn as_slice(&self) -> &[u8] {
        let (p, n) = (self.stable_ptr(), self.bytes_len());
        debug_assert!(!p.is_null());
        // SAFETY: the trait's contract: `n` initialised bytes at `p`,
        // borrowed for as long as `self` is.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// A buffer a read may fill: an [`IoBuf`] whose bytes may also be written.
///
/// Implemented for `Vec<u8>` (its length, not its capacity, is the
/// request's size), [`AlignedBuf`] and boxes of either, so the page cache
/// can later pass its own type (a locked folio holding a reference) boxed
/// as a `Box<dyn IoBufMut>`.
///
/// # Safety
/// As [`IoBuf`], and the [`stable_mut_ptr`](IoBufMut::stable_mut_ptr)
/// bytes may be written by whoever holds the value.
pub unsafe trait IoBufMut: IoBuf {
    /// The first byte, for writing.
    fn stable_mut_ptr(&mut self) -> *mut u8;

    /// The bytes, as a mutable slice.
    fn as_mut_slice(&mut self) -> &mut [u8] {
        let n = self.bytes_len();
        let p = self.stable_mut_ptr();
        debug_assert!(!p.is_null());
        // SAFETY: the trait's contract: `n` initialised bytes at `p`, owned
        // by `self`, borrowed mutably for as long as `self` is.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

// SAFETY: a vector's bytes live in its heap block, which moving the vector
// does not move; its length is the transfer size, all of it initialised.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: as above; `as_mut_ptr` does not reallocate.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

// SAFETY: the box's pointee does not move when the box does, and the
// pointee's own bytes (which it promises are not inside itself) do not
// either; the box forwards the pointee's answers.
unsafe impl<T: IoBuf + ?Sized> IoBuf for Box<T> {
    fn stable_ptr(&self) -> *const u8 {
        (**self).stable_ptr()
    }
    fn bytes_len(&self) -> usize {
        (**self).bytes_len()
    }
}

// SAFETY: as above.
unsafe impl<T: IoBufMut + ?Sized> IoBufMut for Box<T> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        (**self).stable_mut_ptr()
    }
}

impl std::fmt::Debug for dyn IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.bytes_len())
            .finish()
    }
}

impl std::fmt::Debug for dyn IoBufMut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBufMut")
            .field("len", &self.bytes_len())
            .finish()
    }
}

/// A boxed buffer back as its own type, or the box again if it holds
/// another type.
///
/// # Errors
/// The box itself, when it does not hold a `T`.
///
/// ```
/// use kxarray::aio::{downcast_buf, AlignedBuf, IoBufMut};
///
/// let b: Box<dyn IoBufMut> = Box::new(vec![1u8, 2, 3]);
/// let b = downcast_buf::<AlignedBuf>(b).unwrap_err(); // not an AlignedBuf
/// assert_eq!(*downcast_buf::<Vec<u8>>(b).unwrap(), vec![1, 2, 3]);
/// ```
pub fn downcast_buf<T: IoBufMut>(b: Box<dyn IoBufMut>) -> Result<Box<T>, Box<dyn IoBufMut>> {
    if (*b).type_id() == std::any::TypeId::of::<T>() {
        let any: Box<dyn Any> = b;
        Ok(any.downcast::<T>().expect("the type id matched"))
    } else {
        Err(b)
    }
}

/// An owned, zero-initialised buffer whose first byte is aligned to a power
/// of two (4096 by default): what `O_DIRECT` reads and writes need.
///
/// ```
/// use kxarray::aio::AlignedBuf;
///
/// let mut b = AlignedBuf::new(8192);
/// assert_eq!(b.len(), 8192);
/// assert_eq!(b.as_ptr() as usize % AlignedBuf::DEFAULT_ALIGN, 0);
/// b[0] = 7;
/// assert!(b[1..].iter().all(|&x| x == 0));
/// ```
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation outright (no sharing, no interior
// mutability), as a `Vec<u8>` does.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// The alignment [`new`](AlignedBuf::new) uses: a page, what `O_DIRECT`
    /// asks of buffers on every common device.
    pub const DEFAULT_ALIGN: usize = 4096;

    /// `len` zero bytes aligned to [`DEFAULT_ALIGN`](AlignedBuf::DEFAULT_ALIGN).
    ///
    /// # Panics
    /// When the allocation fails or `len` is too large for a layout (the
    /// global allocator's out-of-memory handler runs), as `vec![0; len]`.
    pub fn new(len: usize) -> AlignedBuf {
        AlignedBuf::with_alignment(len, Self::DEFAULT_ALIGN)
            .expect("the default alignment is a power of two")
    }

    /// `len` zero bytes aligned to `align`, or `None` when `align` is not a
    /// power of two or `len` rounded up to it overflows.
    ///
    /// ```
    /// use kxarray::aio::AlignedBuf;
    ///
    /// assert!(AlignedBuf::with_alignment(100, 512).is_some());
    /// assert!(AlignedBuf::with_alignment(100, 3).is_none());
    /// ```
    pub fn with_alignment(len: usize, align: usize) -> Option<AlignedBuf> {
        // A zero-sized layout may not be allocated: keep at least one byte.
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: the layout's size is at least 1.
        let p = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        Some(AlignedBuf { ptr, len, layout })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The alignment of its first byte.
    pub fn alignment(&self) -> usize {
        self.layout.align()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `with_alignment` with this very layout, and
        // freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` zeroed-then-owned bytes at `ptr`, live while `self` is.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.layout.align())
            .finish()
    }
}

// SAFETY: the bytes are the buffer's own heap allocation (not inside the
// struct), freed only by its `Drop`; `len` of them are initialised (zeroed).
unsafe impl IoBuf for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_len(&self) -> usize {
        self.len
    }
}

// SAFETY: as above; the allocation is exclusively the buffer's.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_zeroed_and_stable_across_moves() {
        for (len, align) in [(0, 4096), (1, 512), (4096, 4096), (10_000, 8192)] {
            let mut b = AlignedBuf::with_alignment(len, align).unwrap();
            assert_eq!(b.stable_ptr() as usize % align, 0);
            assert_eq!(b.bytes_len(), len);
            assert!(b.iter().all(|&x| x == 0));
            let p = b.stable_mut_ptr();
            let moved = Box::new(b);
            assert_eq!(moved.stable_ptr(), p.cast_const());
        }
        assert!(AlignedBuf::with_alignment(10, 0).is_none());
        assert!(AlignedBuf::with_alignment(usize::MAX, 4096).is_none());
    }

    #[test]
    fn boxes_forward_and_downcast() {
        let mut v = vec![3u8; 10];
        let p = v.stable_mut_ptr();
        let mut b: Box<dyn IoBufMut> = Box::new(v);
        assert_eq!(b.stable_mut_ptr(), p);
        b.as_mut_slice()[0] = 9;
        assert_eq!(b.as_slice()[..2], [9, 3]);
        let v = downcast_buf::<Vec<u8>>(b).unwrap();
        assert_eq!(v.len(), 10);
    }
}
