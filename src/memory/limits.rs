//! The memory the process may use: physical memory and its cgroup's
//! limits.
//!
//! Owns [`MemoryLimits`] (reading them from a `/proc` and a cgroup root,
//! real or fake) and [`Bound`] (which of them binds). Invariants: an
//! absent file is a limit not set, never an error; a present file that
//! does not parse is a [`LimitsError`], never a panic or a guess.

use super::cgroup::{self, CgroupLimit};
use super::error::LimitsError;
use std::path::{Path, PathBuf};

/// The memory limits that apply to this process: physical memory and the
/// tightest cgroup limits of its cgroup and every ancestor.
///
/// Read from a real system with [`from_system`](Self::from_system), or
/// from any `/proc` and cgroup root with [`read`](Self::read) (tests and
/// examples build a fake tree in a temporary directory):
///
/// ```
/// use kxarray::memory::{Bound, MemoryLimits};
/// use std::fs;
///
/// let tmp = tempfile::tempdir().unwrap();
/// let (proc_root, cg) = (tmp.path().join("proc"), tmp.path().join("cgroup"));
/// fs::create_dir_all(proc_root.join("self")).unwrap();
/// fs::write(proc_root.join("meminfo"), "MemTotal:       16777216 kB\n").unwrap();
/// fs::write(proc_root.join("self/cgroup"), "0::/app.slice/db.service\n").unwrap();
/// fs::create_dir_all(cg.join("app.slice/db.service")).unwrap();
/// fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
/// fs::write(cg.join("app.slice/memory.max"), "2147483648\n").unwrap(); // the parent: 2 GiB
/// fs::write(cg.join("app.slice/db.service/memory.max"), "max\n").unwrap(); // no limit of its own
/// fs::write(cg.join("app.slice/db.service/memory.high"), "1610612736\n").unwrap();
///
/// let limits = MemoryLimits::read(&proc_root, &cg).unwrap();
/// assert_eq!(limits.physical, Some(16 << 30));
/// assert_eq!(limits.max.as_ref().unwrap().bytes, 2 << 30); // the parent's binds
/// assert_eq!(limits.high.as_ref().unwrap().bytes, 1536 << 20);
/// assert_eq!(limits.budget(), Some((1536 << 20, Bound::CgroupHigh)));
/// assert_eq!(limits.cgroup, Some(cg.join("app.slice/db.service")));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Physical memory in bytes (`MemTotal` in `/proc/meminfo`).
    pub physical: Option<u64>,
    /// The hard limit: the smallest `memory.max` of the process's cgroup
    /// v2 and its ancestors, or on a hybrid host the smallest cgroup v1
    /// `memory.limit_in_bytes` (the lower of the two if both exist).
    pub max: Option<CgroupLimit>,
    /// The throttling limit: the smallest cgroup v2 `memory.high` of the
    /// process's cgroup and its ancestors (above it the kernel reclaims
    /// and slows the cgroup down).
    pub high: Option<CgroupLimit>,
    /// The process's cgroup v2 directory (where its `memory.pressure` is),
    /// if a v2 hierarchy is mounted.
    pub cgroup: Option<PathBuf>,
}

/// Which limit binds the memory budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bound {
    /// Physical memory: no cgroup limit is lower.
    Physical,
    /// The cgroup's hard limit ([`MemoryLimits::max`]).
    CgroupMax,
    /// The cgroup's throttling limit ([`MemoryLimits::high`]).
    CgroupHigh,
    /// Nothing is known: no limit and no physical memory size was found.
    Unknown,
}

impl MemoryLimits {
    /// The limits of this process on this machine: [`read`](Self::read)
    /// from `/proc` and `/sys/fs/cgroup`, with physical memory from
    /// `sysconf` when `/proc/meminfo` is absent.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    ///
    /// ```
    /// use kxarray::memory::MemoryLimits;
    ///
    /// let limits = MemoryLimits::from_system().unwrap();
    /// if let Some((bytes, bound)) = limits.budget() {
    ///     println!("this process may use {bytes} bytes ({bound:?})");
    /// }
    /// ```
    pub fn from_system() -> Result<MemoryLimits, LimitsError> {
        let mut limits = MemoryLimits::read(Path::new("/proc"), Path::new("/sys/fs/cgroup"))?;
        if limits.physical.is_none() {
            limits.physical = sysconf_physical();
        }
        Ok(limits)
    }

