//! The transmission phase of one connection: requests in, replies out,
//! many in flight at once.
//!
//! Design (the leader/follower shape of nbdkit's parallel thread model,
//! with batching): a connection has a few worker threads sharing one
//! buffered reader and one writer. A worker takes the reader lock, waits
//! for one request, then also takes the requests already sitting in the
//! read buffer (up to `MAX_BATCH`; it never waits for one the client may
//! not have sent), lets go, executes them against the backend, and writes
//! all their replies with one `write` under the writer lock. While it
//! executes, the next worker reads the next requests, so requests run
//! concurrently and replies go out in completion order; no request is
//! handed from thread to thread, and a pipelined client (fio at iodepth 64)
//! costs one `read` and one `write` per batch rather than per request.
//! With one worker (the server's choice for in-memory backends, see
//! [`workers_for`](crate::server::workers_for)) the same loop runs on one
//! thread: it never waits on the locks, and the requests that arrive while
//! it executes a batch make up the next one.
//!
//! Invariants:
//! - the server never reads more than a request declares: a `WRITE` whose
//!   length is above [`MAX_PAYLOAD`] has its payload skipped in bounded
//!   pieces and gets `NBD_EINVAL`; a request past the end of the export
//!   gets `NBD_EINVAL` (`NBD_ENOSPC` for writes) and the connection lives;
//! - a reply is sent only after its request's effect is in the backend
//!   (and durable, for `NBD_CMD_FLAG_FUA` and `NBD_CMD_FLUSH`), so
//!   whatever was acknowledged survives the client leaving mid-request;
//! - a bad request magic or an I/O error on the socket ends this
//!   connection only: the first worker to see it marks the connection
//!   closing and shuts the socket down, the others finish what they hold.

use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tracing::{debug, warn};

use crate::export::Export;
use crate::proto::{
    command_name, encode_error_chunk, encode_offset_data_prefix, ChunkHeader, Request, SimpleReply,
    MAX_PAYLOAD, NBD_CMD_DISC, NBD_CMD_FLAG_FUA, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_FLUSH, NBD_CMD_READ,
    NBD_CMD_TRIM, NBD_CMD_WRITE, NBD_CMD_WRITE_ZEROES, NBD_EINVAL, NBD_EIO, NBD_ENOMEM, NBD_ENOSPC,
    NBD_EPERM, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, OFFSET_DATA_PREFIX_LEN, REQUEST_LEN,
    SIMPLE_REPLY_LEN,
};
use crate::socket::Socket;

/// Bytes of the shared read buffer (many pipelined request headers per
/// `read` system call).
const READ_BUFFER: usize = 256 * 1024;

/// Most requests one worker takes from the read buffer at once.
const MAX_BATCH: usize = 16;
/// Most write payload bytes one batch holds beyond its first request.
const MAX_BATCH_PAYLOAD: usize = 1 << 20;

/// One connection in the transmission phase.
#[derive(Debug)]
pub struct Transmission<'a> {
    reader: Mutex<BufReader<Socket>>,
    writer: Mutex<Socket>,
    /// A third handle, to shut the socket down without taking a lock.
    control: Socket,
    export: &'a Export,
    structured: bool,
    closing: AtomicBool,
}

/// A request taken from the stream.
#[derive(Debug, Clone)]
enum Taken {
    /// A request to execute; a `WRITE`'s payload is `payload` of the batch.
    Request(Request, Range<usize>),
    /// A `WRITE` too long to hold, its payload skipped: refuse it.
    Oversized(Request),
}

/// A worker's buffers, reused from batch to batch.
#[derive(Debug, Default)]
struct Batch {
    taken: Vec<Taken>,
    /// The payloads of the batch's `WRITE`s, back to back.
    payload: Vec<u8>,
    /// The replies, back to back, sent with one `write`.
    out: Vec<u8>,
}

impl<'a> Transmission<'a> {
    /// Wrap a negotiated connection.
    ///
    /// # Errors
    /// As `dup(2)` (the socket is cloned into a reading and a writing half).
    pub fn new(socket: Socket, export: &'a Export, structured: bool) -> io::Result<Self> {
        let writer = socket.try_clone()?;
        let control = socket.try_clone()?;
        Ok(Self {
            reader: Mutex::new(BufReader::with_capacity(READ_BUFFER, socket)),
            writer: Mutex::new(writer),
            control,
            export,
            structured,
            closing: AtomicBool::new(false),
        })
    }

    /// Serve requests with `workers` threads until the client disconnects
    /// or the socket fails; returns once every request read has been
    /// answered (or its reply could not be sent).
    pub fn serve(&self, workers: usize) {
        std::thread::scope(|s| {
            for _ in 0..workers.max(1) {
                s.spawn(|| self.worker());
            }
        });
    }

