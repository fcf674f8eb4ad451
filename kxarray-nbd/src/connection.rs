//! One client connection, and the registry of every open one.
//!
//! Owns [`Conn`] (a socket and the phase it is in: handshake or
//! transmission) and [`Live`] (every open connection's socket, by id, so
//! that a shutdown can reach them wherever they are: parked in the event
//! loop, or on a worker thread). A `Conn` is owned by exactly one place at
//! a time (the event loop's parked set or one pool job) and moves between
//! them; it holds no thread and no buffer while parked.
//! Invariants: a connection is in [`Live`] from [`Live::open`] until its
//! `Conn` is dropped, which also closes its socket; [`Live::len`] is
//! therefore the number of open connections, the figure the connection
//! cap is checked against.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::debug;

use crate::handshake;
use crate::socket::Socket;
use crate::transmission::Session;

/// Where a connection is in the protocol.
#[derive(Debug)]
pub(crate) enum Phase {
    /// Option haggling.
    Handshake(handshake::State),
    /// Requests and replies.
    Transmission(Session),
}

/// An open connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) socket: Arc<Socket>,
    pub(crate) peer: String,
    pub(crate) phase: Phase,
    live: Arc<Live>,
}

impl Conn {
    /// The handshake deadline, while in the handshake.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Handshake(s) => Some(s.deadline()),
            Phase::Transmission(_) => None,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Both directions, now: a thread of ours blocked on this socket
        // (there is none once the `Conn` is dropped) or the peer see it.
        let _ = self.socket.shutdown(Shutdown::Both);
        let open = self.live.remove(self.id);
        debug!(id = self.id, open, "disconnected");
    }
}

/// Every open connection's socket.
#[derive(Debug, Default)]
pub(crate) struct Live {
    sockets: Mutex<Sockets>,
    empty: Condvar,
}

#[derive(Debug, Default)]
struct Sockets {
    by_id: HashMap<u64, Arc<Socket>>,
    /// The most connections open since memory was last given back.
    peak: usize,
}

/// Fewest connections whose closing is worth a `malloc_trim`.
const TRIM_AFTER: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Single inserts and removes: a panic cannot leave the map half-updated.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Live {
    /// Register `socket` as connection `id` in `phase`.
    pub(crate) fn open(self: &Arc<Self>, id: u64, socket: Socket, phase: Phase) -> Conn {
        let socket = Arc::new(socket);
        let mut sockets = lock(&self.sockets);
        sockets.by_id.insert(id, socket.clone());
        sockets.peak = sockets.peak.max(sockets.by_id.len());
        drop(sockets);
        Conn {
            id,
            peer: socket.peer(),
            socket,
            phase,
            live: self.clone(),
        }
    }

    /// Forget connection `id`; the number left open. When half the
    /// connections open at the peak (and at least [`TRIM_AFTER`]) have
    /// closed, the memory they freed goes back to the system.
    fn remove(&self, id: u64) -> usize {
        let mut sockets = lock(&self.sockets);
        sockets.by_id.remove(&id);
        let n = sockets.by_id.len();
        if n == 0 {
            self.empty.notify_all();
        }
        let trim = sockets.peak >= TRIM_AFTER && n <= sockets.peak / 2;
        if trim {
            sockets.peak = n;
            if n == 0 {
                // Let the map's table go too.
                sockets.by_id = HashMap::new();
            }
        }
        drop(sockets);
        if trim {
            crate::memory::release_free_memory();
        }
        n
    }

    /// Open connections.
    pub(crate) fn len(&self) -> usize {
        lock(&self.sockets).by_id.len()
    }

    /// Shut down `how` every open connection's socket.
    pub(crate) fn shutdown_all(&self, how: Shutdown) {
        for s in lock(&self.sockets).by_id.values() {
            // Already shut down or the peer is gone: either way done.
            let _ = s.shutdown(how);
        }
    }

    /// Wait up to `timeout` for every connection to close; whether they
    /// did.
    pub(crate) fn wait_empty(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut sockets = lock(&self.sockets);
        while !sockets.by_id.is_empty() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            sockets = self
                .empty
                .wait_timeout(sockets, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}
