//! The directory of a [`ChunkedXArray`](super::ChunkedXArray) and the
//! life cycle of its chunks: lock-free lookup by chunk number, lazy
//! creation, and retirement of a chunk that a write left empty.
//!
//! Layout: chunks `0..direct.len()` sit in a flat table of atomic pointers
//! (one load, the kernel's `swapper_spaces[]`); later chunks sit in an
//! overflow `XArray` of boxed chunks keyed by chunk number. Both are read
//! lock-free and changed only under the directory lock (the overflow
//! `XArray`'s own lock).
//!
//! Invariants:
//! - Every write to a chunk happens under the chunk's lock after checking
//!   that it is not dead ([`Directory::with_chunk`]). A chunk is marked
//!   dead under its own lock, only when empty, and unlinked under the
//!   directory lock while its lock is still held; a dead chunk is never
//!   written again, so no entry is ever stored into an unlinked chunk.
//! - An unlinked chunk is freed through the epoch, after every reader that
//!   could have loaded its pointer has unpinned.
//! - Lock order: a chunk's lock, then the directory lock. Creating a chunk
//!   takes only the directory lock.

use crate::error::Error;
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item, ItemRef};
use crate::sync::{AtomicPtr, AtomicU8, Ordering};
use crate::xarray::{XArray, XaLock};
use core::ptr;

/// One chunk: an `XArray` of offsets within the chunk, and the flag that
/// retires it.
pub(super) struct Chunk<T: Item> {
    pub(super) xa: XArray<T>,
    /// Nonzero once the chunk was found empty and unlinked. Read and written
    /// only under `xa`'s lock.
    dead: AtomicU8,
}

impl<T: Item> Chunk<T> {
    fn new() -> Self {
        Chunk {
            xa: XArray::new(),
            dead: AtomicU8::new(0),
        }
    }
    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed) != 0
    }
}

/// An unlinked chunk on its way to the epoch's deferred drop.
struct SendChunk<T: Item>(*mut Chunk<T>);
// SAFETY: the chunk is unreachable when it is sent, and `Chunk<T>` is an
// `XArray<T>` plus a flag; `T: Item` is `Send + Sync`, so dropping it on
// another thread is sound.
unsafe impl<T: Item> Send for SendChunk<T> {}

/// Chunk number -> chunk.
pub(super) struct Directory<T: Item> {
    /// Chunks `0..direct.len()`, one atomic pointer each.
    /// A non-null pointer came from `Box::into_raw` and is owned by the
    /// table until unlinked.
    direct: Box<[AtomicPtr<Chunk<T>>]>,
    /// Chunks from `direct.len()` on; its lock is the directory lock.
    overflow: XArray<Box<Chunk<T>>>,
}

impl<T: Item> Directory<T> {
    pub(super) fn new(direct: usize) -> Self {
        Directory {
            direct: (0..direct)
                .map(|_| AtomicPtr::new(ptr::null_mut()))
                .collect(),
            overflow: XArray::new(),
        }
    }

    /// How many chunks the flat table covers.
    pub(super) fn direct_len(&self) -> usize {
        self.direct.len()
    }

    /// The overflow `XArray` (for introspection).
    pub(super) fn overflow(&self) -> &XArray<Box<Chunk<T>>> {
        &self.overflow
    }

    /// Bytes of the flat table.
    pub(super) fn table_bytes(&self) -> usize {
        core::mem::size_of_val(&*self.direct)
    }

    /// The chunk numbered `c`, lock-free.
    #[inline(always)]
    pub(super) fn get<'g>(&'g self, c: u64, guard: &'g Guard) -> Option<&'g Chunk<T>> {
        if c < self.direct.len() as u64 {
            let p = self.direct[c as usize].load(Ordering::Acquire);
            // SAFETY: a non-null pointer in the table is a live boxed chunk
            // (published with Release in `create`, paired with this
            // Acquire); one unlinked from the table is freed only through
            // the epoch (`unlink`), after every guard pinned before the
            // unlink is dropped. `guard` is pinned now, so the chunk lives
            // for 'g.
            unsafe { p.as_ref() }
        } else {
            self.overflow
                .load(c, guard)
                .and_then(EntryRef::item)
                .map(ItemRef::get)
        }
    }

