//! A folio's bytes ([`FolioMem`]): the buffer that holds them, the version
//! lock-free readers validate a copy against, the lock writers take, and the
//! pins ([`BufPin`]) that keep one buffer's bytes readable without blocking
//! anyone.
//!
//! Owns buffers (`Buf`: a header with a reference count and the length, and
//! the bytes, page-aligned once they are a page or more, so `O_DIRECT` I/O
//! needs no bounce buffer; every buffer of one folio has the folio's length,
//! fixed when the folio is made) and the protocol over them:
//!
//! - **References.** A folio holds one reference to its current buffer,
//!   each [`BufPin`] one more. A buffer whose count drops to zero is freed
//!   after an epoch grace period (an optimistic reader may still be copying
//!   from it under its guard). A count that reached zero is never raised
//!   again (a pin raises it only from a non-zero value).
//! - **Who writes what.** Only the holder of the folio's lock ([`MemWrite`])
//!   changes anything: which buffer is current, and the bytes of the current
//!   buffer. It writes the current buffer's bytes in place only while the
//!   folio's reference is the only one (nothing pinned); otherwise it writes
//!   a copy and publishes that (copy-on-write), so a pinned buffer's bytes
//!   never change and a [`BufPin`] may lend them as `&[u8]`. Bytes written in
//!   place are written byte-wise atomically ([`bytewise`]), because an
//!   optimistic reader may be copying them at that moment; a buffer not yet
//!   published is written with plain stores (no one else can reach it).
//! - **The version** (`seq`). Even while the bytes are stable. The writer
//!   makes it odd before it writes in place and even again (two higher)
//!   after, and moves it on by two whenever it replaces or drops the buffer.
//!   An optimistic reader ([`FolioMem::read`]) copies between two loads of
//!   the version and keeps the copy only if both are equal and even: it
//!   writes nothing shared, so readers on many cores never pass a cache line
//!   between them.
//! - **Writer against pinner**, a Dekker handshake in the `SeqCst` order:
//!   the writer stores the odd version, issues a `SeqCst` fence, then reads
//!   the count; a pinner raises the count (a `SeqCst` read-modify-write),
//!   then reads the version again (a `SeqCst` load). Either the writer sees
//!   the pin (and copies instead of writing in place) or the pinner sees the
//!   version move (and drops its pin before lending a byte).
//!
//! This is what lets a borrower hold a folio's bytes for as long as it likes
//! (SQLite's `xFetch` pages, a parser walking a page in place) while writes
//! to the same folio, from any thread including its own, complete at once:
//! the borrower keeps the bytes it pinned, readers after the write see the
//! new ones, the kernel's coherent `mmap` is not the model (Rust's `&[u8]`
//! promises the bytes do not change under it).

use super::frames;
use crate::bytewise;
use crate::guard::ProtectsBuffers;
use crate::sync::{fence, AtomicPtr, AtomicU32, AtomicU64, Lock, LockGuard, Ordering};
use core::fmt;
use core::ptr::NonNull;

/// A buffer could not be allocated (`ENOMEM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocError {
    /// Bytes asked for.
    pub bytes: usize,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot allocate a folio buffer of {} bytes", self.bytes)
    }
}

impl std::error::Error for AllocError {}

/// One buffer: a frame ([`frames::Frame`]: its header and its bytes,
/// recycled through the frames' free lists when freed).
type Buf = frames::Frame;

impl Buf {
    /// A buffer of `len` bytes holding one reference (its creator's), and
    /// whether its bytes are zero (otherwise stale: a former folio's).
    fn alloc(len: usize) -> Result<(NonNull<Buf>, bool), AllocError> {
        let (b, zeroed) = frames::take(len).ok_or(AllocError { bytes: len })?;
        // SAFETY: a frame just taken: ours alone.
        unsafe { b.as_ref() }.refs.store(1, Ordering::Relaxed);
        Ok((b, zeroed))
    }

