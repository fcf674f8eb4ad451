//! The error of reading the machine's memory limits: a file that could not
//! be read, or whose contents do not parse.
//!
//! Owns [`LimitsError`]. Invariant: every error names the file it came
//! from, and a file's contents are quoted at most [`QUOTE_MAX`] bytes long
//! (a garbage file of any size makes a short message).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Bytes of a bad file's contents quoted in a [`LimitsError::Parse`].
pub(crate) const QUOTE_MAX: usize = 64;

/// A memory limit file that could not be read or does not parse. Absent
/// files are not errors (they mean "no limit there"); see
/// [`MemoryLimits::read`](super::MemoryLimits::read).
///
/// ```
/// use kxarray::memory::{LimitsError, MemoryLimits};
///
/// let root = tempfile::tempdir().unwrap();
/// let proc_root = root.path().join("proc");
/// std::fs::create_dir_all(proc_root.join("self")).unwrap();
/// std::fs::write(proc_root.join("meminfo"), "MemTotal: lots\n").unwrap();
/// let e = MemoryLimits::read(&proc_root, &root.path().join("cgroup")).unwrap_err();
/// assert!(matches!(&e, LimitsError::Parse { path, .. } if path.ends_with("meminfo")));
/// assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::InvalidData);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitsError {
    /// Reading `path` failed (for a reason other than its absence).
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `path`'s contents are not what the kernel writes there.
    Parse {
        /// The file.
        path: PathBuf,
        /// The start of its contents (at most 64 bytes, lossily decoded).
        content: String,
        /// What was expected.
        expected: &'static str,
    },
}

impl LimitsError {
    /// A parse error quoting the start of `content`.
    pub(crate) fn parse(path: PathBuf, content: &[u8], expected: &'static str) -> LimitsError {
        let end = content.len().min(QUOTE_MAX);
        LimitsError::Parse {
            path,
            content: String::from_utf8_lossy(&content[..end]).into_owned(),
            expected,
        }
    }
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitsError::Io { path, source } => write!(f, "reading {}: {source}", path.display()),
            LimitsError::Parse {
                path,
                content,
                expected,
            } => write!(
                f,
                "{}: expected {expected}, found {content:?}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LimitsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitsError::Io { source, .. } => Some(source),
            LimitsError::Parse { .. } => None,
        }
    }
}

impl From<LimitsError> for io::Error {
    /// [`LimitsError::Io`] keeps its error's kind; a parse error is
    /// [`io::ErrorKind::InvalidData`].
    fn from(e: LimitsError) -> io::Error {
        let kind = match &e {
            LimitsError::Io { source, .. } => source.kind(),
            LimitsError::Parse { .. } => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}
