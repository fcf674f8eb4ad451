//! The byte stream of a connection in the transmission phase: the socket
//! itself, or a TLS session over it, split so that one worker reads
//! requests while another sends replies.
//!
//! Owns [`Channel`] and its read-side buffer [`ReadSide`]. A plain channel
//! reads and writes the socket directly. A TLS channel keeps the rustls
//! session under a mutex that is held only to decrypt or encrypt, never
//! across a blocking socket call: the reader receives ciphertext into its
//! [`ReadSide`] without the lock and decrypts under it; a sender encrypts
//! under it into the caller's scratch buffer and sends after releasing it.
//! Invariants: the caller serialises reads (one [`ReadSide`], under the
//! transmission's reader lock) and sends (under its writer lock), so
//! ciphertext leaves in the order it was encrypted; the session mutex is
//! always taken last (reader or writer lock, then session), so the locks
//! cannot deadlock; a timeout of the socket's read reaches the caller as
//! `WouldBlock` with nothing consumed.

use std::io::{self, Read, Write};
use std::sync::{Mutex, MutexGuard};

use rustls::ServerConnection;

use crate::socket::Socket;

/// Bytes of ciphertext received per `read`: many records (each at most
/// 16 KiB of data plus its header and tag), so that a pipelining client's
/// requests are received, and decrypted into one batch, with one system
/// call, as in clear.
pub(crate) const RAW_BUFFER: usize = 256 * 1024;

/// A connection's stream in the transmission phase.
#[derive(Debug)]
pub(crate) struct Channel<'a> {
    socket: &'a Socket,
    tls: Option<Mutex<Box<ServerConnection>>>,
}

/// The reader's own state: ciphertext received and not yet decrypted.
#[derive(Debug)]
pub(crate) struct ReadSide {
    raw: Box<[u8]>,
    start: usize,
    end: usize,
}

impl ReadSide {
    /// An empty read side (no buffer for a plain channel).
    pub(crate) fn new(tls: bool) -> Self {
        let raw = if tls {
            vec![0u8; RAW_BUFFER].into_boxed_slice()
        } else {
            Box::default()
        };
        Self {
            raw,
            start: 0,
            end: 0,
        }
    }
}

fn lock(m: &Mutex<Box<ServerConnection>>) -> MutexGuard<'_, Box<ServerConnection>> {
    // A panic under this lock leaves a session rustls may consider
    // broken; its next call then fails and ends the connection.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<'a> Channel<'a> {
    /// A channel over `socket`, through `tls` when given.
    pub(crate) fn new(socket: &'a Socket, tls: Option<Box<ServerConnection>>) -> Self {
        Self {
            socket,
            tls: tls.map(Mutex::new),
        }
    }

    /// Whether this channel is encrypted.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TLS session back, to keep while the connection is idle.
    pub(crate) fn into_tls(self) -> Option<Box<ServerConnection>> {
        self.tls
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
    }

    /// Read plaintext into `buf`; `Ok(0)` at the end of the stream.
    ///
    /// # Errors
    /// `WouldBlock` when the socket's read timeout passed with nothing to
    /// return; `InvalidData` for a TLS error; others as the socket's.
    pub(crate) fn read(&self, side: &mut ReadSide, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return (&*self.socket).read(buf);
        };
        loop {
            {
                let mut s = lock(tls);
                match s.reader().read(buf) {
                    Ok(0) => return Ok(0),
                    Ok(n) => return Ok(n + Self::decrypt_more(&mut s, side, &mut buf[n..])),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if side.start < side.end {
                    let mut raw = &side.raw[side.start..side.end];
                    let n = s.read_tls(&mut raw)?;
                    side.start += n;
                    s.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    continue;
                }
            }
            side.start = 0;
            side.end = 0;
            let n = (&*self.socket).read(&mut side.raw)?;
            if n == 0 {
                // The end of the stream: rustls reports a clean close
                // (close_notify seen) as Ok(0), a truncation as an error.
                let mut s = lock(tls);
                s.read_tls(&mut io::empty())?;
                s.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                return s.reader().read(buf);
            }
            side.end = n;
        }
    }

    /// Decrypt the records already received into `buf` while it has room
    /// (no system call); the bytes added. Errors are left for the next
    /// [`Channel::read`] to report.
    fn decrypt_more(s: &mut ServerConnection, side: &mut ReadSide, buf: &mut [u8]) -> usize {
        let mut got = 0;
        while got < buf.len() {
            match s.reader().read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    continue;
                }
                Err(_) => {}
            }
            if side.start == side.end {
                break;
            }
            let mut raw = &side.raw[side.start..side.end];
            match s.read_tls(&mut raw) {
                Ok(n) => side.start += n,
                Err(_) => break,
            }
            if s.process_new_packets().is_err() {
                break;
            }
        }
        got
    }

    /// Send `data` whole. The caller holds the transmission's writer lock,
    /// whose `scratch` buffer receives the ciphertext of a TLS channel.
    ///
    /// # Errors
    /// As the socket's write, or a TLS error.
    pub(crate) fn send(&self, scratch: &mut Vec<u8>, data: &[u8]) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            return (&*self.socket).write_all(data);
        };
        scratch.clear();
        {
            let mut s = lock(tls);
            s.writer().write_all(data)?;
            while s.wants_write() {
                s.write_tls(scratch)?;
            }
        }
        (&*self.socket).write_all(scratch)
    }
}
