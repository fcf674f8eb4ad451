//! The one export a server offers: its name, description, backing store,
//! size and the transmission flags derived from them.
//!
//! Invariants: the size is read once, when the export is made, and every
//! connection sees the same size and flags; `NBD_FLAG_CAN_MULTI_CONN` is
//! set because all connections share one backend, so a flush on one
//! connection flushes the writes completed on every connection.

use std::io;
use std::sync::Arc;

use kxarray::backend::{Backend, ReadBuf};

use crate::batch::{read_each, read_now, ReadInFlight, ReadMany};
use crate::proto::{
    NBD_FLAG_CAN_MULTI_CONN, NBD_FLAG_HAS_FLAGS, NBD_FLAG_READ_ONLY, NBD_FLAG_SEND_FLUSH,
    NBD_FLAG_SEND_FUA, NBD_FLAG_SEND_TRIM, NBD_FLAG_SEND_WRITE_ZEROES,
};

/// A named backend served over NBD.
#[derive(Debug, Clone)]
pub struct Export {
    /// The export's name (`NBD_OPT_LIST`, `NBD_INFO_NAME`); the empty name
    /// also selects it.
    pub name: String,
    /// Description for humans (`NBD_INFO_DESCRIPTION`).
    pub description: String,
    /// Refuse writes (`NBD_FLAG_READ_ONLY`).
    pub read_only: bool,
    backend: Arc<dyn Backend>,
    /// The batch read of the same store, when it has one.
    reader: Option<Arc<dyn ReadMany>>,
    size: u64,
}

impl Export {
    /// An export of `backend` under `name`; its size is the backend's
    /// length now.
    ///
    /// # Errors
    /// The backend's error from [`Backend::len`].
    pub fn new(name: impl Into<String>, backend: Arc<dyn Backend>) -> io::Result<Self> {
        let size = backend.len()?;
        Ok(Self {
            name: name.into(),
            description: String::new(),
            read_only: false,
            backend,
            reader: None,
            size,
        })
    }

    /// Serve the `READ`s a worker takes together through `reader`, the
    /// batch read of the same store as the backend (the page cache's, or a
    /// file's submission side), rather than one `read_at` after the other.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kxarray::backend::FileBackend;
    /// use kxarray_nbd::Export;
    ///
    /// let file = Arc::new(FileBackend::from_file(tempfile::tempfile().unwrap()));
    /// let export = Export::new("", file.clone()).unwrap().with_read_many(file);
    /// assert!(export.batches_reads());
    /// ```
    pub fn with_read_many(mut self, reader: Arc<dyn ReadMany>) -> Self {
        self.reader = Some(reader);
        self
    }

    /// Whether grouped `READ`s go to a batch read ([`with_read_many`](Export::with_read_many)).
    pub fn batches_reads(&self) -> bool {
        self.reader.is_some()
    }

    /// Read every `(offset, buffer)` of `reqs`: through the batch read if
    /// the export has one, else one [`Backend::read_at`] after the other.
    /// One result per request, in order (fewer bytes than asked only at
    /// the end of the store).
    ///
    /// # Errors
    /// Per request, in its result.
    pub fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<usize>> {
        match &self.reader {
            Some(r) => r.read_many(reqs),
            None => read_each(&*self.backend, reqs),
        }
    }

    /// Start every `(offset, buffer)` of `reqs` without waiting
    /// ([`ReadMany::start_reads`]); an export without a batch read reads
    /// them now, one [`Backend::read_at`] after the other, and returns
    /// futures that are ready.
    ///
    /// # Errors
    /// Per request, in its future's output.
    pub fn start_reads(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<ReadInFlight> {
        match &self.reader {
            Some(r) => r.start_reads(reqs),
            None => read_now(reqs, |slices| read_each(&*self.backend, slices)),
        }
    }

    /// Whether the export's reads can be kept in flight
    /// ([`ReadMany::reads_in_flight`]).
    pub fn reads_in_flight(&self) -> bool {
        self.reader.as_ref().is_some_and(|r| r.reads_in_flight())
    }

    /// Set the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The backing store.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether a client asking for `name` gets this export (its own name or
    /// the empty default name).
    pub fn matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }

    /// The transmission flags every connection gets.
    pub fn transmission_flags(&self) -> u16 {
        let mut flags = NBD_FLAG_HAS_FLAGS
            | NBD_FLAG_SEND_FLUSH
            | NBD_FLAG_SEND_FUA
            | NBD_FLAG_SEND_TRIM
            | NBD_FLAG_SEND_WRITE_ZEROES
            | NBD_FLAG_CAN_MULTI_CONN;
        if self.read_only {
            flags |= NBD_FLAG_READ_ONLY;
        }
        flags
    }
}
