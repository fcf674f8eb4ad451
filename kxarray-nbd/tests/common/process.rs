//! The `kxarray-nbd` binary as a child process, for what only a process
//! shows: its resident memory and thread count (from /proc), and how it
//! ends on SIGTERM. `KXARRAY_NBD_TEST_BIN` runs the tests against another
//! build (for example the server before a change, to see a test fail).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kxarray_nbd::ListenAddr;

/// The binary under test.
pub fn binary() -> PathBuf {
    std::env::var_os("KXARRAY_NBD_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kxarray-nbd")))
}

/// A running server process.
pub struct Process {
    pub child: Child,
    pub addr: ListenAddr,
    pub dir: tempfile::TempDir,
}

/// The server's log file (a file, not a pipe nobody reads, which could
/// fill and block the server).
fn log(dir: &tempfile::TempDir) -> std::fs::File {
    std::fs::File::create(dir.path().join("server.log")).unwrap()
}

/// Start the server on a Unix socket in a new temporary directory with
/// `args` (and `env`), and wait until it accepts.
pub fn spawn_unix(args: &[&str], env: &[(&str, &str)]) -> Process {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .arg("--unix")
        .arg(&sock)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log(&dir));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start the server");
    let addr = ListenAddr::Unix(sock);
    let mut p = Process { child, addr, dir };
    p.wait_ready();
    p
}

/// Start the server on a free TCP port of 127.0.0.1.
pub fn spawn_tcp(args: &[&str], env: &[(&str, &str)]) -> Process {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .args(["--listen", &listen])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log(&dir));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start the server");
    let addr = ListenAddr::Tcp(listen.parse().unwrap());
    let mut p = Process { child, addr, dir };
    p.wait_ready();
    p
}

impl Process {
    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if self.addr.connect().is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("server exited at start: {status}\n{}", self.stderr());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "server not ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of /proc/PID/status, as a number (kB for memory).
    fn status(&self, field: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }

    /// Resident memory, bytes.
    pub fn rss(&self) -> u64 {
        self.status("VmRSS:") * 1024
    }

    /// Threads.
    pub fn threads(&self) -> u64 {
        self.status("Threads:")
    }

    /// Send `signal`.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid, which it cannot outlive
        // before `wait` (no pid reuse), with a valid signal number.
        let r = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(r, 0, "kill");
    }

    /// Wait up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// What the server logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("server.log")).unwrap_or_default()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `path` exists.
pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}
