//! The kernel's pressure stall information as a [`PressureSource`]: a
//! trigger written to a `memory.pressure` file, then `poll` for `POLLPRI`.
//!
//! Owns [`Psi`]: opening the process's cgroup v2 `memory.pressure` (or
//! `/proc/pressure/memory`), writing the trigger, and waiting on it beside
//! a [`StopSignal`]. Invariants: the trigger lives as long as the open
//! file (the kernel removes it on close); a wait blocks in `poll` with no
//! busy loop (the kernel reports each event once, so a returned stall is
//! never reported again); an error reported on the file ends the source.

use super::cgroup;
use super::poll::{self, StopSignal};
use super::source::{PressureSource, Wait};
use super::trigger::Trigger;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A PSI trigger on a memory pressure file.
///
/// ```no_run
/// use kxarray::memory::{Psi, PressureSource, StopSignal, Trigger, Wait};
/// use std::path::Path;
/// use std::time::Duration;
///
/// let mut psi = Psi::for_process(Path::new("/proc"), Path::new("/sys/fs/cgroup"), &Trigger::default())?;
/// println!("watching {}", psi.describe());
/// let stop = StopSignal::new()?;
/// if psi.wait(Some(Duration::from_secs(5)), &stop)? == Wait::Stall {
///     println!("memory is short");
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Psi {
    file: File,
    path: PathBuf,
    trigger: Trigger,
}

impl Psi {
    /// Write `trigger` to the pressure file at `path`. If the kernel
    /// refuses it (`EINVAL`) and its window is not a multiple of 2 s, the
    /// trigger is tried again with the window rounded up (what an
    /// unprivileged process may use); [`trigger`](Self::trigger) says
    /// which one is in place.
    ///
    /// # Errors
    /// Opening the file (`NotFound` where the kernel has no PSI or the
    /// cgroup has no such file) or writing the trigger (`InvalidInput`
    /// when the kernel refuses it, `Unsupported` when PSI is disabled).
    pub fn open(path: &Path, trigger: &Trigger) -> io::Result<Psi> {
        match Psi::open_exact(path, trigger) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => match trigger.unprivileged() {
                Some(t) => Psi::open_exact(path, &t),
                None => Err(e),
            },
            r => r,
        }
    }

    fn open_exact(path: &Path, trigger: &Trigger) -> io::Result<Psi> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        // One write with a terminating NUL: /proc/pressure/* replaces the
        // last byte written by a NUL, cgroup files take it as the end.
        let line = format!("{trigger}\0");
        let n = file.write(line.as_bytes())?;
        if n != line.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "the trigger was written in part ({n} of {} bytes)",
                    line.len()
                ),
            ));
        }
        Ok(Psi {
            file,
            path: path.to_path_buf(),
            trigger: *trigger,
        })
    }

    /// The process's memory pressure: `memory.pressure` in its cgroup v2
    /// directory under `cgroup_root` (found from `proc_root/self/cgroup`,
    /// as [`MemoryLimits::read`](super::MemoryLimits::read) does), or when
    /// that is absent or refuses the trigger, the system's
    /// `proc_root/pressure/memory`.
    ///
    /// # Errors
    /// When neither accepts the trigger: an error of the first one's kind
    /// whose message says what each attempt met.
    pub fn for_process(proc_root: &Path, cgroup_root: &Path, trigger: &Trigger) -> io::Result<Psi> {
        let mut candidates = Vec::new();
        if let Ok(dirs) = cgroup::locate(proc_root, cgroup_root) {
            if let Some(dir) = dirs.v2 {
                candidates.push(dir.path().join("memory.pressure"));
            }
        }
        candidates.push(proc_root.join("pressure").join("memory"));
        let mut failures: Vec<(PathBuf, io::Error)> = Vec::new();
        for path in candidates {
            match Psi::open(&path, trigger) {
                Ok(psi) => return Ok(psi),
                Err(e) => failures.push((path, e)),
            }
        }
        let kind = failures[0].1.kind();
        let why: Vec<String> = failures
            .iter()
            .map(|(p, e)| format!("{}: {e}", p.display()))
            .collect();
        Err(io::Error::new(kind, why.join("; ")))
    }

    /// The pressure file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The trigger in place (the one asked for, or its 2 s form).
    pub fn trigger(&self) -> &Trigger {
        &self.trigger
    }
}

impl PressureSource for Psi {
    fn wait(&mut self, timeout: Option<Duration>, stop: &StopSignal) -> io::Result<Wait> {
        let mut fds = [
            poll::pollfd(self.file.as_fd(), libc::POLLPRI),
            poll::pollfd(stop.as_fd(), libc::POLLIN),
        ];
        poll::poll(&mut fds, timeout)?;
        if fds[1].revents != 0 {
            return Ok(Wait::Stop);
        }
        let r = fds[0].revents;
        if r & (libc::POLLERR | libc::POLLNVAL) != 0 {
            return Err(io::Error::other(format!(
                "{} reported an error (its cgroup removed?)",
                self.path.display()
            )));
        }
        Ok(if r & libc::POLLPRI != 0 {
            Wait::Stall
        } else {
            Wait::Timeout
        })
    }

    fn describe(&self) -> String {
        format!("{} ({})", self.path.display(), self.trigger)
    }
}
