//! A growable in-memory backend for the page-cache tests, with fault
//! injection (fail all writes, writes overlapping a range, the next N
//! writes, flushes) and an awkward mode (short transfers and `EINTR`).

#![allow(dead_code)]

use kxarray::backend::Backend;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// A `Vec<u8>` file.
#[derive(Debug, Default)]
pub(crate) struct MemBackend {
    pub data: Mutex<Vec<u8>>,
    pub fail_all: AtomicBool,
    pub fail_range: Mutex<Option<Range<u64>>>,
    pub fail_next: AtomicU64,
    pub fail_flush: AtomicBool,
    pub fail_reads: AtomicBool,
    /// Return at most 100 bytes per call and `EINTR` every third call.
    pub awkward: AtomicBool,
    calls: AtomicU64,
    pub writes: AtomicU64,
    pub written: AtomicU64,
    /// `flush` calls.
    pub flushes: AtomicU64,
}

impl MemBackend {
    pub(crate) fn new() -> Self {
        Self::default()
    }
    pub(crate) fn contents(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }
    fn awkward_step(&self) -> io::Result<Option<usize>> {
        if !self.awkward.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if self.calls.fetch_add(1, Ordering::Relaxed) % 3 == 2 {
            return Err(io::ErrorKind::Interrupted.into());
        }
        Ok(Some(100))
    }
}

impl Backend for MemBackend {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.fail_reads.load(Ordering::Relaxed) {
            return Err(io::Error::other("injected read error"));
        }
        let cap = self.awkward_step()?.unwrap_or(usize::MAX);
        let d = self.data.lock().unwrap();
        if offset >= d.len() as u64 {
            return Ok(0);
        }
        let at = offset as usize;
        let n = buf.len().min(d.len() - at).min(cap);
        buf[..n].copy_from_slice(&d[at..at + n]);
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let end = offset + buf.len() as u64;
        if self.fail_all.load(Ordering::Relaxed) {
            return Err(io::Error::other("injected write error (all)"));
        }
        if let Some(r) = self.fail_range.lock().unwrap().clone() {
            if offset < r.end && r.start < end {
                return Err(io::Error::other("injected write error (range)"));
            }
        }
        if self
            .fail_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::other("injected write error (next)"));
        }
        let cap = self.awkward_step()?.unwrap_or(usize::MAX);
        let n = buf.len().min(cap);
        let mut d = self.data.lock().unwrap();
        let at = offset as usize;
        if d.len() < at + n {
            d.resize(at + n, 0);
        }
        d[at..at + n].copy_from_slice(&buf[..n]);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        if self.fail_flush.load(Ordering::Relaxed) {
            return Err(io::Error::other("injected flush error"));
        }
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.data.lock().unwrap().len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.data.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
}