    /// Give the buffer back to the frames.
    ///
    /// # Safety
    /// - `b` came from [`Buf::alloc`] and is freed once;
    /// - no one can reach it any more: its count is zero and every reader
    ///   that loaded it from a folio has finished (a grace period passed),
    ///   or it was never published.
    unsafe fn free(b: NonNull<Buf>) {
        // SAFETY: live until given back just below.
        debug_assert!(unsafe { b.as_ref() }.refs.load(Ordering::Relaxed) <= 1);
        // SAFETY: from `frames::take` (through `Buf::alloc`), given back
        // once, unreachable (the contract).
        unsafe { frames::give(b) };
    }

    /// Drop one reference; the last one frees the buffer after a grace
    /// period.
    ///
    /// # Safety
    /// - The caller owns one reference of `b` and gives it up here.
    unsafe fn unref(b: NonNull<Buf>) {
        // SAFETY: a reference is owned, so the buffer is allocated.
        let refs = unsafe { &b.as_ref().refs };
        debug_assert!(refs.load(Ordering::Relaxed) > 0);
        if refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            Buf::retire(b);
        }
    }

    /// Free a buffer whose count reached zero once every reader pinned now
    /// has left: crossbeam guards, then light sections (the page cache's
    /// hit path reads under a light pin).
    fn retire(b: NonNull<Buf>) {
        struct Send(NonNull<Buf>);
        // SAFETY: the pointer is only freed by the deferred call, on
        // whichever thread runs it; the buffer holds plain bytes.
        unsafe impl core::marker::Send for Send {}
        /// The buffer's free for the light limbo.
        ///
        /// # Safety
        /// `p` is a retired buffer nothing else frees, unreachable to every
        /// reader (`lightpin`'s `defer_free` contract).
        unsafe fn free_erased(p: NonNull<u8>) {
            // SAFETY: per the contract.
            unsafe { Buf::free(p.cast()) }
        }
        let p = Send(b);
        if cfg!(loom) {
            // No light reader under loom (the page cache's `LIGHT_HITS`),
            // and a free delayed into a later model execution would touch
            // its state: crossbeam's grace period alone.
            let free = move || {
                let p = p;
                // SAFETY: run once, after the grace period (below).
                unsafe { Buf::free(p.0) }
            };
            let guard = crate::pin();
            // SAFETY: as below, without light readers.
            unsafe { guard.defer_unchecked(free) };
            return;
        }
        let arrivals = crate::lightpin::arrivals();
        // SAFETY: the count is zero, so the buffer is ours until freed.
        let bytes = unsafe { b.as_ref() }.len();
        let to_limbo = move || {
            let p = p;
            // SAFETY: run once, after crossbeam's grace period (below); the
            // limbo then waits for the light sections.
            unsafe { arrivals.push_sized(p.0.cast(), free_erased, bytes) }
        };
        let guard = crate::pin();
        // SAFETY: the count is zero: no folio points to the buffer any more
        // (a folio drops its reference only after unpublishing it) and no
        // pin holds it, and a zero count is never raised again, so after
        // the grace periods nobody can reach it; readers that loaded it
        // before it was unpublished hold guards pinned before this call,
        // which the deferral waits for, or light pins, which the limbo
        // waits for.
        unsafe { guard.defer_unchecked(to_limbo) };
        // Crossbeam seals a thread's bag of deferred frees at 64 entries:
        // 64 buffers of up to 2 MiB each out of reach. Past 2 MiB retired
        // by this thread, the bag goes to the global queue now.
        let flush = RETIRED.with(|r| {
            let n = r.get() + bytes;
            r.set(if n >= RETIRED_FLUSH { 0 } else { n });
            n >= RETIRED_FLUSH
        });
        if flush {
            guard.flush();
        }
    }
}

/// Bytes of buffers a thread retires between two flushes of its bag.
const RETIRED_FLUSH: usize = 2 << 20;

crate::sync::thread_local_const! {
    /// Bytes of buffers this thread retired since its bag was last flushed.
    static RETIRED: core::cell::Cell<usize> = core::cell::Cell::new(0);
}

