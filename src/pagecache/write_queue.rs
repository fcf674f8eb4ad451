//! The writes of one writeback pass in flight: each sealed run (adjacent
//! dirty blocks, up to the pass's largest run, 1 MiB) goes to
//! [`Backend::submit_write`](crate::backend::Backend::submit_write)
//! while the pass goes on collecting the next, up to [`MAX_IN_FLIGHT`]
//! requests and [`MAX_IN_FLIGHT_BYTES`] bytes at once.
//!
//! Owns the runs from the moment they are sealed until their folios' share
//! of writeback ends. Invariants:
//! - completions are settled in submission order, so a folio whose blocks
//!   are spread over several runs ends writeback with its last share,
//!   after every earlier share was settled (as the synchronous pass did);
//! - a run's buffer is the engine's while the write is in flight (it is
//!   moved into the request and handed back with the completion): the
//!   bytes were copied out of the folios under their locks, so nothing the
//!   cache does meanwhile can touch them;
//! - a failed run is settled exactly as the synchronous pass settled it:
//!   its blocks are dirty again before their folios' `WRITEBACK` clears,
//!   and the error goes to the file's error sequence; a short or
//!   interrupted write is finished synchronously (what `write_all_at`
//!   does);
//! - a folio a failed run carried is backed off when the pass ends
//!   (`retry`), and one whose every share was written is forgotten there;
//! - [`WriteQueue::finish`] (or dropping the queue, if the pass unwinds)
//!   returns only when every write it submitted has completed and been
//!   settled: a pass never leaves a write in flight behind it, so `sync`'s
//!   flush comes after every write its pass started;
//! - a pass goes in flight only once it is a batch (a few runs, or a few
//!   hundred KiB): a smaller one, a commit's few pages, writes its runs on
//!   the caller's thread, where a `pwrite` costs less than a trip through
//!   the engine and back; the last run of a batch is written on the
//!   caller's thread too, while the others are in flight.

use super::inode::FileShared;
use super::stats::{bump, drop_gauge};
use crate::aio::Completion;
use crate::backend::WriteBuf;
use crate::filemap::{Folio, FolioFlags};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// Most writes of one pass in flight at once.
pub(crate) const MAX_IN_FLIGHT: usize = 16;
/// Most bytes of one pass in flight at once.
pub(crate) const MAX_IN_FLIGHT_BYTES: usize = 16 << 20;
/// A pass goes in flight once it has sealed this many runs...
const BATCH_RUNS: usize = 4;
/// ...or this many bytes; a smaller pass (a commit's few pages) writes its
/// runs on the caller's thread, where a `pwrite` costs less than a trip
/// through the engine and back (Neon #7124).
const BATCH_BYTES: usize = 256 << 10;

/// One folio's share of a run: blocks `first..first + count`; `last` when
/// it is the folio's last share (its writeback ends with that run).
pub(crate) struct Part {
    pub(crate) folio: Arc<Folio>,
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) bytes: u64,
    pub(crate) last: bool,
}

/// Adjacent dirty blocks copied out of their folios, to be written at
/// `offset`.
pub(crate) struct Run {
    pub(crate) offset: u64,
    pub(crate) buf: Vec<u8>,
    pub(crate) parts: Vec<Part>,
}

/// A run whose write is in flight.
struct Sent {
    offset: u64,
    len: usize,
    parts: Vec<Part>,
    done: Completion<WriteBuf>,
    at: Instant,
}

/// The writes of one pass (see the module notes).
pub(crate) struct WriteQueue<'f> {
    file: &'f FileShared,
    /// Sealed runs not submitted yet: until the pass is a batch
    /// ([`BATCH_RUNS`], [`BATCH_BYTES`]) all of them, then the last one
    /// only; written on the caller's thread if the pass ends with them.
    held: VecDeque<Run>,
    held_bytes: usize,
    /// Whether runs go in flight (the pass reached a batch).
    batch: bool,
    sent: VecDeque<Sent>,
    bytes: usize,
    /// Buffers back from completed writes.
    spare: Vec<Vec<u8>>,
    /// When the last completion was settled (throughput samples).
    last_settled: Instant,
    /// Folios (by index) a failed run of this pass carried, with the
    /// bytes it left dirty: backed off when the pass ends.
    failed: Vec<(u64, u64)>,
    /// Whether a run of this pass was written.
    wrote: bool,
    result: io::Result<()>,
}

