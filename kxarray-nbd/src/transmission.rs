//! The transmission phase of one connection while it is served: requests
//! in, replies out, many in flight at once; and the state it keeps while
//! idle.
//!
//! Design (the leader/follower shape of nbdkit's parallel thread model,
//! with batching): a served connection has one or a few worker threads
//! sharing one read buffer and one writer. A worker takes the reader lock,
//! waits for one request, then also takes the requests already sitting in
//! the read buffer (up to [`MAX_BATCH`]; it never waits for one the client
//! may not have sent), lets go, executes them against the backend, and
//! sends all their replies with one `write` under the writer lock. The
//! consecutive `READ`s of a batch are served together by one batch read
//! ([`Export::read_many`]: the page cache's, or the file's submission side
//! on the I/O engine), so the client's queue depth reaches the device; a
//! write or any other request ends such a group, so requests keep their
//! order, and each read keeps its own reply and its own error. With
//! one worker (the server's choice for in-memory backends, see its
//! `workers_for`) the same loop runs on the calling thread alone: the requests that arrive while it executes a
//! batch make up the next one.
//!
//! When no request arrives for the socket's read timeout (the server's
//! `park_after`), [`serve`] returns [`End::Idle`]: the workers are gone,
//! the read buffer is freed, and the [`Session`] (TLS state, the bytes of
//! a request header begun) is all the connection keeps until the event
//! loop sees its next request.
//!
//! Invariants:
//! - memory: a worker holds at most one batch's `WRITE` payloads (below
//!   [`MAX_BATCH_PAYLOAD`] plus one request's [`MAX_PAYLOAD`]; the buffer
//!   shrinks back after a large batch) and [`REPLY_BUFFER`] bytes of
//!   replies: a longer `READ` is read and sent in pieces, so unread
//!   replies cost the client its socket buffer, not the server memory
//!   (see [`connection_budget`](crate::config::connection_budget));
//! - the server never reads more than a request declares; a `WRITE`
//!   announcing more than [`MAX_PAYLOAD`] (the advertised maximum) gets
//!   `NBD_EINVAL` and the connection is closed at once, its payload
//!   unread; a `READ` above it gets `NBD_EINVAL` and the connection
//!   lives; a request past the end of the export gets `NBD_EINVAL`
//!   (`NBD_ENOSPC` for writes) and the connection lives;
//! - a reply is sent only after its request's effect is in the backend
//!   (and durable, for `NBD_CMD_FLAG_FUA` and `NBD_CMD_FLUSH`), so
//!   whatever was acknowledged survives the client leaving mid-request;
//! - a bad request magic or an I/O error on the socket ends this
//!   connection only: the first worker to see it marks the connection
//!   closing and shuts the socket down, the others finish what they hold.

use std::io;
use std::net::Shutdown;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use rustls::ServerConnection;
use tracing::{debug, warn};

use crate::channel::{Channel, ReadSide};
use crate::config::{MAX_BATCH, MAX_BATCH_PAYLOAD, READ_BUFFER, REPLY_BUFFER};
use crate::export::Export;
use crate::proto::{
    command_name, encode_error_chunk, encode_offset_data_prefix, ChunkHeader, Request, SimpleReply,
    MAX_PAYLOAD, NBD_CMD_DISC, NBD_CMD_FLAG_FUA, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_FLUSH, NBD_CMD_READ,
    NBD_CMD_TRIM, NBD_CMD_WRITE, NBD_CMD_WRITE_ZEROES, NBD_EINVAL, NBD_EIO, NBD_ENOMEM, NBD_ENOSPC,
    NBD_EPERM, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, OFFSET_DATA_PREFIX_LEN, REQUEST_LEN,
    SIMPLE_REPLY_LEN,
};
use crate::socket::Socket;

/// What a connection in the transmission phase keeps between the times it
/// is served.
#[derive(Debug, Default)]
pub struct Session {
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The TLS session, when the client upgraded.
    pub(crate) tls: Option<Box<ServerConnection>>,
    /// The start of a request header received before the client went
    /// quiet (fewer than [`REQUEST_LEN`] bytes).
    pub(crate) leftover: Vec<u8>,
}

impl Session {
    /// Whether decrypted bytes wait in the TLS session (a request may then
    /// be pending although the socket is quiet).
    pub(crate) fn has_plaintext(&mut self) -> bool {
        self.tls.as_mut().is_some_and(|s| {
            s.process_new_packets()
                .is_ok_and(|st| st.plaintext_bytes_to_read() > 0)
        })
    }
}