/// A folio's bytes: see the module docs for the protocol. The version,
/// the bytes' pointer and the length come first (what a lock-free read
/// loads).
#[repr(C)]
pub(crate) struct FolioMem {
    /// The version: even when stable, odd during an in-place write.
    seq: AtomicU64,
    /// The current buffer's bytes (null: none yet, or dropped), beside its
    /// header so the lock-free read follows one pointer less.
    data: AtomicPtr<u8>,
    /// Bytes of every buffer of this folio; never changes. Third: a
    /// lock-free read checks its range against it.
    len: usize,
    /// The current buffer (null when `data` is).
    buf: AtomicPtr<Buf>,
    /// Borrows under a guard ([`MemBorrow`]) of the current buffer: counted
    /// here, on the folio's own line, not on the buffer's header (a
    /// borrow's bytes are kept alive by its guard, not by a reference).
    borrows: AtomicU32,
    /// Writers, fills, writeback and removal serialize on it.
    lock: Lock<()>,
}

impl FolioMem {
    /// No buffer yet; every buffer will be `len` bytes.
    pub(crate) fn new(len: usize) -> FolioMem {
        FolioMem {
            seq: AtomicU64::new(0),
            data: AtomicPtr::new(core::ptr::null_mut()),
            len,
            buf: AtomicPtr::new(core::ptr::null_mut()),
            borrows: AtomicU32::new(0),
            lock: Lock::new(()),
        }
    }

    /// The address just past the fields a lock-free read loads (for a
    /// layout test).
    #[cfg(test)]
    pub(crate) fn hot_end(&self) -> usize {
        &self.len as *const usize as usize + core::mem::size_of::<usize>()
    }

    /// Copy bytes `at..at + out.len()` of the current buffer into `out`
    /// without taking the lock or writing anything shared. Returns `false`
    /// (and `out` holds garbage) if there is no buffer, the range does not
    /// fit in it, or a writer changed it meanwhile: the caller then takes
    /// the lock ([`FolioMem::lock`]) and reads under it.
    #[inline]
    pub(crate) fn read<P: ProtectsBuffers>(&self, at: usize, out: &mut [u8], _pin: &P) -> bool {
        let s = self.seq.load(Ordering::Acquire);
        if s & 1 != 0 || at > self.len || self.len - at < out.len() {
            return false;
        }
        let data = self.data.load(Ordering::Acquire);
        if data.is_null() {
            return false;
        }
        #[cfg(all(test, not(loom)))]
        tests::before_copy();
        // SAFETY: a non-null `data` is the bytes of a buffer that was
        // current when loaded under `_pin`, `self.len` bytes long, and a
        // buffer is freed only after grace periods that began after it
        // stopped being current, so it stays allocated while the pin lives
        // (`ProtectsBuffers`); `at..at + out.len()` lies inside (just checked); every
        // concurrent write to it is an in-place write of the lock holder,
        // made through `bytewise::store`/`fill`.
        unsafe { bytewise::load(out, data.wrapping_add(at)) };
        // Order the copy's loads before the second load of the version (the
        // writer orders its odd version before its first byte store).
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == s
    }

