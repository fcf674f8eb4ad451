//! The job loop of the fio example: one job's I/Os over its slice of the
//! file, the same loop for every engine (a copy per engine type,
//! monomorphized), with the same random stream, clock reads, histogram and
//! bookkeeping.
//!
//! Owns what a job measures ([`JobResult`]) and the rule that makes the
//! verify pass possible: job `id` touches only blocks `first_block ..
//! first_block + blocks`, and `gens` holds the generation every one of them
//! carries (the number of verified writes to it).

use crate::engine::Engine;
use crate::stamp::{check_piece, checksum, stamp};
use clap::ValueEnum;
use hdrhistogram::Histogram;
use kxarray::pagecache::{CachedFile, ReadFuture};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::future::Future;
use std::hint::black_box;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// I/O pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Rw {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random mixed reads and writes (`--rwmixread`).
    Randrw,
}

impl Rw {
    /// Whether the offsets are random.
    pub(crate) fn random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite | Rw::Randrw)
    }
}

/// What every job of a run does (the same for every engine).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    pub(crate) rw: Rw,
    pub(crate) rwmixread: u8,
    pub(crate) bs: u64,
    /// Sync after every `fsync` writes (0: never).
    pub(crate) fsync: u64,
    pub(crate) seed: u64,
    /// I/Os per job (`u64::MAX`: until stopped).
    pub(crate) ios: u64,
    /// Check every read against its stamp and stamp every write.
    pub(crate) verify: bool,
    /// Checksum every byte read.
    pub(crate) touch: bool,
    /// Time every I/O into the histograms.
    pub(crate) clat: bool,
    /// Reads in flight per job (`--iodepth`; reads only): batches of this
    /// many through [`Engine::read_many`].
    pub(crate) iodepth: usize,
    /// With `iodepth`: keep that many `read_owned` futures in flight,
    /// each replaced as it completes, instead of batches.
    pub(crate) futures: bool,
}

/// What one job measured.
pub(crate) struct JobResult {
    pub(crate) read: Histogram<u64>,
    pub(crate) write: Histogram<u64>,
    pub(crate) sync: Histogram<u64>,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) read_bytes: u64,
    pub(crate) write_bytes: u64,
    /// The `--touch` checksum of every block read (wrapping sum).
    pub(crate) sum: u64,
    pub(crate) mismatches: Vec<String>,
    pub(crate) error: Option<io::Error>,
    /// The generation each block of the job's slice holds now.
    pub(crate) gens: Vec<u64>,
    pub(crate) first_block: u64,
    /// When the job's last I/O ended.
    pub(crate) end: Instant,
}

/// CPU time the whole process has used, in nanoseconds
/// (`CLOCK_PROCESS_CPUTIME_ID`: every thread, user and system time, so the
/// page cache's flusher and `pread`'s time in the kernel count; time spent
/// waiting for a CPU does not, which on a shared machine is most of the
/// noise in wall-clock IOPS).
pub(crate) fn process_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// A latency histogram (1 ns to 10 minutes, 3 significant digits).
pub(crate) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds")
}

/// One job: its slice of the file and the run's shared flags.
pub(crate) struct Job<'a> {
    pub(crate) spec: &'a Spec,
    pub(crate) id: u64,
    pub(crate) first_block: u64,
    pub(crate) blocks: u64,
    /// Set when the run's time is up.
    pub(crate) stop: &'a AtomicBool,
    /// I/Os done by all jobs, in steps of 64 (the progress bar).
    pub(crate) ops: &'a AtomicU64,
}

