//! The event loop: one thread that accepts connections and holds every
//! connection that is waiting for its client, with no thread of its own.
//!
//! Owns the `mio` poll (epoll), the listeners, and the parked set: the
//! connections waiting for their next message, each registered for
//! readability under its own token, with the handshake deadline of those
//! still in the handshake. When a parked connection becomes readable it is
//! taken out of the set, deregistered, and handed to a job (the server's
//! `dispatch`); the job serves it and parks it again ([`Parking::park`])
//! when the client goes quiet. Deadlines of parked handshakes are kept in
//! order; the poll's timeout is the earliest, and the loop closes what
//! passed it.
//!
//! Invariants: a connection is registered with epoll exactly while it is
//! in the parked set (it is inserted before it is registered, and
//! deregistered when taken out), so a readiness event is delivered to the
//! loop only for a parked connection and each parked connection is
//! handed to at most one job; once the loop has stopped
//! ([`Parking::close`]), a connection parked late is closed instead; the
//! loop never blocks on a client (the greeting written at accept fits an
//! empty socket buffer).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use tracing::{info, warn};

use crate::connection::Conn;
use crate::socket::Listener;

/// The waker's token.
const WAKER: Token = Token(0);
/// Listener `i` has token `LISTENER_BASE + i`.
const LISTENER_BASE: usize = 1;
/// Connection `id` has token `CONN_BASE + id`.
const CONN_BASE: usize = 1 << 16;

/// How long to wait before accepting again after running out of file
/// descriptors (`EMFILE`/`ENFILE`).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

fn token(conn: &Conn) -> Token {
    // Ids count from 1 and stay far below usize::MAX - CONN_BASE.
    Token(CONN_BASE.wrapping_add(conn.id as usize))
}

/// The part of the loop the worker threads use: parking and waking.
#[derive(Debug)]
pub(crate) struct Parking {
    registry: Registry,
    waker: Waker,
    state: Mutex<Parked>,
}

#[derive(Debug, Default)]
struct Parked {
    conns: HashMap<Token, Conn>,
    deadlines: BTreeSet<(Instant, Token)>,
    /// The loop has stopped: park nothing more.
    closed: bool,
}

fn lock(m: &Mutex<Parked>) -> MutexGuard<'_, Parked> {
    // Single inserts and removes: a panic cannot leave the set half-updated.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Parking {
    /// Park `conn` until its socket is readable (at once if it already is).
    pub(crate) fn park(&self, conn: Conn) {
        let t = token(&conn);
        let fd = conn.socket.as_raw_fd();
        let deadline = conn.deadline();
        let mut state = lock(&self.state);
        if state.closed {
            drop(state);
            drop(conn);
            return;
        }
        state.conns.insert(t, conn);
        let mut earliest = false;
        if let Some(d) = deadline {
            state.deadlines.insert((d, t));
            earliest = state.deadlines.first() == Some(&(d, t));
        }
        if let Err(e) = self
            .registry
            .register(&mut SourceFd(&fd), t, Interest::READABLE)
        {
            warn!(error = %e, "cannot watch a connection; closing it");
            let conn = state.conns.remove(&t);
            if let Some(d) = deadline {
                state.deadlines.remove(&(d, t));
            }
            drop(state);
            drop(conn);
            return;
        }
        drop(state);
        if earliest {
            // The loop may be sleeping past this deadline.
            self.wake();
        }
    }

    /// Wake the loop (to see a new deadline or the shutdown flag).
    pub(crate) fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            warn!(error = %e, "cannot wake the event loop");
        }
    }

    /// Connections parked now.
    pub(crate) fn parked(&self) -> usize {
        lock(&self.state).conns.len()
    }

    /// Take a parked connection out (deregistered).
    fn take(&self, state: &mut Parked, t: Token) -> Option<Conn> {
        let conn = state.conns.remove(&t)?;
        if state.conns.capacity() > 64 && state.conns.len() < state.conns.capacity() / 8 {
            // Give back the table of a crowd that has left.
            state.conns.shrink_to(state.conns.len() * 2);
        }
        if let Some(d) = conn.deadline() {
            state.deadlines.remove(&(d, t));
        }
        let fd = conn.socket.as_raw_fd();
        // It is registered (invariant); a failure here would only mean a
        // closed descriptor, which the connection's next use reports.
        let _ = self.registry.deregister(&mut SourceFd(&fd));
        Some(conn)
    }

    /// Stop parking and hand back every parked connection.
    fn close(&self) -> Vec<Conn> {
        let mut state = lock(&self.state);
        state.closed = true;
        let tokens: Vec<Token> = state.conns.keys().copied().collect();
        tokens
            .into_iter()
            .filter_map(|t| self.take(&mut state, t))
            .collect()
    }
}

