//! One request in flight: what it asks of the kernel ([`Sqe`]), how a pool
//! thread performs it ([`Op::run_sync`]), and how it hands its buffer back
//! ([`Op::finish`]).
//!
//! Owns the in-flight record. Invariants:
//! - an op owns its buffer, its slot and a reference to its file from
//!   submission until `finish` (or its drop, should an engine be torn down
//!   with the op never submitted): the bytes the kernel writes, and the
//!   descriptor it writes through, stay valid and unmoved until the
//!   completion is reaped;
//! - the [`Sqe`] an op describes points into its own buffer, whose address
//!   the [`IoBuf`] contract keeps stable while the op (and so the buffer)
//!   is moved around;
//! - lengths are capped at [`MAX_RW`] (Linux's `MAX_RW_COUNT`: a larger
//!   read or write is short anyway), offsets are at most `i64::MAX` or
//!   [`CURRENT_POSITION`].

use super::buf::{AlignedBuf, IoBuf, IoBufMut};
use super::completion::Slot;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::Arc;

/// The offset that means "at the file's own position, advancing it", as
/// `read(2)` and `write(2)` do (io_uring's `-1`): for pipes, sockets and
/// other streams. Any other offset is positional (`pread`/`pwrite`).
pub const CURRENT_POSITION: u64 = u64::MAX;

/// The largest transfer one request makes: Linux's `MAX_RW_COUNT`
/// (`INT_MAX` rounded down to a page); a larger buffer gets a short count.
pub const MAX_RW: usize = 0x7fff_f000;

/// A request as the kernel sees it.
pub(crate) struct Sqe {
    pub(crate) fd: RawFd,
    pub(crate) write: bool,
    pub(crate) ptr: *mut u8,
    pub(crate) len: u32,
    pub(crate) offset: u64,
}

/// A request the engine holds while it is in flight.
pub(crate) trait Op: Send {
    /// What to submit. Called once, just before submission, on the op at
    /// its final address.
    fn sqe(&mut self) -> Sqe;
    /// The file it reads or writes.
    fn file(&self) -> &std::fs::File;
    /// Perform the request on the calling thread (a pool worker, or a
    /// submitter over its ring's in-flight limit).
    fn run_sync(&mut self) -> io::Result<usize>;
    /// Hand the outcome and the buffer to the waiter.
    fn finish(self: Box<Self>, res: io::Result<usize>);
}

/// Run `op.finish(res)`, keeping a panicking waker or buffer destructor
/// from unwinding into the engine's thread.
pub(crate) fn finish_guarded(op: Box<dyn Op>, res: io::Result<usize>) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op.finish(res)));
    if r.is_err() {
        log::error!("kxarray: a completion's waker or buffer destructor panicked; ignored");
    }
}

/// Refuse offsets a file cannot have (past `i64::MAX`, other than
/// [`CURRENT_POSITION`]) before anything is submitted.
pub(crate) fn check_offset(offset: u64) -> io::Result<()> {
    if offset <= i64::MAX as u64 || offset == CURRENT_POSITION {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "offset {offset} is past the largest file offset, {}",
                i64::MAX
            ),
        ))
    }
}

fn capped(len: usize) -> usize {
    len.min(MAX_RW)
}

fn read_file(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let n = capped(buf.len());
    let buf = &mut buf[..n];
    if offset == CURRENT_POSITION {
        (&*file).read(buf)
    } else {
        file.read_at(buf, offset)
    }
}

fn write_file(file: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
    let buf = &buf[..capped(buf.len())];
    if offset == CURRENT_POSITION {
        (&*file).write(buf)
    } else {
        file.write_at(buf, offset)
    }
}

/// A read into the caller's buffer.
pub(crate) struct ReadOp<B> {
    pub(crate) file: Arc<File>,
    pub(crate) offset: u64,
    pub(crate) buf: B,
    pub(crate) slot: Arc<Slot<B>>,
}

