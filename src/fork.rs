//! Which process this is: a fork generation that stays the same for the
//! life of a process and is greater in every child it makes, however the
//! child was made (`fork(2)`, glibc's `_Fork`, a raw `clone(2)` or
//! `clone3` without `CLONE_VM`), and the descriptors a child must not
//! keep.
//!
//! Why: a child gets a copy of the parent's memory (its I/O rings' shared
//! queues, its caches, its budget membership) and shares the parent's open
//! file descriptions (and with them their OFD locks), but none of the
//! parent's threads. Whatever belongs to one process records the
//! generation it was made in and compares it before use; a mismatch means
//! "inherited: do not touch, make your own".
//!
//! How a child is told apart, cheaply: the generation is stamped in a page
//! advised `MADV_WIPEONFORK` (Linux 4.14), which the kernel hands to every
//! child of a `fork`-like `clone` zeroed, whatever the C library ran; the
//! hot check is one load of that word. A zero stamp sends the caller to
//! the slow path, which compares `getpid()` with the pid the generation
//! belongs to and, in a new process, moves the generation on (one
//! compare-and-swap of a word holding both, so threads of a child racing
//! there agree). A `pthread_atfork` child handler also clears the stamp
//! (for kernels without `MADV_WIPEONFORK`, where a raw `clone` child then
//! goes unnoticed) and closes the descriptors registered with
//! [`close_in_child`].
//!
//! Owns the stamp page, the generation word, the child handler and the
//! parent's after-fork hooks ([`in_parent_after_fork`]).
//! Invariants:
//! - [`generation`] returns the same value in a process from its first call
//!   until that process makes a child; in the child it returns a greater
//!   one from its first call on;
//! - the slow path takes no lock (a lock held by another thread of the
//!   parent at fork time stays held in the child for ever);
//! - the child handler does only async-signal-safe work (atomic stores and
//!   `close`), as a handler run in the child of a multithreaded process
//!   must;
//! - a descriptor registered with [`close_in_child`] is closed exactly once
//!   in a child: by the handler, or by [`InheritedFd::release`] where no
//!   handler ran, never by both (one atomic swap decides);
//! - a `vfork` child shares the parent's memory and sees the parent's
//!   generation: as POSIX says, it may only call `execve` or `_exit`.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// The pid (high half) and generation (low half) of the process that
/// last took the slow path.
static STATE: AtomicU64 = AtomicU64::new(0);
/// The stamp: the generation plus one, in a page wiped in every child;
/// null until the first call.
static STAMP: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
/// Whether the `pthread_atfork` handler is installed.
static HANDLER: AtomicBool = AtomicBool::new(false);
/// Descriptors a child closes (-1: a free entry).
static CLOSE_IN_CHILD: [AtomicI32; CLOSE_SLOTS] = [const { AtomicI32::new(-1) }; CLOSE_SLOTS];
/// Entries of [`CLOSE_IN_CHILD`].
const CLOSE_SLOTS: usize = 64;
/// Functions the parent runs after each `fork` ([`in_parent_after_fork`];
/// 0: a free entry).
static PARENT_HOOKS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// This process's fork generation (see the module notes): one load when
/// the process has used it before, a `getpid` the first time and in a new
/// child.
///
/// ```
/// let g = kxarray::fork::generation();
/// assert_eq!(kxarray::fork::generation(), g); // the same process
/// assert!(g > 0);
/// ```
#[inline]
pub fn generation() -> u64 {
    let p = STAMP.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null stamp points into the page `stamp_page`
        // mapped for the life of the process (never unmapped).
        let s = unsafe { &*p }.load(Ordering::Relaxed);
        if s != 0 {
            return s - 1;
        }
    }
    slow()
}

/// Whether this process is a child of the one whose generation was `g`
/// (or of one of its children): `g` is not this process's generation.
#[inline]
pub fn inherited(g: u64) -> bool {
    g != generation()
}

