//! The server: accept loops, one thread per connection (handshake, then
//! the transmission workers), and a clean shutdown.
//!
//! Owns the registry of live connections and listeners. Invariants:
//! - after [`ShutdownHandle::shutdown`] no new connection is served, every
//!   live connection's read side is shut down (its workers answer what
//!   they already read, then stop), and every accept loop returns;
//! - [`Server::finish`] returns only after every connection thread has
//!   ended and the backend has been flushed, so everything acknowledged is
//!   durable when it returns `Ok`.

use std::collections::HashMap;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tracing::{debug, info, warn};

use crate::export::Export;
use crate::handshake::{negotiate, Outcome};
use crate::socket::{ListenAddr, Listener, Socket};
use crate::transmission::Transmission;

/// Worker threads per connection for a backend that may wait on a device
/// (a file, a cache over one); see [`workers_for`].
pub const DEFAULT_WORKERS: usize = 4;

/// Worker threads per connection suited to `export`'s backend: one when
/// it completes every request in memory
/// ([`in_memory`](kxarray::backend::Backend::in_memory), the RAM disks),
/// [`DEFAULT_WORKERS`] otherwise.
///
/// An in-memory request takes about a microsecond, less than handing it
/// to another worker costs (a futex wake-up and a context switch per
/// batch); with one worker a connection reads every request waiting in
/// its buffer, runs them, and answers them with one `write`, so a
/// pipelined client is served in batches, and the client's connections
/// run in parallel (one thread each). A request that may wait on a device
/// is worth running beside others, so such backends get a pool. Measured
/// with fio (README, "NBD server"): one worker per connection cut the RAM
/// disk server's CPU per request to 0.21-0.83x of what four workers spent.
///
/// ```
/// use std::sync::Arc;
/// use kxarray::backend::RamDisk;
/// use kxarray_nbd::{server::workers_for, Export};
///
/// let export = Export::new("", Arc::new(RamDisk::new(1 << 20))).unwrap();
/// assert_eq!(workers_for(&export), 1);
/// ```
pub fn workers_for(export: &Export) -> usize {
    if export.backend().in_memory() {
        1
    } else {
        DEFAULT_WORKERS
    }
}

/// An NBD server for one export.
///
/// ```no_run
/// use std::sync::Arc;
/// use kxarray_nbd::{Export, HashMapDisk, Listener, Server};
///
/// let export = Export::new("disk", Arc::new(HashMapDisk::new(1 << 30))).unwrap();
/// let server = Server::new(export, 4);
/// let handle = server.handle();
/// ctrlc::set_handler(move || handle.shutdown()).unwrap();
/// server.serve(Listener::tcp("127.0.0.1:10809").unwrap()).unwrap();
/// server.finish().unwrap(); // every connection gone, backend flushed
/// ```
#[derive(Debug, Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// Stops a [`Server`] from any thread (a signal handler's, a test's).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    export: Export,
    workers: usize,
    shutting_down: AtomicBool,
    next_id: AtomicU64,
    /// A handle to each live connection's socket, to shut it down.
    conns: Mutex<HashMap<u64, Socket>>,
    listeners: Mutex<Vec<ListenAddr>>,
    /// Live connection threads, and the condition they signal on leaving.
    active: Mutex<usize>,
    idle: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a single insert/remove/read, so a
    // panic cannot leave the data half-updated.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// A server for `export` with `workers` threads per connection.
    pub fn new(export: Export, workers: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                export,
                workers: workers.max(1),
                shutting_down: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                conns: Mutex::new(HashMap::new()),
                listeners: Mutex::new(Vec::new()),
                active: Mutex::new(0),
                idle: Condvar::new(),
            }),
        }
    }

    /// The export served.
    pub fn export(&self) -> &Export {
        &self.inner.export
    }

    /// A handle that stops this server.
    pub fn handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            inner: self.inner.clone(),
        }
    }

    /// Accept and serve connections on `listener` until shutdown; each
    /// connection runs on its own threads.
    ///
    /// # Errors
    /// An `accept` error other than a transient one (the listener is then
    /// closed); errors of single connections are logged, not returned.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let addr = listener.local_addr()?;
        lock(&self.inner.listeners).push(addr.clone());
        info!(%addr, export = %self.inner.export.name, size = self.inner.export.size(), "listening");
        loop {
            if self.inner.shutting_down.load(Ordering::SeqCst) {
                break;
            }
            let socket = match listener.accept() {
                Ok(s) => s,
                Err(e) if is_transient(&e) => {
                    warn!(error = %e, "accept failed; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if self.inner.shutting_down.load(Ordering::SeqCst) {
                break;
            }
            self.spawn_connection(socket);
        }
        info!(%addr, "stopped listening");
        Ok(())
    }

    fn spawn_connection(&self, socket: Socket) {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.active) += 1;
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                let _leave = Leave(&inner);
                inner.connection(id, socket);
            });
        if let Err(e) = spawned {
            // The closure (and the socket) were dropped; undo the count.
            warn!(error = %e, "cannot start a connection thread");
            self.inner.leave();
        }
    }

    /// Wait until every connection has ended, then flush the backend.
    ///
    /// # Errors
    /// The backend's flush error.
    pub fn finish(&self) -> io::Result<()> {
        let mut active = lock(&self.inner.active);
        while *active > 0 {
            active = self
                .inner
                .idle
                .wait(active)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(active);
        self.inner.export.backend().flush()?;
        info!("backend flushed");
        Ok(())
    }
}

