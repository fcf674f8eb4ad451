//! Reads and writes straight on a descriptor ([`pread_full`],
//! [`pwrite_all`]), below the cache: a journal's or WAL's bytes in shared
//! locking mode (other processes read and write them too; the unix VFS
//! does the same), a checkpoint's read-once of WAL frames, and the
//! database header a coherence check compares. Invariant: a short read
//! means the file ended, never an interrupted read; a write writes every
//! byte or fails.
//!
//! On 64-bit Linux the system calls are made directly
//! (`syscall(SYS_pread64)`, `SYS_pwrite64`): glibc's `pread` and `pwrite`
//! are cancellation points, and in a process with threads (every process
//! using this VFS has some: the I/O engine's, the pressure monitor) they
//! switch the thread's cancellation type around the call, which costs as
//! much as the rest of a WAL frame's write in user space. Nothing here is
//! a cancellation point then; no Rust code cancels threads, and SQLite is
//! not cancellation-safe anyway.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `pread(fd, buf, off)`: the bytes read, or -1 with `errno` set.
fn pread(fd: &File, buf: &mut [u8], off: i64) -> libc::c_long {
    let (p, n, fd) = (buf.as_mut_ptr(), buf.len(), fd.as_raw_fd());
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    // SAFETY: the kernel writes at most `n` bytes at `p`, which `buf`
    // (borrowed mutably for the call) holds; a bad descriptor or offset is
    // an error, not undefined behaviour.
    let r = unsafe { libc::syscall(libc::SYS_pread64, fd, p, n, off) };
    #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
    // SAFETY: as above, through the C library.
    let r = unsafe { libc::pread(fd, p.cast(), n, off) } as libc::c_long;
    r
}

/// `pwrite(fd, buf, off)`: the bytes written, or -1 with `errno` set.
fn pwrite(fd: &File, buf: &[u8], off: i64) -> libc::c_long {
    let (p, n, fd) = (buf.as_ptr(), buf.len(), fd.as_raw_fd());
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    // SAFETY: the kernel reads at most `n` bytes at `p`, which `buf`
    // (borrowed for the call) holds; a bad descriptor or offset is an
    // error, not undefined behaviour.
    let r = unsafe { libc::syscall(libc::SYS_pwrite64, fd, p, n, off) };
    #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
    // SAFETY: as above, through the C library.
    let r = unsafe { libc::pwrite(fd, p.cast(), n, off) } as libc::c_long;
    r
}

/// The offset `off + done` as `pread`/`pwrite` take it.
fn offset(off: u64, done: usize) -> io::Result<i64> {
    off.checked_add(done as u64)
        .and_then(|o| i64::try_from(o).ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The most bytes one call asks for (as std: the kernel's limit, and
/// `isize::MAX`).
const MAX_IO: usize = 0x7fff_f000;

/// Read `buf.len()` bytes at `off` of `fd` with `pread`, retrying short
/// reads and `EINTR`; fewer only at the file's end. The bytes read.
///
/// # Errors
/// `pread`'s error (`EINVAL` for an offset past `i64::MAX`).
pub(crate) fn pread_full(fd: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let end = buf.len().min(got + MAX_IO);
        match pread(fd, &mut buf[got..end], offset(off, got)?) {
            0 => break,
            k if k > 0 => got += k as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(got)
}

/// Write all of `buf` at `off` of `fd` with `pwrite`, retrying short
/// writes and `EINTR`.
///
/// # Errors
/// `pwrite`'s error (`EINVAL` for an offset past `i64::MAX`; `WriteZero`
/// when a call writes nothing).
pub(crate) fn pwrite_all(fd: &File, buf: &[u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let end = buf.len().min(done + MAX_IO);
        match pwrite(fd, &buf[done..end], offset(off, done)?) {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            k if k > 0 => done += k as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn writes_and_reads_at_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        pwrite_all(&f, b"hello", 3).unwrap();
        pwrite_all(&f, &[7; 5000], 4096).unwrap();
        let mut b = [0xffu8; 8];
        assert_eq!(pread_full(&f, &mut b, 0).unwrap(), 8);
        assert_eq!(&b, b"\0\0\0hello");
        let mut tail = vec![0u8; 6000];
        // the file ends 904 bytes into the last 5000
        assert_eq!(pread_full(&f, &mut tail, 4096 + 4096).unwrap(), 904);
        assert!(tail[..904].iter().all(|&x| x == 7));
        let mut std_read = [0u8; 5];
        f.read_exact_at(&mut std_read, 3).unwrap();
        assert_eq!(&std_read, b"hello");
        // an offset the system calls cannot take is an error, not a wrap
        assert_eq!(
            pwrite_all(&f, b"x", u64::MAX).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        // a read-only descriptor: the write's error (EBADF)
        let ro = std::fs::File::open(dir.path().join("f")).unwrap();
        assert_eq!(
            pwrite_all(&ro, b"x", 0).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
    }
}
