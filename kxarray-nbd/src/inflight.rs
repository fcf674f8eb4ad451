//! A connection's reads in flight: the futures of the `READ`s it has
//! started ([`crate::batch::ReadInFlight`]), each with its request, and the
//! wake-ups that tell the connection's thread which of them to poll again.
//!
//! Owns [`InFlight`] (the slots, at most [`MAX_IN_FLIGHT`] reads and
//! [`IN_FLIGHT_BYTES`] of replies) and its `Notify`: a bit per slot set by
//! the slot's waker (on whatever thread completes the read: an I/O
//! engine's reaper), and an `eventfd` written when the connection's
//! thread sleeps, so that one `poll(2)` waits for the socket and the
//! reads together.
//!
//! Invariants:
//! - a slot holds a future from [`InFlight::add`] until the future is
//!   ready (or panics), and is polled only after its waker set its bit (or
//!   once when added), so the thread never spins over pending reads;
//! - no wake-up is lost: the thread announces it sleeps (`sleeping`, then
//!   looks at the bits once more) before `poll(2)`; a waker sets its bit,
//!   then writes the eventfd if the thread announced sleep (both `SeqCst`:
//!   either the thread sees the bit or the waker sees `sleeping`);
//! - a waker outliving the connection (a read completing after the
//!   connection closed) holds the `Notify`, so its eventfd stays open and
//!   is never another file's descriptor;
//! - a panic in a future's poll fails that read alone (`NBD_EIO`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use kxarray::backend::ReadBuf;

use crate::batch::ReadInFlight;
use crate::config::{IN_FLIGHT_BYTES, MAX_IN_FLIGHT};
use crate::proto::Request;

const WORDS: usize = MAX_IN_FLIGHT.div_ceil(64);

/// A read that finished: its request, its result, its buffer (`None` when
/// its future panicked).
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) req: Request,
    pub(crate) result: io::Result<usize>,
    pub(crate) buf: Option<ReadBuf>,
}

/// What woke [`InFlight::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// The socket has bytes, the end of the stream, or an error.
    Socket,
    /// A read in flight may be ready (or the wait was interrupted).
    Reads,
    /// The timeout passed with nothing.
    Timeout,
}

/// The wake-up side, shared with the slots' wakers.
struct Notify {
    ready: [AtomicU64; WORDS],
    sleeping: AtomicBool,
    efd: OwnedFd,
}

