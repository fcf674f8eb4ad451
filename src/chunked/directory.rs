//! The directory of a [`ChunkedXArray`](super::ChunkedXArray) and the
//! life cycle of its chunks: lock-free lookup by chunk number, lazy
//! creation, and retirement of a chunk that a write left empty.
//!
//! Layout: chunks `0..direct.len()` sit inline in a flat table, one
//! cache-line-aligned `Chunk` each (the kernel's `swapper_spaces[]`, an
//! array of address spaces, not of pointers): a lookup computes the
//! chunk's address and loads its tree's head, with no pointer to chase and
//! the whole table in a few pages. A direct chunk is never created, dead or
//! freed; it "exists" (is counted, iterated, checked) while its tree is not
//! empty, and an empty tree holds no node, so an empty direct chunk costs
//! only its table entry. Later chunks sit in an overflow `XArray` of boxed
//! chunks keyed by chunk number, created lazily and retired when empty;
//! the overflow `XArray` is read lock-free and changed only under its own
//! lock (the directory lock).
//!
//! Invariants:
//! - Every write to a chunk happens under the chunk's lock
//!   ([`Directory::with_chunk`]); for an overflow chunk, after checking
//!   that it is not dead. An overflow chunk is marked dead under its own
//!   lock, only when empty, and unlinked under the directory lock while
//!   its lock is still held; a dead chunk is never written again, so no
//!   entry is ever stored into an unlinked chunk. Direct chunks are never
//!   dead.
//! - An unlinked overflow chunk is freed through the epoch (the overflow
//!   `XArray`'s erase), after every reader that could have loaded it has
//!   unpinned.
//! - Lock order: a chunk's lock, then the directory lock. Creating a chunk
//!   takes only the directory lock.

use crate::error::Error;
use crate::guard::{pin, Guard};
use crate::item::{Entry, EntryRef, Item, ItemRef};
use crate::sync::{AtomicU8, Ordering};
use crate::xarray::{XArray, XaLock};

/// One chunk: an `XArray` of offsets within the chunk, and the flag that
/// retires it (overflow chunks only). Aligned to a cache line so that a
/// direct chunk's tree head shares its line with no neighbour.
#[repr(align(64))]
pub(super) struct Chunk<T: Item> {
    pub(super) xa: XArray<T>,
    /// Nonzero once the (overflow) chunk was found empty and unlinked. Read
    /// and written only under `xa`'s lock; never set on a direct chunk.
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

/// Chunk number -> chunk.
pub(super) struct Directory<T: Item> {
    /// Chunks `0..direct.len()`, inline; each always there (never dead),
    /// in use while its tree is not empty.
    direct: Box<[Chunk<T>]>,
    /// Chunks from `direct.len()` on; its lock is the directory lock.
    overflow: XArray<Box<Chunk<T>>>,
}

impl<T: Item> Directory<T> {
    pub(super) fn new(direct: usize) -> Self {
        Directory {
            direct: (0..direct).map(|_| Chunk::new()).collect(),
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

    /// Whether chunk `c` sits inline in the flat table.
    pub(super) fn is_direct(&self, c: u64) -> bool {
        c < self.direct.len() as u64
    }

    /// Bytes of the flat table (the inline chunks' structs included).
    pub(super) fn table_bytes(&self) -> usize {
        core::mem::size_of_val(&*self.direct)
    }

    /// Chunk `c` if it sits in the flat table. Such a chunk lives as long
    /// as the directory (it is never unlinked or freed), so no guard is
    /// needed to hold it; its tree's nodes still need one to be read.
    #[inline(always)]
    pub(super) fn direct(&self, c: u64) -> Option<&Chunk<T>> {
        self.direct.get(usize::try_from(c).ok()?)
    }

    /// The chunk numbered `c`, lock-free. A direct chunk is returned even
    /// when its tree is empty (a lookup in it finds nothing); an overflow
    /// chunk only while it is linked.
    #[inline(always)]
    pub(super) fn get<'g>(&'g self, c: u64, guard: &'g Guard) -> Option<&'g Chunk<T>> {
        if self.is_direct(c) {
            Some(&self.direct[c as usize])
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
            let ch = &self.direct[c as usize];
            if !ch.xa.is_empty() {
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

    /// Every chunk in use (a non-empty direct chunk, or a linked overflow
    /// chunk) in order, folded (lock-free).
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

    /// Link a new empty overflow chunk as number `c` unless one is there.
    ///
    /// # Errors
    /// [`Error::NoMemory`] if the overflow directory could not grow.
    fn create(&self, c: u64) -> Result<(), Error> {
        debug_assert!(!self.is_direct(c));
        let dl = self.overflow.lock();
        match dl.insert(c, Some(Entry::Item(Box::new(Chunk::new())))) {
            Ok(()) => Ok(()),
            Err(r) if r.error == Error::Busy => Ok(()),
            Err(r) => Err(r.error),
        }
    }

    /// Unlink overflow chunk `c`, which the caller has marked dead under
    /// its lock (still held). The overflow `XArray`'s erase disposes of the
    /// box through the epoch.
    fn unlink(&self, c: u64, chunk: &Chunk<T>) {
        debug_assert!(!self.is_direct(c));
        let dl = self.overflow.lock();
        if let Some(EntryRef::Item(r)) = dl.load(c) {
            if core::ptr::eq(r.get(), chunk) {
                dl.erase(c);
            }
        }
    }

    /// Run `f` with `arg` under the lock of live chunk number `c`, creating
    /// the chunk first when `create` is set. Returns `Ok(None)` without
    /// calling `f` when the chunk does not exist (a direct chunk: is empty)
    /// and `create` is not set. An overflow chunk that `f` leaves empty is
    /// marked dead and unlinked before its lock is released.
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
        if self.is_direct(c) {
            let chunk = &self.direct[c as usize];
            let lock = chunk.xa.lock();
            if !create && chunk.xa.is_empty() {
                return Ok(None);
            }
            return Ok(Some(f(&lock, arg)));
        }
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

    /// The chunk numbered `c` through an exclusive borrow (a direct chunk
    /// even when empty).
    pub(super) fn get_mut(&mut self, c: u64) -> Option<&mut Chunk<T>> {
        if self.is_direct(c) {
            self.direct.get_mut(c as usize)
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
            if let Err(r) = self
                .overflow
                .replace(c, Entry::Item(Box::new(Chunk::new())))
            {
                return Err(r.error);
            }
        }
        self.get_mut(c).ok_or(Error::NoMemory)
    }

    /// Drop overflow chunk `c` if it is empty (exclusive access); a direct
    /// chunk stays (empty, it holds no node).
    pub(super) fn drop_if_empty(&mut self, c: u64) {
        if self.is_direct(c) || !self.get_mut(c).is_some_and(|ch| ch.xa.is_empty()) {
            return;
        }
        self.overflow.remove(c);
    }
}
