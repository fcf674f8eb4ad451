//! An NBD (network block device) server for kxarray's backends, so that
//! standard clients (the kernel's `nbd-client`, `qemu`, libnbd and fio's
//! `nbd` engine) drive the crate's RAM disk and cached files unmodified.
//!
//! - [`proto`]: the wire protocol's constants and message layouts;
//! - [`handshake`]: the fixed-newstyle option haggling;
//! - [`transmission`]: requests and replies of one connection, many in
//!   flight;
//! - [`server`]: listeners, connections, shutdown;
//! - [`HashMapDisk`]: the baseline RAM disk (pages in a locked `HashMap`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use kxarray_nbd::{Export, HashMapDisk, Listener, Server};
//!
//! let export = Export::new("", Arc::new(HashMapDisk::new(1 << 30))).unwrap();
//! let workers = kxarray_nbd::workers_for(&export); // 1: a RAM disk
//! let server = Server::new(export, workers);
//! server.serve(Listener::unix("/tmp/nbd.sock").unwrap()).unwrap();
//! ```
#![warn(missing_docs)]

pub mod export;
pub mod handshake;
pub mod hashmap_disk;
pub mod proto;
pub mod server;
pub mod size;
pub mod socket;
pub mod transmission;

pub use export::Export;
pub use hashmap_disk::HashMapDisk;
pub use server::{workers_for, Server, ShutdownHandle, DEFAULT_WORKERS};
pub use size::parse_size;
pub use socket::{ListenAddr, Listener, Socket};