#[cold]
#[inline(never)]
fn slow() -> u64 {
    install_handler();
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() } as u32 as u64;
    let mut cur = STATE.load(Ordering::Acquire);
    let gen = loop {
        if cur >> 32 == pid {
            break cur & 0xFFFF_FFFF;
        }
        let next = (pid << 32) | ((cur + 1) & 0xFFFF_FFFF);
        match STATE.compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break next & 0xFFFF_FFFF,
            Err(now) => cur = now,
        }
    };
    if let Some(stamp) = stamp_page() {
        stamp.store(gen + 1, Ordering::Relaxed);
    }
    gen
}

/// The stamp word, mapping its page on the first call (lock-free: a
/// thread that loses the race unmaps its own page); `None` where no page
/// could be had (then every call takes the slow path).
fn stamp_page() -> Option<&'static AtomicU64> {
    let p = STAMP.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as in `generation`.
        return Some(unsafe { &*p });
    }
    const LEN: usize = 4096;
    // SAFETY: a new private anonymous mapping at an address the kernel
    // picks: no existing memory is affected.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: `page` is the mapping just made, `LEN` bytes.
    let wiped = unsafe { libc::madvise(page, LEN, libc::MADV_WIPEONFORK) } == 0;
    if !wiped {
        log::debug!(
            "kxarray: MADV_WIPEONFORK refused ({}): a child made without fork() \
             is told apart only by its first getpid() check",
            std::io::Error::last_os_error()
        );
    }
    let word = page.cast::<AtomicU64>();
    match STAMP.compare_exchange(
        std::ptr::null_mut(),
        word,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: the mapping is zeroed, page-aligned and lives for the
        // rest of the process: a valid `AtomicU64`.
        Ok(_) => Some(unsafe { &*word }),
        Err(theirs) => {
            // SAFETY: our own mapping, which nobody else has seen.
            unsafe { libc::munmap(page, LEN) };
            // SAFETY: as in `generation`.
            Some(unsafe { &*theirs })
        }
    }
}

/// Runs in the child of `fork(2)` (not of `_Fork` or a raw `clone`):
/// clears the stamp and closes the registered descriptors.
extern "C" fn in_child() {
    let p = STAMP.load(Ordering::Relaxed);
    if !p.is_null() {
        // SAFETY: as in `generation`; an atomic store is
        // async-signal-safe.
        unsafe { &*p }.store(0, Ordering::Relaxed);
    }
    for e in &CLOSE_IN_CHILD {
        let fd = e.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: a descriptor registered by its owner, which no
            // longer closes it in this process (the swap took it);
            // `close` is async-signal-safe.
            unsafe { libc::close(fd) };
        }
    }
}

/// Runs in the parent after `fork(3)` returns there: the registered
/// hooks.
extern "C" fn in_parent() {
    for h in &PARENT_HOOKS {
        let f = h.load(Ordering::Acquire);
        if f != 0 {
            // SAFETY: only `in_parent_after_fork` stores here, and it
            // stores `fn()` pointers, which live for the whole process.
            let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(f) };
            let _ = std::panic::catch_unwind(f);
        }
    }
}

/// Run `hook` in this process after each `fork(3)` it makes (on the
/// forking thread, as `fork` returns in the parent; not after `_Fork` or a
/// raw `clone`): for work a process that forks needs, being long-lived
/// (a pre-fork server's master), such as starting a thread it put off.
/// The same function registered twice runs once; at most 8 are kept
/// (`false` past that).
pub fn in_parent_after_fork(hook: fn()) -> bool {
    install_handler();
    let f = hook as usize;
    for h in &PARENT_HOOKS {
        match h.compare_exchange(0, f, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(cur) if cur == f => return true,
            Err(_) => {}
        }
    }
    false
}

fn install_handler() {
    if HANDLER.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: `in_parent` and `in_child` are plain `extern "C" fn()`s
    // living for the whole process; `in_child` is async-signal-safe;
    // there is no prepare handler.
    let rc = unsafe { libc::pthread_atfork(None, Some(in_parent), Some(in_child)) };
    if rc != 0 {
        log::warn!("kxarray: pthread_atfork failed ({rc}): forked children are told apart by getpid() only");
    }
}