impl Notify {
    fn mark(&self, slot: usize) {
        self.ready[slot / 64].fetch_or(1 << (slot % 64), Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes the 8 bytes of `one`, which lives across the
            // call, to the eventfd this `Notify` owns (open while it is).
            // A failure (the counter full) still leaves the fd readable.
            let _ = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    fn any_ready(&self) -> bool {
        self.ready.iter().any(|w| w.load(Ordering::SeqCst) != 0)
    }

    /// Empty the eventfd's counter (non-blocking: nothing to read is fine).
    fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads at most 8 bytes into `n`, which lives across the
        // call, from the eventfd this `Notify` owns.
        let _ = unsafe { libc::read(self.efd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// One slot's waker: sets the slot's bit.
struct SlotWaker {
    notify: Arc<Notify>,
    slot: usize,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.notify.mark(self.slot);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.notify.mark(self.slot);
    }
}

struct Entry {
    req: Request,
    fut: ReadInFlight,
    bytes: usize,
}

/// A connection's reads in flight.
pub(crate) struct InFlight {
    notify: Arc<Notify>,
    wakers: Vec<Waker>,
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    bytes: usize,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("reads", &self.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl InFlight {
    /// No reads in flight.
    ///
    /// # Errors
    /// As `eventfd(2)`.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: no pointer arguments; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        let notify = Arc::new(Notify {
            ready: std::array::from_fn(|_| AtomicU64::new(0)),
            sleeping: AtomicBool::new(false),
            efd,
        });
        let wakers = (0..MAX_IN_FLIGHT)
            .map(|slot| {
                Waker::from(Arc::new(SlotWaker {
                    notify: notify.clone(),
                    slot,
                }))
            })
            .collect();
        Ok(Self {
            notify,
            wakers,
            slots: (0..MAX_IN_FLIGHT).map(|_| None).collect(),
            free: (0..MAX_IN_FLIGHT).rev().collect(),
            bytes: 0,
        })
    }

    /// Reads in flight.
    pub(crate) fn len(&self) -> usize {
        MAX_IN_FLIGHT - self.free.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.free.len() == MAX_IN_FLIGHT
    }

    /// Whether `more` reads of `bytes` reply bytes in all may be added:
    /// within [`MAX_IN_FLIGHT`] and [`IN_FLIGHT_BYTES`] (one read is
    /// always allowed when none is in flight).
    pub(crate) fn has_room(&self, more: usize, bytes: usize) -> bool {
        more <= self.free.len()
            && (self.bytes + bytes <= IN_FLIGHT_BYTES || (self.is_empty() && more <= 1))
    }

    /// Keep `fut`, the read of `req` (`bytes` reply bytes), in flight; it
    /// is polled once now, and when it is ready at once (a cache hit) it
    /// comes back finished.
    ///
    /// # Panics
    /// When no slot is free (the caller asks [`has_room`](Self::has_room)).
    pub(crate) fn add(&mut self, req: Request, fut: ReadInFlight, bytes: usize) -> Option<Done> {
        let slot = self.free.pop().expect("a free slot (has_room)");
        self.slots[slot] = Some(Entry { req, fut, bytes });
        self.bytes += bytes;
        self.poll_slot(slot)
    }

    /// Poll the reads whose wakers fired; `done` gets each one that is
    /// ready.
    pub(crate) fn take_ready(&mut self, mut done: impl FnMut(Done)) {
        for w in 0..WORDS {
            let mut bits = self.notify.ready[w].swap(0, Ordering::SeqCst);
            while bits != 0 {
                let slot = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(d) = self.poll_slot(slot) {
                    done(d);
                }
            }
        }
    }

    fn poll_slot(&mut self, slot: usize) -> Option<Done> {
        let entry = self.slots[slot].as_mut()?;
        let mut cx = Context::from_waker(&self.wakers[slot]);
        let polled = catch_unwind(AssertUnwindSafe(|| entry.fut.as_mut().poll(&mut cx)));
        let (result, buf) = match polled {
            Ok(Poll::Pending) => return None,
            Ok(Poll::Ready((result, buf))) => (result, Some(buf)),
            Err(_) => {
                tracing::warn!("a read panicked");
                (Err(io::Error::other("internal error")), None)
            }
        };
        let entry = self.slots[slot].take()?;
        self.bytes -= entry.bytes;
        self.free.push(slot);
        Some(Done {
            req: entry.req,
            result,
            buf,
        })
    }

    /// Sleep until a read's waker fires, `socket` (when given) is
    /// readable, or `timeout_ms` passes (negative: no timeout).
    ///
    /// # Errors
    /// As `poll(2)` (an interrupted wait reports [`Woke::Reads`]).
    pub(crate) fn wait(&self, socket: Option<RawFd>, timeout_ms: i32) -> io::Result<Woke> {
        let n = &self.notify;
        n.sleeping.store(true, Ordering::SeqCst);
        if n.any_ready() {
            n.sleeping.store(false, Ordering::SeqCst);
            return Ok(Woke::Reads);
        }
        let mut fds = [
            libc::pollfd {
                fd: n.efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: socket.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let count = if socket.is_some() { 2 } else { 1 };
        // SAFETY: `fds` holds `count` valid, initialised `pollfd`s that
        // live across the call; poll(2) only writes their `revents`.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout_ms) };
        n.sleeping.store(false, Ordering::SeqCst);
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(Woke::Reads);
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            n.drain();
        }
        Ok(if count == 2 && fds[1].revents != 0 {
            Woke::Socket
        } else if r == 0 && !n.any_ready() {
            Woke::Timeout
        } else {
            Woke::Reads
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn req(cookie: u64) -> Request {
        Request {
            flags: 0,
            command: crate::proto::NBD_CMD_READ,
            cookie,
            offset: cookie * 4096,
            length: 4096,
        }
    }

    /// A future that is ready once `gate` holds `true`, and keeps its
    /// waker for the test to call.
    struct Gate(Arc<Mutex<(bool, Option<Waker>)>>);

    impl std::future::Future for Gate {
        type Output = (io::Result<usize>, ReadBuf);
        fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut g = self.0.lock().unwrap();
            if g.0 {
                return Poll::Ready((Ok(7), Box::new(vec![1u8; 7])));
            }
            g.1 = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A pending read is polled again only once its waker fires (from
    /// another thread), which also ends a wait; the room follows the
    /// count and bytes in flight.
    #[test]
    fn a_wake_from_another_thread_ends_the_wait_and_readies_its_read() {
        let mut inf = InFlight::new().unwrap();
        let gate = Arc::new(Mutex::new((false, None)));
        assert!(inf
            .add(req(1), Box::pin(Gate(gate.clone())), IN_FLIGHT_BYTES)
            .is_none());
        assert_eq!(inf.len(), 1);
        assert!(!inf.has_room(1, 1), "the byte budget is used up");
        let mut got = Vec::new();
        inf.take_ready(|d| got.push(d.req.cookie));
        assert!(got.is_empty(), "no wake-up yet");
        assert_eq!(inf.wait(None, 0).unwrap(), Woke::Timeout);
        let g = gate.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let w = {
                let mut g = g.lock().unwrap();
                g.0 = true;
                g.1.take().unwrap()
            };
            w.wake();
        });
        assert_eq!(inf.wait(None, 10_000).unwrap(), Woke::Reads);
        t.join().unwrap();
        inf.take_ready(|d| got.push(d.req.cookie));
        assert_eq!(got, vec![1]);
        assert!(inf.is_empty());
        assert!(inf.has_room(MAX_IN_FLIGHT, IN_FLIGHT_BYTES));
        assert!(!inf.has_room(MAX_IN_FLIGHT + 1, 0));
    }

    /// A read ready when added comes back at once; a panicking one fails
    /// alone.
    #[test]
    fn ready_and_panicking_reads() {
        let mut inf = InFlight::new().unwrap();
        let d = inf
            .add(
                req(2),
                Box::pin(std::future::ready((
                    Ok(3),
                    Box::new(vec![0u8; 3]) as ReadBuf,
                ))),
                3,
            )
            .unwrap();
        assert_eq!((d.req.cookie, *d.result.as_ref().unwrap()), (2, 3));
        let boom: ReadInFlight = Box::pin(async { panic!("a read panicking on purpose") });
        let d = inf.add(req(3), boom, 3).unwrap();
        assert_eq!(d.req.cookie, 3);
        assert!(d.result.is_err() && d.buf.is_none());
        assert!(inf.is_empty());
    }
}
