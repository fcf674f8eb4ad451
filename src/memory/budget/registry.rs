//! The registry of a budget's members: one small file in shared memory
//! (`/dev/shm/kxarray-budget-<uid>-<hash of the key>`) holding a fixed
//! table of slots, one per cache, each naming its process by pid and start
//! time.
//!
//! Owns the file's layout, its lock and the liveness test of a member.
//! Layout (little-endian `u64` words, [`FILE_BYTES`] bytes): a header
//! (magic, slot count, generation, key length, the key's first
//! [`KEY_BYTES`] bytes) and [`SLOTS`] slots of [`SLOT_WORDS`] words (pid,
//! start time, want, demand, capacity, used; pid 0 is a free slot). The
//! table is read and written whole (`pread`/`pwrite` of 4 KiB on tmpfs)
//! while an exclusive open-file-description lock (`F_OFD_SETLK`) is held
//! on the file: the kernel drops that lock when its holder's file is
//! closed, so a process killed inside the critical section leaves no lock
//! behind. The table fits in one page, so a write is never cut short by
//! the writer's death (a torn table would be refused as foreign). Invariants: every change of the table happens under the lock;
//! a slot whose process is gone (no `/proc/<pid>/stat`, a zombie, or a
//! start time other than the one recorded: the pid was reused) is freed by
//! whoever next takes the lock, and the generation moves on; a file whose
//! header is not ours (another key hashed to the same name, garbage) is an
//! error, never overwritten.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Slots in a registry: caches that can share one budget.
pub const SLOTS: usize = 60;
/// Words per slot.
pub const SLOT_WORDS: usize = 6;
/// Bytes of the key kept in the header (longer keys are told apart by
/// the file's name, a hash of the whole key, and this prefix).
pub const KEY_BYTES: usize = 1024;
const HEADER_WORDS: usize = 4 + KEY_BYTES / 8;
const _: () = assert!(FILE_BYTES <= 4096, "the table fits in one page");
/// The file's size.
pub const FILE_BYTES: usize = (HEADER_WORDS + SLOTS * SLOT_WORDS) * 8;
const MAGIC: u64 = u64::from_le_bytes(*b"KXBUDG01");
/// How long a lock is waited for before the caller gives up (and keeps
/// its capacity for this round).
const LOCK_PATIENCE: Duration = Duration::from_secs(1);

/// One member of a budget, as the registry records it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// Its process.
    pub pid: u32,
    /// Its process's start time (`/proc/<pid>/stat` field 22, clock
    /// ticks since boot), which tells a reused pid apart.
    pub start_time: u64,
    /// The most it would take (its fixed size without a budget).
    pub want: u64,
    /// What it asks for now (at most `want`; less when it does not use
    /// what it has).
    pub demand: u64,
    /// Its capacity now.
    pub capacity: u64,
    /// The bytes it holds now.
    pub used: u64,
}

impl Slot {
    fn words(&self) -> [u64; SLOT_WORDS] {
        [
            u64::from(self.pid),
            self.start_time,
            self.want,
            self.demand,
            self.capacity,
            self.used,
        ]
    }

    fn from_words(w: &[u64]) -> Slot {
        Slot {
            // A pid beyond u32 is garbage: a free slot.
            pid: u32::try_from(w[0]).unwrap_or(0),
            start_time: w[1],
            want: w[2],
            demand: w[3],
            capacity: w[4],
            used: w[5],
        }
    }
}

/// The table as read under the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Moves on at every join, leave and reclaimed dead member.
    pub generation: u64,
    /// The slots (pid 0: free).
    pub slots: Vec<Slot>,
}

/// Why a registry could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum RegistryError {
    /// The file could not be opened, locked, read or written.
    Io(PathBuf, io::Error),
    /// The file holds something else (another key, another version,
    /// garbage).
    Foreign(PathBuf),
    /// Every slot is taken by a live member.
    Full(PathBuf),
    /// The lock was held by another process for longer than a second.
    Busy(PathBuf),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Io(p, e) => write!(f, "budget registry {}: {e}", p.display()),
            RegistryError::Foreign(p) => write!(
                f,
                "budget registry {}: not a registry of this key and version",
                p.display()
            ),
            RegistryError::Full(p) => {
                write!(
                    f,
                    "budget registry {}: all {SLOTS} slots taken",
                    p.display()
                )
            }
            RegistryError::Busy(p) => {
                write!(
                    f,
                    "budget registry {}: locked for over a second",
                    p.display()
                )
            }
        }
    }
}

impl std::error::Error for RegistryError {}

/// An open registry file.
#[derive(Debug)]
pub struct Registry {
    file: File,
    path: PathBuf,
    key: String,
    proc_root: PathBuf,
}

/// FNV-1a, 64 bits: the file name of a key.
fn fnv(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The registry file of `key` in `dir` for this process's user: one
/// registry per user (the file is the user's alone, mode 0600, so another
/// user can neither read its members nor skew their shares).
pub fn path_for(dir: &Path, key: &str) -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    dir.join(format!("kxarray-budget-{uid}-{:016x}", fnv(key)))
}