    /// Pin the current buffer without the lock: its bytes stay readable and
    /// unchanged until the pin is dropped, and no writer waits for it.
    /// `None` if there is no buffer or a writer is at work (the caller
    /// retries, or takes the lock and pins with [`MemWrite::pin`]).
    #[inline]
    pub(crate) fn pin<P: ProtectsBuffers>(&self, _pin: &P) -> Option<BufPin> {
        let s = self.seq.load(Ordering::Acquire);
        if s & 1 != 0 {
            return None;
        }
        let p = NonNull::new(self.buf.load(Ordering::Acquire))?;
        // SAFETY: as in `read`, a buffer loaded under the guard stays
        // allocated while it lives.
        let refs = unsafe { &p.as_ref().refs };
        let mut n = refs.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return None; // no longer current, being retired
            }
            match refs.compare_exchange_weak(n, n + 1, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => break,
                Err(m) => n = m,
            }
        }
        let pin = BufPin(p);
        // The pinner's half of the handshake: count raised (a SeqCst
        // read-modify-write), then the version read again with a SeqCst
        // load. Against the writer's store, SeqCst fence, load: if the
        // raise is before the writer's fence in the SeqCst order, the
        // writer's load sees it; if the fence is before the raise, so is it
        // before this load, which then sees the writer's store (C++20
        // [atomics.order]). On x86 the raise's locked instruction is the
        // whole cost; no fence instruction. Loom treats SeqCst accesses as
        // AcqRel, so there the same half is a SeqCst fence and a relaxed
        // load (what the models check; equivalent by the same rules).
        #[cfg(loom)]
        fence(Ordering::SeqCst);
        let order = if cfg!(loom) {
            Ordering::Relaxed
        } else {
            Ordering::SeqCst
        };
        if self.seq.load(order) != s {
            return None; // `pin` drops the reference again
        }
        // A publish stores the new bytes' address before it swaps `buf`
        // (and moves the version after): a reader that copied the new
        // bytes before this call must not be handed the old buffer from
        // that window. This load sees the new address then (read-read
        // coherence), and the caller takes the lock.
        if !core::ptr::eq(self.data.load(Ordering::Acquire), pin.bytes().as_ptr()) {
            return None;
        }
        Some(pin)
    }

    /// Borrow the current buffer's bytes for as long as `_pin` lives,
    /// without a reference on the buffer: the count of borrows sits on the
    /// folio's own line (a zero-copy hit touches no other), writers copy
    /// instead of writing in place while it is non-zero, and the pin (a
    /// guard) keeps the borrowed buffer allocated if a writer replaces it
    /// meanwhile (a replaced buffer is freed only after a grace period).
    /// `None` if there is no buffer or a writer is at work.
    #[inline]
    pub(crate) fn borrow<'g, P: ProtectsBuffers>(&'g self, _pin: &'g P) -> Option<MemBorrow<'g>> {
        let s = self.seq.load(Ordering::Acquire);
        if s & 1 != 0 {
            return None;
        }
        let data = NonNull::new(self.data.load(Ordering::Acquire))?;
        self.borrows.fetch_add(1, Ordering::SeqCst);
        let b = MemBorrow { mem: self, data };
        // The borrower's half of the handshake, as `pin`'s: count raised,
        // then the version read again.
        #[cfg(loom)]
        fence(Ordering::SeqCst);
        let order = if cfg!(loom) {
            Ordering::Relaxed
        } else {
            Ordering::SeqCst
        };
        if self.seq.load(order) != s {
            return None; // `b` lowers the count again
        }
        Some(b)
    }

    /// Ask the CPU to fetch the current buffer's header (reclaim reads its
    /// count before it evicts). A hint: reads nothing the program sees.
    #[inline]
    pub(crate) fn prefetch_buffer(&self) {
        crate::node::prefetch(self.buf.load(Ordering::Relaxed).cast_const().cast());
    }

    /// Take the lock (waiting for the writer that holds it).
    #[inline]
    pub(crate) fn lock(&self) -> MemWrite<'_> {
        MemWrite {
            mem: self,
            _lock: self.lock.lock(),
        }
    }

    /// Take the lock if no one holds it.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<MemWrite<'_>> {
        Some(MemWrite {
            mem: self,
            _lock: self.lock.try_lock()?,
        })
    }
}

impl FolioMem {
    /// Whether `pin` pins the folio's current buffer: then its bytes are
    /// the folio's now (a pinned buffer never changes, and a write to the
    /// folio makes another buffer current). Loads only, no write; the
    /// pinned buffer stays allocated, so its address cannot be reused.
    /// The bytes' address is the one compared: a publish stores it before
    /// it swaps `buf`, so a reader that already copied the new bytes never
    /// finds the old buffer current in between.
    #[inline]
    pub(crate) fn holds(&self, pin: &BufPin) -> bool {
        core::ptr::eq(self.data.load(Ordering::Acquire), pin.bytes().as_ptr())
    }

