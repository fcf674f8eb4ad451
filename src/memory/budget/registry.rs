//! The registry of a budget's members: one small file in the user's
//! private runtime directory ([`RuntimeDir`]:
//! `$XDG_RUNTIME_DIR/kxarray/budget-<hash of the key>`, or
//! `/dev/shm/kxarray-<euid>/budget-<hash>`) holding a fixed table of
//! slots, one per cache.
//!
//! Owns the file's layout, its lock and the liveness of a member. Layout
//! (little-endian `u64` words, [`FILE_BYTES`] bytes): a header (magic, slot
//! count, generation, key length, the key's first [`KEY_BYTES`] bytes) and
//! [`SLOTS`] slots of [`SLOT_WORDS`] words (pid, start time, want, demand,
//! capacity, used; pid 0 is a free slot; the pid and start time say who it
//! is, for people and stats, and prove nothing). The table is read and
//! written whole (`pread`/`pwrite` of 4 KiB on tmpfs) while an exclusive
//! OFD lock on byte 0 ([`TABLE_LOCK`]) is held, waited for at most
//! [`LOCK_PATIENCE`] (a holder that makes no progress is skipped: the
//! caller keeps its capacity for this round). The table fits in one page,
//! so a write is never cut short by the writer's death.
//!
//! Liveness is the kernel's ([`LifeBytes`]): a member holds an exclusive
//! OFD lock on byte `4096 + i` for as long as it has slot `i`; a slot
//! whose byte no other open file description holds is free, whatever its
//! pid says (another PID namespace, a reused pid, a forged table). The
//! kernel drops both locks when the member's description is closed, so a
//! process killed inside the critical section leaves nothing locked.
//!
//! Invariants: every change of the table happens under the table lock; a
//! member's life byte is locked before its slot is written and released
//! after the slot is cleared; a slot whose byte is free is freed by
//! whoever next takes the lock, and the generation moves on; a file whose
//! header is not ours (another key hashed to the same name, another
//! version, garbage) is an error, never overwritten; the file is opened
//! only through [`RuntimeDir::open_file`](crate::ipc::RuntimeDir::open_file)
//! (no symlink, no FIFO, the user's own, mode 0600, one link, at most
//! [`FILE_BYTES`]); a forked child never uses the parent's `Registry`
//! (its description, its locks and its slot are the parent's: the child
//! closes the descriptor, [`crate::fork::close_in_child`], and opens its
//! own).

use crate::fork::{self, InheritedFd};
use crate::ipc::{lock_within, unlock, LifeBytes, LockKind, RuntimeDir, RuntimeError};
use std::fs::File;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
const MAGIC: u64 = u64::from_le_bytes(*b"KXBUDG02");
/// The byte whose exclusive OFD lock is the table's lock.
pub const TABLE_LOCK: u64 = 0;
/// Slot `i`'s life byte is `4096 + i`.
pub const LIFE: LifeBytes = LifeBytes::new(4096);
/// How long the table's lock is waited for before the caller gives up
/// for this round.
pub const LOCK_PATIENCE: Duration = Duration::from_millis(5);

/// Where a budget's registry lives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryDir {
    /// The user's runtime directory ([`RuntimeDir::for_user`]): the
    /// default.
    #[default]
    User,
    /// This directory, which must be the user's own with no group or
    /// other permission bits ([`RuntimeDir::open`]): a program's own, or a
    /// test's.
    Private(PathBuf),
    /// The per-user directory made in this shared directory
    /// ([`RuntimeDir::in_shared`]), as the default does in `/dev/shm`
    /// when `$XDG_RUNTIME_DIR` is not the user's.
    InShared(PathBuf),
}

impl RegistryDir {
    /// Open (making the per-user directory if needed) and check it.
    ///
    /// # Errors
    /// What was found instead of a directory only the user can reach.
    pub fn open(&self) -> Result<RuntimeDir, RuntimeError> {
        match self {
            RegistryDir::User => RuntimeDir::for_user(),
            RegistryDir::Private(p) => RuntimeDir::open(p),
            RegistryDir::InShared(p) => RuntimeDir::in_shared(p),
        }
    }
}

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
    /// The file could not be read, written or locked.
    Io(PathBuf, io::Error),
    /// The directory or the file is not one only this user can reach (a
    /// symlink, a FIFO, another user's, a file others may use, too large):
    /// refused and left as it is.
    Refused(RuntimeError),
    /// The file holds something else (another key, another version,
    /// garbage).
    Foreign(PathBuf),
    /// Every slot is taken by a live member.
    Full(PathBuf),
    /// The lock was held by another member for longer than
    /// [`LOCK_PATIENCE`].
    Busy(PathBuf),
    /// Used in a child process after `fork`: the registry is the parent's.
    Inherited(PathBuf),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Io(p, e) => write!(f, "budget registry {}: {e}", p.display()),
            RegistryError::Refused(e) => write!(f, "budget registry refused: {e}"),
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
            RegistryError::Busy(p) => write!(
                f,
                "budget registry {}: locked for over {} ms",
                p.display(),
                LOCK_PATIENCE.as_millis()
            ),
            RegistryError::Inherited(p) => write!(
                f,
                "budget registry {}: opened by the parent of this forked process",
                p.display()
            ),
        }
    }
}