impl Registry {
    /// Open (creating if needed) the registry of `key` in `dir`; members'
    /// liveness is read under `proc_root`.
    ///
    /// # Errors
    /// [`RegistryError::Io`] if the file cannot be opened.
    pub fn open(dir: &Path, key: &str, proc_root: &Path) -> Result<Registry, RegistryError> {
        let path = path_for(dir, key);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| RegistryError::Io(path.clone(), e))?;
        Ok(Registry {
            file,
            path,
            key: key.to_string(),
            proc_root: proc_root.to_path_buf(),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` on the table under the lock, after freeing the slots of
    /// dead members (their count is `f`'s second argument), and write the
    /// table back if `f` returns `true` or a member was freed. An empty
    /// file is initialised first.
    ///
    /// # Errors
    /// [`RegistryError::Io`], [`RegistryError::Foreign`] (nothing is
    /// written), [`RegistryError::Busy`].
    pub fn update<R>(
        &self,
        f: impl FnOnce(&mut Table, usize) -> (bool, R),
    ) -> Result<R, RegistryError> {
        let _lock = self.lock()?;
        let io = |e| RegistryError::Io(self.path.clone(), e);
        let mut buf = vec![0u8; FILE_BYTES];
        let n = read_full(&self.file, &mut buf).map_err(io)?;
        let mut table = if n == 0 {
            Table {
                generation: 0,
                slots: vec![Slot::default(); SLOTS],
            }
        } else {
            self.parse(&buf[..n])?
        };
        let mut dead = 0;
        for s in table.slots.iter_mut().filter(|s| s.pid != 0) {
            if !alive(&self.proc_root, s.pid, s.start_time) {
                *s = Slot::default();
                dead += 1;
            }
        }
        if dead > 0 {
            table.generation = table.generation.wrapping_add(1);
        }
        let (write, r) = f(&mut table, dead);
        if write || dead > 0 || n == 0 {
            self.file
                .write_all_at(&self.encode(&table), 0)
                .map_err(io)?;
        }
        Ok(r)
    }

    fn parse(&self, buf: &[u8]) -> Result<Table, RegistryError> {
        let foreign = || RegistryError::Foreign(self.path.clone());
        if buf.len() != FILE_BYTES {
            return Err(foreign());
        }
        let words: Vec<u64> = buf
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let key = self.key.as_bytes();
        let kept = key.len().min(KEY_BYTES);
        if words[0] != MAGIC
            || words[1] != SLOTS as u64
            || words[3] != key.len() as u64
            || buf[32..32 + kept] != key[..kept]
        {
            return Err(foreign());
        }
        Ok(Table {
            generation: words[2],
            slots: words[HEADER_WORDS..]
                .chunks_exact(SLOT_WORDS)
                .map(Slot::from_words)
                .collect(),
        })
    }

    fn encode(&self, t: &Table) -> Vec<u8> {
        let mut buf = Vec::with_capacity(FILE_BYTES);
        for w in [MAGIC, SLOTS as u64, t.generation, self.key.len() as u64] {
            buf.extend_from_slice(&w.to_le_bytes());
        }
        let key = self.key.as_bytes();
        let mut k = [0u8; KEY_BYTES];
        let kept = key.len().min(KEY_BYTES);
        k[..kept].copy_from_slice(&key[..kept]);
        buf.extend_from_slice(&k);
        for s in &t.slots {
            for w in s.words() {
                buf.extend_from_slice(&w.to_le_bytes());
            }
        }
        buf
    }

    /// Take the exclusive lock, waiting at most [`LOCK_PATIENCE`].
    fn lock(&self) -> Result<LockGuard<'_>, RegistryError> {
        let start = Instant::now();
        loop {
            match ofd_lock(&self.file, libc::F_WRLCK) {
                Ok(true) => return Ok(LockGuard(&self.file)),
                Ok(false) if start.elapsed() < LOCK_PATIENCE => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Ok(false) => return Err(RegistryError::Busy(self.path.clone())),
                Err(e) => return Err(RegistryError::Io(self.path.clone(), e)),
            }
        }
    }

    /// Whether another open file description holds the lock now (for
    /// tests and diagnostics).
    ///
    /// # Errors
    /// The `fcntl` failed.
    pub fn is_locked_elsewhere(&self) -> io::Result<bool> {
        let got = ofd_lock(&self.file, libc::F_WRLCK)?;
        if got {
            ofd_lock(&self.file, libc::F_UNLCK)?;
        }
        Ok(!got)
    }
}

/// Holds the registry's lock; releases it when dropped.
struct LockGuard<'a>(&'a File);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; an error here leaves the
        // lock to the file's close.
        let _ = ofd_lock(self.0, libc::F_UNLCK);
    }
}

/// `F_OFD_SETLK` of the whole file with `kind` (`F_WRLCK` or `F_UNLCK`):
/// `Ok(false)` if another open file description holds a conflicting lock.
fn ofd_lock(file: &File, kind: libc::c_int) -> io::Result<bool> {
    // SAFETY: `flock` is a plain C struct of integers, for which all
    // zeroes is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0; // the whole file
    fl.l_pid = 0; // required by F_OFD_* locks
    loop {
        // SAFETY: the descriptor is open for the life of `file`, and `fl`
        // is a valid `flock` that outlives the call.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Read from offset 0 until `buf` is full or the file ends.
fn read_full(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The start time of process `pid` (`proc_root/<pid>/stat` field 22) and
/// whether it is a zombie or dead; `None` if there is no such process or
/// its `stat` does not parse.
pub fn start_time(proc_root: &Path, pid: u32) -> Option<(u64, bool)> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything:
    // the fields after it follow the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?; // field 3
    let start = fields.nth(18)?; // field 22
    Some((start.parse().ok()?, matches!(state, "Z" | "X" | "x")))
}

/// Whether the process `pid` that started at `start` still runs.
pub fn alive(proc_root: &Path, pid: u32, start: u64) -> bool {
    pid != 0 && matches!(start_time(proc_root, pid), Some((s, false)) if s == start)
}

// Real files and OFD locks: not under Miri's isolation.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::fs;

    fn fake_process(proc_root: &Path, pid: u32, start: u64, state: &str) {
        let d = proc_root.join(pid.to_string());
        fs::create_dir_all(&d).unwrap();
        // A command name with spaces and parentheses, as a process may have.
        let mut fields = vec!["0"; 50];
        fields[0] = state;
        let start = start.to_string();
        fields[19] = &start;
        fs::write(
            d.join("stat"),
            format!("{pid} (a (b) c) {}\n", fields.join(" ")),
        )
        .unwrap();
    }

    #[test]
    fn liveness_uses_the_start_time() {
        let tmp = tempfile::tempdir().unwrap();
        fake_process(tmp.path(), 10, 777, "S");
        fake_process(tmp.path(), 11, 5, "Z");
        assert!(alive(tmp.path(), 10, 777));
        assert!(!alive(tmp.path(), 10, 778), "a reused pid");
        assert!(!alive(tmp.path(), 11, 5), "a zombie");
        assert!(!alive(tmp.path(), 12, 5), "no such process");
        fs::write(tmp.path().join("10/stat"), "garbage").unwrap();
        assert!(!alive(tmp.path(), 10, 777));
        let me = std::process::id();
        let (s, zombie) = start_time(Path::new("/proc"), me).unwrap();
        assert!(!zombie && alive(Path::new("/proc"), me, s));
    }

    #[test]
    fn dead_slots_are_freed_and_foreign_files_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        fake_process(&proc_root, 10, 1, "R");
        fake_process(&proc_root, 11, 1, "R");
        let r = Registry::open(tmp.path(), "k", &proc_root).unwrap();
        r.update(|t, dead| {
            assert_eq!((t.generation, dead), (0, 0));
            t.slots[0] = Slot {
                pid: 10,
                start_time: 1,
                want: 5,
                ..Slot::default()
            };
            t.slots[7] = Slot {
                pid: 11,
                start_time: 1,
                want: 6,
                ..Slot::default()
            };
            (true, ())
        })
        .unwrap();
        assert_eq!(fs::metadata(r.path()).unwrap().len(), FILE_BYTES as u64);
        fake_process(&proc_root, 11, 2, "R"); // 11 died and its pid was reused
        let (gen, dead, live) = r
            .update(|t, dead| {
                let live: Vec<u32> = t
                    .slots
                    .iter()
                    .filter(|s| s.pid != 0)
                    .map(|s| s.pid)
                    .collect();
                (false, (t.generation, dead, live))
            })
            .unwrap();
        assert_eq!((gen, dead, live), (1, 1, vec![10]));
        // The same file name with another key's header: refused, untouched.
        let other = Registry {
            file: File::options()
                .read(true)
                .write(true)
                .open(r.path())
                .unwrap(),
            path: r.path().to_path_buf(),
            key: "other".into(),
            proc_root: proc_root.clone(),
        };
        let before = fs::read(r.path()).unwrap();
        assert!(matches!(
            other.update(|_, _| (true, ())),
            Err(RegistryError::Foreign(_))
        ));
        fs::write(r.path(), b"garbage").unwrap();
        assert!(matches!(
            r.update(|_, _| (true, ())),
            Err(RegistryError::Foreign(_))
        ));
        assert_eq!(fs::read(r.path()).unwrap(), b"garbage");
        drop(before);
    }

    #[test]
    fn the_lock_excludes_another_open_file() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Registry::open(tmp.path(), "k", Path::new("/proc")).unwrap();
        let b = Registry::open(tmp.path(), "k", Path::new("/proc")).unwrap();
        assert!(!b.is_locked_elsewhere().unwrap());
        a.update(|_, _| {
            assert!(b.is_locked_elsewhere().unwrap());
            (false, ())
        })
        .unwrap();
        assert!(!b.is_locked_elsewhere().unwrap());
    }
}