    fn worker(&self) {
        let mut batch = Batch::default();
        loop {
            let more = self.read_batch(&mut batch);
            batch.out.clear();
            for taken in &batch.taken {
                match taken {
                    Taken::Oversized(req) => {
                        self.error_reply(&mut batch.out, req, NBD_EINVAL, "payload above 32 MiB")
                    }
                    Taken::Request(req, range) => {
                        let payload = &batch.payload[range.clone()];
                        let out = &mut batch.out;
                        let start = out.len();
                        let run =
                            catch_unwind(AssertUnwindSafe(|| self.execute(req, payload, out)));
                        if run.is_err() {
                            warn!(command = command_name(req.command), "backend panicked");
                            batch.out.truncate(start);
                            self.error_reply(&mut batch.out, req, NBD_EIO, "internal error");
                        }
                    }
                }
            }
            if !batch.out.is_empty() {
                let sent = {
                    let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
                    (&*writer).write_all(&batch.out)
                };
                if let Err(e) = sent {
                    debug!(error = %e, "replies not sent; closing");
                    self.close();
                    return;
                }
            }
            if !more {
                return;
            }
        }
    }

    /// Take the next requests: wait for one, then take those already in
    /// the read buffer (never waiting for a request the client may not
    /// have sent yet), up to [`MAX_BATCH`]. Returns `false` when no more
    /// requests will come (`NBD_CMD_DISC`, end of stream, an error).
    fn read_batch(&self, batch: &mut Batch) -> bool {
        batch.taken.clear();
        batch.payload.clear();
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.closing.load(Ordering::Acquire) {
                return false;
            }
            match self.read_one(&mut reader, &mut batch.payload) {
                Some(t) => batch.taken.push(t),
                None => return false,
            }
            if batch.taken.len() >= MAX_BATCH
                || batch.payload.len() >= MAX_BATCH_PAYLOAD
                || reader.buffer().len() < REQUEST_LEN
            {
                return true;
            }
        }
    }

    /// Read one request (and a `WRITE`'s payload, appended to `payload`).
    fn read_one(&self, reader: &mut BufReader<Socket>, payload: &mut Vec<u8>) -> Option<Taken> {
        let mut header = [0u8; REQUEST_LEN];
        if let Err(e) = reader.read_exact(&mut header) {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                debug!("client closed the connection");
            } else {
                debug!(error = %e, "reading a request failed");
            }
            self.close();
            return None;
        }
        let req = match Request::decode(&header) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "malformed request; closing the connection");
                self.close();
                return None;
            }
        };
        match req.command {
            NBD_CMD_DISC => {
                debug!("NBD_CMD_DISC");
                self.closing.store(true, Ordering::Release);
                None
            }
            NBD_CMD_WRITE if req.length > MAX_PAYLOAD => {
                let len = u64::from(req.length);
                match io::copy(&mut reader.take(len), &mut io::sink()) {
                    Ok(n) if n == len => Some(Taken::Oversized(req)),
                    _ => {
                        self.close();
                        None
                    }
                }
            }
            NBD_CMD_WRITE => {
                let start = payload.len();
                // At most 32 MiB, so the cast is lossless.
                let len = req.length as usize;
                payload.reserve(len);
                // `read_to_end` fills the spare capacity without zeroing it
                // first (as `resize` + `read_exact` would); `take` bounds it
                // to the declared length.
                let got = reader.take(u64::from(req.length)).read_to_end(payload);
                if got.map_or(true, |n| n != len) {
                    debug!("client left inside a WRITE payload");
                    self.close();
                    return None;
                }
                Some(Taken::Request(req, start..payload.len()))
            }
            _ => Some(Taken::Request(req, 0..0)),
        }
    }

    /// Mark the connection closing and wake every worker blocked on it.
    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        // Already shut down or the peer is gone: either way it is closed.
        let _ = self.control.shutdown(Shutdown::Both);
    }

    /// Execute `req` (a `WRITE`'s data is `payload`) and append its reply
    /// to `out`.
    fn execute(&self, req: &Request, payload: &[u8], out: &mut Vec<u8>) {
        const KNOWN_FLAGS: u16 = NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE;
        let backend = self.export.backend();
        let len = u64::from(req.length);
        let in_range = req
            .offset
            .checked_add(len)
            .is_some_and(|end| end <= self.export.size());
        let allowed = if req.command == NBD_CMD_WRITE_ZEROES {
            KNOWN_FLAGS
        } else {
            NBD_CMD_FLAG_FUA
        };
        if req.flags & !allowed != 0 {
            return self.error_reply(out, req, NBD_EINVAL, "unsupported command flags");
        }
        let writes = matches!(
            req.command,
            NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES | NBD_CMD_TRIM
        );
        if writes && self.export.read_only {
            return self.error_reply(out, req, NBD_EPERM, "read-only export");
        }
        let result = match req.command {
            NBD_CMD_READ => {
                if req.length > MAX_PAYLOAD {
                    return self.error_reply(out, req, NBD_EINVAL, "read above 32 MiB");
                }
                if !in_range {
                    return self.error_reply(
                        out,
                        req,
                        NBD_EINVAL,
                        "read past the end of the export",
                    );
                }
                return self.read(req, out);
            }
            NBD_CMD_WRITE => {
                if !in_range {
                    return self.error_reply(
                        out,
                        req,
                        NBD_ENOSPC,
                        "write past the end of the export",
                    );
                }
                backend.write_all_at(payload, req.offset)
            }
            NBD_CMD_WRITE_ZEROES => {
                if !in_range {
                    return self.error_reply(
                        out,
                        req,
                        NBD_ENOSPC,
                        "write past the end of the export",
                    );
                }
                if req.flags & NBD_CMD_FLAG_NO_HOLE != 0 {
                    write_zero_bytes(&**backend, req.offset, len)
                } else {
                    backend.write_zeroes(req.offset, len)
                }
            }
            NBD_CMD_TRIM => {
                if !in_range {
                    return self.error_reply(
                        out,
                        req,
                        NBD_EINVAL,
                        "trim past the end of the export",
                    );
                }
                backend.discard(req.offset, len)
            }
            NBD_CMD_FLUSH => backend.flush(),
            _ => return self.error_reply(out, req, NBD_EINVAL, "unknown command"),
        };
        let result = result.and_then(|()| {
            if req.flags & NBD_CMD_FLAG_FUA != 0 && req.command != NBD_CMD_FLUSH {
                backend.flush()
            } else {
                Ok(())
            }
        });
        match result {
            Ok(()) => self.ok_reply(out, req),
            Err(e) => {
                debug!(command = command_name(req.command), error = %e, "request failed");
                self.error_reply(out, req, errno(&e), &e.to_string())
            }
        }
    }

    /// Append a `READ`'s reply: the header, then the data read straight
    /// into `out` behind it.
    fn read(&self, req: &Request, out: &mut Vec<u8>) {
        let prefix = if self.structured {
            OFFSET_DATA_PREFIX_LEN
        } else {
            SIMPLE_REPLY_LEN
        };
        let len = req.length as usize;
        if len == 0 {
            // An OFFSET_DATA chunk must describe at least one byte.
            return self.ok_reply(out, req);
        }
        let start = out.len();
        out.resize(start + prefix + len, 0);
        if let Err(e) = self
            .export
            .backend()
            .read_exact_at(&mut out[start + prefix..], req.offset)
        {
            debug!(error = %e, "read failed");
            out.truncate(start);
            return self.error_reply(out, req, errno(&e), &e.to_string());
        }
        if self.structured {
            encode_offset_data_prefix(&mut out[start..], req.cookie, req.offset, req.length, true);
        } else {
            SimpleReply {
                error: 0,
                cookie: req.cookie,
            }
            .encode_into(&mut out[start..]);
        }
    }

    fn ok_reply(&self, out: &mut Vec<u8>, req: &Request) {
        if self.structured && req.command == NBD_CMD_READ {
            let h = ChunkHeader {
                flags: NBD_REPLY_FLAG_DONE,
                chunk_type: NBD_REPLY_TYPE_NONE,
                cookie: req.cookie,
                length: 0,
            };
            return out.extend_from_slice(&h.encode());
        }
        // A simple reply is allowed for every command but READ, even with
        // structured replies negotiated.
        out.extend_from_slice(
            &SimpleReply {
                error: 0,
                cookie: req.cookie,
            }
            .encode(),
        );
    }

    fn error_reply(&self, out: &mut Vec<u8>, req: &Request, error: u32, message: &str) {
        debug!(
            command = command_name(req.command),
            error, message, "error reply"
        );
        if self.structured {
            out.extend_from_slice(&encode_error_chunk(req.cookie, error, message));
        } else {
            out.extend_from_slice(
                &SimpleReply {
                    error,
                    cookie: req.cookie,
                }
                .encode(),
            );
        }
    }
}

/// Zeros written as data (`NBD_CMD_FLAG_NO_HOLE`: the range must end up
/// allocated, not punched out).
fn write_zero_bytes(
    backend: &dyn kxarray::backend::Backend,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let zeros = vec![0u8; 64 * 1024];
    let mut at = 0;
    while at < len {
        // Bounded by 64 KiB, so the cast is lossless.
        let n = (len - at).min(zeros.len() as u64) as usize;
        backend.write_all_at(&zeros[..n], offset + at)?;
        at += n as u64;
    }
    Ok(())
}

/// The NBD error value for a backend error.
pub fn errno(e: &io::Error) -> u32 {
    match e.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof => NBD_EINVAL,
        io::ErrorKind::StorageFull | io::ErrorKind::WriteZero | io::ErrorKind::FileTooLarge => {
            NBD_ENOSPC
        }
        io::ErrorKind::OutOfMemory => NBD_ENOMEM,
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => NBD_EPERM,
        _ => NBD_EIO,
    }
}
