//! The two transports, TCP and Unix stream sockets, behind one type.
//!
//! Owns [`Socket`] (a connected stream) and [`Listener`] (a bound
//! listener). Invariants: every handle made by [`Socket::try_clone`]
//! refers to the same kernel socket, so a `shutdown` through one wakes a
//! thread blocked reading through another; a connected socket is in
//! blocking mode (its waits are bounded by its read and write timeouts),
//! a listener in non-blocking mode (the server's event loop accepts until
//! `WouldBlock`); a Unix listener removes its socket file when dropped
//! only if the path still names the socket it bound (never one that
//! replaced it after the path was deleted).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// A connected stream socket.
#[derive(Debug)]
pub enum Socket {
    /// TCP.
    Tcp(TcpStream),
    /// Unix domain stream socket.
    Unix(UnixStream),
}

impl Socket {
    /// Another handle to the same socket.
    ///
    /// # Errors
    /// As `dup(2)`.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Tcp(s) => Self::Tcp(s.try_clone()?),
            Self::Unix(s) => Self::Unix(s.try_clone()?),
        })
    }

    /// Shut down one or both directions.
    ///
    /// # Errors
    /// As `shutdown(2)` (`NotConnected` once the peer is gone).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.shutdown(how),
            Self::Unix(s) => s.shutdown(how),
        }
    }

    /// Bound every blocking read (`None`: wait for ever); a read that
    /// times out fails with `WouldBlock` (Linux's `EAGAIN`).
    ///
    /// # Errors
    /// As `setsockopt(SO_RCVTIMEO)`.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(timeout),
            Self::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    /// Bound every blocking write (`None`: wait for ever).
    ///
    /// # Errors
    /// As `setsockopt(SO_SNDTIMEO)`.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_write_timeout(timeout),
            Self::Unix(s) => s.set_write_timeout(timeout),
        }
    }

    /// Whether a read would return at once (data, end of stream or an
    /// error is waiting), asked without blocking (`poll(2)`, no timeout).
    pub fn readable_now(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid, initialised `pollfd` that lives
        // across the call, and the count passed is 1; poll(2) only writes
        // its `revents`.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents != 0
    }

    /// Read what has arrived into `buf` without waiting (`recv(2)` with
    /// `MSG_DONTWAIT`); `Ok(0)` at the end of the stream.
    ///
    /// # Errors
    /// `WouldBlock` when nothing has arrived; others as `recv(2)`.
    pub fn recv_nowait(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: `buf` is a valid, writable region of `buf.len()`
            // bytes for the whole call; recv(2) writes at most that many.
            let n = unsafe {
                libc::recv(
                    self.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                // Non-negative and at most `buf.len()`: lossless.
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// The peer, for logs.
    pub fn peer(&self) -> String {
        match self {
            Self::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp:?".into(), |a| a.to_string()),
            Self::Unix(_) => "unix".into(),
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for &Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).read(buf),
            Socket::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).write(buf),
            Socket::Unix(s) => (&*s).write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).write_vectored(bufs),
            Socket::Unix(s) => (&*s).write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A bound listener (non-blocking: [`Listener::accept`] returns
/// `WouldBlock` when no connection waits).
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix domain socket at a path.
    Unix(UnixListener, UnixPath),
}

/// The path of a Unix listener and the identity (device, inode) of the
/// socket file it created there.
#[derive(Debug)]
pub struct UnixPath {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

/// Where a listener is, so that it can be woken by connecting to it.
#[derive(Debug, Clone)]
pub enum ListenAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Listener {
    /// Bind a TCP listener.
    ///
    /// # Errors
    /// As `bind(2)`/`listen(2)`.
    pub fn tcp(addr: &str) -> io::Result<Self> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(Self::Tcp(l))
    }

    /// Bind a Unix socket at `path`, replacing a stale socket file left by
    /// a server that is gone (one nobody answers on).
    ///
    /// # Errors
    /// `AddrInUse` when a live server listens there; `AlreadyExists` when
    /// something other than a socket (a regular file, a directory) is
    /// there, which is never replaced; or as `bind(2)`.
    pub fn unix(path: impl Into<PathBuf>) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        let path = path.into();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            let t = meta.file_type();
            if !t.is_socket() {
                let what = if t.is_dir() {
                    "a directory"
                } else if t.is_file() {
                    "a regular file"
                } else if t.is_symlink() {
                    "a symbolic link"
                } else {
                    "not a socket"
                };
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} is {what}, not a socket: give a path to make the socket at",
                        path.display()
                    ),
                ));
            }
            if UnixStream::connect(&path).is_err() {
                std::fs::remove_file(&path)?;
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a server already listens on {}", path.display()),
                ));
            }
        }
        let l = UnixListener::bind(&path)?;
        l.set_nonblocking(true)?;
        let id = std::fs::symlink_metadata(&path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        Ok(Self::Unix(l, UnixPath { path, id }))
    }

    /// The address to connect to.
    ///
    /// # Errors
    /// As `getsockname(2)`.
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        Ok(match self {
            Self::Tcp(l) => ListenAddr::Tcp(l.local_addr()?),
            Self::Unix(_, p) => ListenAddr::Unix(p.path.clone()),
        })
    }

    /// Take the next waiting connection (in blocking mode).
    ///
    /// # Errors
    /// `WouldBlock` when none waits; otherwise as `accept(2)`.
    pub fn accept(&self) -> io::Result<Socket> {
        Ok(match self {
            Self::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
            Self::Unix(l, _) => Socket::Unix(l.accept()?.0),
        })
    }
}

impl ListenAddr {
    /// Connect to it (wakes a thread blocked in `accept`).
    ///
    /// # Errors
    /// As `connect(2)`.
    pub fn connect(&self) -> io::Result<Socket> {
        Ok(match self {
            Self::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
            Self::Unix(p) => Socket::Unix(UnixStream::connect(p)?),
        })
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "tcp://{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Self::Tcp(l) => l.as_raw_fd(),
            Self::Unix(l, _) => l.as_raw_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Self::Unix(_, UnixPath { path, id }) = self {
            // Only the socket file this listener made: the path may have
            // been deleted (and perhaps reused) while it ran. A failure
            // only leaves a stale file that the next `Listener::unix`
            // replaces.
            let now = std::fs::symlink_metadata(&*path)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            if now.is_some() && now == *id {
                let _ = std::fs::remove_file(&*path);
            }
        }
    }
}
