//! The user's private runtime directory and the files in it: where the
//! processes of one user meet (the shared memory budget's registry), and
//! no other user can create, replace, read or write a name.
//!
//! Owns [`RuntimeDir`] (an open, checked directory: its descriptor is what
//! every later open is relative to) and [`RuntimeDir::open_file`] (a
//! regular file in it, opened or created and checked).
//!
//! Where: `$XDG_RUNTIME_DIR/kxarray` when `$XDG_RUNTIME_DIR` is the user's
//! (the XDG base directory rules: owned by the user, mode 0700; systemd's
//! `/run/user/<uid>`), else `/dev/shm/kxarray-<euid>`. Both are made with
//! `mkdir(0700)` when absent and then checked; nothing is ever created
//! outside them.
//!
//! Invariants:
//! - a `RuntimeDir` is a directory opened with `O_NOFOLLOW | O_DIRECTORY`
//!   whose `fstat` says it is owned by the effective user and has no group
//!   or other permission bits; it is never reached through a symlink at
//!   its last component, and what its path names later (a rename, a new
//!   directory) does not matter: every file is opened relative to the
//!   descriptor (`openat`);
//! - a file is opened with `O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK |
//!   O_NOCTTY` (a symlink fails, a FIFO does not block the open), created
//!   only with `O_CREAT | O_EXCL` (mode 0600), and kept only if `fstat`
//!   says it is a regular file, owned by the effective user, with no
//!   group or other permission bits, one link, and at most the size the
//!   caller allows; anything else is a [`Refused`] naming what was found,
//!   and the file is left as it is.

use std::ffi::{CString, OsStr};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The shared directory the per-user directory is made in when
/// `$XDG_RUNTIME_DIR` is not the user's.
pub const SHARED_DIR: &str = "/dev/shm";

/// What was found where a private directory or file was expected.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refused {
    /// A system call failed (`ENOENT`, `EACCES`, ...).
    Io(io::Error),
    /// A symbolic link.
    Symlink,
    /// Not a directory (for a directory) or not a regular file (for a
    /// file): what it is (`"directory"`, `"FIFO"`, `"socket"`, ...).
    Kind(&'static str),
    /// Owned by another user.
    Owner {
        /// Its owner.
        uid: u32,
        /// The effective user.
        euid: u32,
    },
    /// Group or others may use it: its permission bits.
    Mode(u32),
    /// Hard links to it elsewhere.
    Links(u64),
    /// Larger than the caller allows.
    Size {
        /// Its size.
        len: u64,
        /// The most allowed.
        max: u64,
    },
    /// Not a single path component (empty, `.`, `..`, a `/` or a NUL).
    Name,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Io(e) => write!(f, "{e}"),
            Refused::Symlink => f.write_str("a symbolic link"),
            Refused::Kind(k) => write!(f, "a {k}"),
            Refused::Owner { uid, euid } => write!(f, "owned by uid {uid}, not {euid}"),
            Refused::Mode(m) => write!(f, "mode {m:04o} (others may use it)"),
            Refused::Links(n) => write!(f, "{n} hard links"),
            Refused::Size { len, max } => write!(f, "{len} bytes (at most {max} expected)"),
            Refused::Name => f.write_str("not a file name"),
        }
    }
}

/// Why a private directory or file could not be used: the path and what
/// was found there. One line: `<path>: <what>`.
#[derive(Debug)]
pub struct RuntimeError {
    /// The path tried.
    pub path: PathBuf,
    /// What was found.
    pub refused: Refused,
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.refused)
    }
}

impl std::error::Error for RuntimeError {}

impl RuntimeError {
    fn new(path: &Path, refused: Refused) -> RuntimeError {
        RuntimeError {
            path: path.to_path_buf(),
            refused,
        }
    }

    fn io(path: &Path, e: io::Error) -> RuntimeError {
        // `O_NOFOLLOW | O_DIRECTORY` on a symlink fails with ENOTDIR: say
        // what is there (for the message only; nothing is opened).
        let what = || std::fs::symlink_metadata(path).map(|m| m.file_type());
        let code = e.raw_os_error();
        let symlink = code == Some(libc::ELOOP)
            || (code == Some(libc::ENOTDIR) && what().is_ok_and(|t| t.is_symlink()));
        let refused = if symlink {
            Refused::Symlink
        } else if code == Some(libc::EISDIR) {
            Refused::Kind("directory")
        } else if code == Some(libc::ENOTDIR) {
            Refused::Kind("file that is not a directory")
        } else {
            Refused::Io(e)
        };
        RuntimeError::new(path, refused)
    }
}

/// A file opened by [`RuntimeDir::open_file`].
#[derive(Debug)]
pub struct PrivateFile {
    /// The file, read-write.
    pub file: File,
    /// Whether this call created it (empty).
    pub created: bool,
}