    /// Make `new` current (its bytes first, for the readers that load only
    /// them), move the version on, and drop the folio's reference to the
    /// old buffer. Only the lock holder calls it.
    fn publish(&self, new: Option<NonNull<Buf>>) {
        let data = match new {
            // SAFETY: `new` is a live buffer this call makes current.
            Some(b) => unsafe { b.as_ref() }.data().as_ptr(),
            None => core::ptr::null_mut(),
        };
        debug_assert!(
            // SAFETY: as above.
            new.is_none_or(|b| unsafe { b.as_ref() }.len() == self.len),
            "a folio's buffers all have its length"
        );
        self.data.store(data, Ordering::Release);
        let old = self.buf.swap(
            new.map_or(core::ptr::null_mut(), NonNull::as_ptr),
            Ordering::AcqRel,
        );
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store((s | 1).wrapping_add(1), Ordering::Release);
        if let Some(old) = NonNull::new(old) {
            // SAFETY: the folio owned one reference of its current buffer,
            // which it no longer points to (unpublished above).
            unsafe { Buf::unref(old) };
        }
    }
}

impl Drop for FolioMem {
    fn drop(&mut self) {
        let Some(b) = NonNull::new(self.buf.load(Ordering::Relaxed)) else {
            return;
        };
        // SAFETY: the folio owns one reference of its current buffer. No
        // optimistic reader can be copying from it now: readers reach a
        // buffer only through a live `&Folio` (borrowed under a guard that
        // keeps the folio itself alive, or through an `Arc`), and the folio
        // is being dropped; pins hold references of their own.
        let last = unsafe { b.as_ref() }.refs.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            // SAFETY: count zero, unreachable (see above).
            unsafe { Buf::free(b) };
        }
    }
}

impl fmt::Debug for FolioMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FolioMem")
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A counted reference to one buffer: its bytes stay readable and unchanged
/// while it lives, whatever writers and reclaim do to the folio meanwhile.
pub(crate) struct BufPin(NonNull<Buf>);

// SAFETY: a pinned buffer's bytes never change (module invariant) and its
// header is only touched atomically, so the pin may move to and be shared
// with any thread.
unsafe impl Send for BufPin {}
// SAFETY: as above.
unsafe impl Sync for BufPin {}

impl BufPin {
    /// The pinned bytes.
    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the pin's reference keeps the header allocated.
        let b = unsafe { self.0.as_ref() };
        // SAFETY: the bytes live as long as the header, and while the pin is
        // counted no writer changes them (a writer writes in place only
        // with the count at one, the folio's own).
        unsafe { core::slice::from_raw_parts(b.data().as_ptr(), b.len()) }
    }
}

impl Clone for BufPin {
    fn clone(&self) -> BufPin {
        // SAFETY: this pin's reference keeps the buffer allocated.
        unsafe { self.0.as_ref() }
            .refs
            .fetch_add(1, Ordering::Relaxed);
        BufPin(self.0)
    }
}

impl Drop for BufPin {
    fn drop(&mut self) {
        // SAFETY: the pin owns one reference.
        unsafe { Buf::unref(self.0) }
    }
}

impl fmt::Debug for BufPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPin")
            .field("len", &self.bytes().len())
            .finish()
    }
}

/// A borrow of a folio's bytes under a guard ([`FolioMem::borrow`]): they
/// stay allocated (the guard) and unchanged (writers copy while the folio's
/// borrow count is non-zero) for `'g`.
pub(crate) struct MemBorrow<'g> {
    mem: &'g FolioMem,
    data: NonNull<u8>,
}

impl<'g> MemBorrow<'g> {
    /// The borrowed bytes.
    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `data` is the bytes of a buffer that was current when
        // loaded under the guard `'g` (this borrow's lifetime), `len` bytes
        // long as every buffer of the folio; it is freed only after a grace
        // period that began after it stopped being current, so it lives for
        // `'g`; while the borrow is counted, a writer does not write the
        // current buffer in place (and a replaced one never changes).
        unsafe { core::slice::from_raw_parts(self.data.as_ptr(), self.mem.len) }
    }
}

impl Drop for MemBorrow<'_> {
    #[inline]
    fn drop(&mut self) {
        self.mem.borrows.fetch_sub(1, Ordering::Release);
    }
}

impl fmt::Debug for MemBorrow<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBorrow")
            .field("len", &self.mem.len)
            .finish()
    }
}

/// The folio's lock, held: the only way to change its buffer or bytes.
pub(crate) struct MemWrite<'a> {
    mem: &'a FolioMem,
    _lock: LockGuard<'a, ()>,
}