    /// The first chunk numbered in `from..=to`, lock-free.
    pub(super) fn next<'g>(
        &'g self,
        from: u64,
        to: u64,
        guard: &'g Guard,
    ) -> Option<(u64, &'g Chunk<T>)> {
        let dlen = self.direct.len() as u64;
        let mut c = from;
        while c < dlen {
            if c > to {
                return None;
            }
            if let Some(ch) = self.get(c, guard) {
                return Some((c, ch));
            }
            c += 1;
        }
        if c > to {
            return None;
        }
        let (n, e) = self.overflow.find(c, to, None, guard)?;
        Some((n, e.item()?.get()))
    }

    /// Every linked chunk in order, folded (lock-free).
    pub(super) fn fold<A>(&self, init: A, mut f: impl FnMut(A, u64, &Chunk<T>) -> A) -> A {
        let guard = pin();
        let mut acc = init;
        let mut c = 0;
        while let Some((n, ch)) = self.next(c, u64::MAX, &guard) {
            acc = f(acc, n, ch);
            match n.checked_add(1) {
                Some(next) => c = next,
                None => break,
            }
        }
        acc
    }

    /// Link a new empty chunk as number `c` unless one is there.
    ///
    /// # Errors
    /// [`Error::NoMemory`] if the overflow directory could not grow.
    fn create(&self, c: u64) -> Result<(), Error> {
        let dl = self.overflow.lock();
        if c < self.direct.len() as u64 {
            let slot = &self.direct[c as usize];
            if slot.load(Ordering::Relaxed).is_null() {
                let fresh = Box::into_raw(Box::new(Chunk::new()));
                slot.store(fresh, Ordering::Release);
            }
            return Ok(());
        }
        match dl.insert(c, Some(Entry::Item(Box::new(Chunk::new())))) {
            Ok(()) => Ok(()),
            Err(r) if r.error == Error::Busy => Ok(()),
            Err(r) => Err(r.error),
        }
    }

    /// Unlink chunk `c`, which the caller has marked dead under its lock
    /// (still held). Its memory goes back through the epoch.
    fn unlink(&self, c: u64, chunk: &Chunk<T>) {
        let dl = self.overflow.lock();
        if c < self.direct.len() as u64 {
            let slot = &self.direct[c as usize];
            let cur = slot.load(Ordering::Relaxed);
            if ptr::eq(cur, chunk) {
                slot.store(ptr::null_mut(), Ordering::Release);
                let owned = SendChunk(cur);
                // SAFETY: `cur` came from `Box::into_raw` in `create` (or
                // `get_or_create_mut`) and is now unlinked under the
                // directory lock, so no reader can load it any more and no
                // other unlink can defer it again; readers that loaded it
                // hold guards pinned on the default collector before this
                // point, and the epoch runs the drop only after they are all
                // dropped. The chunk is empty, so dropping it on another
                // thread drops no item.
                let drop_chunk = move || {
                    let owned = owned;
                    // SAFETY: from `Box::into_raw`, unlinked, dropped once
                    // (see below).
                    drop(unsafe { Box::from_raw(owned.0) });
                };
                // SAFETY: see above.
                unsafe { dl.guard().defer_unchecked(drop_chunk) }
            }
        } else if let Some(EntryRef::Item(r)) = dl.load(c) {
            if core::ptr::eq(r.get(), chunk) {
                // The box is disposed through the epoch by the erase.
                dl.erase(c);
            }
        }
    }

    /// Run `f` with `arg` under the lock of live chunk number `c`, creating
    /// the chunk first when `create` is set. Returns `Ok(None)` without
    /// calling `f` when the chunk does not exist and `create` is not set. A
    /// chunk that `f` leaves empty is marked dead and unlinked before its
    /// lock is released.
    ///
    /// # Errors
    /// The creation error, with `arg` handed back (`f` was not called).
    pub(super) fn with_chunk<A, R>(
        &self,
        c: u64,
        create: bool,
        guard: &Guard,
        arg: A,
        f: impl FnOnce(&XaLock<'_, T>, A) -> R,
    ) -> Result<Option<R>, (Error, A)> {
        loop {
            let chunk = match self.get(c, guard) {
                Some(ch) => ch,
                None if create => {
                    if let Err(e) = self.create(c) {
                        return Err((e, arg));
                    }
                    continue;
                }
                None => return Ok(None),
            };
            let lock = chunk.xa.lock();
            if chunk.is_dead() {
                // Unlinked while we waited for its lock: look again.
                continue;
            }
            let r = f(&lock, arg);
            if chunk.xa.is_empty() {
                chunk.dead.store(1, Ordering::Relaxed);
                self.unlink(c, chunk);
            }
            drop(lock);
            return Ok(Some(r));
        }
    }

    /// The chunk numbered `c` through an exclusive borrow.
    pub(super) fn get_mut(&mut self, c: u64) -> Option<&mut Chunk<T>> {
        if c < self.direct.len() as u64 {
            let p = self.direct[c as usize].load(Ordering::Relaxed);
            // SAFETY: a non-null pointer in the table is a live boxed chunk
            // that the table owns, and `&mut self` makes this the only
            // access (nothing is deferred or freed concurrently).
            unsafe { p.as_mut() }
        } else {
            self.overflow.get_mut(c)
        }
    }

    /// The chunk numbered `c` through an exclusive borrow, created if
    /// missing.
    ///
    /// # Errors
    /// [`Error::NoMemory`] if the overflow directory could not grow.
    pub(super) fn get_or_create_mut(&mut self, c: u64) -> Result<&mut Chunk<T>, Error> {
        if self.get_mut(c).is_none() {
            if c < self.direct.len() as u64 {
                let fresh = Box::into_raw(Box::new(Chunk::new()));
                self.direct[c as usize].store(fresh, Ordering::Relaxed);
            } else if let Err(r) = self
                .overflow
                .replace(c, Entry::Item(Box::new(Chunk::new())))
            {
                return Err(r.error);
            }
        }
        self.get_mut(c).ok_or(Error::NoMemory)
    }

    /// Drop chunk `c` if it is empty (exclusive access).
    pub(super) fn drop_if_empty(&mut self, c: u64) {
        if !self.get_mut(c).is_some_and(|ch| ch.xa.is_empty()) {
            return;
        }
        if c < self.direct.len() as u64 {
            let p = self.direct[c as usize].swap(ptr::null_mut(), Ordering::Relaxed);
            debug_assert!(!p.is_null());
            // SAFETY: unlinked, non-null (the chunk existed above), made by
            // `Box::into_raw`, and no reader exists under `&mut self`.
            drop(unsafe { Box::from_raw(p) });
        } else {
            self.overflow.remove(c);
        }
    }
}

impl<T: Item> Drop for Directory<T> {
    fn drop(&mut self) {
        for slot in self.direct.iter() {
            let p = slot.swap(ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: a linked chunk, made by `Box::into_raw`, owned by
                // the table and unreachable by anyone else now (dropping
                // means exclusive access).
                drop(unsafe { Box::from_raw(p) });
            }
        }
        // `overflow` drops its boxed chunks itself.
    }
}
