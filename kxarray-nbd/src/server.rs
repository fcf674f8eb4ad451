//! The server: the event loop for idle connections, pool threads for busy
//! ones, the connection cap, and a shutdown that always ends.
//!
//! A connection's life: the loop accepts it (or refuses it past the
//! connection cap), sends the greeting and parks it; each time it becomes
//! readable a pool thread runs it (handshake steps, then the transmission
//! phase) until its client goes quiet, and parks it again. So an idle
//! connection costs no thread and no buffer, a busy one costs its workers
//! (see [`workers_for`]), and the threads that serve a connection keep it
//! as long as requests keep coming (no hand-off per request).
//!
//! Owns the [`Server`] and its [`ShutdownHandle`]. Invariants:
//! - at most [`Config::max_connections`] connections are open at once;
//! - every handshake ends within [`Config::handshake_timeout`] of the
//!   accept: parked, the loop closes it at the deadline; on a thread,
//!   every read and write is bounded by the time left;
//! - after [`ShutdownHandle::shutdown`] no connection is accepted, every
//!   connection's read side is shut down (its workers answer what they
//!   already read, then stop), idle connections are closed, and the loop
//!   returns; nothing depends on the listening address still existing
//!   (the loop is woken directly, not by connecting to itself);
//! - [`Server::finish`] returns within [`SHUTDOWN_GRACE`] plus
//!   [`SHUTDOWN_FORCE`] plus the backend's flush: connections still open
//!   after the grace (a client that stopped reading its replies) have both
//!   directions shut down, which fails their blocked writes; then the
//!   backend is flushed, so everything acknowledged is durable.

use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::config::{connection_budget, Config};
use crate::connection::{Conn, Live, Phase};
use crate::export::Export;
use crate::handshake::{self, advance, Context, Step};
use crate::pipeline;
use crate::pool::Pool;
use crate::reactor::{Handler, Parking, Reactor};
use crate::socket::{Listener, Socket};
use crate::transmission::{self, End};

/// Worker threads per connection for a backend that may wait on a device
/// (a file, a cache over one); see [`workers_for`].
pub const DEFAULT_WORKERS: usize = 4;

/// How long a shutdown lets connections answer the requests they read.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How long a shutdown then waits for connections whose sockets it shut
/// down in both directions.
pub const SHUTDOWN_FORCE: Duration = Duration::from_secs(1);

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
/// with fio (docs/nbd.md): one worker per connection cut the RAM
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
/// use kxarray_nbd::{Config, Export, HashMapDisk, Listener, Server};
///
/// let export = Export::new("disk", Arc::new(HashMapDisk::new(1 << 30))).unwrap();
/// let server = Server::new(export, Config::new(4)).unwrap();
/// let handle = server.handle();
/// ctrlc::set_handler(move || handle.shutdown()).unwrap();
/// server.serve(vec![Listener::tcp("127.0.0.1:10809").unwrap()]).unwrap();
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
    config: Config,
    shutting_down: AtomicBool,
    next_id: AtomicU64,
    live: Arc<Live>,
    pool: Pool,
    parking: Parking,
    /// The loop's half, taken by [`Server::serve`].
    reactor: Mutex<Option<Reactor>>,
    /// Connections refused at the cap since the last log line, and when
    /// that line was.
    refused: Mutex<(u64, Option<Instant>)>,
}

impl Server {
    /// A server for `export`.
    ///
    /// # Errors
    /// When the event loop cannot be made (`epoll_create1`, `eventfd`).
    pub fn new(export: Export, config: Config) -> io::Result<Self> {
        let (reactor, parking) = Reactor::new()?;
        Ok(Self {
            inner: Arc::new(Inner {
                export,
                config,
                shutting_down: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                live: Arc::new(Live::default()),
                pool: Pool::new(),
                parking,
                reactor: Mutex::new(Some(reactor)),
                refused: Mutex::new((0, None)),
            }),
        })
    }

    /// The export served.
    pub fn export(&self) -> &Export {
        &self.inner.export
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// A handle that stops this server.
    pub fn handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            inner: self.inner.clone(),
        }
    }

    /// Open connections (handshaking, served or idle).
    pub fn connections(&self) -> usize {
        self.inner.live.len()
    }

    /// Connections idle in the event loop (no thread).
    pub fn idle_connections(&self) -> usize {
        self.inner.parking.parked()
    }

    /// Live worker threads.
    pub fn worker_threads(&self) -> usize {
        self.inner.pool.threads()
    }

    /// Accept and serve connections on `listeners` until shutdown; runs
    /// the event loop on the calling thread.
    ///
    /// # Errors
    /// `AlreadyExists` when called a second time; a failed `epoll_wait`,
    /// or an `accept` error other than a transient one.
    pub fn serve(&self, listeners: Vec<Listener>) -> io::Result<()> {
        let reactor = self
            .inner
            .reactor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| io::Error::new(io::ErrorKind::AlreadyExists, "already served"))?;
        let c = &self.inner.config;
        for l in &listeners {
            let addr = l.local_addr()?;
            info!(
                %addr,
                export = %self.inner.export.name,
                size = self.inner.export.size(),
                max_connections = c.max_connections,
                handshake_timeout = ?c.handshake_timeout,
                workers = c.workers,
                tls = ?c.tls.as_ref().map(|t| t.mode()),
                memory_per_connection = connection_budget(c.workers, c.tls.is_some()),
                "listening"
            );
        }
        let r = reactor.run(
            listeners,
            &self.inner.parking,
            &Dispatcher(self.inner.clone()),
        );
        info!("stopped listening");
        r
    }

    /// Shut down (if not yet), wait for the connections to end (forcing
    /// them after [`SHUTDOWN_GRACE`]), then flush the backend.
    ///
    /// # Errors
    /// The backend's flush error.
    pub fn finish(&self) -> io::Result<()> {
        self.handle().shutdown();
        let live = &self.inner.live;
        if !live.wait_empty(SHUTDOWN_GRACE) {
            warn!(
                connections = live.len(),
                "connections still open after the shutdown grace; closing them"
            );
            live.shutdown_all(Shutdown::Both);
            if !live.wait_empty(SHUTDOWN_FORCE) {
                warn!(
                    connections = live.len(),
                    "connections still busy in the backend; flushing without them"
                );
            }
        }
        self.inner.export.backend().flush()?;
        info!("backend flushed");
        Ok(())
    }
}

