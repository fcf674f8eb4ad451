//! The completion side: [`Completion`], the caller's handle on one request,
//! waited synchronously or awaited as a runtime-agnostic [`Future`], and the
//! slot the engine completes it through.
//!
//! Owns the slot's state machine: `Pending` (the engine holds the buffer;
//! an optional waker) → `Done` (the result and the buffer, handed over by
//! the engine after the kernel or the pool thread is finished with it) →
//! `Taken` (the caller has them). Invariants:
//! - the buffer is never in the slot while the request is in flight: the
//!   engine's in-flight record owns it and moves it in only on completion,
//!   so dropping, leaking or panicking with a [`Completion`] cannot free
//!   or reuse the bytes the kernel writes (a dropped handle's buffer is
//!   dropped by the engine after the completion);
//! - the slot is completed exactly once, and its waker is called after the
//!   slot's lock is released, never under it;
//! - a thread that belongs to the engine (a ring's reaper, a pool worker)
//!   never parks waiting for the engine: it makes progress itself
//!   ([`Progress::block`]), so a waker that waits on another request from
//!   inside a completion cannot deadlock the engine;
//! - a caller's thread never completes another caller's request: waiting
//!   ([`Completion::wait`], [`Completion::is_done`], a poll) reaps nothing
//!   there, so a waker or an [`on_complete`](Completion::on_complete)
//!   callback runs on an engine thread (or, for a request performed
//!   synchronously, on its own submitter's thread), never inside an
//!   unrelated caller's wait.

use crate::sync::Lock;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// A finished request: its result (bytes transferred, or the error) and
/// its buffer back.
pub type BufResult<B> = (io::Result<usize>, B);

/// How a waiter helps the engine along (implemented by a ring and by the
/// pool).
pub(crate) trait Progress: Send + Sync {
    /// Reap whatever has completed, without blocking, when called on one
    /// of the engine's threads; on a caller's thread, only what concerns
    /// no other caller (see the module notes).
    fn poll_once(&self);
    /// Block until something completes and reap it. Called only on the
    /// engine's own threads (see the module notes).
    fn block(&self);
}

std::thread_local! {
    /// Whether this thread is one of an engine's (a reaper or a pool worker).
    static ENGINE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This thread's waker for synchronous waits (made once).
    static THREAD_WAKER: Waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
}

/// Mark the calling thread as one of an engine's own.
pub(crate) fn mark_engine_thread() {
    ENGINE_THREAD.with(|c| c.set(true));
}

/// Whether the calling thread is one of an engine's own.
pub(crate) fn on_engine_thread() -> bool {
    ENGINE_THREAD.with(|c| c.get())
}

/// Wakes a thread parked in [`Completion::wait`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A function the engine runs with the outcome, in place of storing it
/// ([`Completion::on_complete`]).
type Callback<B> = Box<dyn FnOnce(io::Result<usize>, B) + Send>;

enum State<B> {
    Pending(Option<Waker>),
    /// Pending, with a callback to run on completion instead of a waiter.
    Callback(Callback<B>),
    Done(io::Result<usize>, B),
    Taken,
}

/// Where a request's outcome lands: shared by the engine's in-flight record
/// and the caller's [`Completion`].
pub(crate) struct Slot<B> {
    state: Lock<State<B>>,
}

impl<B> Slot<B> {
    pub(crate) fn new() -> Arc<Slot<B>> {
        Arc::new(Slot {
            state: Lock::new(State::Pending(None)),
        })
    }

