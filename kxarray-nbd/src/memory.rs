//! Giving memory back to the system: glibc's allocator settings for a
//! server whose buffers come and go with its connections.
//!
//! Owns two process-wide calls. [`tune_allocator`] fixes glibc's mmap
//! threshold at 128 KiB (glibc otherwise raises it to the size of the
//! largest block freed, up to 32 MiB, after which read buffers and `WRITE`
//! payloads come from the heap, where their pages stay resident after they
//! are freed); with it, every buffer of 128 KiB or more is its own
//! mapping, resident only where written and unmapped when freed.
//! [`release_free_memory`] returns the free pages inside the heaps
//! (`malloc_trim`), which the server calls when many connections have
//! closed. Invariant: both only change how much freed memory is kept, never
//! what is allocated; elsewhere than glibc they do nothing.

/// The mmap threshold [`tune_allocator`] sets.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fix the allocator's mmap threshold (see the module docs). Call once,
/// at the start of a server process.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // 128 KiB fits an i32, so the cast is lossless.
        // SAFETY: mallopt only changes the allocator's parameters; it is
        // safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        }
    }
}

/// Return the free pages of every heap to the system.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds
        // free; it is safe to call at any time, from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