impl MemWrite<'_> {
    /// The current buffer (the lock holder is its only writer).
    fn cur(&self) -> Option<&Buf> {
        let b = self.mem.buf.load(Ordering::Acquire);
        // SAFETY: the folio's reference keeps its current buffer allocated,
        // and only the lock holder (this guard) replaces or drops it.
        unsafe { b.as_ref() }
    }

    /// The current buffer's length (0 without one).
    pub(crate) fn len(&self) -> usize {
        self.cur().map_or(0, |b| b.len())
    }

    /// The current buffer's bytes (empty without one), to read.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self.cur() {
            // SAFETY: the bytes are allocated while the buffer is current,
            // which it stays while this guard is borrowed (only `&mut self`
            // methods replace it); they change only through `&mut self`
            // methods of this, the only, writer, which the shared borrow
            // excludes; other threads only read them.
            Some(b) => unsafe { core::slice::from_raw_parts(b.data().as_ptr(), b.len()) },
            None => &[],
        }
    }

    /// Whether a pin holds the current buffer (reclaim leaves such folios).
    pub(crate) fn is_pinned(&self) -> bool {
        self.mem.borrows.load(Ordering::Acquire) > 0
            || self
                .cur()
                .is_some_and(|b| b.refs.load(Ordering::Acquire) > 1)
    }

    /// Pin the current buffer (no writer can be at work: this is it).
    pub(crate) fn pin(&self) -> Option<BufPin> {
        let b = self.cur()?;
        // The count is at least one (the folio's), so raising it is safe;
        // writers see it once they take the lock after this guard.
        b.refs.fetch_add(1, Ordering::SeqCst);
        Some(BufPin(NonNull::from(b)))
    }

    /// Make a new buffer of the folio's length, let `fill` write it (it is
    /// private until published), and make it current, dropping the old
    /// one. `fill` is told whether the bytes are zero; otherwise they are a
    /// recycled frame's stale bytes, and it must write every byte a reader
    /// may see (the frames hand out recycled frames unzeroed: a miss fills
    /// its folio from the backend anyway). When `fill` fails nothing
    /// changes and its error is returned.
    ///
    /// # Errors
    /// [`InstallError::Alloc`] when the buffer cannot be allocated,
    /// [`InstallError::Fill`] with `fill`'s error.
    pub(crate) fn install<E>(
        &mut self,
        fill: impl FnOnce(&mut [u8], bool) -> Result<(), E>,
    ) -> Result<(), InstallError<E>> {
        let len = self.mem.len;
        let (new, zeroed) = Buf::alloc(len).map_err(InstallError::Alloc)?;
        // SAFETY: just allocated, owned here.
        let data = unsafe { new.as_ref() }.data();
        // SAFETY: the new buffer is private: nothing else can reach it
        // until it is published below, so a unique borrow of its `len`
        // bytes is sound; they are initialised (zero, or a former folio's).
        let bytes = unsafe { core::slice::from_raw_parts_mut(data.as_ptr(), len) };
        if let Err(e) = fill(bytes, zeroed) {
            // SAFETY: never published, so no one else can reach it.
            unsafe { Buf::free(new) };
            return Err(InstallError::Fill(e));
        }
        self.publish(Some(new));
        Ok(())
    }

    /// Like [`MemWrite::install`], with every byte zero before `fill` runs
    /// (a recycled frame is zeroed first).
    ///
    /// # Errors
    /// As [`MemWrite::install`].
    pub(crate) fn install_zeroed<E>(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), InstallError<E>> {
        self.install(|b, zeroed| {
            if !zeroed {
                b.fill(0);
            }
            fill(b)
        })
    }

    /// Drop the current buffer (the folio leaves the cache).
    pub(crate) fn release(&mut self) {
        self.publish(None);
    }

    /// Make `new` current, move the version on, and drop the folio's
    /// reference to the old buffer.
    fn publish(&mut self, new: Option<NonNull<Buf>>) {
        self.mem.publish(new);
    }

    /// Begin changing the current buffer's bytes: in place when nothing
    /// pins the buffer, else into a copy that becomes current when the
    /// returned [`Edit`] is dropped.
    ///
    /// # Errors
    /// [`AllocError`] when a copy is needed and cannot be allocated (nothing
    /// changed). Without a buffer the edit has length 0.
    pub(crate) fn edit(&mut self) -> Result<Edit<'_>, AllocError> {
        let Some(b) = self.cur() else {
            return Ok(Edit {
                mem: self.mem,
                data: NonNull::dangling(),
                len: 0,
                how: How::Nothing,
            });
        };
        let (data, len) = (b.data(), b.len());
        let s = self.mem.seq.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 0);
        // The writer's half of the handshake: odd version, then the count.
        self.mem.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // Acquire: a pin or borrow released before these loads happens-before
        // the in-place writes (the fence orders the handshake, not that).
        if b.refs.load(Ordering::Acquire) == 1 && self.mem.borrows.load(Ordering::Acquire) == 0 {
            return Ok(Edit {
                mem: self.mem,
                data,
                len,
                how: How::InPlace { seq: s },
            });
        }
        // Pinned: nothing was written, so the version may go back to the
        // even value readers may have copied under (their copies are good).
        self.mem.seq.store(s, Ordering::Release);
        let (new, _) = Buf::alloc(len)?;
        // SAFETY: just allocated, owned here.
        let copy = unsafe { new.as_ref() }.data();
        // SAFETY: `new` is private until published and `len` bytes long, as
        // the old buffer is; the old bytes are read with plain loads, which
        // only race with other reads (this guard is the only writer).
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), copy.as_ptr(), len) };
        Ok(Edit {
            mem: self.mem,
            data: copy,
            len,
            how: How::Copy { new },
        })
    }
}