    /// Hand over the outcome and the buffer, and wake the waiter. Called
    /// once per slot, by the engine, after the I/O is finished.
    pub(crate) fn complete(&self, res: io::Result<usize>, buf: B) {
        let waker = {
            let mut st = self.state.lock();
            if let State::Callback(_) = &*st {
                let State::Callback(f) = std::mem::replace(&mut *st, State::Taken) else {
                    unreachable!("matched Callback above")
                };
                drop(st);
                // Outside the slot's lock, on the completing thread.
                f(res, buf);
                return;
            }
            match std::mem::replace(&mut *st, State::Done(res, buf)) {
                State::Pending(w) => w,
                State::Callback(_) => unreachable!("handled above"),
                State::Done(..) | State::Taken => {
                    debug_assert!(false, "a slot completed twice");
                    None
                }
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Run `f` with the outcome: now if it is there, else when the engine
    /// completes the slot (on the engine's thread, in place of a waiter).
    fn set_callback(&self, f: Callback<B>) {
        let mut st = self.state.lock();
        match std::mem::replace(&mut *st, State::Taken) {
            State::Pending(_) => *st = State::Callback(f),
            State::Done(r, b) => {
                drop(st);
                f(r, b);
            }
            State::Callback(_) | State::Taken => {
                debug_assert!(false, "a completion's outcome is handed over once");
            }
        }
    }

    /// The outcome if done; otherwise `waker` is registered (replacing an
    /// older one) and `None` returned.
    fn take_or_register(&self, waker: &Waker) -> Option<BufResult<B>> {
        let mut st = self.state.lock();
        match &mut *st {
            State::Callback(_) => None,
            State::Pending(w) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *w = Some(waker.clone());
                }
                None
            }
            State::Done(..) => match std::mem::replace(&mut *st, State::Taken) {
                State::Done(r, b) => Some((r, b)),
                _ => unreachable!("matched Done above"),
            },
            State::Taken => None,
        }
    }

    fn is_taken(&self) -> bool {
        matches!(*self.state.lock(), State::Taken)
    }

    fn is_done(&self) -> bool {
        matches!(*self.state.lock(), State::Done(..))
    }
}

/// The handle on one submitted request: wait for it
/// ([`wait`](Completion::wait)) or `.await` it (it is a [`Future`]; any
/// executor, or none, will do).
///
/// Dropping it (or leaking it with `mem::forget`) does not cancel the
/// request and does not free its buffer early: the engine keeps the buffer
/// until the kernel is finished with it, then drops it.
///
/// ```
/// use kxarray::aio::{IoEngine, IoSettings};
/// use std::io::Write;
/// use std::sync::Arc;
///
/// let mut f = tempfile::tempfile().unwrap();
/// f.write_all(b"hello, engine").unwrap();
/// let f = Arc::new(f);
/// let engine = IoEngine::new(&IoSettings::default()).unwrap();
/// let (n, buf) = engine.read(&f, 7, vec![0u8; 6]).wait();
/// assert_eq!((n.unwrap(), &buf[..]), (6, &b"engine"[..]));
/// ```
#[must_use = "a request runs whether or not it is waited for; drop the handle to ignore its outcome"]
pub struct Completion<B> {
    slot: Arc<Slot<B>>,
    progress: Option<Arc<dyn Progress>>,
}

impl<B> std::fmt::Debug for Completion<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.slot.is_done())
            .finish()
    }
}

impl<B: Send + 'static> Completion<B> {
    /// A handle on an in-flight request.
    pub(crate) fn pending(slot: Arc<Slot<B>>, progress: Option<Arc<dyn Progress>>) -> Self {
        Completion { slot, progress }
    }

    /// A request already finished (done synchronously, or refused before
    /// submission). Backends without an engine return these.
    ///
    /// ```
    /// use kxarray::aio::Completion;
    ///
    /// let c = Completion::ready(Ok(3), vec![1u8, 2, 3]);
    /// assert!(c.is_done());
    /// let (n, buf) = c.wait();
    /// assert_eq!((n.unwrap(), buf.len()), (3, 3));
    /// ```
    pub fn ready(res: io::Result<usize>, buf: B) -> Self {
        Completion {
            slot: Arc::new(Slot {
                state: Lock::new(State::Done(res, buf)),
            }),
            progress: None,
        }
    }

    /// Whether the outcome is there, so [`wait`](Completion::wait) returns
    /// without blocking.
    pub fn is_done(&self) -> bool {
        if let Some(p) = &self.progress {
            p.poll_once();
        }
        self.slot.is_done()
    }

    /// Block the calling thread until the request is finished; its result
    /// and buffer.
    ///
    /// The thread parks (no spinning). On one of the engine's own threads
    /// (a waker called by the engine that waits in turn) it drives the
    /// engine instead of parking.
    pub fn wait(self) -> BufResult<B> {
        let waker = THREAD_WAKER.with(Waker::clone);
        loop {
            if let Some(p) = &self.progress {
                p.poll_once();
            }
            if let Some(out) = self.slot.take_or_register(&waker) {
                return out;
            }
            debug_assert!(!self.slot.is_taken(), "a Completion is taken only once");
            match &self.progress {
                Some(p) if on_engine_thread() => p.block(),
                _ => std::thread::park(),
            }
        }
    }
}

