//! The transmission phase with a connection's reads in flight: one thread
//! per connection takes every request the client has sent, starts the
//! `READ`s together ([`Export::start_reads`]: the page cache's misses, or
//! the file's reads, submitted in one batch) and keeps them in flight
//! (`inflight::InFlight`), answering each as it completes, in whatever order, so
//! the client's queue never drains while a batch waits for its slowest
//! read, and no worker thread waits on a read.
//!
//! Used for an export whose reads can be kept in flight
//! ([`Export::reads_in_flight`]: a cached or plain file) on a clear-text
//! connection, when [`Config::in_flight_reads`](crate::Config) is on;
//! otherwise the workers of [`transmission`](crate::transmission) serve it.
//!
//! The loop: answer the reads that completed; take the requests buffered
//! (as many `READ`s as the in-flight limits allow) and start them; send
//! the replies built, with one `write`; read more requests without waiting
//! if the buffer is empty; then sleep until the socket or a read's
//! completion wakes the thread (with nothing in flight, on the socket
//! alone, with its read timeout: a quiet client is parked as before).
//!
//! Invariants:
//! - every request read is answered once, with its own cookie: a read's
//!   reply carries its data or its own error; a request that is not a
//!   `READ` kept in flight (a write, a flush, a long or invalid read, a
//!   disconnect) is taken only once every read before it is answered, and
//!   executed alone as the workers do (`Transmission::execute_taken`), so
//!   a write is never overtaken by an earlier read, nor a read by an
//!   earlier write;
//! - memory: the read buffer, the reply buffer (sent when the next reply
//!   would not fit) and at most [`IN_FLIGHT_BYTES`](crate::config::IN_FLIGHT_BYTES)
//!   of reads in flight or one `WRITE`'s payload, never both;
//! - when the client leaves (or the server shuts the read side down), the
//!   reads in flight are finished and their replies sent if the socket
//!   still takes them, then the connection closes.

use std::io;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use kxarray::backend::ReadBuf;
use tracing::{debug, warn};

use crate::batch::{keep_buffer, take_buffer};
use crate::config::{MAX_BATCH_PAYLOAD, REPLY_BUFFER};
use crate::export::Export;
use crate::inflight::{Done, InFlight};
use crate::proto::{
    encode_offset_data_prefix, Request, SimpleReply, OFFSET_DATA_PREFIX_LEN, REQUEST_LEN,
    SIMPLE_REPLY_LEN,
};
use crate::socket::Socket;
use crate::transmission::{errno, locked, quiet, Batch, End, Flow, Next, Session, Transmission};

/// Serve `session` on `socket` with the reads in flight, on the calling
/// thread, until the client goes quiet for the socket's read timeout or
/// the connection ends; as [`transmission::serve`](crate::transmission::serve)
/// otherwise.
pub fn serve(socket: &Socket, session: &mut Session, export: &Export) -> End {
    let t = Transmission::new(socket, session, export);
    match InFlight::new() {
        Ok(inflight) => Pipeline {
            t: &t,
            inflight,
            out: Vec::new(),
            batch: Batch::default(),
            failed: false,
            done: Vec::new(),
        }
        .run(),
        Err(e) => {
            warn!(error = %e, "no eventfd for reads in flight; serving in batches");
            t.worker();
        }
    }
    t.finish(session)
}

/// A connection being served with its reads in flight.
struct Pipeline<'t, 'a> {
    t: &'t Transmission<'a>,
    inflight: InFlight,
    /// Replies built and not yet sent.
    out: Vec<u8>,
    /// A request taken alone (its `WRITE` payload).
    batch: Batch,
    /// A reply could not be sent: the connection is closed.
    failed: bool,
    /// The reads found ready, reused from pass to pass.
    done: Vec<Done>,
}