/// What the loop asks of the server.
pub(crate) trait Handler {
    /// Whether to stop.
    fn stopping(&self) -> bool;
    /// A new connection: refuse it (`None`) or return it, greeted, to park.
    fn accepted(&self, socket: crate::socket::Socket) -> Option<Conn>;
    /// A parked connection became readable: serve it.
    fn dispatch(&self, conn: Conn);
}

/// The loop's own half: the poll and the listeners.
#[derive(Debug)]
pub(crate) struct Reactor {
    poll: Poll,
}

impl Reactor {
    /// A poll with its waker; the [`Parking`] half goes to the workers.
    ///
    /// # Errors
    /// As `epoll_create1(2)`, `eventfd(2)`.
    pub(crate) fn new() -> io::Result<(Self, Parking)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let registry = poll.registry().try_clone()?;
        Ok((
            Self { poll },
            Parking {
                registry,
                waker,
                state: Mutex::new(Parked::default()),
            },
        ))
    }

    /// Accept on `listeners` and watch parked connections until `handler`
    /// says stop; then close the listeners and every parked connection.
    ///
    /// # Errors
    /// A failed `epoll_wait`, or an `accept` error other than a transient
    /// one (an aborted connection, a signal, running out of descriptors).
    pub(crate) fn run(
        mut self,
        listeners: Vec<Listener>,
        parking: &Parking,
        handler: &impl Handler,
    ) -> io::Result<()> {
        for (i, l) in listeners.iter().enumerate() {
            self.poll.registry().register(
                &mut SourceFd(&l.as_raw_fd()),
                Token(LISTENER_BASE + i),
                Interest::READABLE,
            )?;
        }
        let result = self.turn(&listeners, parking, handler);
        drop(listeners);
        let parked = parking.close();
        if !parked.is_empty() {
            info!(connections = parked.len(), "closing idle connections");
        }
        drop(parked);
        result
    }

    fn turn(
        &mut self,
        listeners: &[Listener],
        parking: &Parking,
        handler: &impl Handler,
    ) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut retry_accept: Option<Instant> = None;
        let mut ready_conns = Vec::new();
        let mut ready_listeners = vec![false; listeners.len()];
        loop {
            let now = Instant::now();
            let next_deadline = lock(&parking.state).deadlines.first().map(|d| d.0);
            let wake_at = [next_deadline, retry_accept].into_iter().flatten().min();
            let timeout = wake_at.map(|w| w.saturating_duration_since(now));
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if handler.stopping() {
                return Ok(());
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    Token(t) if t >= CONN_BASE => ready_conns.push(ev.token()),
                    Token(t) => {
                        if let Some(r) = ready_listeners.get_mut(t - LISTENER_BASE) {
                            *r = true;
                        }
                    }
                }
            }
            if retry_accept.is_some_and(|r| r <= Instant::now()) {
                retry_accept = None;
                ready_listeners.fill(true);
            }
            for (i, l) in listeners.iter().enumerate() {
                if std::mem::take(&mut ready_listeners[i]) {
                    if let Some(retry) = accept_all(l, parking, handler)? {
                        retry_accept = Some(retry);
                    }
                }
            }
            let mut taken = Vec::with_capacity(ready_conns.len());
            let mut expired = Vec::new();
            {
                let mut state = lock(&parking.state);
                for t in ready_conns.drain(..) {
                    if let Some(c) = parking.take(&mut state, t) {
                        taken.push(c);
                    }
                }
                let now = Instant::now();
                while let Some(&(d, t)) = state.deadlines.first() {
                    if d > now {
                        break;
                    }
                    match parking.take(&mut state, t) {
                        Some(c) => expired.push(c),
                        None => {
                            state.deadlines.remove(&(d, t));
                        }
                    }
                }
            }
            for c in taken {
                handler.dispatch(c);
            }
            for c in expired {
                info!(id = c.id, peer = %c.peer, "handshake deadline passed; closing");
            }
        }
    }
}

/// Accept every waiting connection of `l`; `Some(when)` to retry after
/// running out of file descriptors.
fn accept_all(
    l: &Listener,
    parking: &Parking,
    handler: &impl Handler,
) -> io::Result<Option<Instant>> {
    loop {
        match l.accept() {
            Ok(socket) => {
                if let Some(conn) = handler.accepted(socket) {
                    parking.park(conn);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                warn!(error = %e, "out of file descriptors; accepting again shortly");
                return Ok(Some(Instant::now() + ACCEPT_RETRY));
            }
            Err(e) => return Err(e),
        }
    }
}