/// An open directory only its user can reach (see the module notes).
///
/// ```
/// use kxarray::ipc::RuntimeDir;
///
/// use std::os::unix::fs::PermissionsExt;
///
/// let tmp = tempfile::tempdir().unwrap();
/// std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
/// let dir = RuntimeDir::open(tmp.path()).unwrap(); // ours, 0700
/// let f = dir.open_file("registry", 4096).unwrap();
/// assert!(f.created);
/// assert!(!dir.open_file("registry", 4096).unwrap().created);
/// // Another user's or a shared directory is refused:
/// assert!(RuntimeDir::open(std::path::Path::new("/tmp")).is_err());
/// ```
#[derive(Debug)]
pub struct RuntimeDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn cstr(p: &OsStr) -> Result<CString, Refused> {
    CString::new(p.as_bytes()).map_err(|_| Refused::Name)
}

fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value (plain integers).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a `stat` that outlives the call.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "directory",
        libc::S_IFREG => "regular file",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFLNK => "symbolic link",
        _ => "file of unknown type",
    }
}

/// Owner and permission checks shared by directories and files.
fn check_owner_mode(st: &libc::stat) -> Result<(), Refused> {
    let me = euid();
    if st.st_uid != me {
        return Err(Refused::Owner {
            uid: st.st_uid,
            euid: me,
        });
    }
    if st.st_mode & 0o077 != 0 {
        return Err(Refused::Mode(st.st_mode & 0o7777));
    }
    Ok(())
}

const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// How a file in the directory is opened: read-write, no symlink followed,
/// a FIFO not waited on, never a controlling terminal.
const FILE_FLAGS: libc::c_int =
    libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Check an open file as every private file is checked: a regular file,