impl Pipeline<'_, '_> {
    fn run(mut self) {
        let t = self.t;
        let mut reader = locked(&t.reader);
        let fd = t.socket.as_raw_fd();
        let mut offsets: Vec<(u64, ReadBuf)> = Vec::new();
        let mut reqs: Vec<Request> = Vec::new();
        loop {
            // Answer the reads done first: their replies free the client's
            // queue slots while the new reads are submitted.
            self.reap();
            if !self.send_out() {
                return;
            }
            // Take the requests buffered: the READs kept in flight, up to
            // the limits; anything else once the reads before it are done.
            let mut bytes = 0;
            let mut other = false;
            while !t.closing.load(Ordering::Acquire) && reader.len() >= REQUEST_LEN {
                let req = match Request::decode(&reader.data()[..REQUEST_LEN]) {
                    Ok(r) if t.batchable(&r) => r,
                    // A bad magic, too: `next` closes the connection.
                    _ => {
                        other = true;
                        break;
                    }
                };
                let len = t.reply_len(&req);
                if !self.inflight.has_room(reqs.len() + 1, bytes + len) {
                    break;
                }
                bytes += len;
                reader.consume(REQUEST_LEN);
                offsets.push((req.offset, take_buffer(req.length as usize)));
                reqs.push(req);
            }
            self.start(&mut reqs, &mut offsets);
            if other {
                if !self.finish_reads() {
                    return;
                }
                self.batch.payload.clear();
                let flow = match t.next(&mut reader, &mut self.batch) {
                    Next::Request(taken) => {
                        t.execute_taken(&taken, &self.batch.payload, &mut self.out)
                    }
                    // `next` found a whole header: only a disconnect or a
                    // broken request (the connection is then closing).
                    Next::End | Next::Wait | Next::Idle => Flow::Go,
                };
                // Give back what a large WRITE took (up to 32 MiB).
                if self.batch.payload.capacity() > 2 * MAX_BATCH_PAYLOAD {
                    self.batch.payload = Vec::new();
                }
                match flow {
                    Flow::Go => {}
                    Flow::Closed => return,
                    Flow::CloseAfterReplies => {
                        warn!("WRITE above the maximum payload; closing the connection");
                        self.send_out();
                        return t.close();
                    }
                }
                continue;
            }
            if !self.send_out() {
                return;
            }
            if t.closing.load(Ordering::Acquire) {
                self.finish_reads();
                return;
            }
            if reader.len() >= REQUEST_LEN {
                // No room: wait for reads to complete (none may be left:
                // those just started may have been hits).
                if !self.inflight.is_empty() {
                    if let Err(e) = self.inflight.wait(None, -1) {
                        return self.broken(e);
                    }
                }
                continue;
            }
            // The buffer holds no whole request: read what has arrived.
            match t.fill(&mut reader, true) {
                Ok(0) => {
                    debug!("client closed the connection");
                    self.finish_reads();
                    return t.close();
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    debug!(error = %e, "reading a request failed");
                    self.finish_reads();
                    return t.close();
                }
            }
            if self.inflight.is_empty() {
                // Nothing in flight: wait on the socket alone, within its
                // read timeout; a quiet client is parked.
                match t.fill(&mut reader, false) {
                    Ok(0) => {
                        debug!("client closed the connection");
                        return t.close();
                    }
                    Ok(_) => {}
                    Err(e) if quiet(&e) => {
                        t.idle.store(true, Ordering::Release);
                        return;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        debug!(error = %e, "reading a request failed");
                        return t.close();
                    }
                }
                continue;
            }
            if let Err(e) = self.inflight.wait(Some(fd), -1) {
                return self.broken(e);
            }
        }
    }