impl<B: IoBufMut> Op for ReadOp<B> {
    fn file(&self) -> &std::fs::File {
        &self.file
    }
    fn sqe(&mut self) -> Sqe {
        Sqe {
            fd: self.file.as_raw_fd(),
            write: false,
            len: capped(self.buf.bytes_len()) as u32,
            ptr: self.buf.stable_mut_ptr(),
            offset: self.offset,
        }
    }
    fn run_sync(&mut self) -> io::Result<usize> {
        read_file(&self.file, self.buf.as_mut_slice(), self.offset)
    }
    fn finish(self: Box<Self>, res: io::Result<usize>) {
        let this = *self;
        this.slot.complete(res, this.buf);
    }
}

/// A write from the caller's buffer.
pub(crate) struct WriteOp<B> {
    pub(crate) file: Arc<File>,
    pub(crate) offset: u64,
    pub(crate) buf: B,
    pub(crate) slot: Arc<Slot<B>>,
}

impl<B: IoBuf> Op for WriteOp<B> {
    fn file(&self) -> &std::fs::File {
        &self.file
    }
    fn sqe(&mut self) -> Sqe {
        Sqe {
            fd: self.file.as_raw_fd(),
            write: true,
            len: capped(self.buf.bytes_len()) as u32,
            // The kernel only reads through a write's pointer.
            ptr: self.buf.stable_ptr().cast_mut(),
            offset: self.offset,
        }
    }
    fn run_sync(&mut self) -> io::Result<usize> {
        write_file(&self.file, self.buf.as_slice(), self.offset)
    }
    fn finish(self: Box<Self>, res: io::Result<usize>) {
        let this = *self;
        this.slot.complete(res, this.buf);
    }
}

/// A read through an aligned bounce buffer, copied into the caller's
/// (misaligned) buffer on completion: how `O_DIRECT` reads a buffer that
/// is not aligned.
pub(crate) struct BounceReadOp<B> {
    pub(crate) file: Arc<File>,
    pub(crate) offset: u64,
    pub(crate) bounce: AlignedBuf,
    pub(crate) buf: B,
    pub(crate) slot: Arc<Slot<B>>,
}

impl<B: IoBufMut> Op for BounceReadOp<B> {
    fn file(&self) -> &std::fs::File {
        &self.file
    }
    fn sqe(&mut self) -> Sqe {
        Sqe {
            fd: self.file.as_raw_fd(),
            write: false,
            len: capped(self.bounce.bytes_len()) as u32,
            ptr: self.bounce.stable_mut_ptr(),
            offset: self.offset,
        }
    }
    fn run_sync(&mut self) -> io::Result<usize> {
        read_file(&self.file, &mut self.bounce, self.offset)
    }
    fn finish(self: Box<Self>, res: io::Result<usize>) {
        let mut this = *self;
        if let Ok(n) = res {
            let n = n.min(this.buf.bytes_len());
            this.buf.as_mut_slice()[..n].copy_from_slice(&this.bounce[..n]);
        }
        this.slot.complete(res, this.buf);
    }
}

/// A write through an aligned bounce buffer (filled from the caller's at
/// submission): how `O_DIRECT` writes a buffer that is not aligned. The
/// caller's buffer comes back untouched.
pub(crate) struct BounceWriteOp<B> {
    pub(crate) file: Arc<File>,
    pub(crate) offset: u64,
    pub(crate) bounce: AlignedBuf,
    pub(crate) buf: B,
    pub(crate) slot: Arc<Slot<B>>,
}

impl<B: IoBuf> Op for BounceWriteOp<B> {
    fn file(&self) -> &std::fs::File {
        &self.file
    }
    fn sqe(&mut self) -> Sqe {
        Sqe {
            fd: self.file.as_raw_fd(),
            write: true,
            len: capped(self.bounce.bytes_len()) as u32,
            ptr: self.bounce.stable_mut_ptr(),
            offset: self.offset,
        }
    }
    fn run_sync(&mut self) -> io::Result<usize> {
        write_file(&self.file, &self.bounce, self.offset)
    }
    fn finish(self: Box<Self>, res: io::Result<usize>) {
        let this = *self;
        this.slot.complete(res, this.buf);
    }
}