impl Job<'_> {
    /// An empty result for this job.
    pub(crate) fn result(&self) -> JobResult {
        JobResult {
            read: hist(),
            write: hist(),
            sync: hist(),
            reads: 0,
            writes: 0,
            read_bytes: 0,
            write_bytes: 0,
            sum: 0,
            mismatches: Vec::new(),
            error: None,
            gens: vec![0; self.blocks as usize],
            first_block: self.first_block,
            end: Instant::now(),
        }
    }

    /// The job loop, the same for every engine: pick the next block and
    /// direction from the job's random stream, time the engine's I/O
    /// (including what the harness does with the bytes: the first byte,
    /// the checksum with `touch`, the check with `verify`), record it.
    pub(crate) fn run<E: Engine>(&self, mut engine: E) -> JobResult {
        let a = self.spec;
        if a.iodepth > 1 {
            if a.futures {
                if let Some(file) = engine.cached_file() {
                    return self.run_futures(file);
                }
            }
            return self.run_batched(engine);
        }
        let bs = a.bs as usize;
        let (verify, touch, clat) = (a.verify, a.touch, a.clat);
        let mut r = self.result();
        let mut rng = SmallRng::seed_from_u64(a.seed.wrapping_mul(1000).wrapping_add(self.id));
        let mut buf = vec![0u8; bs];
        let mut wbuf = vec![0u8; bs];
        if !verify {
            // A fixed pattern, as fio writes one buffer over and over.
            stamp(&mut wbuf, u64::MAX, 0);
        }
        let mut next_seq = 0u64;
        let mut writes_since_sync = 0u64;
        let mut n = 0u64;
        while n < a.ios && !self.stop.load(Ordering::Relaxed) {
            let (rel, write) = match a.rw {
                Rw::Read | Rw::Write => {
                    let b = next_seq;
                    next_seq = (next_seq + 1) % self.blocks;
                    (b, a.rw == Rw::Write)
                }
                Rw::Randread => (rng.random_range(0..self.blocks), false),
                Rw::Randwrite => (rng.random_range(0..self.blocks), true),
                Rw::Randrw => (
                    rng.random_range(0..self.blocks),
                    rng.random_range(0..100u8) >= a.rwmixread,
                ),
            };
            let block = self.first_block + rel;
            let off = block * a.bs;
            let res = if write {
                let gen = r.gens[rel as usize] + 1;
                if verify {
                    stamp(&mut wbuf, block, gen);
                }
                let t0 = clat.then(Instant::now);
                let res = engine.write(off, &wbuf);
                if let Some(t0) = t0 {
                    r.write.saturating_record(t0.elapsed().as_nanos() as u64);
                }
                res.map(|()| {
                    r.gens[rel as usize] = gen;
                    r.writes += 1;
                    r.write_bytes += bs as u64;
                })
            } else {
                let gen = r.gens[rel as usize];
                let (mut at, mut sum, mut bad) = (0usize, 0u64, None);
                let t0 = clat.then(Instant::now);
                let res = engine.read(off, &mut buf, &mut |piece: &[u8]| {
                    if at == 0 {
                        black_box(piece.first().copied());
                    }
                    if touch {
                        sum = sum.wrapping_add(checksum(piece));
                    }
                    if verify && bad.is_none() {
                        bad = check_piece(piece, block, gen, at).err();
                    }
                    at += piece.len();
                });
                if let Some(t0) = t0 {
                    r.read.saturating_record(t0.elapsed().as_nanos() as u64);
                }
                res.and_then(|()| {
                    if at != bs {
                        return Err(io::Error::other(format!(
                            "the engine showed {at} of the {bs} bytes at {off}"
                        )));
                    }
                    r.reads += 1;
                    r.read_bytes += bs as u64;
                    r.sum = r.sum.wrapping_add(black_box(sum));
                    if let Some(e) = bad {
                        r.mismatches.push(format!("during the run: {e}"));
                    }
                    Ok(())
                })
            };
            if let Err(e) = res {
                r.error = Some(e);
                break;
            }
            if write && a.fsync > 0 {
                writes_since_sync += 1;
                if writes_since_sync == a.fsync {
                    writes_since_sync = 0;
                    let t0 = Instant::now();
                    if let Err(e) = engine.sync() {
                        r.error = Some(e);
                        break;
                    }
                    r.sync.saturating_record(t0.elapsed().as_nanos() as u64);
                }
            }
            n += 1;
            if n.is_multiple_of(64) {
                self.ops.fetch_add(64, Ordering::Relaxed);
            }
        }
        r.end = Instant::now();
        r
    }

    /// The job loop at `--iodepth N` (reads only; `validate` refuses
    /// writes): the next N blocks of the job's stream (sequential or
    /// random, as the one-at-a-time loop picks them) go to the engine as
    /// one batch; every request's latency is the batch's (they were all in
    /// flight from its start to its end, as fio's clat counts from
    /// submission to completion); then the harness looks at each block as
    /// it does one at a time.
    fn run_batched<E: Engine>(&self, mut engine: E) -> JobResult {
        let a = self.spec;
        let bs = a.bs as usize;
        let depth = a.iodepth;
        let mut r = self.result();
        let mut rng = SmallRng::seed_from_u64(a.seed.wrapping_mul(1000).wrapping_add(self.id));
        let mut bufs = vec![0u8; bs * depth];
        let mut blocks = vec![0u64; depth];
        let mut next_seq = 0u64;
        let mut n = 0u64;
        'run: while n < a.ios && !self.stop.load(Ordering::Relaxed) {
            let k = (a.ios - n).min(depth as u64) as usize;
            for b in &mut blocks[..k] {
                let rel = if a.rw == Rw::Read {
                    let b = next_seq;
                    next_seq = (next_seq + 1) % self.blocks;
                    b
                } else {
                    rng.random_range(0..self.blocks)
                };
                *b = self.first_block + rel;
            }
            let mut reqs: Vec<(u64, &mut [u8])> = blocks[..k]
                .iter()
                .zip(bufs.chunks_exact_mut(bs))
                .map(|(&b, buf)| (b * a.bs, buf))
                .collect();
            let t0 = a.clat.then(Instant::now);
            let res = engine.read_many(&mut reqs);
            if let Some(t0) = t0 {
                let ns = t0.elapsed().as_nanos() as u64;
                for _ in 0..k {
                    r.read.saturating_record(ns);
                }
            }
            for ((off, buf), res) in reqs.iter().zip(res) {
                let block = off / a.bs;
                let gen = r.gens[(block - self.first_block) as usize];
                match res {
                    Ok(got) if got == bs => {}
                    Ok(got) => {
                        r.error = Some(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("short read at {off}: {got} of {bs} bytes"),
                        ));
                        break 'run;
                    }
                    Err(e) => {
                        r.error = Some(e);
                        break 'run;
                    }
                }
                black_box(buf.first().copied());
                if a.touch {
                    r.sum = r.sum.wrapping_add(black_box(checksum(buf)));
                }
                if a.verify {
                    if let Err(e) = check_piece(buf, block, gen, 0) {
                        r.mismatches.push(format!("during the run: {e}"));
                    }
                }
                r.reads += 1;
                r.read_bytes += bs as u64;
            }
            let before = n;
            n += k as u64;
            if n / 64 != before / 64 {
                self.ops
                    .fetch_add(64 * (n / 64 - before / 64), Ordering::Relaxed);
            }
        }
        r.end = Instant::now();
        r
    }

    /// The job loop at `--iodepth N --iodepth-api future` (kxarray, reads
    /// only): N `CachedFile::read_owned` futures in flight, polled by a
    /// plain loop on this thread (each future's waker marks its slot and
    /// unparks the thread); each completed one is checked as the
    /// one-at-a-time loop checks a block and replaced at once by the next
    /// block of the stream, so N reads stay in flight as fio's io_uring
    /// engine keeps them. A request's latency runs from its submission to
    /// its completion being seen.
    fn run_futures(&self, file: &CachedFile) -> JobResult {
        type Fut = Pin<Box<ReadFuture<Vec<u8>>>>;
        let a = self.spec;
        let bs = a.bs as usize;
        let mut r = self.result();
        let mut rng = SmallRng::seed_from_u64(a.seed.wrapping_mul(1000).wrapping_add(self.id));
        let mut next_seq = 0u64;
        let mut next_block = || {
            let rel = if a.rw == Rw::Read {
                let b = next_seq;
                next_seq = (next_seq + 1) % self.blocks;
                b
            } else {
                rng.random_range(0..self.blocks)
            };
            self.first_block + rel
        };
        let mut issued = 0u64;
        let mut slots: Vec<(Fut, Arc<SlotWaker>, u64, Instant)> = Vec::new();
        while slots.len() < a.iodepth && issued < a.ios {
            let b = next_block();
            issued += 1;
            let w = Arc::new(SlotWaker::new());
            let fut = Box::pin(file.read_owned(b * a.bs, vec![0u8; bs]));
            slots.push((fut, w, b, Instant::now()));
        }
        let mut n = 0u64;
        'run: while !slots.is_empty() && !self.stop.load(Ordering::Relaxed) {
            let mut progressed = false;
            let mut i = 0;
            while i < slots.len() {
                let (fut, w, block, t0) = &mut slots[i];
                if !w.ready.swap(false, Ordering::AcqRel) {
                    i += 1;
                    continue;
                }
                let waker = Waker::from(Arc::clone(w));
                let mut cx = Context::from_waker(&waker);
                let Poll::Ready((res, buf)) = fut.as_mut().poll(&mut cx) else {
                    i += 1;
                    continue;
                };
                progressed = true;
                if a.clat {
                    r.read.saturating_record(t0.elapsed().as_nanos() as u64);
                }
                match res {
                    Ok(got) if got == bs => {}
                    Ok(got) => {
                        r.error = Some(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("short read of block {block}: {got} of {bs} bytes"),
                        ));
                        break 'run;
                    }
                    Err(e) => {
                        r.error = Some(e);
                        break 'run;
                    }
                }
                let gen = r.gens[(*block - self.first_block) as usize];
                black_box(buf.first().copied());
                if a.touch {
                    r.sum = r.sum.wrapping_add(black_box(checksum(&buf)));
                }
                if a.verify {
                    if let Err(e) = check_piece(&buf, *block, gen, 0) {
                        r.mismatches.push(format!("during the run: {e}"));
                    }
                }
                r.reads += 1;
                r.read_bytes += bs as u64;
                n += 1;
                if n.is_multiple_of(64) {
                    self.ops.fetch_add(64, Ordering::Relaxed);
                }
                if issued < a.ios {
                    let b = next_block();
                    issued += 1;
                    w.ready.store(true, Ordering::Release);
                    *fut = Box::pin(file.read_owned(b * a.bs, buf));
                    *block = b;
                    *t0 = Instant::now();
                    i += 1;
                } else {
                    drop(slots.swap_remove(i));
                }
            }
            if !progressed {
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
        r.end = Instant::now();
        r
    }
}

/// A future's waker in `run_futures`: marks its slot ready and unparks the
/// job's thread.
struct SlotWaker {
    ready: AtomicBool,
    thread: std::thread::Thread,
}

impl SlotWaker {
    fn new() -> SlotWaker {
        SlotWaker {
            ready: AtomicBool::new(true),
            thread: std::thread::current(),
        }
    }
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.ready.store(true, Ordering::Release);
        self.thread.unpark();
    }
}
