//! The server's limits and settings, and the memory a connection may use.
//!
//! Owns [`Config`] (what a server is built with) and
//! the byte budget of a connection ([`connection_budget`]), which follows
//! from the transmission phase's buffer sizes; those constants live here
//! so the budget and the code that honours it cannot drift apart.
//! Invariants: every limit is positive (the constructors clamp zero to
//! one); the budget is an upper bound of what one connection's buffers
//! hold at any moment, whatever the client sends or fails to read.

use std::sync::Arc;
use std::time::Duration;

use crate::proto::MAX_PAYLOAD;
use crate::tls::Tls;

/// Default handshake deadline: a client must reach the transmission phase
/// within this time of connecting, or be disconnected.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default cap on connections open at once (handshaking, serving or
/// idle); a connection beyond it is accepted and closed at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// How long a connection in the transmission phase keeps its thread
/// without a request before it is handed back to the event loop (and holds
/// no thread until its next request).
pub const DEFAULT_PARK_AFTER: Duration = Duration::from_millis(20);

/// Bytes of a connection's read buffer while it is served (many pipelined
/// request headers per `read`); freed while the connection is idle.
pub const READ_BUFFER: usize = 256 * 1024;

/// Most reply bytes a worker builds before sending them: a `READ` longer
/// than this is read from the backend and sent in pieces of this size.
pub const REPLY_BUFFER: usize = 1 << 20;

/// Most `WRITE` payload bytes one batch holds besides its last request's
/// (a batch takes no further request once it holds this much).
pub const MAX_BATCH_PAYLOAD: usize = 1 << 20;

/// Most requests one worker takes from the read buffer at once. With
/// several workers per connection, groups of 16 keep the device busier
/// than one group of a client's whole queue, which replies only when its
/// slowest read completes (fio nbd randread, iodepth 64 x 2, through a
/// cache over `O_DIRECT`, 3 interleaved rounds: 16 per batch 1.05-1.06x
/// the IOPS of 64).
pub const MAX_BATCH: usize = 16;

/// Most reads one connection keeps in flight
/// ([`Config::in_flight_reads`]).
pub const MAX_IN_FLIGHT: usize = 256;

/// Most reply bytes of the reads one connection keeps in flight (one read
/// is always allowed, up to [`REPLY_BUFFER`]): with the reply buffer and
/// the read buffer, below the budget of one worker, which also holds a
/// `WRITE`'s payload (never in flight with reads: a connection finishes
/// its reads before it takes any other request).
pub const IN_FLIGHT_BYTES: usize = MAX_BATCH_PAYLOAD;

/// Bytes of ciphertext a TLS connection holds besides its plaintext
/// buffers: the encrypted replies of one send (at most [`REPLY_BUFFER`]
/// plus record overhead, counted as twice it: rustls' copy and the one
/// sent) and the ciphertext received and not yet decrypted (256 KiB,
/// plus one record in rustls).
pub const TLS_OVERHEAD: usize = 2 * REPLY_BUFFER + 256 * 1024 + 64 * 1024;

/// The most memory one connection's buffers hold while it is served with
/// `workers` worker threads (`tls`: over TLS): the read buffer, and per
/// worker a batch's `WRITE` payloads (at most [`MAX_BATCH_PAYLOAD`] plus
/// one request's [`MAX_PAYLOAD`]) and its reply buffer; with TLS, the
/// ciphertext buffers on top. An idle connection holds none of it. A
/// connection whose reads are kept in flight (one thread) holds at most
/// the read buffer, its reply buffer and either one `WRITE`'s payload or
/// [`IN_FLIGHT_BYTES`] of reads (plus one reply): within one worker's
/// share.
///
/// ```
/// use kxarray_nbd::config::connection_budget;
/// // One worker (the RAM disks' default): 34.25 MiB.
/// assert_eq!(connection_budget(1, false), (34 << 20) + (256 << 10));
/// ```
pub fn connection_budget(workers: usize, tls: bool) -> u64 {
    let per_worker = MAX_PAYLOAD as usize + MAX_BATCH_PAYLOAD + REPLY_BUFFER;
    let tls = if tls { TLS_OVERHEAD } else { 0 };
    (READ_BUFFER + workers.max(1) * per_worker + tls) as u64
}

/// What a server is built with.
///
/// ```
/// use kxarray_nbd::Config;
/// let c = Config::new(4).max_connections(100);
/// assert_eq!((c.workers, c.max_connections), (4, 100));
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker threads per connection while it is served (see
    /// the server's `workers_for`).
    pub workers: usize,
    /// Time from connecting to the transmission phase.
    pub handshake_timeout: Duration,
    /// Connections open at once; more are refused.
    pub max_connections: usize,
    /// Quiet time after which a served connection gives its thread back.
    pub park_after: Duration,
    /// TLS (`NBD_OPT_STARTTLS`): `None` for none.
    pub tls: Option<Arc<Tls>>,
    /// Keep a connection's `READ`s in flight on one thread, each answered
    /// as it completes (for an export that can:
    /// [`Export::reads_in_flight`](crate::Export::reads_in_flight), in
    /// clear text), rather than in batches on [`workers`](Config::workers)
    /// threads. On by default.
    pub in_flight_reads: bool,
}

impl Config {
    /// The defaults, with `workers` threads per served connection.
    pub fn new(workers: usize) -> Self {
        Self {
            workers: workers.max(1),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            park_after: DEFAULT_PARK_AFTER,
            tls: None,
            in_flight_reads: true,
        }
    }

    /// Set the handshake deadline (at least a millisecond).
    pub fn handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t.max(Duration::from_millis(1));
        self
    }

    /// Set the cap on open connections (at least 1).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Set the quiet time after which a connection is parked (at least a
    /// millisecond).
    pub fn park_after(mut self, t: Duration) -> Self {
        self.park_after = t.max(Duration::from_millis(1));
        self
    }

    /// Keep reads in flight (`true`, the default) or serve them in
    /// batches on the workers (`false`); see [`Config::in_flight_reads`].
    pub fn in_flight_reads(mut self, on: bool) -> Self {
        self.in_flight_reads = on;
        self
    }

    /// Offer (or require) TLS.
    pub fn tls(mut self, tls: Option<Arc<Tls>>) -> Self {
        self.tls = tls;
        self
    }
}
