//! What the I/O benchmarks (`aio_bench`, `readahead_bench`,
//! `writeback_bench`) share: size arguments, the test file they read, a
//! random sequence, and dropping a file from the kernel's page cache.
//! Included by each with `#[path = "support/bench_file.rs"] mod bench_file;`
//! (not an example of its own: cargo builds only `examples/*.rs` and
//! `examples/*/main.rs`).
#![allow(dead_code)] // each benchmark uses a part

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Bytes from `N`, `Nk`, `Nm` or `Ng` (powers of 1024).
///
/// # Panics
/// When the number does not parse (a benchmark's argument).
pub(crate) fn parse_size(s: &str) -> u64 {
    let s = s.trim().to_ascii_lowercase();
    let (n, mul) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    n.parse::<u64>().expect("a size") * mul
}

/// One step of xorshift64.
pub(crate) fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Make `path` at least `size` bytes of pseudo-random data, synced (kept
/// as it is when it is already that long).
///
/// # Panics
/// On any I/O error.
pub(crate) fn make_file(path: &Path, size: u64) {
    if std::fs::metadata(path)
        .map(|m| m.len() >= size)
        .unwrap_or(false)
    {
        return;
    }
    eprintln!("writing {} ({} MiB)...", path.display(), size >> 20);
    let mut f = File::create(path).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for c in chunk.chunks_mut(8) {
        x = xorshift(x);
        c.copy_from_slice(&x.to_le_bytes());
    }
    for _ in 0..size >> 20 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

/// Drop `path` from the kernel's page cache (`posix_fadvise(DONTNEED)`).
///
/// # Panics
/// When the file cannot be opened or the call fails.
pub(crate) fn drop_kernel_cache(path: &Path) {
    let f = File::open(path).unwrap();
    // SAFETY: a plain system call on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
}
