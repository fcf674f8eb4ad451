//! An NBD (network block device) server for kxarray's backends, so that
//! standard clients (the kernel's `nbd-client`, `qemu`, libnbd and fio's
//! `nbd` engine) drive the crate's RAM disk and cached files unmodified.
//!
//! - [`proto`]: the wire protocol's constants and message layouts;
//! - [`handshake`]: the fixed-newstyle option haggling (with
//!   `NBD_OPT_STARTTLS`), in steps under one deadline;
//! - [`transmission`]: requests and replies of one connection, many in
//!   flight, within a byte budget;
//! - [`batch`]: the `READ`s a worker took together, served by one batch
//!   read (the page cache's, or the I/O engine's), or started together
//!   and kept in flight;
//! - [`pipeline`]: a connection's reads in flight on one thread, each
//!   answered as it completes (cached and plain files, in clear text);
//! - [`server`]: the event loop for idle connections, pool threads for
//!   busy ones, the connection cap, shutdown;
//! - [`config`]: the limits, and the memory a connection may use;
//! - [`tls`]: certificates and the rustls configuration;
//! - [`HashMapDisk`]: the baseline RAM disk (pages in a locked `HashMap`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use kxarray_nbd::{Config, Export, HashMapDisk, Listener, Server};
//!
//! let export = Export::new("", Arc::new(HashMapDisk::new(1 << 30))).unwrap();
//! let workers = kxarray_nbd::workers_for(&export); // 1: a RAM disk
//! let server = Server::new(export, Config::new(workers)).unwrap();
//! server.serve(vec![Listener::unix("/tmp/nbd.sock").unwrap()]).unwrap();
//! ```
#![warn(missing_docs)]

pub mod batch;
mod channel;
pub mod config;
mod connection;
pub mod export;
pub mod handshake;
pub mod hashmap_disk;
mod inflight;
pub mod memory;
pub mod pipeline;
mod pool;
pub mod proto;
mod reactor;
pub mod rlimit;
pub mod server;
pub mod size;
pub mod socket;
pub mod tls;
pub mod transmission;

pub use batch::ReadMany;
pub use config::Config;
pub use export::Export;
pub use hashmap_disk::HashMapDisk;
pub use rlimit::raise_nofile_limit;
pub use server::{workers_for, Server, ShutdownHandle, DEFAULT_WORKERS};
pub use size::parse_size;
pub use socket::{ListenAddr, Listener, Socket};
pub use tls::{Tls, TlsMode};