    /// The limits found under `proc_root` (`self/cgroup`, `meminfo`) and
    /// `cgroup_root` (the mount point of the cgroup hierarchies,
    /// `/sys/fs/cgroup` on a real system).
    ///
    /// The process's cgroup is the `0::/path` line of
    /// `proc_root/self/cgroup`; its directory is `cgroup_root/path` (or
    /// `cgroup_root/unified/path` on a hybrid host, whose v2 hierarchy is
    /// mounted there), and its limits are the smallest found in it and in
    /// each ancestor up to the root, since a parent's limit binds its
    /// children. "max" is no limit. On a hybrid host the v1 memory
    /// controller's line (`N:memory:/path`) is read too, from
    /// `cgroup_root/memory/path/memory.limit_in_bytes` and its ancestors.
    /// If the path does not exist under the root (a container that mounts
    /// its own cgroup as the root without a cgroup namespace), the
    /// longest tail of it that exists is used, down to the root itself.
    ///
    /// # Errors
    /// [`LimitsError::Parse`] naming a file that exists but does not hold
    /// what the kernel writes there (any garbage is an error, never a
    /// panic); [`LimitsError::Io`] for a file that exists but cannot be
    /// read. Absent files are limits not set, not errors: an empty
    /// `proc_root` gives `MemoryLimits::default()`.
    ///
    /// ```
    /// use kxarray::memory::MemoryLimits;
    ///
    /// let empty = tempfile::tempdir().unwrap();
    /// let limits = MemoryLimits::read(empty.path(), empty.path()).unwrap();
    /// assert_eq!(limits, MemoryLimits::default()); // nothing known
    /// assert_eq!(limits.budget(), None);
    /// ```
    pub fn read(proc_root: &Path, cgroup_root: &Path) -> Result<MemoryLimits, LimitsError> {
        let physical = read_meminfo(&proc_root.join("meminfo"))?;
        let dirs = cgroup::locate(proc_root, cgroup_root)?;
        let (mut max, mut high) = (None, None);
        if let Some(dir) = &dirs.v2 {
            const EXPECTED: &str = "\"max\" or a decimal number of bytes";
            max = cgroup::tightest(dir, "memory.max", cgroup::parse_v2_limit, EXPECTED)?;
            high = cgroup::tightest(dir, "memory.high", cgroup::parse_v2_limit, EXPECTED)?;
        }
        if let Some(dir) = &dirs.v1_memory {
            const EXPECTED: &str = "a decimal number of bytes";
            let v1 = cgroup::tightest(
                dir,
                "memory.limit_in_bytes",
                cgroup::parse_v1_limit,
                EXPECTED,
            )?;
            max = match (max, v1) {
                (Some(a), Some(b)) => Some(if b.bytes < a.bytes { b } else { a }),
                (a, b) => a.or(b),
            };
        }
        Ok(MemoryLimits {
            physical,
            max,
            high,
            cgroup: dirs.v2.map(|d| d.path()),
        })
    }

    /// The memory this process may use and which limit binds it: the
    /// smallest of physical memory, `max` and `high` (ties go to the
    /// first of them in that order); `None` if none is known.
    ///
    /// ```
    /// use kxarray::memory::{Bound, CgroupLimit, MemoryLimits};
    ///
    /// let limits = MemoryLimits {
    ///     physical: Some(8 << 30),
    ///     max: Some(CgroupLimit { bytes: 1 << 30, file: "memory.max".into() }),
    ///     ..MemoryLimits::default()
    /// };
    /// assert_eq!(limits.budget(), Some((1 << 30, Bound::CgroupMax)));
    /// ```
    pub fn budget(&self) -> Option<(u64, Bound)> {
        [
            (self.physical, Bound::Physical),
            (self.max.as_ref().map(|l| l.bytes), Bound::CgroupMax),
            (self.high.as_ref().map(|l| l.bytes), Bound::CgroupHigh),
        ]
        .into_iter()
        .filter_map(|(b, bound)| b.map(|b| (b, bound)))
        .min_by_key(|&(b, _)| b)
    }
}

/// `MemTotal` from a `meminfo` file, in bytes; `None` if the file is
/// absent.
fn read_meminfo(path: &Path) -> Result<Option<u64>, LimitsError> {
    let Some(bytes) = cgroup::read_small(path)? else {
        return Ok(None);
    };
    const EXPECTED: &str = "a line `MemTotal: <n> kB`";
    let total = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.trim().strip_suffix("kB"))
                .and_then(|n| cgroup::decimal(n.trim()))
        })
        .and_then(|kb| kb.checked_mul(1024));
    match total {
        Some(t) => Ok(Some(t)),
        None => Err(LimitsError::parse(path.to_path_buf(), &bytes, EXPECTED)),
    }
}

/// Physical memory from `sysconf(_SC_PHYS_PAGES) * _SC_PAGESIZE`.
#[cfg(target_os = "linux")]
fn sysconf_physical() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages > 0 && page > 0).then(|| (pages as u64).saturating_mul(page as u64))
}

#[cfg(not(target_os = "linux"))]
fn sysconf_physical() -> Option<u64> {
    None
}