/// How a served connection stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// No request for the read timeout: hand the connection back to the
    /// event loop.
    Idle,
    /// The client left, disconnected, broke the protocol, or the socket
    /// failed: close it.
    Closed,
}

/// Serve `session` on `socket` with `workers` threads (the calling one and
/// `workers - 1` more) until the client goes quiet for the socket's read
/// timeout or the connection ends. Returns once every request read has
/// been answered (or its reply could not be sent).
pub fn serve(socket: &Socket, session: &mut Session, export: &Export, workers: usize) -> End {
    let t = Transmission::new(socket, session, export);
    std::thread::scope(|s| {
        for _ in 1..workers.max(1) {
            s.spawn(|| t.worker());
        }
        t.worker();
    });
    t.finish(session)
}

/// A connection being served.
#[derive(Debug)]
pub(crate) struct Transmission<'a> {
    pub(crate) socket: &'a Socket,
    pub(crate) channel: Channel<'a>,
    pub(crate) reader: Mutex<Reader>,
    /// The writer lock; its buffer receives a TLS channel's ciphertext.
    writer: Mutex<Vec<u8>>,
    pub(crate) export: &'a Export,
    pub(crate) structured: bool,
    /// No more requests are read (the client disconnected, or the
    /// connection is being closed).
    pub(crate) closing: AtomicBool,
    /// The client went quiet: the workers stop, the connection is parked.
    pub(crate) idle: AtomicBool,
}

/// The reader's buffers: decrypted bytes not yet taken as requests.
#[derive(Debug)]
pub(crate) struct Reader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    side: ReadSide,
}

impl Reader {
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }
    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
}

/// A request taken from the stream.
#[derive(Debug, Clone)]
pub(crate) enum Taken {
    /// A request to execute; a `WRITE`'s payload is `payload` of the batch.
    Request(Request, Range<usize>),
    /// A `WRITE` longer than the maximum payload: refuse it, then close.
    Oversized(Request),
}

/// What the reader found next.
pub(crate) enum Next {
    Request(Taken),
    /// No whole request buffered, and the batch already holds some.
    Wait,
    /// The client was quiet for the read timeout.
    Idle,
    /// No more requests will come.
    End,
}

/// What follows a request executed alone ([`Transmission::execute_taken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Go on.
    Go,
    /// Send the replies built, then close (a `WRITE` above the maximum
    /// payload, whose bytes cannot be skipped).
    CloseAfterReplies,
    /// The connection is closed (a reply could not be sent).
    Closed,
}

/// A worker's buffers, reused from batch to batch.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) taken: Vec<Taken>,
    /// The payloads of the batch's `WRITE`s, back to back.
    pub(crate) payload: Vec<u8>,
    /// The replies, back to back, sent with one `write`.
    pub(crate) out: Vec<u8>,
}