/// A descriptor registered with [`close_in_child`]: closed in a child by
/// the fork handler, or by [`release`](InheritedFd::release) where none
/// ran. The owner keeps the descriptor and closes it itself in its own
/// process (after [`forget`](InheritedFd::forget)).
#[derive(Debug)]
pub struct InheritedFd {
    slot: Option<usize>,
    fd: i32,
    generation: u64,
}

/// Register `fd` (owned by the caller, open in this process) to be closed
/// in every child at once: by the `pthread_atfork` handler of a `fork`,
/// or by the owner's [`InheritedFd::release`] in a child made otherwise.
/// For descriptors whose open file description carries state another
/// process may depend on (an OFD lock that proves a member alive, a lock
/// its holder may die inside): a child that keeps the description keeps
/// the lock. At most 64 descriptors are registered at once; past that the
/// descriptor is closed only by `release`.
///
/// ```
/// use std::os::fd::AsRawFd;
/// let f = tempfile::tempfile().unwrap();
/// let mark = kxarray::fork::close_in_child(f.as_raw_fd());
/// assert!(!mark.is_inherited()); // this process's own
/// mark.forget(); // then close `f` as usual
/// ```
pub fn close_in_child(fd: i32) -> InheritedFd {
    let generation = generation();
    let slot = CLOSE_IN_CHILD.iter().position(|e| {
        e.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    InheritedFd {
        slot,
        fd,
        generation,
    }
}

impl InheritedFd {
    /// Whether this process is a child of the one that registered it.
    pub fn is_inherited(&self) -> bool {
        inherited(self.generation)
    }

    /// In a child: close the descriptor unless the fork handler did (the
    /// caller must then not close it, nor use it). In the owning process:
    /// the same as [`forget`](InheritedFd::forget) (and the caller closes
    /// it).
    pub fn release(self) {
        if !self.is_inherited() {
            return self.forget();
        }
        let fd = match self.slot {
            Some(i) => CLOSE_IN_CHILD[i].swap(-1, Ordering::AcqRel),
            None => self.fd,
        };
        if fd == self.fd {
            // SAFETY: the inherited descriptor, which its owner never
            // closes in this process (it gave it here) and no handler
            // closed (the swap found it).
            unsafe { libc::close(fd) };
        }
    }

    /// In the owning process: unregister (the caller closes the
    /// descriptor next).
    pub fn forget(self) {
        if let Some(i) = self.slot {
            if !self.is_inherited() {
                let _ = CLOSE_IN_CHILD[i].compare_exchange(
                    self.fd,
                    -1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
        }
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A child made with glibc's `_Fork` (no atfork handler runs) sees a
    /// new generation; one made with `fork` too, and its registered
    /// descriptor is closed before `fork` returns there.
    #[test]
    fn children_are_told_apart() {
        extern "C" {
            fn _Fork() -> libc::pid_t;
        }
        let g = generation();
        let f = tempfile::tempfile().unwrap();
        let mark = close_in_child(f.as_raw_fd());
        for raw in [true, false] {
            let pid = if raw {
                // SAFETY: the child only reads atomics, calls getpid and
                // fcntl, and leaves with _exit.
                unsafe { _Fork() }
            } else {
                // SAFETY: as above.
                unsafe { libc::fork() }
            };
            assert!(pid >= 0);
            if pid == 0 {
                let moved = generation() > g && generation() == generation();
                // SAFETY: F_GETFD on a number: no memory involved.
                let open = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFD) } >= 0;
                let ok = moved && (open == raw);
                // SAFETY: leaving the child without running the parent's
                // exit handlers.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "raw {raw}: status {status}"
            );
        }
        assert_eq!(generation(), g);
        assert!(!mark.is_inherited());
        mark.forget();
    }
}