/// owned by the effective user, no group or other permission bits. Its
/// `fstat` for the caller's own checks (links, size).
///
/// # Errors
/// What the file is instead (`path` names it in the error), or `fstat`'s
/// error.
pub fn check_private_file(file: &File, path: &Path) -> Result<libc::stat, RuntimeError> {
    let st = fstat(file).map_err(|e| RuntimeError::io(path, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(RuntimeError::new(path, Refused::Kind(kind_of(st.st_mode))));
    }
    check_owner_mode(&st).map_err(|r| RuntimeError::new(path, r))?;
    Ok(st)
}

impl AsFd for RuntimeDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl RuntimeDir {
    /// The user's runtime directory: `$XDG_RUNTIME_DIR/kxarray` when
    /// `$XDG_RUNTIME_DIR` is set and is the user's, else
    /// `/dev/shm/kxarray-<euid>` (see the module notes).
    ///
    /// # Errors
    /// Why the directory under `/dev/shm` cannot be used (another user
    /// made it, a symlink, a file, its mode, no `/dev/shm`).
    pub fn for_user() -> Result<RuntimeDir, RuntimeError> {
        let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
        RuntimeDir::locate(xdg.as_deref(), Path::new(SHARED_DIR))
    }

    /// [`for_user`](RuntimeDir::for_user) with `xdg` as
    /// `$XDG_RUNTIME_DIR` and `shared` as `/dev/shm` (tests, a container's
    /// mounts).
    ///
    /// # Errors
    /// As [`for_user`](RuntimeDir::for_user).
    pub fn locate(xdg: Option<&Path>, shared: &Path) -> Result<RuntimeDir, RuntimeError> {
        if let Some(x) = xdg.filter(|x| x.is_absolute()) {
            if let Ok(base) = RuntimeDir::open(x) {
                if let Ok(d) = base.subdir("kxarray") {
                    return Ok(d);
                }
            }
        }
        RuntimeDir::in_shared(shared)
    }

    /// The per-user directory `shared/kxarray-<euid>`, made with mode 0700
    /// if absent, then opened and checked (in a shared, sticky directory
    /// such as `/dev/shm`, where another user may have made that name
    /// first: then it is refused).
    ///
    /// # Errors
    /// What was found at the name, or why it could not be made.
    pub fn in_shared(shared: &Path) -> Result<RuntimeDir, RuntimeError> {
        RuntimeDir::create(&shared.join(format!("kxarray-{}", euid())))
    }

    /// The directory at `path`, made with mode 0700 if absent (never
    /// through a symlink: `mkdir` does not follow one), then opened and
    /// checked as [`open`](RuntimeDir::open) checks.
    ///
    /// # Errors
    /// What was found at the path, or why it could not be made.
    pub fn create(path: &Path) -> Result<RuntimeDir, RuntimeError> {
        let c = cstr(path.as_os_str()).map_err(|r| RuntimeError::new(path, r))?;
        // SAFETY: a NUL-terminated path; mkdir touches no memory of ours.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(RuntimeError::io(path, e));
            }
        }
        RuntimeDir::open(path)
    }

    /// Open an existing directory that must be the user's alone: owned by
    /// the effective user, no group or other permission bits, not a
    /// symlink at its last component.
    ///
    /// # Errors
    /// What was found there.
    pub fn open(path: &Path) -> Result<RuntimeDir, RuntimeError> {
        let c = cstr(path.as_os_str()).map_err(|r| RuntimeError::new(path, r))?;
        // SAFETY: a NUL-terminated path; the flags open a directory only.
        let fd = unsafe { libc::open(c.as_ptr(), DIR_FLAGS) };
        RuntimeDir::checked(fd, path)
    }

    /// A directory `name` in this one, made with mode 0700 if absent,
    /// checked as [`open`](RuntimeDir::open) checks.
    ///
    /// # Errors
    /// What was found there.
    pub fn subdir(&self, name: &str) -> Result<RuntimeDir, RuntimeError> {
        let path = self.path.join(name);
        let c = file_name(name).map_err(|r| RuntimeError::new(&path, r))?;
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(RuntimeError::io(&path, e));
            }
        }
        // SAFETY: as above; the flags open a directory only.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), DIR_FLAGS) };
        RuntimeDir::checked(fd, &path)
    }

    fn checked(fd: libc::c_int, path: &Path) -> Result<RuntimeDir, RuntimeError> {
        if fd < 0 {
            return Err(RuntimeError::io(path, io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(&fd).map_err(|e| RuntimeError::io(path, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(RuntimeError::new(path, Refused::Kind(kind_of(st.st_mode))));
        }
        check_owner_mode(&st).map_err(|r| RuntimeError::new(path, r))?;
        Ok(RuntimeDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory's path (for messages; files are opened relative to
    /// its descriptor).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open the regular file `name` in this directory read-write, creating
    /// it (empty, mode 0600) if absent, and check it (see the module
    /// notes): at most `max_len` bytes.
    ///
    /// # Errors
    /// What was found there (a symlink, a FIFO, a directory, another
    /// user's file, a file others may use, a hard link, a larger file),
    /// or the system call's error. Nothing is created or changed then.
    pub fn open_file(&self, name: &str, max_len: u64) -> Result<PrivateFile, RuntimeError> {
        let path = self.path.join(name);
        file_name(name).map_err(|r| RuntimeError::new(&path, r))?;
        let mut created = false;
        let mut opened = Err(io::Error::from_raw_os_error(libc::ENOENT));
        // An open racing another process's create or delete: a few tries.
        for _ in 0..4 {
            opened = self.open_existing(name);
            if !matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::ENOENT)) {
                break;
            }
            opened = self.create_new(name);
            if opened.is_ok() {
                created = true;
            }
            if !matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::EEXIST)) {
                break;
            }
        }
        let file = opened.map_err(|e| RuntimeError::io(&path, e))?;
        let st = check_private_file(&file, &path)?;
        // `nlink_t` is u64 here and u32 on other targets.
        #[allow(clippy::unnecessary_cast)]
        if st.st_nlink != 1 {
            return Err(RuntimeError::new(&path, Refused::Links(st.st_nlink as u64)));
        }
        let len = st.st_size as u64;
        if len > max_len {
            return Err(RuntimeError::new(
                &path,
                Refused::Size { len, max: max_len },
            ));
        }
        Ok(PrivateFile { file, created })
    }

    /// Open the existing file `name` in this directory read-write (with
    /// the flags of [`open_file`](RuntimeDir::open_file): no symlink
    /// followed, no FIFO waited on), unchecked: the caller checks it with
    /// [`check_private_file`] and its own rules.
    ///
    /// # Errors
    /// `openat`'s error (`ENOENT` when there is none, `ELOOP` for a
    /// symlink).
    pub fn open_existing(&self, name: &str) -> io::Result<File> {
        self.openat(name, FILE_FLAGS, 0)
    }

    /// Create the file `name` in this directory, read-write, mode 0600,
    /// with `O_EXCL`: it never opens what is already there.
    ///
    /// # Errors
    /// `openat`'s error (`EEXIST` when the name is taken).
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        self.openat(name, FILE_FLAGS | libc::O_CREAT | libc::O_EXCL, 0o600)
    }

    fn openat(&self, name: &str, flags: libc::c_int, mode: libc::c_uint) -> io::Result<File> {
        let c = file_name(name)
            .map_err(|r| io::Error::new(io::ErrorKind::InvalidInput, r.to_string()))?;
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, mode) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Give the file `from` of this directory a second name `to` (a hard
    /// link; `from` is not followed if it is a symlink). Fails if `to`
    /// exists: a file prepared under a name of its own is published under
    /// `to` whole or not at all, and of two processes publishing at once
    /// one wins.
    ///
    /// # Errors
    /// `linkat`'s error (`EEXIST` when `to` is taken).
    pub fn link_new(&self, from: &str, to: &str) -> io::Result<()> {
        let bad = |r: Refused| io::Error::new(io::ErrorKind::InvalidInput, r.to_string());
        let (f, t) = (file_name(from).map_err(bad)?, file_name(to).map_err(bad)?);
        let d = self.fd.as_raw_fd();
        // SAFETY: a live directory descriptor and NUL-terminated names;
        // flags 0 follow no symlink.
        if unsafe { libc::linkat(d, f.as_ptr(), d, t.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Remove the file `name` from this directory.
    ///
    /// # Errors
    /// `unlinkat`'s error.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        let c = file_name(name)
            .map_err(|r| io::Error::new(io::ErrorKind::InvalidInput, r.to_string()))?;
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// `name` as one path component.
fn file_name(name: &str) -> Result<CString, Refused> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(Refused::Name);
    }
    CString::new(name).map_err(|_| Refused::Name)
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn private() -> (tempfile::TempDir, RuntimeDir) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let d = RuntimeDir::open(tmp.path()).unwrap();
        (tmp, d)
    }

    /// Everything a private file may not be is refused, with what it is,
    /// and left as it was.
    #[test]
    fn files_that_are_not_ours_are_refused() {
        let (tmp, d) = private();
        let p = |n: &str| tmp.path().join(n);
        symlink(p("elsewhere"), p("link")).unwrap();
        let e = d.open_file("link", 10).unwrap_err();
        assert!(matches!(e.refused, Refused::Symlink), "{e}");
        assert!(!p("elsewhere").exists(), "nothing created through the link");
        let fifo = CString::new(p("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = d.open_file("fifo", 10).unwrap_err();
        assert!(matches!(e.refused, Refused::Kind("FIFO")), "{e}");
        std::fs::create_dir(p("dir")).unwrap();
        let e = d.open_file("dir", 10).unwrap_err();
        assert!(matches!(e.refused, Refused::Kind("directory")), "{e}");
        std::fs::write(p("big"), [0u8; 100]).unwrap();
        std::fs::set_permissions(p("big"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = d.open_file("big", 10).unwrap_err();
        assert!(
            matches!(e.refused, Refused::Size { len: 100, max: 10 }),
            "{e}"
        );
        std::fs::write(p("open"), b"").unwrap();
        std::fs::set_permissions(p("open"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = d.open_file("open", 10).unwrap_err();
        assert!(matches!(e.refused, Refused::Mode(0o644)), "{e}");
        std::fs::set_permissions(p("open"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(p("open"), p("open2")).unwrap();
        let e = d.open_file("open", 10).unwrap_err();
        assert!(matches!(e.refused, Refused::Links(2)), "{e}");
        for bad in ["", ".", "..", "a/b"] {
            assert!(matches!(
                d.open_file(bad, 10).unwrap_err().refused,
                Refused::Name
            ));
        }
        let f = d.open_file("fresh", 10).unwrap();
        assert!(f.created);
        let mode = std::fs::metadata(p("fresh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A directory others may use, a symlink to ours, or a file is not a
    /// runtime directory; the per-user directory in a shared one is made
    /// 0700 and found again; an `$XDG_RUNTIME_DIR` that is ours is used,
    /// one that is not is passed over.
    #[test]
    fn directories_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shm");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = RuntimeDir::open(&shared).unwrap_err();
        assert!(matches!(e.refused, Refused::Mode(0o1777)), "{e}");
        let d = RuntimeDir::in_shared(&shared).unwrap();
        assert_eq!(d.path(), shared.join(format!("kxarray-{}", euid())));
        let mode = std::fs::metadata(d.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o700);
        symlink(d.path(), tmp.path().join("link")).unwrap();
        let e = RuntimeDir::open(&tmp.path().join("link")).unwrap_err();
        assert!(matches!(e.refused, Refused::Symlink), "{e}");
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        let e = RuntimeDir::open(&tmp.path().join("file")).unwrap_err();
        assert!(matches!(e.refused, Refused::Kind(_)), "{e}");
        let xdg = tmp.path().join("xdg");
        std::fs::create_dir(&xdg).unwrap();
        std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
        let d = RuntimeDir::locate(Some(&xdg), &shared).unwrap();
        assert_eq!(d.path(), xdg.join("kxarray"));
        std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = RuntimeDir::locate(Some(&xdg), &shared).unwrap();
        assert_eq!(d.path(), shared.join(format!("kxarray-{}", euid())));
    }
}
