//! The two transports, TCP and Unix stream sockets, behind one type.
//!
//! Owns [`Socket`] (a connected stream) and [`Listener`] (a bound
//! listener). Invariants: every handle made by [`Socket::try_clone`]
//! refers to the same kernel socket, so a `shutdown` through one wakes a
//! thread blocked reading through another.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

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

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix domain socket at a path.
    Unix(UnixListener, PathBuf),
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
        Ok(Self::Tcp(TcpListener::bind(addr)?))
    }

    /// Bind a Unix socket at `path`, replacing a stale socket file left by
    /// a server that is gone (one nobody answers on).
    ///
    /// # Errors
    /// `AddrInUse` when a live server listens there, or as `bind(2)`.
    pub fn unix(path: impl Into<PathBuf>) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        let path = path.into();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if meta.file_type().is_socket() && UnixStream::connect(&path).is_err() {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(Self::Unix(UnixListener::bind(&path)?, path))
    }

    /// The address to connect to.
    ///
    /// # Errors
    /// As `getsockname(2)`.
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        Ok(match self {
            Self::Tcp(l) => ListenAddr::Tcp(l.local_addr()?),
            Self::Unix(_, p) => ListenAddr::Unix(p.clone()),
        })
    }

    /// Wait for the next connection.
    ///
    /// # Errors
    /// As `accept(2)`.
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

impl Drop for Listener {
    fn drop(&mut self) {
        if let Self::Unix(_, path) = self {
            // The socket file is ours; a failure only leaves a stale file
            // that the next `Listener::unix` replaces.
            let _ = std::fs::remove_file(path);
        }
    }
}