/// Counts a connection thread out when dropped (also on panic).
struct Leave<'a>(&'a Inner);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl Inner {
    fn leave(&self) {
        let mut active = lock(&self.active);
        *active -= 1;
        if *active == 0 {
            self.idle.notify_all();
        }
    }

    fn connection(&self, id: u64, socket: Socket) {
        let peer = socket.peer();
        let span = tracing::info_span!("conn", id, %peer);
        let _enter = span.enter();
        info!("connected");
        match socket.try_clone() {
            Ok(control) => {
                lock(&self.conns).insert(id, control);
            }
            Err(e) => {
                warn!(error = %e, "cannot clone the socket");
                return;
            }
        }
        // Registered before this check, so a shutdown either sees the
        // socket in `conns` or is seen here.
        if !self.shutting_down.load(Ordering::SeqCst) {
            self.run(&socket);
        }
        lock(&self.conns).remove(&id);
        info!("disconnected");
    }

    fn run(&self, socket: &Socket) {
        let outcome = negotiate(socket, &self.export, || {
            self.shutting_down.load(Ordering::SeqCst)
        });
        let structured = match outcome {
            Ok(Outcome::Transmission { structured }) => structured,
            Ok(Outcome::Closed) => {
                debug!("closed during the handshake");
                return;
            }
            Err(e) => {
                warn!(error = %e, "handshake failed; closing this connection");
                return;
            }
        };
        let socket = match socket.try_clone() {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot clone the socket");
                return;
            }
        };
        match Transmission::new(socket, &self.export, structured) {
            Ok(t) => t.serve(self.workers),
            Err(e) => warn!(error = %e, "cannot start the transmission phase"),
        }
        // Make what this client wrote durable now rather than at exit.
        if let Err(e) = self.export.backend().flush() {
            warn!(error = %e, "flush after disconnect failed");
        }
    }
}

impl ShutdownHandle {
    /// Stop accepting, and end every connection once the requests it has
    /// read are answered. Returns at once; [`Server::finish`] waits.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        if inner.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        info!("shutting down");
        for socket in lock(&inner.conns).values() {
            // Ends the reads; the workers still send their replies.
            let _ = socket.shutdown(Shutdown::Read);
        }
        for addr in lock(&inner.listeners).iter() {
            // Wakes the accept loop, which then sees the flag.
            if let Err(e) = addr.connect() {
                debug!(%addr, error = %e, "cannot wake the listener");
            }
        }
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    ) || matches!(e.raw_os_error(), Some(23 | 24)) // ENFILE, EMFILE
}
