//! The transmission phase of one connection: requests in, replies out,
//! many in flight at once.
//!
//! Design (the leader/follower shape nbdkit's parallel thread model uses):
//! a connection has a few worker threads sharing one buffered reader and
//! one writer. A worker takes the reader lock, reads one request header
//! and its payload, lets go, executes the request against the backend,
//! then takes the writer lock and writes the whole reply with one
//! `write`. While it executes, the next worker reads the next request, so
//! requests run concurrently and replies go out in completion order; no
//! request is handed from thread to thread.
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

/// What the reader found.
enum Next {
    /// A request to execute; a `WRITE`'s payload is in the worker's buffer.
    Request(Request),
    /// A `WRITE` too long to hold, its payload skipped: refuse it.
    Oversized(Request),
    /// No more requests (`NBD_CMD_DISC`, end of stream, or an error).
    Stop,
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
        // Reused across requests: reply header room, then the data.
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let next = self.read_next(&mut buf);
            let reply = match next {
                Next::Stop => return,
                Next::Oversized(req) => self.error_reply(&req, NBD_EINVAL, "payload above 32 MiB"),
                Next::Request(req) => {
                    match catch_unwind(AssertUnwindSafe(|| self.execute(&req, &mut buf))) {
                        Ok(r) => r,
                        Err(_) => {
                            warn!(command = command_name(req.command), "backend panicked");
                            self.error_reply(&req, NBD_EIO, "internal error")
                        }
                    }
                }
            };
            let bytes: &[u8] = match &reply {
                Reply::InBuf => &buf,
                Reply::Owned(v) => v,
            };
            let sent = {
                let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
                (&*writer).write_all(bytes)
            };
            if let Err(e) = sent {
                debug!(error = %e, "reply not sent; closing");
                self.close();
                return;
            }
        }
    }

    /// Read the next request (and a `WRITE`'s payload into `buf`).
    fn read_next(&self, buf: &mut Vec<u8>) -> Next {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if self.closing.load(Ordering::Acquire) {
            return Next::Stop;
        }
        let mut header = [0u8; REQUEST_LEN];
        if let Err(e) = reader.read_exact(&mut header) {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                debug!("client closed the connection");
            } else {
                debug!(error = %e, "reading a request failed");
            }
            self.close();
            return Next::Stop;
        }
        let req = match Request::decode(&header) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "malformed request; closing the connection");
                self.close();
                return Next::Stop;
            }
        };
        match req.command {
            NBD_CMD_DISC => {
                debug!("NBD_CMD_DISC");
                self.closing.store(true, Ordering::Release);
                Next::Stop
            }
            NBD_CMD_WRITE if req.length > MAX_PAYLOAD => {
                let len = u64::from(req.length);
                match io::copy(&mut (&mut *reader).take(len), &mut io::sink()) {
                    Ok(n) if n == len => Next::Oversized(req),
                    _ => {
                        self.close();
                        Next::Stop
                    }
                }
            }
            NBD_CMD_WRITE => {
                // At most 32 MiB, so the cast is lossless.
                buf.resize(req.length as usize, 0);
                if let Err(e) = reader.read_exact(buf) {
                    debug!(error = %e, "client left inside a WRITE payload");
                    self.close();
                    return Next::Stop;
                }
                Next::Request(req)
            }
            _ => Next::Request(req),
        }
    }

    /// Mark the connection closing and wake every worker blocked on it.
    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        // Already shut down or the peer is gone: either way it is closed.
        let _ = self.control.shutdown(Shutdown::Both);
    }

    /// Execute `req`; a `WRITE`'s payload is in `buf`, and a `READ`'s reply
    /// is built in `buf`.
    fn execute(&self, req: &Request, buf: &mut Vec<u8>) -> Reply {
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
            return self.error_reply(req, NBD_EINVAL, "unsupported command flags");
        }
        let writes = matches!(
            req.command,
            NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES | NBD_CMD_TRIM
        );
        if writes && self.export.read_only {
            return self.error_reply(req, NBD_EPERM, "read-only export");
        }
        let result = match req.command {
            NBD_CMD_READ => {
                if req.length > MAX_PAYLOAD {
                    return self.error_reply(req, NBD_EINVAL, "read above 32 MiB");
                }
                if !in_range {
                    return self.error_reply(req, NBD_EINVAL, "read past the end of the export");
                }
                return self.read(req, buf);
            }
            NBD_CMD_WRITE => {
                if !in_range {
                    return self.error_reply(req, NBD_ENOSPC, "write past the end of the export");
                }
                backend.write_all_at(buf, req.offset)
            }
            NBD_CMD_WRITE_ZEROES => {
                if !in_range {
                    return self.error_reply(req, NBD_ENOSPC, "write past the end of the export");
                }
                if req.flags & NBD_CMD_FLAG_NO_HOLE != 0 {
                    write_zero_bytes(&**backend, req.offset, len)
                } else {
                    backend.write_zeroes(req.offset, len)
                }
            }
            NBD_CMD_TRIM => {
                if !in_range {
                    return self.error_reply(req, NBD_EINVAL, "trim past the end of the export");
                }
                backend.discard(req.offset, len)
            }
            NBD_CMD_FLUSH => backend.flush(),
            _ => return self.error_reply(req, NBD_EINVAL, "unknown command"),
        };
        let result = result.and_then(|()| {
            if req.flags & NBD_CMD_FLAG_FUA != 0 && req.command != NBD_CMD_FLUSH {
                backend.flush()
            } else {
                Ok(())
            }
        });
        match result {
            Ok(()) => self.ok_reply(req),
            Err(e) => {
                debug!(command = command_name(req.command), error = %e, "request failed");
                self.error_reply(req, errno(&e), &e.to_string())
            }
        }
    }

    /// Read into `buf` behind room for the reply header, and encode it.
    fn read(&self, req: &Request, buf: &mut Vec<u8>) -> Reply {
        let prefix = if self.structured {
            OFFSET_DATA_PREFIX_LEN
        } else {
            SIMPLE_REPLY_LEN
        };
        let len = req.length as usize;
        if len == 0 {
            // An OFFSET_DATA chunk must describe at least one byte.
            return self.ok_reply(req);
        }
        buf.resize(prefix + len, 0);
        if let Err(e) = self
            .export
            .backend()
            .read_exact_at(&mut buf[prefix..], req.offset)
        {
            debug!(error = %e, "read failed");
            return self.error_reply(req, errno(&e), &e.to_string());
        }
        if self.structured {
            encode_offset_data_prefix(buf, req.cookie, req.offset, req.length, true);
        } else {
            SimpleReply {
                error: 0,
                cookie: req.cookie,
            }
            .encode_into(buf);
        }
        Reply::InBuf
    }

    fn ok_reply(&self, req: &Request) -> Reply {
        if self.structured && req.command == NBD_CMD_READ {
            let h = ChunkHeader {
                flags: NBD_REPLY_FLAG_DONE,
                chunk_type: NBD_REPLY_TYPE_NONE,
                cookie: req.cookie,
                length: 0,
            };
            return Reply::Owned(h.encode().to_vec());
        }
        // A simple reply is allowed for every command but READ, even with
        // structured replies negotiated.
        Reply::Owned(
            SimpleReply {
                error: 0,
                cookie: req.cookie,
            }
            .encode()
            .to_vec(),
        )
    }

    fn error_reply(&self, req: &Request, error: u32, message: &str) -> Reply {
        debug!(
            command = command_name(req.command),
            error, message, "error reply"
        );
        if self.structured {
            Reply::Owned(encode_error_chunk(req.cookie, error, message))
        } else {
            Reply::Owned(
                SimpleReply {
                    error,
                    cookie: req.cookie,
                }
                .encode()
                .to_vec(),
            )
        }
    }
}

/// A reply: in the worker's buffer, or its own bytes.
enum Reply {
    InBuf,
    Owned(Vec<u8>),
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
