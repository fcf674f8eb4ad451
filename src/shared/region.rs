//! A region joined: the region file found or made in the user's own
//! directory, checked, mapped, and this process's membership in it.
//!
//! Owns [`Region`] (the mapping, this process's open of the file, its
//! member slot) and the checks a region file passes before anything in it
//! is trusted:
//!
//! - the directory is a [`RuntimeDir`] (the user's own: opened with
//!   `O_NOFOLLOW | O_DIRECTORY`, owned by the effective user, no access
//!   for group or others), and every file is opened relative to it;
//! - the file is opened with `O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK` and
//!   must pass [`check_private_file`] (a regular file owned by the
//!   effective user, no group or other bits), be exactly as long as its
//!   header says, with a header whose format words are exactly the ones
//!   this code writes ([`Geometry::from_words`]) for the same user;
//! - a new region is laid out in a file of its own name (`O_CREAT |
//!   O_EXCL`, mode 0600), then linked to the region's name with `linkat`,
//!   which fails if the name exists: no member ever sees a half-made region,
//!   and two processes making one at once end with one.
//!
//! It also owns what one process keeps for its membership ([`Local`]:
//! its dirty list's lock and reservations, its clock batch, the files it
//! has open, whether its flusher runs, the dead members its threads are
//! recovering; reset when a child joins, so nothing of the parent's
//! membership is used by the child; what the threads of a reader take,
//! the clock batch and the recovery marks, are atomic words, not locks a
//! thread of the parent may hold at the fork for ever) and [`FileIo`], one
//! open of a file shared by the process's handles of it.
//!
//! Membership ([`Region::me`]) belongs to a process: a child after `fork`
//! (or a raw `clone`) notices that its fork generation
//! ([`crate::fork::generation`]) is not the one that joined and
//! joins again on a new open of the file before it takes any lock, so it
//! never acts under its parent's slot, and it closes its inherited copy of
//! the parent's descriptor without releasing the parent's lock (the
//! parent's open file description still holds it).

use super::frame::Owner;
use super::layout::{hdr, Geometry, MEMBERS, PAGE64, READY};
use super::map::Mapping;
use super::member::{self, w as mw, LIFE, LIVE};
use crate::ipc::{check_private_file, RuntimeDir, RuntimeError};
use crate::sync::{AtomicUsize, Lock, Ordering};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

/// Why a region could not be joined (the caller falls back to a private
/// cache and says so once).
#[derive(Debug)]
pub enum RegionError {
    /// A system call failed.
    Io(&'static str, io::Error),
    /// The directory or file is not the user's own, or not what this code
    /// makes: refused, never written.
    Refused(String),
    /// Every member slot is taken by a live process.
    Full,
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io(what, e) => write!(f, "{what}: {e}"),
            RegionError::Refused(why) => write!(f, "refused: {why}"),
            RegionError::Full => write!(f, "all {MEMBERS} member slots are in use"),
        }
    }
}

impl std::error::Error for RegionError {}