    /// Start the reads `reqs` into the buffers of `offsets`, together;
    /// both lists are emptied.
    fn start(&mut self, reqs: &mut Vec<Request>, offsets: &mut Vec<(u64, ReadBuf)>) {
        if reqs.is_empty() {
            return;
        }
        let t = self.t;
        let n = reqs.len();
        let reads = std::mem::take(offsets);
        let started = catch_unwind(AssertUnwindSafe(|| t.export.start_reads(reads)));
        let futs = match started {
            Ok(f) if f.len() == n => f,
            _ => {
                warn!("starting reads failed (a panic or a wrong count)");
                for req in reqs.drain(..) {
                    self.finish(Done {
                        req,
                        result: Err(io::Error::other("internal error")),
                        buf: None,
                    });
                }
                return;
            }
        };
        for (req, fut) in reqs.drain(..).zip(futs) {
            let len = t.reply_len(&req);
            if let Some(done) = self.inflight.add(req, fut, len) {
                self.finish(done);
            }
        }
    }

    /// Answer the reads that completed.
    fn reap(&mut self) {
        let mut done = std::mem::take(&mut self.done);
        self.inflight.take_ready(|d| done.push(d));
        for d in done.drain(..) {
            self.finish(d);
        }
        self.done = done;
    }

    /// Append a finished read's reply to the replies (sent first when it
    /// would not fit).
    fn finish(&mut self, d: Done) {
        let t = self.t;
        let Done { req, result, buf } = d;
        if self.out.len() + t.reply_len(&req) > REPLY_BUFFER {
            self.send_out();
        }
        let len = req.length as usize;
        let res = match buf {
            Some(mut buf) => {
                let res = result.and_then(|n| {
                    let data = &mut buf.as_mut_slice()[..len];
                    if n >= len {
                        return Ok(());
                    }
                    // Short (the end of the store moved): complete it; a
                    // panicking backend fails this read alone.
                    let rest = &mut data[n..];
                    let at = req.offset + n as u64;
                    catch_unwind(AssertUnwindSafe(|| {
                        t.export.backend().read_exact_at(rest, at)
                    }))
                    .unwrap_or_else(|_| Err(io::Error::other("internal error")))
                });
                if res.is_ok() {
                    let prefix = if t.structured {
                        OFFSET_DATA_PREFIX_LEN
                    } else {
                        SIMPLE_REPLY_LEN
                    };
                    let start = self.out.len();
                    self.out.resize(start + prefix, 0);
                    if t.structured {
                        encode_offset_data_prefix(
                            &mut self.out[start..],
                            req.cookie,
                            req.offset,
                            req.length,
                            true,
                        );
                    } else {
                        SimpleReply {
                            error: 0,
                            cookie: req.cookie,
                        }
                        .encode_into(&mut self.out[start..]);
                    }
                    self.out.extend_from_slice(&buf.as_slice()[..len]);
                }
                keep_buffer(buf);
                res
            }
            None => result.map(drop),
        };
        if let Err(e) = res {
            debug!(error = %e, "read failed");
            // A panicked read's error is `Other`: NBD_EIO.
            t.error_reply(&mut self.out, &req, errno(&e), &e.to_string());
        }
    }

    /// Send the replies built; `false` when they could not be (the
    /// connection is then closed).
    fn send_out(&mut self) -> bool {
        if self.failed {
            self.out.clear();
            return false;
        }
        if self.out.is_empty() {
            return true;
        }
        let r = self.t.send(&self.out);
        self.out.clear();
        if let Err(e) = r {
            debug!(error = %e, "replies not sent; closing");
            self.failed = true;
            self.t.close();
            return false;
        }
        true
    }

    /// Wait for every read in flight and send its reply; `false` when the
    /// connection is closed (a reply could not be sent, or the wait
    /// failed).
    fn finish_reads(&mut self) -> bool {
        loop {
            self.reap();
            if self.inflight.is_empty() {
                return self.send_out();
            }
            if !self.send_out() {
                // Nobody takes the replies: the reads finish into the
                // cache (or the engine) without us.
                return false;
            }
            if let Err(e) = self.inflight.wait(None, -1) {
                self.broken(e);
                return false;
            }
        }
    }

    fn broken(&mut self, e: io::Error) {
        warn!(error = %e, "waiting for reads in flight failed; closing");
        self.failed = true;
        self.t.close();
    }
}