pub(crate) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded buffers stay consistent whatever panicked under them:
    // the reader's indices are updated after the bytes are in place.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn quiet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl<'a> Transmission<'a> {
    pub(crate) fn new(socket: &'a Socket, session: &mut Session, export: &'a Export) -> Self {
        let channel = Channel::new(socket, session.tls.take());
        let mut buf = vec![0u8; READ_BUFFER].into_boxed_slice();
        let n = session.leftover.len();
        buf[..n].copy_from_slice(&session.leftover);
        session.leftover = Vec::new();
        let side = ReadSide::new(channel.is_tls());
        Self {
            socket,
            channel,
            reader: Mutex::new(Reader {
                buf,
                start: 0,
                end: n,
                side,
            }),
            writer: Mutex::new(Vec::new()),
            export,
            structured: session.structured,
            closing: AtomicBool::new(false),
            idle: AtomicBool::new(false),
        }
    }

    /// Give the idle state back to `session`.
    pub(crate) fn finish(self, session: &mut Session) -> End {
        let closing = self.closing.load(Ordering::Acquire);
        let reader = self.reader.into_inner().unwrap_or_else(|e| e.into_inner());
        session.tls = self.channel.into_tls();
        if closing || !self.idle.load(Ordering::Acquire) {
            return End::Closed;
        }
        session.leftover = reader.data().to_vec();
        End::Idle
    }

    pub(crate) fn worker(&self) {
        let mut batch = Batch::default();
        loop {
            let more = self.read_batch(&mut batch);
            batch.out.clear();
            let mut oversized = false;
            let mut i = 0;
            while i < batch.taken.len() {
                let full = self.read_group(&batch.taken[i..], 0);
                if full > 0 {
                    if self.read_group(&batch.taken[i..], batch.out.len()) < full {
                        // Send what is built, so the whole group fits.
                        if let Err(e) = self.send(&batch.out) {
                            debug!(error = %e, "replies not sent; closing");
                            return self.close();
                        }
                        batch.out.clear();
                    }
                    let group = self.read_group(&batch.taken[i..], batch.out.len());
                    self.read_batch_group(&batch.taken[i..i + group], &mut batch.out);
                    i += group;
                    continue;
                }
                let taken = &batch.taken[i];
                i += 1;
                match self.execute_taken(taken, &batch.payload, &mut batch.out) {
                    Flow::Go => {}
                    Flow::CloseAfterReplies => oversized = true,
                    Flow::Closed => return,
                }
            }
            if !batch.out.is_empty() {
                if let Err(e) = self.send(&batch.out) {
                    debug!(error = %e, "replies not sent; closing");
                    self.close();
                    return;
                }
            }
            if oversized {
                warn!("WRITE above the maximum payload; closing the connection");
                self.close();
                return;
            }
            // Give back what a large batch took (a 32 MiB WRITE).
            if batch.payload.capacity() > 2 * MAX_BATCH_PAYLOAD {
                batch.payload = Vec::new();
            }
            if !more {
                return;
            }
        }
    }

    /// Execute one request taken alone (not in a read group) and append
    /// its reply to `out`, sending what `out` holds first when a long
    /// `READ`'s reply follows; a `WRITE`'s data is `payload[range]`. A
    /// panicking backend gets the request `NBD_EIO` (or closes the
    /// connection when part of a streamed reply may be out).
    pub(crate) fn execute_taken(&self, taken: &Taken, payload: &[u8], out: &mut Vec<u8>) -> Flow {
        let (req, range) = match taken {
            Taken::Oversized(req) => {
                self.error_reply(
                    out,
                    req,
                    NBD_EINVAL,
                    "write payload above the 32 MiB maximum; closing",
                );
                return Flow::CloseAfterReplies;
            }
            Taken::Request(req, range) => (req, range),
        };
        let reply = self.reply_len(req);
        if out.len() + reply > REPLY_BUFFER && !out.is_empty() {
            // Send what is built before a long READ reply.
            if let Err(e) = self.send(out) {
                debug!(error = %e, "replies not sent; closing");
                self.close();
                return Flow::Closed;
            }
            out.clear();
        }
        let payload = &payload[range.clone()];
        let start = out.len();
        let run = catch_unwind(AssertUnwindSafe(|| self.execute(req, payload, out)));
        if run.is_err() {
            warn!(command = command_name(req.command), "backend panicked");
            if reply > REPLY_BUFFER {
                // Part of a streamed reply may be out.
                self.close();
                return Flow::Closed;
            }
            out.truncate(start);
            self.error_reply(out, req, NBD_EIO, "internal error");
        }
        Flow::Go
    }

    /// Whether `req` is a `READ` a batch can serve: valid flags, a length
    /// from 1 byte to what one reply buffer holds, inside the export.
    /// Anything else (and every error reply) goes through
    /// [`execute`](Self::execute), as before.
    pub(crate) fn batchable(&self, req: &Request) -> bool {
        req.command == NBD_CMD_READ
            && req.flags & !NBD_CMD_FLAG_FUA == 0
            && req.length > 0
            && req.length <= MAX_PAYLOAD
            && self.reply_len(req) <= REPLY_BUFFER
            && req
                .offset
                .checked_add(u64::from(req.length))
                .is_some_and(|end| end <= self.export.size())
    }

    /// Bytes of the successful replies to a group of `READ`s.
    fn group_len(&self, group: &[Taken]) -> usize {
        group
            .iter()
            .map(|t| match t {
                Taken::Request(req, _) => self.reply_len(req),
                Taken::Oversized(_) => 0,
            })
            .sum()
    }

    /// How many of the requests at the head of `taken` make one batch read:
    /// the consecutive [`batchable`](Self::batchable) `READ`s (a write or
    /// any other request ends the group, so the requests keep their order)
    /// whose replies fit behind `used` bytes of the reply buffer. 0 when
    /// the first request is not one (or does not fit).
    fn read_group(&self, taken: &[Taken], used: usize) -> usize {
        let mut bytes = used;
        let mut n = 0;
        for t in taken {
            let Taken::Request(req, _) = t else { break };
            if !self.batchable(req) {
                break;
            }
            bytes += self.reply_len(req);
            if bytes > REPLY_BUFFER {
                break;
            }
            n += 1;
        }
        n
    }

    /// Serve a group of batchable `READ`s with one batch read
    /// ([`Export::read_many`]): their replies are laid out in `out` (each
    /// header, then its data read straight behind it), the reads are
    /// submitted together, then each reply is finished: its header
    /// encoded, a short read completed with `read_exact_at`, a failed one
    /// replaced by its own error reply (the others keep their data). A
    /// panicking backend fails the whole group with `NBD_EIO`.
    fn read_batch_group(&self, group: &[Taken], out: &mut Vec<u8>) {
        let prefix = if self.structured {
            OFFSET_DATA_PREFIX_LEN
        } else {
            SIMPLE_REPLY_LEN
        };
        let reqs: Vec<&Request> = group
            .iter()
            .filter_map(|t| match t {
                Taken::Request(req, _) => Some(req),
                Taken::Oversized(_) => None,
            })
            .collect();
        let start = out.len();
        out.resize(start + self.group_len(group), 0);
        let results = {
            let mut slices: Vec<(u64, &mut [u8])> = Vec::with_capacity(reqs.len());
            let mut rest = &mut out[start..];
            for req in &reqs {
                let (reply, tail) = rest.split_at_mut(prefix + req.length as usize);
                slices.push((req.offset, &mut reply[prefix..]));
                rest = tail;
            }
            catch_unwind(AssertUnwindSafe(|| self.export.read_many(&mut slices)))
        };
        let Ok(results) = results.map(|r| (r.len() == reqs.len()).then_some(r)) else {
            warn!("backend panicked in a batch read");
            out.truncate(start);
            for req in reqs {
                self.error_reply(out, req, NBD_EIO, "internal error");
            }
            return;
        };
        let Some(results) = results else {
            out.truncate(start);
            for req in reqs {
                self.error_reply(out, req, NBD_EIO, "batch read returned a wrong count");
            }
            return;
        };
        // Finish each reply in place; note the failures.
        let mut failed = Vec::new();
        let mut at = start;
        for (k, (req, res)) in reqs.iter().zip(results).enumerate() {
            let len = req.length as usize;
            let data = &mut out[at + prefix..at + prefix + len];
            let res = res.and_then(|n| match n {
                n if n >= len => Ok(()),
                n => self
                    .export
                    .backend()
                    .read_exact_at(&mut data[n..], req.offset + n as u64),
            });
            match res {
                Ok(()) if self.structured => encode_offset_data_prefix(
                    &mut out[at..],
                    req.cookie,
                    req.offset,
                    req.length,
                    true,
                ),
                Ok(()) => SimpleReply {
                    error: 0,
                    cookie: req.cookie,
                }
                .encode_into(&mut out[at..]),
                Err(e) => {
                    debug!(error = %e, "read failed");
                    failed.push((k, e));
                }
            }
            at += prefix + len;
        }
        if failed.is_empty() {
            return;
        }
        // Rare: rebuild the group's replies with the failed ones replaced.
        let built = out.split_off(start);
        let mut at = 0;
        let mut failed = failed.into_iter().peekable();
        for (k, req) in reqs.iter().enumerate() {
            let n = prefix + req.length as usize;
            match failed.next_if(|(f, _)| *f == k) {
                Some((_, e)) => self.error_reply(out, req, errno(&e), &e.to_string()),
                None => out.extend_from_slice(&built[at..at + n]),
            }
            at += n;
        }
    }

    pub(crate) fn send(&self, data: &[u8]) -> io::Result<()> {
        let mut scratch = locked(&self.writer);
        let r = self.channel.send(&mut scratch, data);
        if scratch.capacity() > 4 * REPLY_BUFFER {
            *scratch = Vec::new();
        }
        r
    }

    /// Take the next requests: wait for one, then take those already
    /// buffered (never waiting for one the client may not have sent yet),
    /// up to [`MAX_BATCH`] or [`MAX_BATCH_PAYLOAD`]. Returns `false` when
    /// this worker should stop after the batch (the connection ends or
    /// goes idle).
    fn read_batch(&self, batch: &mut Batch) -> bool {
        batch.taken.clear();
        batch.payload.clear();
        let mut reader = locked(&self.reader);
        loop {
            if self.closing.load(Ordering::Acquire) || self.idle.load(Ordering::Acquire) {
                return false;
            }
            match self.next(&mut reader, batch) {
                Next::Request(t) => {
                    let oversized = matches!(t, Taken::Oversized(_));
                    batch.taken.push(t);
                    if oversized {
                        // Its payload cannot be skipped safely: read nothing more.
                        self.closing.store(true, Ordering::Release);
                        return false;
                    }
                }
                Next::Wait => return true,
                Next::Idle => {
                    self.idle.store(true, Ordering::Release);
                    return false;
                }
                Next::End => return false,
            }
            if batch.taken.len() >= MAX_BATCH
                || batch.payload.len() >= MAX_BATCH_PAYLOAD
                || reader.len() < REQUEST_LEN
            {
                return true;
            }
        }
    }

    /// Read more bytes into the reader's buffer (`nowait`, on a clear-text
    /// channel: only what has arrived, or `WouldBlock`).
    pub(crate) fn fill(&self, reader: &mut Reader, nowait: bool) -> io::Result<usize> {
        if reader.start > 0 {
            let (start, end) = (reader.start, reader.end);
            reader.buf.copy_within(start..end, 0);
            reader.end -= start;
            reader.start = 0;
        }
        let Reader { buf, end, side, .. } = reader;
        let n = match nowait {
            // Only a clear-text channel reads the socket without waiting.
            true if !self.channel.is_tls() => self.socket.recv_nowait(&mut buf[*end..])?,
            _ => self.channel.read(side, &mut buf[*end..])?,
        };
        *end += n;
        Ok(n)
    }

    /// The next request (and a `WRITE`'s payload, appended to the batch's).
    pub(crate) fn next(&self, reader: &mut Reader, batch: &mut Batch) -> Next {
        while reader.len() < REQUEST_LEN {
            if !batch.taken.is_empty() {
                return Next::Wait;
            }
            match self.fill(reader, false) {
                Ok(0) => {
                    debug!("client closed the connection");
                    self.close();
                    return Next::End;
                }
                Ok(_) => {}
                Err(e) if quiet(&e) => return Next::Idle,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(error = %e, "reading a request failed");
                    self.close();
                    return Next::End;
                }
            }
        }
        let req = match Request::decode(&reader.data()[..REQUEST_LEN]) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "malformed request; closing the connection");
                self.close();
                return Next::End;
            }
        };
        reader.consume(REQUEST_LEN);
        match req.command {
            NBD_CMD_DISC => {
                debug!("NBD_CMD_DISC");
                self.closing.store(true, Ordering::Release);
                Next::End
            }
            NBD_CMD_WRITE if req.length > MAX_PAYLOAD => Next::Request(Taken::Oversized(req)),
            NBD_CMD_WRITE => {
                let start = batch.payload.len();
                // At most 32 MiB, so the cast is lossless.
                let len = req.length as usize;
                if self.read_payload(reader, &mut batch.payload, start + len) {
                    Next::Request(Taken::Request(req, start..start + len))
                } else {
                    debug!("client left inside a WRITE payload");
                    self.close();
                    Next::End
                }
            }
            _ => Next::Request(Taken::Request(req, 0..0)),
        }
    }

    /// Append payload bytes to `payload` until it is `target` long: first
    /// those buffered, then straight from the stream. `false` when the
    /// stream ended first. A client quiet inside a payload is waited for
    /// (a shutdown of the socket ends the wait).
    fn read_payload(&self, reader: &mut Reader, payload: &mut Vec<u8>, target: usize) -> bool {
        payload.reserve(target - payload.len());
        let n = (target - payload.len()).min(reader.len());
        payload.extend_from_slice(&reader.data()[..n]);
        reader.consume(n);
        while payload.len() < target {
            let want = target - payload.len();
            let got = if self.channel.is_tls() {
                let at = payload.len();
                payload.resize(target, 0);
                let r = self.channel.read(&mut reader.side, &mut payload[at..]);
                payload.truncate(at + *r.as_ref().unwrap_or(&0));
                r
            } else {
                // `read_to_end` fills the spare capacity without zeroing
                // it first; `take` bounds it to the declared length.
                use std::io::Read;
                let before = payload.len();
                let r = self
                    .socket
                    .take(want as u64)
                    .read_to_end(payload)
                    .map(|_| payload.len() - before);
                match r {
                    // Bytes read before a timeout are kept in `payload`.
                    Err(e) if quiet(&e) && payload.len() > before => Ok(payload.len() - before),
                    r => r,
                }
            };
            match got {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) if quiet(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Mark the connection closing and wake every worker blocked on it.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        // Already shut down or the peer is gone: either way it is closed.
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    /// Execute `req` (a `WRITE`'s data is `payload`) and append its reply
    /// to `out` (a long `READ` sends `out` and then its own reply).
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

    /// Bytes of a successful reply to `req` (a `READ`'s header and data).
    pub(crate) fn reply_len(&self, req: &Request) -> usize {
        if req.command != NBD_CMD_READ || req.length > MAX_PAYLOAD {
            return SIMPLE_REPLY_LEN;
        }
        let prefix = if self.structured {
            OFFSET_DATA_PREFIX_LEN
        } else {
            SIMPLE_REPLY_LEN
        };
        prefix + req.length as usize
    }

    /// A `READ`'s reply: appended to `out` (the header, then the data read
    /// straight into `out` behind it), or streamed in pieces when longer
    /// than [`REPLY_BUFFER`] (the worker has sent `out` before then).
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
        if prefix + len > REPLY_BUFFER {
            // The worker sent what `out` held before this request.
            debug_assert!(out.is_empty());
            if !out.is_empty() {
                if let Err(e) = self.send(out) {
                    debug!(error = %e, "replies not sent; closing");
                    return self.close();
                }
                out.clear();
            }
            return self.stream_read(req, out);
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

    /// Send a long `READ`'s reply in pieces of at most [`REPLY_BUFFER`]
    /// bytes, read one at a time into `out` (empty on entry and on return),
    /// under the writer lock: one `OFFSET_DATA` chunk per piece with
    /// structured replies, one simple reply header and then the pieces
    /// without. A backend error after data went out ends the reply with an
    /// error chunk (structured) or closes the connection (simple: the
    /// protocol's rule once a successful header is sent).
    fn stream_read(&self, req: &Request, out: &mut Vec<u8>) {
        let mut scratch = locked(&self.writer);
        let len = req.length as usize;
        let mut at = 0;
        while at < len {
            let n = (len - at).min(REPLY_BUFFER - OFFSET_DATA_PREFIX_LEN);
            let prefix = match (self.structured, at) {
                (true, _) => OFFSET_DATA_PREFIX_LEN,
                (false, 0) => SIMPLE_REPLY_LEN,
                (false, _) => 0,
            };
            out.resize(prefix + n, 0);
            let offset = req.offset + at as u64;
            if let Err(e) = self
                .export
                .backend()
                .read_exact_at(&mut out[prefix..], offset)
            {
                debug!(error = %e, "read failed");
                out.clear();
                if at > 0 && !self.structured {
                    return self.close();
                }
                self.error_reply(out, req, errno(&e), &e.to_string());
                let r = self.channel.send(&mut scratch, out);
                out.clear();
                if r.is_err() {
                    self.close();
                }
                return;
            }
            let done = at + n == len;
            if self.structured {
                // At most REPLY_BUFFER, so the cast is lossless.
                encode_offset_data_prefix(out, req.cookie, offset, n as u32, done);
            } else if at == 0 {
                SimpleReply {
                    error: 0,
                    cookie: req.cookie,
                }
                .encode_into(out);
            }
            let r = self.channel.send(&mut scratch, out);
            out.clear();
            if let Err(e) = r {
                debug!(error = %e, "reply not sent; closing");
                return self.close();
            }
            at += n;
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

    pub(crate) fn error_reply(&self, out: &mut Vec<u8>, req: &Request, error: u32, message: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_maps_kinds() {
        let e = |k| errno(&io::Error::from(k));
        assert_eq!(e(io::ErrorKind::InvalidInput), NBD_EINVAL);
        assert_eq!(e(io::ErrorKind::StorageFull), NBD_ENOSPC);
        assert_eq!(e(io::ErrorKind::PermissionDenied), NBD_EPERM);
        assert_eq!(e(io::ErrorKind::OutOfMemory), NBD_ENOMEM);
        assert_eq!(e(io::ErrorKind::Other), NBD_EIO);
    }
}