impl<B: Send + 'static> Completion<B> {
    /// Hand the outcome to `f` instead of waiting for it: `f` runs once,
    /// with the result and the buffer, on the thread that completes the
    /// request (an engine's reaper or pool thread; the submitter's own
    /// thread for a request it performed itself, over the engine's
    /// in-flight bound or after io_uring was refused), or at once on the
    /// caller's thread when the request is already finished (a backend
    /// without an engine). Never on the thread of another caller waiting
    /// for its own request. Nothing waits: this is how a submitter that
    /// does not want the outcome itself (the page cache's readahead)
    /// finishes its requests.
    ///
    /// `f` runs on an engine thread: it must be short and must not wait
    /// for other requests of the same engine to finish.
    ///
    /// ```
    /// use kxarray::aio::{IoEngine, IoSettings};
    /// use std::io::Write;
    /// use std::sync::{mpsc, Arc};
    ///
    /// let mut f = tempfile::tempfile().unwrap();
    /// f.write_all(b"called back").unwrap();
    /// let f = Arc::new(f);
    /// let engine = IoEngine::new(&IoSettings::default()).unwrap();
    /// let (tx, rx) = mpsc::channel();
    /// engine.read(&f, 7, vec![0u8; 4]).on_complete(move |n, buf| {
    ///     tx.send((n.unwrap(), buf)).unwrap();
    /// });
    /// assert_eq!(rx.recv().unwrap(), (4, b"back".to_vec()));
    /// ```
    pub fn on_complete(self, f: impl FnOnce(io::Result<usize>, B) + Send + 'static) {
        self.slot.set_callback(Box::new(f));
    }

    /// A request the caller runs its own way (a thread of its own, a
    /// network round trip): the [`Completion`] to hand out, and the
    /// [`Completer`] that owns `buf` until it reports the outcome. A
    /// backend that is neither synchronous nor on the engine returns these
    /// from `Backend::submit_write` (in `kxarray::backend`) and the others.
    ///
    /// ```
    /// use kxarray::aio::Completion;
    ///
    /// let (c, done) = Completion::pair(vec![0u8; 4]);
    /// let t = std::thread::spawn(move || {
    ///     let mut done = done;
    ///     done.buf_mut().copy_from_slice(b"late");
    ///     done.complete(Ok(4));
    /// });
    /// let (n, buf) = c.wait(); // parks until the other thread completes it
    /// assert_eq!((n.unwrap(), &buf[..]), (4, &b"late"[..]));
    /// t.join().unwrap();
    /// ```
    pub fn pair(buf: B) -> (Completion<B>, Completer<B>) {
        let slot = Slot::new();
        let done = Completer {
            slot: Arc::clone(&slot),
            buf: Some(buf),
        };
        (Completion::pending(slot, None), done)
    }
}

/// The other end of a [`Completion`] made by [`Completion::pair`]: owns the
/// request's buffer until [`complete`](Completer::complete) hands it over
/// with the outcome. Dropped without completing, it completes the request
/// with an error ([`io::ErrorKind::BrokenPipe`]) and the buffer, so a
/// waiter never waits forever.
pub struct Completer<B> {
    slot: Arc<Slot<B>>,
    buf: Option<B>,
}

impl<B> std::fmt::Debug for Completer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer").finish_non_exhaustive()
    }
}

impl<B> Completer<B> {
    /// The request's buffer.
    pub fn buf(&self) -> &B {
        self.buf.as_ref().expect("held until completed")
    }

    /// The request's buffer, to fill (a read).
    pub fn buf_mut(&mut self) -> &mut B {
        self.buf.as_mut().expect("held until completed")
    }

    /// Report the outcome (bytes transferred, or the error) and hand the
    /// buffer to the waiter.
    pub fn complete(mut self, res: io::Result<usize>) {
        let buf = self.buf.take().expect("held until completed");
        self.slot.complete(res, buf);
    }
}

impl<B> Drop for Completer<B> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let e = io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the request was dropped before it completed",
            );
            self.slot.complete(Err(e), buf);
        }
    }
}

impl<B: Send + 'static> Future for Completion<B> {
    type Output = BufResult<B>;

    /// Ready once the request is finished.
    ///
    /// # Panics
    /// When polled again after it returned `Ready` (the buffer was handed
    /// over then), as a finished `async` block does.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BufResult<B>> {
        if let Some(p) = &self.progress {
            p.poll_once();
        }
        match self.slot.take_or_register(cx.waker()) {
            Some(out) => Poll::Ready(out),
            None if self.slot.is_taken() => {
                panic!("kxarray::aio::Completion polled after it returned Ready")
            }
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_completed_from_another_thread_wakes_a_waiter() {
        let slot = Slot::<Vec<u8>>::new();
        let c = Completion::pending(Arc::clone(&slot), None);
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            slot.complete(Ok(2), vec![1, 2]);
        });
        let (n, b) = c.wait();
        assert_eq!((n.unwrap(), b), (2, vec![1, 2]));
        t.join().unwrap();
    }

    #[test]
    fn a_dropped_handle_leaves_the_buffer_to_the_engine() {
        let slot = Slot::<Vec<u8>>::new();
        drop(Completion::pending(Arc::clone(&slot), None));
        slot.complete(Err(io::ErrorKind::Other.into()), vec![0; 4]);
        assert!(slot.is_done());
    }
}
