//! Byte-wise atomic memory copies: C++'s `atomic_load_per_byte_memcpy` and
//! `atomic_store_per_byte_memcpy` (proposal P1478), the primitive a
//! sequence lock over a byte buffer needs.
//!
//! Owns the only code that reads or writes bytes another thread may be
//! writing at the same moment: a folio's bytes, which an optimistic reader
//! copies while a writer may be changing them in place (the reader then
//! sees the version move and throws its copy away).
//!
//! The rule that makes this sound: every byte is accessed as a relaxed
//! atomic byte load or store, never as a plain access, by every party that
//! may race. A race between atomic accesses is not a data race, so a torn
//! copy is only a wrong value, which the caller detects and discards.
//! On x86-64 the copies are one `rep movsb` or `rep stosb` (fast on every
//! CPU with ERMS or FSRM, as fast as `memcpy` for page-sized copies); an
//! inline-assembly block may do whatever Rust code could do, and a string
//! instruction moving bytes is exactly a sequence of relaxed byte loads and
//! stores. Elsewhere (and under Miri, which does not run assembly) each byte
//! goes through [`AtomicU8`](core::sync::atomic::AtomicU8) (slower, same
//! semantics).
//!
//! Invariant: callers never mix these with plain (non-atomic) writes to a
//! buffer another thread may read through [`load`]. Plain *reads* of such a
//! buffer are fine (reads do not race with reads), and so are plain writes
//! into memory no other thread can reach yet (a buffer before it is
//! published with a release store).

/// Copy `dst.len()` bytes starting at `src` into `dst`, each byte read as a
/// relaxed atomic load.
///
/// # Safety
/// - `src..src + dst.len()` must be valid for reads for the whole call
///   (allocated and not freed meanwhile);
/// - every write to those bytes that may run concurrently must be made
///   through [`store`] or [`fill`] (never a plain write).
#[inline]
pub(crate) unsafe fn load(dst: &mut [u8], src: *const u8) {
    debug_assert!(!src.is_null() || dst.is_empty());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `rep movsb` reads `dst.len()` bytes from `src` (valid for
    // reads by the caller's contract) and writes them to `dst` (a unique
    // borrow, so nothing else accesses it); with the direction flag clear
    // (the ABI guarantees it on entry to Rust code) it moves forwards.
    // Racing writers use `store`/`fill`, so the concurrent accesses are
    // byte-wise atomic on both sides.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") dst.len() => _,
            inout("rdi") dst.as_mut_ptr() => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    for (i, d) in dst.iter_mut().enumerate() {
        // SAFETY: byte `i` of the source is valid for reads (the caller's
        // contract) and `AtomicU8` has the alignment and size of `u8`.
        let a = unsafe { core::sync::atomic::AtomicU8::from_ptr(src.add(i).cast_mut()) };
        *d = a.load(core::sync::atomic::Ordering::Relaxed);
    }
}

/// Copy `src` to `dst..dst + src.len()`, each byte written as a relaxed
/// atomic store.
///
/// # Safety
/// - `dst..dst + src.len()` must be valid for writes for the whole call and
///   must not overlap `src`;
/// - every access to those bytes that may run concurrently must be a read
///   through [`load`] (no plain read or write, no other writer: writers
///   serialize on a lock of their own).
#[inline]
pub(crate) unsafe fn store(dst: *mut u8, src: &[u8]) {
    debug_assert!(!dst.is_null() || src.is_empty());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `rep movsb` writes `src.len()` bytes at `dst` (valid for
    // writes by the caller's contract) from `src` (a shared borrow that
    // does not overlap); concurrent readers use `load`, so every racing
    // access is byte-wise atomic.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") src.len() => _,
            inout("rdi") dst => _,
            inout("rsi") src.as_ptr() => _,
            options(nostack, preserves_flags),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    for (i, &s) in src.iter().enumerate() {
        // SAFETY: byte `i` of the destination is valid for writes (the
        // caller's contract); `AtomicU8` has the layout of `u8`.
        let a = unsafe { core::sync::atomic::AtomicU8::from_ptr(dst.add(i)) };
        a.store(s, core::sync::atomic::Ordering::Relaxed);
    }
}

/// Set `len` bytes at `dst` to `byte`, each written as a relaxed atomic
/// store.
///
/// # Safety
/// As [`store`]: `dst..dst + len` valid for writes for the whole call, and
/// concurrent accesses to it only reads through [`load`].
#[inline]
pub(crate) unsafe fn fill(dst: *mut u8, len: usize, byte: u8) {
    debug_assert!(!dst.is_null() || len == 0);
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `rep stosb` writes `len` bytes of `al` at `dst`, valid for
    // writes by the caller's contract; racing readers use `load`.
    unsafe {
        core::arch::asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") byte,
            options(nostack, preserves_flags),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    for i in 0..len {
        // SAFETY: byte `i` at `dst` is valid for writes (the caller's
        // contract); `AtomicU8` has the layout of `u8`.
        let a = unsafe { core::sync::atomic::AtomicU8::from_ptr(dst.add(i)) };
        a.store(byte, core::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_fills_every_length_and_offset() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0usize, 1, 7, 8, 63, 64, 65, 255] {
            for off in [0usize, 1, 13] {
                let mut dst = vec![0xAAu8; len];
                // SAFETY: `src[off..off + len]` is in bounds and nothing
                // else accesses it.
                unsafe { load(&mut dst, src.as_ptr().wrapping_add(off)) };
                assert_eq!(dst, &src[off..off + len], "load {len}@{off}");
                let mut buf = vec![0u8; len + 2 * off];
                // SAFETY: `buf[off..off + len]` is in bounds, owned here.
                unsafe { store(buf.as_mut_ptr().wrapping_add(off), &src[..len]) };
                assert_eq!(&buf[off..off + len], &src[..len], "store {len}@{off}");
                assert!(buf[..off].iter().chain(&buf[off + len..]).all(|&b| b == 0));
                // SAFETY: as above.
                unsafe { fill(buf.as_mut_ptr().wrapping_add(off), len, 0x5C) };
                assert!(buf[off..off + len].iter().all(|&b| b == 0x5C), "fill");
                assert!(buf[..off].iter().chain(&buf[off + len..]).all(|&b| b == 0));
            }
        }
    }
}
