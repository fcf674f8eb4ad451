//! The process's limit on open files (`RLIMIT_NOFILE`), which caps how
//! many connections a server can hold (one descriptor each).
//!
//! Owns [`raise_nofile_limit`]. Invariant: only the soft limit changes,
//! and only upwards, to at most the hard limit.

use std::io;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (or to the kernel's
/// `nr_open` ceiling when the hard limit is unlimited); returns the soft
/// limit in force afterwards.
///
/// # Errors
/// As `getrlimit(2)`/`setrlimit(2)`.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable `rlimit` for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut target = lim.rlim_max;
    if target == libc::RLIM_INFINITY {
        target = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20);
    }
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < target {
        let new = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `new` is a valid `rlimit` read by the call only.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = target;
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_least_where_it_was() {
        let n = super::raise_nofile_limit().unwrap();
        assert!(n >= 64, "{n}");
        // Idempotent.
        assert_eq!(super::raise_nofile_limit().unwrap(), n);
    }
}
