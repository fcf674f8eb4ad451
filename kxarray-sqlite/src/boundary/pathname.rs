//! The canonical name of a file, as `xFullPathname` gives it: the unix
//! VFS's `unixFullPathname` (`os_unix.c`), in Rust.
//!
//! Owns one function, [`full_pathname`]: a name made absolute against the
//! current directory, `.` and `..` removed component by component, and every
//! symbolic link met on the way replaced by its target (relative targets
//! against the link's directory), with the same limit on links followed as
//! SQLite's. A component that does not exist yet (a database about to be
//! created, its journal) is taken as it is.
//!
//! Why it matters: SQLite names a database's journal and WAL after the name
//! this returns, and the VFS keys its per-file state (locks, cache, WAL
//! index) by `(st_dev, st_ino)`. Two connections that reach one database
//! through two names (a symlink, `./`, `a/../`) must get one name, or one of
//! them writes `link.db-wal` beside `real.db-wal` and a crash leaves a hot
//! journal or WAL that an opener by the other name never sees.
//!
//! Invariant: the result is absolute, has no `.` or `..` component, no
//! doubled or trailing `/` (except the root itself), and none of its
//! existing prefixes is a symbolic link.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How many symbolic links one name may go through (SQLite's
/// `SQLITE_MAX_SYMLINK`); more is a loop or an attack.
pub(crate) const MAX_SYMLINKS: usize = 200;

/// Why a name has no canonical form.
#[derive(Debug)]
pub(crate) enum PathError {
    /// The current directory could not be read (a relative name).
    Cwd(io::Error),
    /// `lstat` or `readlink` failed other than with "does not exist".
    Io(PathBuf, io::Error),
    /// More than [`MAX_SYMLINKS`] links were followed.
    TooManyLinks(PathBuf),
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::Cwd(e) => write!(f, "the current directory: {e}"),
            PathError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            PathError::TooManyLinks(p) => write!(
                f,
                "{}: more than {MAX_SYMLINKS} symbolic links",
                p.display()
            ),
        }
    }
}

/// A canonical name under construction.
struct Builder {
    out: Vec<u8>,
    links: usize,
}

impl Builder {
    /// Append every component of `name` (absolute names restart at `/`).
    fn append_all(&mut self, name: &[u8]) -> Result<(), PathError> {
        if name.first() == Some(&b'/') {
            self.out.clear();
        }
        for part in name.split(|&b| b == b'/') {
            self.append_one(part)?;
        }
        Ok(())
    }

    /// Append one component, resolving it if it is a link.
    fn append_one(&mut self, part: &[u8]) -> Result<(), PathError> {
        match part {
            b"" | b"." => return Ok(()),
            b".." => {
                // Up one (the root's parent is the root).
                let cut = self.out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                self.out.truncate(cut);
                return Ok(());
            }
            _ => {}
        }
        let before = self.out.len();
        self.out.push(b'/');
        self.out.extend_from_slice(part);
        let here = Path::new(OsStr::from_bytes(&self.out));
        let meta = match std::fs::symlink_metadata(here) {
            Ok(m) => m,
            // Not there (yet): taken as it is, like the unix VFS.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(PathError::Io(here.to_path_buf(), e)),
        };
        if !meta.file_type().is_symlink() {
            return Ok(());
        }
        self.links += 1;
        if self.links > MAX_SYMLINKS {
            return Err(PathError::TooManyLinks(here.to_path_buf()));
        }
        let target = std::fs::read_link(here).map_err(|e| PathError::Io(here.to_path_buf(), e))?;
        // A relative target is relative to the link's directory.
        self.out.truncate(before);
        self.append_all(target.as_os_str().as_bytes())
    }
}

/// The canonical name of `name` (see the module notes) and whether a
/// symbolic link was followed on the way.
///
/// # Errors
/// [`PathError`]: the current directory unreadable for a relative name, an
/// `lstat`/`readlink` failure other than "not found", or a link chain
/// longer than [`MAX_SYMLINKS`] (a loop).
pub(crate) fn full_pathname(name: &Path) -> Result<(PathBuf, bool), PathError> {
    let mut b = Builder {
        out: Vec::with_capacity(256),
        links: 0,
    };
    let bytes = name.as_os_str().as_bytes();
    if bytes.first() != Some(&b'/') {
        let cwd = std::env::current_dir().map_err(PathError::Cwd)?;
        b.append_all(cwd.as_os_str().as_bytes())?;
    }
    b.append_all(bytes)?;
    if b.out.is_empty() {
        b.out.push(b'/');
    }
    let followed = b.links > 0;
    Ok((PathBuf::from(OsStr::from_bytes(&b.out)), followed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn full(p: &Path) -> (PathBuf, bool) {
        full_pathname(p).unwrap()
    }

    #[test]
    fn dots_and_slashes_go() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap();
        std::fs::create_dir(real.join("a")).unwrap();
        let messy = format!("{}//a/./../a/x.db", real.display());
        assert_eq!(full(Path::new(&messy)), (real.join("a/x.db"), false));
        assert_eq!(full(Path::new("/")), (PathBuf::from("/"), false));
        assert_eq!(full(Path::new("/..")), (PathBuf::from("/"), false));
        assert_eq!(full(Path::new("/tmp/..")), (PathBuf::from("/"), false));
    }

    #[test]
    fn relative_names_start_at_the_current_directory() {
        let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
        let (p, _) = full(Path::new("no-such-file.db"));
        assert_eq!(p, cwd.join("no-such-file.db"));
    }

    #[test]
    fn links_are_resolved_relative_and_absolute() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap();
        std::fs::create_dir(real.join("data")).unwrap();
        std::fs::write(real.join("data/real.db"), b"x").unwrap();
        // a relative link to a file, an absolute link to a directory, and
        // a link to a name that does not exist yet
        symlink("data/real.db", real.join("rel.db")).unwrap();
        symlink(real.join("data"), real.join("dir")).unwrap();
        symlink("data/new.db", real.join("dangling.db")).unwrap();
        assert_eq!(
            full(&real.join("rel.db")),
            (real.join("data/real.db"), true)
        );
        assert_eq!(
            full(&real.join("dir/real.db")),
            (real.join("data/real.db"), true)
        );
        assert_eq!(
            full(&real.join("dir/../rel.db")),
            (real.join("data/real.db"), true)
        );
        assert_eq!(
            full(&real.join("dangling.db")),
            (real.join("data/new.db"), true)
        );
        assert!(!full(&real.join("data/real.db")).1);
    }

    #[test]
    fn a_link_loop_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap();
        symlink("b", real.join("a")).unwrap();
        symlink("a", real.join("b")).unwrap();
        assert!(matches!(
            full_pathname(&real.join("a")),
            Err(PathError::TooManyLinks(_))
        ));
    }
}