impl std::error::Error for RegistryError {}

/// What a look at the table found besides the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Look {
    /// Slots freed because their member was gone.
    pub dead: usize,
    /// This member's slot (its life byte held), if it has one.
    pub mine: Option<usize>,
}

/// An open registry file: one member's open file description.
#[derive(Debug)]
pub struct Registry {
    file: ManuallyDrop<File>,
    mark: Option<InheritedFd>,
    path: PathBuf,
    key: String,
    /// The slot whose life byte this description holds.
    slot: Option<usize>,
    generation: u64,
}

/// FNV-1a, 64 bits: the file name of a key.
fn fnv(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The registry file's name in the runtime directory for `key`.
pub fn file_name(key: &str) -> String {
    format!("budget-{:016x}", fnv(key))
}

impl Registry {
    /// Open (creating if needed, with `O_EXCL`) the registry of `key` in
    /// `dir`, checked as [`RuntimeDir::open_file`] checks.
    ///
    /// # Errors
    /// [`RegistryError::Refused`] for anything but the user's own regular
    /// file of at most [`FILE_BYTES`] (left as it is).
    pub fn open(dir: &RuntimeDir, key: &str) -> Result<Registry, RegistryError> {
        let name = file_name(key);
        let f = dir
            .open_file(&name, FILE_BYTES as u64)
            .map_err(RegistryError::Refused)?;
        let mark = fork::close_in_child(f.file.as_raw_fd());
        Ok(Registry {
            file: ManuallyDrop::new(f.file),
            mark: Some(mark),
            path: dir.path().join(name),
            key: key.to_string(),
            slot: None,
            generation: fork::generation(),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This member's slot, once it has one.
    pub fn slot(&self) -> Option<usize> {
        self.slot
    }

    fn here(&self) -> Result<(), RegistryError> {
        if fork::inherited(self.generation) {
            return Err(RegistryError::Inherited(self.path.clone()));
        }
        Ok(())
    }

    /// Run `f` on the table under the lock, after freeing the slots whose
    /// life byte no one holds (their count is in the [`Look`]) and, with
    /// `claim`, taking a free slot for this member if it has none (its
    /// life byte locked first; [`Look::mine`] is `None` when every slot is
    /// taken); then write the table back if `f` returns `true`, a slot
    /// was freed or claimed, or the file was empty. An empty file is
    /// initialised first.
    ///
    /// # Errors
    /// [`RegistryError::Io`], [`RegistryError::Foreign`] (nothing is
    /// written), [`RegistryError::Busy`] (nothing is read or written),
    /// [`RegistryError::Inherited`].
    pub fn update<R>(
        &mut self,
        claim: bool,
        f: impl FnOnce(&mut Table, Look) -> (bool, R),
    ) -> Result<R, RegistryError> {
        self.here()?;
        let io = |p: &Path, e| RegistryError::Io(p.to_path_buf(), e);
        if !lock_within(&*self.file, LockKind::Write, TABLE_LOCK, 1, LOCK_PATIENCE)
            .map_err(|e| io(&self.path, e))?
        {
            return Err(RegistryError::Busy(self.path.clone()));
        }
        let r = self.update_locked(claim, f);
        // Closing the file would release it too; an error here leaves the
        // lock to the file's close.
        let _ = unlock(&*self.file, TABLE_LOCK, 1);
        r
    }

    fn update_locked<R>(
        &mut self,
        claim: bool,
        f: impl FnOnce(&mut Table, Look) -> (bool, R),
    ) -> Result<R, RegistryError> {
        let io = |p: &Path, e| RegistryError::Io(p.to_path_buf(), e);
        let mut buf = vec![0u8; FILE_BYTES];
        let n = read_full(&self.file, &mut buf).map_err(|e| io(&self.path, e))?;
        let mut table = if n == 0 {
            Table {
                generation: 0,
                slots: vec![Slot::default(); SLOTS],
            }
        } else {
            self.parse(&buf[..n])?
        };
        let mut dead = 0;
        for i in 0..SLOTS {
            if table.slots[i].pid == 0 || self.slot == Some(i) {
                continue;
            }
            if !LIFE
                .is_alive(&*self.file, i)
                .map_err(|e| io(&self.path, e))?
            {
                table.slots[i] = Slot::default();
                dead += 1;
            }
        }
        if dead > 0 {
            table.generation = table.generation.wrapping_add(1);
        }
        let mut claimed = false;
        if claim && self.slot.is_none() {
            for i in 0..SLOTS {
                // A free slot whose byte someone holds: a member that left
                // and could not let go of it; passed over.
                if table.slots[i].pid == 0
                    && LIFE.claim(&*self.file, i).map_err(|e| io(&self.path, e))?
                {
                    self.slot = Some(i);
                    table.generation = table.generation.wrapping_add(1);
                    claimed = true;
                    break;
                }
            }
        }
        let look = Look {
            dead,
            mine: self.slot,
        };
        let (write, r) = f(&mut table, look);
        if write || dead > 0 || claimed || n == 0 {
            if let Err(e) = self.file.write_all_at(&self.encode(&table), 0) {
                if claimed {
                    self.drop_slot();
                }
                return Err(io(&self.path, e));
            }
        }
        Ok(r)
    }

    /// Let go of the slot's life byte.
    fn drop_slot(&mut self) {
        if let Some(i) = self.slot.take() {
            let _ = LIFE.release(&*self.file, i);
        }
    }

    /// Leave: clear this member's slot (if it still names `pid`) and let go
    /// of its life byte. `Ok(false)` when it had no slot.
    ///
    /// # Errors
    /// As [`update`](Registry::update); the slot is then freed when this
    /// file is closed (the next member finds its byte free).
    pub fn leave(&mut self, pid: u32) -> Result<bool, RegistryError> {
        let Some(i) = self.slot else {
            return Ok(false);
        };
        self.update(false, |t, _| {
            if t.slots[i].pid == pid {
                t.slots[i] = Slot::default();
                t.generation = t.generation.wrapping_add(1);
                return (true, ());
            }
            (false, ())
        })?;
        self.drop_slot();
        Ok(true)
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

    /// Whether another open file description holds the table's lock now
    /// (for tests and diagnostics).
    ///
    /// # Errors
    /// The `fcntl` failed.
    pub fn is_locked_elsewhere(&self) -> io::Result<bool> {
        crate::ipc::held_elsewhere(&*self.file, LockKind::Write, TABLE_LOCK, 1)
    }

    /// Slots whose member is alive now (their life byte held by another
    /// description than this one, or this one's own), for tests and
    /// diagnostics.
    ///
    /// # Errors
    /// The `fcntl` failed.
    pub fn live_slots(&self) -> io::Result<Vec<usize>> {
        let mut v = Vec::new();
        for i in 0..SLOTS {
            if self.slot == Some(i) || LIFE.is_alive(&*self.file, i)? {
                v.push(i);
            }
        }
        Ok(v)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let mark = self.mark.take();
        if fork::inherited(self.generation) {
            // The parent's description: closed once (by the fork handler
            // or here), never unlocked, and the `File` never dropped.
            if let Some(m) = mark {
                m.release();
            }
            return;
        }
        if let Some(m) = mark {
            m.forget();
        }
        // SAFETY: dropped once, here; the locks go with the description.
        unsafe { ManuallyDrop::drop(&mut self.file) };
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

// Real files and OFD locks: not under Miri's isolation.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Instant;

    /// A private directory of the test's own (tempdirs are 0755).
    pub(crate) fn private_dir() -> (tempfile::TempDir, RuntimeDir) {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let d = RuntimeDir::open(tmp.path()).unwrap();
        (tmp, d)
    }

    fn slot(pid: u32) -> Slot {
        Slot {
            pid,
            start_time: 1,
            want: 5,
            ..Slot::default()
        }
    }

    /// A member is alive while its description holds its life byte,
    /// whatever its pid says (here one no process has, as a member in
    /// another PID namespace looks); once that description is closed its
    /// slot is freed by the next look, and the generation moves on.
    #[test]
    fn liveness_is_the_life_byte_not_the_pid() {
        let (_tmp, dir) = private_dir();
        let mut a = Registry::open(&dir, "k").unwrap();
        let mut b = Registry::open(&dir, "k").unwrap();
        let ghost = 0x7FFF_FFF0; // no such pid here
        let i = a
            .update(true, |t, look| {
                let i = look.mine.unwrap();
                t.slots[i] = slot(ghost);
                (true, i)
            })
            .unwrap();
        assert_eq!(a.slot(), Some(i));
        assert_eq!(fs::metadata(a.path()).unwrap().len(), FILE_BYTES as u64);
        let (dead, live) = b
            .update(false, |t, look| {
                (
                    false,
                    (look.dead, t.slots.iter().filter(|s| s.pid != 0).count()),
                )
            })
            .unwrap();
        assert_eq!((dead, live), (0, 1), "a member with a foreign pid is alive");
        assert_eq!(b.live_slots().unwrap(), vec![i]);
        let gen = b.update(false, |t, _| (false, t.generation)).unwrap();
        drop(a); // closed: the kernel drops its life byte
        let (dead, live, gen2) = b
            .update(false, |t, look| {
                let live = t.slots.iter().filter(|s| s.pid != 0).count();
                (false, (look.dead, live, t.generation))
            })
            .unwrap();
        assert_eq!((dead, live, gen2), (1, 0, gen + 1));
        // b leaves nothing behind either: it never claimed a slot.
        assert!(!b.leave(1).unwrap());
    }

    /// A claimed slot is given back by `leave`; a slot whose byte a live
    /// description holds is never handed to another member.
    #[test]
    fn claims_and_leaves() {
        let (_tmp, dir) = private_dir();
        let mut a = Registry::open(&dir, "k").unwrap();
        let mut b = Registry::open(&dir, "k").unwrap();
        let ia = a
            .update(true, |t, l| {
                t.slots[l.mine.unwrap()] = slot(1);
                (true, l.mine.unwrap())
            })
            .unwrap();
        let ib = b
            .update(true, |t, l| {
                t.slots[l.mine.unwrap()] = slot(2);
                (true, l.mine.unwrap())
            })
            .unwrap();
        assert_ne!(ia, ib);
        assert!(a.leave(1).unwrap());
        assert_eq!(a.slot(), None);
        let (dead, pids) = b
            .update(false, |t, l| {
                (
                    false,
                    (
                        l.dead,
                        t.slots
                            .iter()
                            .map(|s| s.pid)
                            .filter(|&p| p != 0)
                            .collect::<Vec<_>>(),
                    ),
                )
            })
            .unwrap();
        assert_eq!((dead, pids), (0, vec![2]));
    }

    /// The same file name with another key's header, or garbage: refused
    /// and left as it is.
    #[test]
    fn foreign_files_are_refused_and_left_alone() {
        let (_tmp, dir) = private_dir();
        let mut r = Registry::open(&dir, "k").unwrap();
        r.update(true, |t, l| {
            t.slots[l.mine.unwrap()] = slot(1);
            (true, ())
        })
        .unwrap();
        let before = fs::read(r.path()).unwrap();
        // another key whose name is the same file
        let mut other = Registry::open(&dir, "k").unwrap();
        other.key = "other".into();
        assert!(matches!(
            other.update(true, |_, _| (true, ())),
            Err(RegistryError::Foreign(_))
        ));
        assert_eq!(fs::read(r.path()).unwrap(), before);
        fs::write(r.path(), b"garbage").unwrap();
        assert!(matches!(
            r.update(false, |_, _| (true, ())),
            Err(RegistryError::Foreign(_))
        ));
        assert_eq!(fs::read(r.path()).unwrap(), b"garbage");
    }

    /// The table's lock excludes another description, and a holder that
    /// does not let go costs the other member one bounded wait
    /// ([`LOCK_PATIENCE`]), not a second (the wait before).
    #[test]
    fn the_lock_excludes_another_open_file_for_a_bounded_time() {
        let (_tmp, dir) = private_dir();
        let mut a = Registry::open(&dir, "k").unwrap();
        let mut b = Registry::open(&dir, "k").unwrap();
        assert!(!b.is_locked_elsewhere().unwrap());
        a.update(false, |_, _| {
            assert!(b.is_locked_elsewhere().unwrap());
            let t = Instant::now();
            assert!(matches!(
                b.update(false, |_, _| (false, ())),
                Err(RegistryError::Busy(_))
            ));
            // A hang guard far above the patience and far below the old
            // second.
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "{:?}",
                t.elapsed()
            );
            (false, ())
        })
        .unwrap();
        assert!(!b.is_locked_elsewhere().unwrap());
        assert!(b.update(false, |_, _| (false, ())).is_ok());
    }
}
