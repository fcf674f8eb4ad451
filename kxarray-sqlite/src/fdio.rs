//! Reads straight from a descriptor ([`pread_full`]), below the cache: a
//! journal's or WAL's bytes in shared locking mode (other processes write
//! them too; the unix VFS reads them the same way), a checkpoint's
//! read-once of WAL frames, and the database header a coherence check
//! compares. Invariant: a short count means the file ended, never an
//! interrupted read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Read `buf.len()` bytes at `off` of `fd` with `pread`, retrying short
/// reads and `EINTR`; fewer only at the file's end. The bytes read.
///
/// # Errors
/// `pread`'s error.
pub(crate) fn pread_full(fd: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match fd.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