/// A fill in flight ([`MemWrite::begin_fill`]): the folio's lock, handed
/// over to an I/O and held by nobody's guard, and the new buffer the I/O
/// writes, private (not published: no reader can reach its bytes) until
/// [`RawFill::end`] publishes or frees it and gives the lock back as a
/// guard. Not tied to a thread or a borrow, so an I/O completion on
/// another thread may end it.
///
/// Dropping one without ending it leaves the folio locked for ever and the
/// buffer allocated (a bug: `debug_assert`); its owner must end it.
#[cfg(not(loom))]
pub(crate) struct RawFill {
    frame: NonNull<Buf>,
    zeroed: bool,
    len: usize,
    ended: bool,
}

// SAFETY: the buffer is private to this value (never published) and its
// bytes are plain; the lock it stands for may be released from any thread
// (`sync::lock_resume`).
#[cfg(not(loom))]
unsafe impl Send for RawFill {}

#[cfg(not(loom))]
impl MemWrite<'_> {
    /// Hand the lock over to a fill: allocate the folio's new buffer and
    /// keep the lock held (by the returned [`RawFill`]) after this guard is
    /// gone. On an allocation failure the lock is released.
    ///
    /// # Errors
    /// [`AllocError`] when the buffer cannot be allocated.
    pub(crate) fn begin_fill(self) -> Result<RawFill, AllocError> {
        let len = self.mem.len;
        let (frame, zeroed) = Buf::alloc(len)?;
        crate::sync::lock_handover(self._lock);
        Ok(RawFill {
            frame,
            zeroed,
            len,
            ended: false,
        })
    }
}