/// A region's name: one path component that is not hidden (names
/// starting with `.` are the temporary names regions are made under).
fn check_name(n: &str) -> Result<(), RegionError> {
    if n.is_empty() || n.contains(['/', '\0']) || n.starts_with('.') {
        return Err(RegionError::Refused(format!("bad region name {n:?}")));
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn refused(e: RuntimeError) -> RegionError {
    RegionError::Refused(e.to_string())
}

fn pread_words(fd: &File, off: u64, n: usize) -> io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; n * 8];
    fd.read_exact_at(&mut buf, off)?;
    Ok(buf
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// Lay out a new region of at most `max_frames` frames in `fd`.
fn lay_out(fd: &File, max_frames: u64) -> io::Result<Geometry> {
    use std::os::unix::fs::FileExt;
    let g = Geometry::for_frames(max_frames);
    // SAFETY: `fd` is open for writing.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), g.len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let words = g.words(euid());
    let mut page = vec![0u8; PAGE64 as usize];
    for (i, w) in words.iter().enumerate() {
        page[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    page[hdr::STATE * 8..hdr::STATE * 8 + 8].copy_from_slice(&READY.to_le_bytes());
    fd.write_all_at(&page, 0)?;
    Ok(g)
}

/// What a region calls in the modules above it: recovery of a dead
/// member (`me` recovers `dead`, holding its liveness byte) and the clearing
/// of a member's openers bits; the face (`mod.rs`) fills them in, so that
/// this module imports none of them.
#[derive(Debug)]
pub(crate) struct Hooks {
    /// Undo what member `dead` left (the caller `me` holds its byte).
    pub(crate) recover: fn(&Region, Owner, Owner),
    /// A member leaving: its writer marks (their files' frames retired)
    /// and its bit in every file's openers cleared.
    pub(crate) leave_files: fn(&Region, Owner),
}

/// This process's membership: its slot, the fork generation that joined
/// and its open of the region file.
#[derive(Debug)]
struct Membership {
    me: Owner,
    gen: u64,
    fd: File,
}

/// A region this process has joined.
#[derive(Debug)]
pub struct Region {
    map: Mapping,
    name: PathBuf,
    dir: RuntimeDir,
    file_name: String,
    membership: Lock<Membership>,
    /// The descriptor `membership` owns, readable without its lock (it
    /// changes only when a child joins again, before the child has a
    /// second thread of ours).
    fd: crate::sync::AtomicU32,
    /// `generation << 8 | slot + 1` of the membership now (the fork
    /// generation, [`crate::fork::generation`]): two loads tell a child
    /// after fork or clone that it must join again, with no system call.
    current: crate::sync::AtomicU64,
    /// What this process keeps for its membership (its dirty list's lock
    /// and reservations, its open files, its flusher).
    pub(crate) local: Local,
    /// What the region calls in the modules above it (recovery).
    hooks: &'static Hooks,
    this: Weak<Region>,
}

impl Region {
    /// Join the region `name` in the user's own directory `dir` (made if
    /// missing), making the region if there is none, with room for
    /// `max_frames` frames when it is made.
    ///
    /// # Errors
    /// [`RegionError`]: the directory or file refused, a system call
    /// failed, or no member slot is free.
    pub(crate) fn join_with(
        dir: RuntimeDir,
        name: &str,
        max_frames: u64,
        hooks: &'static Hooks,
    ) -> Result<Arc<Region>, RegionError> {
        check_name(name)?;
        let path = dir.path().join(name);
        let fd = loop {
            match dir.open_existing(name) {
                Ok(fd) => break fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    if let Some(fd) = Self::make(&dir, name, max_frames)? {
                        break fd;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    return Err(RegionError::Refused(format!("{name} is a symbolic link")))
                }
                Err(e) => return Err(RegionError::Io("open the region", e)),
            }
        };
        let geo = Self::check(&fd, &path)?;
        let map =
            Mapping::map(fd.as_fd(), geo).map_err(|e| RegionError::Io("map the region", e))?;
        let raw = fd.as_raw_fd() as u32;
        let region = Arc::new_cyclic(|this| Region {
            map,
            name: path,
            dir,
            file_name: name.to_owned(),
            membership: Lock::new(Membership {
                me: Owner::of_slot(0),
                gen: 0,
                fd,
            }),
            fd: crate::sync::AtomicU32::new(raw),
            current: crate::sync::AtomicU64::new(0),
            local: Local::new(geo.max_frames),
            hooks,
            this: this.clone(),
        });
        region.enter()?;
        Ok(region)
    }

    /// This region as an `Arc` (for threads that hold it weakly).
    pub(crate) fn self_arc(&self) -> Option<Arc<Region>> {
        self.this.upgrade()
    }

    /// Make a region at `name` in `dir`: laid out under a name of its own,
    /// then linked into place. `None` when another process linked one first
    /// (the caller opens that one).
    fn make(dir: &RuntimeDir, name: &str, max_frames: u64) -> Result<Option<File>, RegionError> {
        let tmp = format!(".new-{}-{:x}", std::process::id(), member::now_ms());
        let fd = dir
            .create_new(&tmp)
            .map_err(|e| RegionError::Io("make the region", e))?;
        let made = lay_out(&fd, max_frames).map_err(|e| RegionError::Io("lay the region out", e));
        let linked = made.and_then(|_| match dir.link_new(&tmp, name) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(RegionError::Io("link the region into place", e)),
        });
        let _ = dir.remove_file(&tmp);
        Ok(linked?.then_some(fd))
    }

    /// Check an opened region file (`path` names it in messages): a
    /// private file of the user's ([`check_private_file`]) whose header
    /// is one this code wrote and whose length is the header's; its
    /// geometry.
    fn check(fd: &File, path: &Path) -> Result<Geometry, RegionError> {
        let st = check_private_file(fd, path).map_err(refused)?;
        let name = path.display();
        let words = pread_words(fd, 0, 10)
            .map_err(|e| RegionError::Refused(format!("{name}: its header cannot be read: {e}")))?;
        let w: [u64; 10] = words.try_into().unwrap();
        let geo = Geometry::from_words(&w, euid())
            .map_err(|e| RegionError::Refused(format!("{name}: {e}")))?;
        if st.st_size as u64 != geo.len {
            return Err(RegionError::Refused(format!(
                "{name} is {} bytes, its header says {}",
                st.st_size, geo.len
            )));
        }
        let state = pread_words(fd, (hdr::STATE * 8) as u64, 1)
            .map_err(|e| RegionError::Io("read the region's state", e))?;
        if state[0] != READY {
            return Err(RegionError::Refused(format!("{name} was never finished")));
        }
        Ok(geo)
    }

    /// Take a member slot through the current descriptor: the first slot
    /// whose liveness byte can be locked, recovered first if a dead member
    /// left it. Called with no membership lock held (recovery takes it).
    fn enter(&self) -> Result<(), RegionError> {
        for slot in 0..MEMBERS {
            let got = self
                .with_fd(|fd| LIFE.claim(fd, slot))
                .map_err(|e| RegionError::Io("lock a member slot", e))?;
            if !got {
                continue;
            }
            let me = Owner::of_slot(slot);
            let ms = self.map.member(slot);
            self.local.reset();
            // The slot is this process's from here (it holds the byte):
            // recovery below acts as it.
            let gen = crate::fork::generation();
            {
                let mut m = self.membership.lock();
                m.me = me;
                m.gen = gen;
            }
            self.current
                .store(gen << 8 | u64::from(me.bits()), Ordering::Release);
            if ms.state() != 0 {
                // A dead member's slot: undo what it left, as the member
                // taking its place (its dirty list becomes this one's).
                (self.hooks.recover)(self, me, me);
            } else {
                ms.words[mw::DIRTY_COUNT].store(0, Ordering::Relaxed);
                self.clear_dirty_member(me.slot());
                // A slot its last member left: a table lock still naming
                // it (taken after it was counted out) names no one.
                self.release_table_locks(me);
            }
            let round = (ms.state() >> 8) + 1;
            ms.words[mw::PID].store(u64::from(std::process::id()), Ordering::Relaxed);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            ms.words[mw::JOINED].store(now, Ordering::Relaxed);
            ms.words[mw::STATE].store(round << 8 | LIVE, Ordering::Release);
            self.map.header().words[hdr::MEMBERSHIP].fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        Err(RegionError::Full)
    }

    /// This process's member identity, joining again first if the process
    /// is not the one that joined (a child after fork or clone).
    ///
    /// # Errors
    /// The child's join failed (the caller treats the region as unusable
    /// for this call: a read reads the file, a write fails).
    #[inline]
    pub(crate) fn me(&self) -> Result<Owner, RegionError> {
        let cur = self.current.load(Ordering::Acquire);
        let gen = crate::fork::generation();
        if cur >> 8 == gen {
            if let Some(o) = Owner::from_bits(cur as u32 & 0xff) {
                return Ok(o);
            }
        }
        self.rejoin(gen)
    }

    #[cold]
    fn rejoin(&self, gen: u64) -> Result<Owner, RegionError> {
        {
            let mut m = self.membership.lock();
            if m.gen == gen {
                return Ok(m.me);
            }
            // A child: a new open of the file (its own open file
            // description), then a slot of its own. Dropping the old
            // descriptor closes the child's copy only; the parent's lock
            // stays with the parent.
            let fd = self
                .dir
                .open_existing(&self.file_name)
                .map_err(|e| RegionError::Io("open the region again after fork", e))?;
            Self::check(&fd, &self.name)?;
            self.fd.store(fd.as_raw_fd() as u32, Ordering::Release);
            m.fd = fd;
            m.gen = 0;
            self.current.store(0, Ordering::Release);
        }
        self.enter()?;
        self.me()
    }

    /// The mapping.
    #[inline]
    pub(crate) fn map(&self) -> &Mapping {
        &self.map
    }

    /// The region file's path.
    pub fn path(&self) -> &Path {
        &self.name
    }

    /// This process's slot, if it is a member now (without joining).
    pub fn member_slot(&self) -> Option<usize> {
        let cur = self.current.load(Ordering::Acquire);
        (cur >> 8 == crate::fork::generation())
            .then(|| Owner::from_bits(cur as u32 & 0xff).map(|o| o.slot()))
            .flatten()
    }

    /// Run `f` with this process's open of the region file (for liveness
    /// checks and recovery).
    pub(crate) fn with_fd<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> R {
        // SAFETY: the descriptor `membership` owns; it is closed only when
        // a child replaces it in `rejoin`, before any other thread of the
        // child uses the region.
        f(unsafe { BorrowedFd::borrow_raw(self.raw_fd()) })
    }

    /// The raw descriptor of this process's open of the region file.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire) as RawFd
    }

    /// Whether member `o`'s process is alive: it holds its liveness byte
    /// (this process's own slot is alive by definition).
    pub(crate) fn alive(&self, o: Owner) -> bool {
        if self.member_slot() == Some(o.slot()) {
            return true;
        }
        self.with_fd(|fd| LIFE.is_alive(fd, o.slot()).unwrap_or(true))
    }

    /// Take an owner lock word of the region (a file's, the file
    /// table's), recovering a dead holder.
    pub(crate) fn lock_word(&self, word: &crate::sync::AtomicU32, me: Owner) {
        let mut b = super::wait::Backoff::new();
        while word
            .compare_exchange(0, me.bits(), Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            if b.spin() {
                continue;
            }
            let cur = word.load(Ordering::Relaxed);
            if cur == 0 {
                continue;
            }
            super::wait::wait(word, cur, super::frame::WAIT_TICK);
            if let Some(o) = Owner::from_bits(word.load(Ordering::Relaxed)) {
                if o == Owner::from_bits(cur).unwrap_or(o) {
                    self.stuck(o);
                }
            }
        }
    }

    /// Release an owner lock word taken with [`lock_word`](Self::lock_word).
    pub(crate) fn unlock_word(word: &crate::sync::AtomicU32) {
        word.store(0, Ordering::Release);
        super::wait::wake_all(word);
    }

    /// A lock holder `o` makes no progress: if it is dead, recover it (the
    /// first to lock its liveness byte does; others return and wait again).
    pub(crate) fn stuck(&self, o: Owner) {
        if self.alive(o) {
            return;
        }
        let Some(mine) = self.member_slot() else {
            return;
        };
        let me = Owner::of_slot(mine);
        if me == o {
            return;
        }
        // One thread of this process at a time (see `Local::recovering`):
        // another one recovering the slot now, this one waits and looks
        // again, as a waiter on another process's recovery does.
        let busy = &self.local.recovering[o.slot()];
        let gen = crate::fork::generation();
        let cur = busy.load(Ordering::Acquire);
        if cur == gen
            || busy
                .compare_exchange(cur, gen, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // The turn ends however this returns: a recovery that unwinds does
        // not leave the slot marked for the rest of the process's life.
        let _turn = ClearOnDrop(busy);
        let got = self.with_fd(|fd| LIFE.claim(fd, o.slot()).unwrap_or(false));
        if got {
            // Another recoverer may have finished and a new member joined
            // between the liveness check and the lock: the lock says no one
            // holds the byte now, so the slot's state tells what is left.
            if self.map.member(o.slot()).state() != 0 {
                (self.hooks.recover)(self, o, me);
            }
            let _ = self.with_fd(|fd| LIFE.release(fd, o.slot()));
        }
    }

    /// Release the region's table locks (the file table's, the resize
    /// lock) that name member `o`; how many did.
    pub(crate) fn release_table_locks(&self, o: Owner) -> u64 {
        let mut n = 0;
        for word in [hdr::FILES_LOCK, hdr::RESIZE] {
            let l = self.map.header_u32(word);
            if l.compare_exchange(o.bits(), 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                super::wait::wake_all(l);
                n += 1;
            }
        }
        n
    }

    /// Leave the region: the slot is freed (the caller has written back
    /// what this member dirtied) and the liveness byte released.
    pub(crate) fn leave(&self) {
        let (me, gen) = {
            let m = self.membership.lock();
            (m.me, m.gen)
        };
        if gen != crate::fork::generation() {
            return; // a child that never joined: nothing of ours to free
        }
        let ms = self.map.member(me.slot());
        (self.hooks.leave_files)(self, me);
        ms.words[mw::DIRTY_COUNT].store(0, Ordering::Relaxed);
        self.clear_dirty_member(me.slot());
        ms.words[mw::STATE].store(0, Ordering::Release);
        self.map.header().words[hdr::MEMBERSHIP].fetch_add(1, Ordering::AcqRel);
        self.current.store(0, Ordering::Release);
        let _ = self.with_fd(|fd| LIFE.release(fd, me.slot()));
    }

    /// The header's word `i`.
    #[inline]
    pub(crate) fn hword(&self, i: usize) -> &crate::sync::AtomicU64 {
        &self.map.header().words[i]
    }
}

/// One open of a file in the region, shared by this process's handles of
/// it: the descriptor writebacks and fills use.
#[derive(Debug)]
pub(crate) struct FileIo {
    /// The file slot.
    pub(crate) slot: usize,
    /// The descriptor.
    pub(crate) fd: File,
    /// The region, when this open set the member's bit in the file's
    /// openers (a handle's open; not a recoverer's reopen): dropping it
    /// writes back what this member dirtied in the file and clears the bit.
    pub(crate) opener: Option<Weak<Region>>,
}

/// This process's side of its membership.
#[derive(Debug)]
pub(crate) struct Local {
    /// Where this process found pages last (see `hint`).
    pub(crate) hints: super::hint::Hints,
    /// Serializes appends to and compaction of this member's dirty list.
    pub(crate) dirty: Lock<()>,
    /// Entries reserved and not yet appended.
    pub(crate) reserved: AtomicUsize,
    /// Files this process has open, by slot.
    files: Lock<HashMap<usize, Weak<FileIo>>>,
    /// The fork generation of the process whose flusher thread runs (0:
    /// none in this process).
    pub(crate) flusher_gen: crate::sync::AtomicU64,
    /// The fork generation of the process that holds the region's place in
    /// the memory budget through this membership (0: none).
    pub(crate) budget_gen: crate::sync::AtomicU64,
    /// This process's fills and syncs drop the kernel's copy of the pages
    /// they read or wrote ([`Region::set_drop_behind`]).
    pub(crate) drop_behind: std::sync::atomic::AtomicBool,
    /// The clock batch this process walks (an atomic word, not a lock: a
    /// child after fork or clone gets it as it stood).
    hand: super::hand::Hand,
    /// For each member slot, the fork generation of this process while one
    /// of its threads recovers that slot (0: none). The liveness byte a
    /// recoverer locks keeps other processes out, not the other threads of
    /// this one: they lock it through the same open file description,
    /// which the kernel grants it to again. A generation not this
    /// process's is a parent's thread's at the fork: taken over.
    recovering: [crate::sync::AtomicU64; MEMBERS],
}

/// Stores 0 in its word when dropped (a thread's recovery turn ending).
struct ClearOnDrop<'a>(&'a crate::sync::AtomicU64);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

impl Local {
    fn new(max_frames: u64) -> Local {
        Local {
            hints: super::hint::Hints::new(max_frames),
            dirty: Lock::new(()),
            reserved: AtomicUsize::new(0),
            files: Lock::new(HashMap::new()),
            flusher_gen: crate::sync::AtomicU64::new(0),
            budget_gen: crate::sync::AtomicU64::new(0),
            drop_behind: std::sync::atomic::AtomicBool::new(false),
            hand: super::hand::Hand::new(),
            recovering: [const { crate::sync::AtomicU64::new(0) }; MEMBERS],
        }
    }

    /// A new membership (after join or a child's rejoin): nothing reserved,
    /// no flusher in this process yet (a parent's is not the child's).
    pub(crate) fn reset(&self) {
        self.reserved.store(0, Ordering::Relaxed);
        self.hand.reset();
    }

    /// The next frame of this process's clock batch, taking a new batch
    /// (`claim` returns its first frame) when it is used up.
    pub(crate) fn next_hand(&self, claim: impl FnOnce() -> u64) -> u64 {
        self.hand.next(claim)
    }

    /// Remember `io` as this process's open of its slot.
    pub(crate) fn register(&self, io: &Arc<FileIo>) {
        let mut m = self.files.lock();
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(io.slot, Arc::downgrade(io));
    }

    pub(crate) fn file(&self, slot: usize) -> Option<Arc<FileIo>> {
        self.files.lock().get(&slot).and_then(Weak::upgrade)
    }
}