impl ShutdownHandle {
    /// Stop accepting, end idle connections, and end every other one once
    /// the requests it has read are answered. Returns at once;
    /// [`Server::finish`] waits.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        if inner.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        info!("shutting down");
        // Ends the reads; the workers still send their replies.
        inner.live.shutdown_all(Shutdown::Read);
        inner.parking.wake();
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }
}

/// The server as the event loop sees it.
struct Dispatcher(Arc<Inner>);

impl Handler for Dispatcher {
    fn stopping(&self) -> bool {
        self.0.shutting_down.load(Ordering::SeqCst)
    }

    fn accepted(&self, socket: Socket) -> Option<Conn> {
        self.0.accepted(socket)
    }

    fn dispatch(&self, conn: Conn) {
        let inner = self.0.clone();
        if let Err((job, e)) = self.0.pool.execute(Box::new(move || inner.resume(conn))) {
            warn!(error = %e, "no thread for a connection; closing it");
            drop(job);
        }
    }
}

impl Inner {
    fn accepted(self: &Arc<Self>, socket: Socket) -> Option<Conn> {
        let open = self.live.len();
        if open >= self.config.max_connections {
            self.refuse(&socket);
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.config.handshake_timeout;
        let conn = self.live.open(
            id,
            socket,
            Phase::Handshake(handshake::State::new(deadline)),
        );
        info!(id, peer = %conn.peer, open = open + 1, "connected");
        // 18 bytes into a new socket's empty buffer: this cannot block.
        use std::io::Write;
        if let Err(e) = (&*conn.socket).write_all(&handshake::greeting()) {
            debug!(id, error = %e, "greeting not sent");
            return None;
        }
        Some(conn)
    }

    fn refuse(&self, socket: &Socket) {
        let _ = socket.shutdown(Shutdown::Both);
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.0 += 1;
        if refused
            .1
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            warn!(
                limit = self.config.max_connections,
                refused = refused.0,
                "connection limit reached; refusing new connections (--max-connections)"
            );
            *refused = (0, Some(Instant::now()));
        }
    }

    /// Serve `conn` until its client goes quiet (park it) or it ends.
    fn resume(self: Arc<Self>, mut conn: Conn) {
        let span = tracing::info_span!("conn", id = conn.id, peer = %conn.peer);
        let _enter = span.enter();
        if let Phase::Handshake(state) = &mut conn.phase {
            let ctx = Context {
                export: &self.export,
                tls: self.config.tls.as_deref(),
                shutting_down: self.shutting_down.load(Ordering::SeqCst),
            };
            match advance(&conn.socket, state, ctx) {
                Ok(Step::Park) => return self.parking.park(conn),
                Ok(Step::Closed) => return debug!("closed during the handshake"),
                Ok(Step::Transmission(session)) => {
                    let socket = &conn.socket;
                    let timeouts = socket
                        .set_read_timeout(Some(self.config.park_after))
                        .and_then(|()| socket.set_write_timeout(None));
                    if let Err(e) = timeouts {
                        return warn!(error = %e, "cannot set the socket's timeouts");
                    }
                    conn.phase = Phase::Transmission(session);
                }
                Err(e) => return warn!(error = %e, "handshake failed; closing this connection"),
            }
        }
        let Phase::Transmission(session) = &mut conn.phase else {
            return;
        };
        if !conn.socket.readable_now() && !session.has_plaintext() {
            return self.parking.park(conn);
        }
        let in_flight =
            self.config.in_flight_reads && self.export.reads_in_flight() && session.tls.is_none();
        let end = if in_flight {
            pipeline::serve(&conn.socket, session, &self.export)
        } else {
            transmission::serve(&conn.socket, session, &self.export, self.config.workers)
        };
        match end {
            End::Idle => {
                debug!("idle; parked");
                self.parking.park(conn);
            }
            End::Closed => {
                drop(conn);
                // Make what this client wrote durable now rather than at exit.
                if let Err(e) = self.export.backend().flush() {
                    warn!(error = %e, "flush after disconnect failed");
                }
            }
        }
    }
}