#[cfg(not(loom))]
impl RawFill {
    /// The first byte of the private buffer (page-aligned once a page or
    /// more: a frame).
    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: the frame is live until `end` (this value owns it).
        unsafe { self.frame.as_ref() }.data().as_ptr()
    }

    /// The buffer's length: the folio's.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// End the fill: with `Some(n)`, the first `n` bytes were filled (the
    /// rest is zeroed unless the buffer came zeroed) and the buffer becomes
    /// the folio's current one; with `None` it is freed and the folio keeps
    /// what it had. Returns the folio's lock as a guard (dropping it
    /// unlocks).
    ///
    /// # Safety
    /// - `mem` is the folio memory whose guard [`MemWrite::begin_fill`]
    ///   made this value from;
    /// - nothing writes the buffer any more (the I/O is finished) and no
    ///   reference to its bytes outlives this call.
    pub(crate) unsafe fn end(mut self, mem: &FolioMem, filled: Option<usize>) -> MemWrite<'_> {
        debug_assert_eq!(mem.len, self.len);
        debug_assert!(mem.lock.is_locked());
        self.ended = true;
        // SAFETY: the lock is held by the guard `begin_fill` forgot, whose
        // acquisition this value owns (the contract) and gives up here.
        let lock = unsafe { crate::sync::lock_resume(&mem.lock) };
        let mut w = MemWrite { mem, _lock: lock };
        match filled {
            Some(n) => {
                if !self.zeroed {
                    let n = n.min(self.len);
                    // SAFETY: the buffer is private (never published) and
                    // the I/O is finished (the contract): this is its only
                    // user; `len` initialised bytes.
                    let bytes = unsafe { core::slice::from_raw_parts_mut(self.ptr(), self.len) };
                    bytes[n..].fill(0);
                }
                w.publish(Some(self.frame));
            }
            // SAFETY: never published, so no one else can reach it.
            None => unsafe { Buf::free(self.frame) },
        }
        w
    }
}

#[cfg(not(loom))]
impl Drop for RawFill {
    fn drop(&mut self) {
        debug_assert!(self.ended, "a fill dropped without being ended");
    }
}

impl fmt::Debug for MemWrite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemWrite")
            .field("len", &self.len())
            .finish()
    }
}

/// Why [`MemWrite::install`] failed.
#[derive(Debug)]
pub(crate) enum InstallError<E> {
    /// The buffer could not be allocated.
    Alloc(AllocError),
    /// The fill function failed.
    Fill(E),
}

enum How {
    /// No buffer: nothing to change.
    Nothing,
    /// Writing the current buffer in place; the version is `seq + 1` (odd).
    InPlace { seq: u64 },
    /// Writing a private copy, published when the edit ends.
    Copy { new: NonNull<Buf> },
}

/// Changes to a folio's bytes under its lock ([`MemWrite::edit`]). They
/// become visible as one: readers validating against the version never
/// keep a copy taken while an edit ran.
pub(crate) struct Edit<'w> {
    mem: &'w FolioMem,
    data: NonNull<u8>,
    len: usize,
    how: How,
}

impl Edit<'_> {
    fn check(&self, at: usize, n: usize) {
        assert!(
            at.checked_add(n).is_some_and(|e| e <= self.len),
            "folio edit of {n} bytes at {at} outside its {} bytes",
            self.len
        );
    }

    /// Write `src` at byte `at`.
    ///
    /// # Panics
    /// If `at + src.len()` exceeds the buffer's length (a bug of the caller).
    pub(crate) fn write(&mut self, at: usize, src: &[u8]) {
        self.check(at, src.len());
        let dst = self.data.as_ptr().wrapping_add(at);
        match self.how {
            // SAFETY: in bounds (checked); readers copy with
            // `bytewise::load`, and this is the only writer.
            How::InPlace { .. } => unsafe { bytewise::store(dst, src) },
            // SAFETY: in bounds (checked) of a buffer private until the edit
            // ends.
            How::Copy { .. } => unsafe {
                core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
            },
            How::Nothing => {}
        }
    }

    /// Set `n` bytes at `at` to `byte`.
    ///
    /// # Panics
    /// If `at + n` exceeds the buffer's length.
    pub(crate) fn fill(&mut self, at: usize, n: usize, byte: u8) {
        self.check(at, n);
        let dst = self.data.as_ptr().wrapping_add(at);
        match self.how {
            // SAFETY: as in `write`.
            How::InPlace { .. } => unsafe { bytewise::fill(dst, n, byte) },
            // SAFETY: as in `write`.
            How::Copy { .. } => unsafe { core::ptr::write_bytes(dst, byte, n) },
            How::Nothing => {}
        }
    }
}

impl Drop for Edit<'_> {
    fn drop(&mut self) {
        match self.how {
            How::Nothing => {}
            How::InPlace { seq } => self.mem.seq.store(seq + 2, Ordering::Release),
            How::Copy { new } => self.mem.publish(Some(new)),
        }
    }
}

#[cfg(all(test, not(loom)))]
#[path = "mem_tests.rs"]
mod tests;