impl<'f> WriteQueue<'f> {
    /// A queue for one pass over `file`, with a first spare buffer.
    pub(crate) fn new(file: &'f FileShared, buf: Vec<u8>) -> WriteQueue<'f> {
        WriteQueue {
            file,
            held: VecDeque::new(),
            held_bytes: 0,
            batch: false,
            sent: VecDeque::new(),
            bytes: 0,
            spare: vec![buf],
            last_settled: Instant::now(),
            failed: Vec::new(),
            wrote: false,
            result: Ok(()),
        }
    }

    /// An empty buffer for the next run.
    pub(crate) fn buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Seal `run`: once the pass is a batch, every run sealed before it
    /// goes in flight.
    pub(crate) fn push(&mut self, run: Run) {
        if run.parts.is_empty() {
            self.recycle(run.buf);
            return;
        }
        self.held_bytes += run.buf.len();
        self.held.push_back(run);
        self.batch |= self.held.len() >= BATCH_RUNS || self.held_bytes >= BATCH_BYTES;
        if self.batch {
            while self.held.len() > 1 {
                let prev = self.held.pop_front().expect("more than one");
                self.held_bytes -= prev.buf.len();
                self.submit(prev);
            }
        }
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        buf.clear();
        self.spare.push(buf);
    }

    fn submit(&mut self, run: Run) {
        let len = run.buf.len();
        while !self.sent.is_empty()
            && (self.sent.len() >= MAX_IN_FLIGHT || self.bytes + len > MAX_IN_FLIGHT_BYTES)
        {
            self.settle_oldest();
        }
        let done = self
            .file
            .backend
            .submit_write(Box::new(run.buf), run.offset);
        self.bytes += len;
        self.sent.push_back(Sent {
            offset: run.offset,
            len,
            parts: run.parts,
            done,
            at: Instant::now(),
        });
    }

    /// Wait for the oldest write in flight and settle it.
    fn settle_oldest(&mut self) {
        let Some(s) = self.sent.pop_front() else {
            return;
        };
        let (res, buf) = s.done.wait();
        self.bytes -= s.len;
        let res = match res {
            Ok(n) if n == s.len => Ok(()),
            // A short write, or one interrupted: the rest synchronously,
            // as `write_all_at` would have gone on.
            Ok(n) => self
                .file
                .backend
                .write_all_at(&buf.as_slice()[n.min(s.len)..], s.offset + n as u64),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                self.file.backend.write_all_at(buf.as_slice(), s.offset)
            }
            Err(e) => Err(e),
        };
        let now = Instant::now();
        let took = now.duration_since(s.at.max(self.last_settled));
        self.last_settled = now;
        let any: Box<dyn std::any::Any> = buf;
        if let Ok(v) = any.downcast::<Vec<u8>>() {
            self.recycle(*v);
        }
        self.settle(s.parts, s.len, took, res);
    }

    /// Every write done and settled; the pass's first error (each one is
    /// also in the file's error sequence), and a buffer to keep for the
    /// next pass.
    pub(crate) fn finish(mut self) -> (io::Result<()>, Vec<u8>) {
        self.drain();
        let buf = self.buffer();
        (std::mem::replace(&mut self.result, Ok(())), buf)
    }

    fn drain(&mut self) {
        // Written here while the others are in flight, in order; each
        // settled after every run sealed before it (a folio's earlier
        // shares are in those).
        while let Some(run) = self.held.pop_front() {
            self.held_bytes -= run.buf.len();
            let t0 = Instant::now();
            let res = self.file.backend.write_all_at(&run.buf, run.offset);
            let took = t0.elapsed();
            while !self.sent.is_empty() {
                self.settle_oldest();
            }
            self.settle(run.parts, run.buf.len(), took, res);
            self.recycle(run.buf);
        }
        while !self.sent.is_empty() {
            self.settle_oldest();
        }
        // Back off every folio a failed run carried (once per pass, with
        // all the bytes its failed shares left dirty).
        let mut failed = core::mem::take(&mut self.failed);
        failed.sort_unstable_by_key(|&(i, _)| i);
        failed.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
            }
            same
        });
        let any_failed = !failed.is_empty();
        for (index, bytes) in failed {
            self.file.backoff.failed(&self.file.cache, index, bytes);
        }
        let wrote = core::mem::take(&mut self.wrote);
        if any_failed || wrote {
            self.file
                .backoff
                .pass_ended(&self.file.cache, any_failed, wrote);
        }
    }

    /// End a run: count it, and on an error make its blocks dirty again
    /// and record the error; end writeback of the folios whose last share
    /// it carried.
    fn settle(
        &mut self,
        parts: Vec<Part>,
        len: usize,
        took: std::time::Duration,
        res: io::Result<()>,
    ) {
        let file = self.file;
        let c = &file.cache.counters;
        match &res {
            Ok(()) => {
                self.wrote = true;
                file.cache.throttle.note_writeback(len as u64, took);
                bump(&c.backend_written_bytes, len as u64);
            }
            Err(e) => {
                bump(&c.writeback_errors, 1);
                file.errseq.set(e)
            }
        }
        for p in parts {
            if res.is_err() {
                // Dirty again before writeback ends: nothing is lost.
                let newly = file.blocks.redirty(&p.folio, p.first, p.count);
                c.dirty_bytes.add(newly);
                if !p.folio.test(FolioFlags::DETACHED) {
                    p.folio.set(FolioFlags::DIRTY);
                    file.mapping.mark_dirty(p.folio.index());
                }
            }
            drop_gauge(&c.writeback_bytes, p.bytes);
            let index = p.folio.index();
            if res.is_err() {
                self.failed.push((index, p.bytes));
            } else if p.last && !self.failed.iter().any(|&(i, _)| i == index) {
                // Written: no longer backed off.
                file.backoff.forget(&file.cache, index);
            }
            if p.last {
                file.mapping.end_writeback(index);
            }
        }
        if let Err(e) = res {
            if self.result.is_ok() {
                self.result = Err(e);
            }
        }
    }
}

impl Drop for WriteQueue<'_> {
    /// A pass that unwinds still waits for what it put in flight and
    /// settles it, so no folio stays under writeback.
    fn drop(&mut self) {
        self.drain();
    }
}
