//! # kxarray
//!
//! The Linux kernel's XArray and page cache in user space.
//!
//! - [`XArray`]: a 64-way radix tree indexed by `u64` that holds
//!   pointer-like items ([`Item`]: `Box<U>`, `Arc<U>`) and 63-bit value
//!   entries, with multi-index entries of any order, three search marks
//!   ([`Mark`]), range stores, ID allocation, and an `xas_*`-style cursor
//!   ([`XaState`]) whose operations continue from where the last one
//!   stopped instead of walking from the root. [`ChunkedXArray`] cuts the
//!   key space into chunks, each its own array and lock (the swap cache's
//!   layout).
//! - [`filemap`]: an address space of folios with shadow entries,
//!   dirty/writeback tags, and the one-walk `add_folio` of Linux 6.10.
//! - [`pagecache`]: a page cache over any [`backend::Backend`]: buffered
//!   reads and writes, zero-copy folio references, workingset reclaim,
//!   per-block dirty state, tag-driven writeback, a flusher, dirty
//!   throttling and readahead.
//!
//! Semantics follow the kernel's `lib/xarray.c` and `mm/filemap.c` unless
//! the repository's `docs/kernel-differences.md` lists a deliberate
//! difference; its `ARCHITECTURE.md` maps the modules, the lock order and
//! the invariants.
//!
//! # Quick start
//!
//! ```
//! use kxarray::{Entry, Mark, XArray};
//!
//! let xa: XArray<Box<String>> = XArray::new();
//! xa.store(1, Entry::Item(Box::new("one".into()))).unwrap();
//! xa.store_order(64, 6, Entry::Value(7)).unwrap(); // indices 64..=127
//! xa.set_mark(1, Mark::M1);
//!
//! let guard = kxarray::pin();
//! assert_eq!(xa.load(100, &guard).unwrap().value(), Some(7));
//! assert!(xa.get_mark(1, Mark::M1));
//! let marked: Vec<u64> = xa.iter_marked(.., Mark::M1, &guard).map(|(i, _)| i).collect();
//! assert_eq!(marked, [1]);
//! ```
//!
//! A cursor runs several steps in one walk, as the kernel's `xas_*` calls
//! do; a [`CursorMut`] borrows the held lock, so it can only write the
//! array whose lock is held, and cannot outlive it:
//!
//! ```
//! use kxarray::{Entry, Mark, XArray};
//!
//! let xa: XArray<Box<u32>> = XArray::new();
//! let lock = xa.lock();
//! let mut cur = lock.cursor_mut(100);
//! cur.store(Some(Entry::Value(7))).unwrap();
//! cur.set_mark(Mark::M0);
//! assert_eq!(cur.load().and_then(|e| e.value()), Some(7));
//! assert_eq!(cur.walks(), 1); // the mark and the load reused the store's walk
//! ```
//!
//! # Concurrency model
//!
//! The kernel's, with crossbeam-epoch standing in for RCU: writers
//! serialize on one lock per array; readers take no lock, pin an epoch
//! [`Guard`] ([`pin`]) and are never blocked; a writer publishes with
//! Release stores, so a reader sees for each index either the old or the
//! new entry.
//!
//! ## Guards and memory
//!
//! A lock-free read pins the epoch with a [`Guard`] ([`pin`]); every
//! [`EntryRef`] borrows it, so an entry stays readable until the guard is
//! dropped even if a writer erased it meanwhile. Removed nodes and items are
//! freed only after every guard pinned before the removal is gone: a guard
//! (or a [`Retired`], which holds one) kept for a long time therefore holds
//! back the reclamation of everything removed since, crate-wide, not just in
//! one array. Pin per operation or per batch, never across blocking calls.
//! Through `&mut self` ([`XArray::replace`], [`XArray::remove`]) no guard is
//! involved and removed items come back owned. [`XArray::load_value`] reads
//! a value entry under a lighter pin of its own (no guard to pass).
//!
//! ## Locking
//!
//! Writers serialize on one lock per array ([`XArray::lock`], the kernel's
//! `xa_lock`); the one-call methods on [`XArray`] take it for the call, the
//! methods on the held [`XaLock`] and on a [`CursorMut`] run under it.
//! Readers never take it and are never blocked by it. The lock is not
//! reentrant: a method that takes it must not be called while the same
//! thread holds it. A panic inside a write poisons the array
//! ([`XArray::is_poisoned`]); the writing methods then panic.
//!
//! ## Iteration under concurrent writers
//!
//! Iterators ([`XArray::iter`], [`Cursor::find`]) are lock-free and weakly
//! consistent, as in the kernel: every entry returned was present at its
//! index at some instant during the iteration, indices come in increasing
//! order, entries stored or erased meanwhile may or may not be seen, and no
//! entry is returned twice.
//!
//! ## Multi-index entries
//!
//! [`XArray::store_order`] stores one entry over an aligned block of
//! `2^order` indices; every index of the block loads it, marks apply to the
//! whole block, an iteration returns it once (at its first index), and a
//! store to any index of it replaces all of it. [`CursorMut::split`] and
//! [`CursorMut::try_split`] break one up. [`XArray::store_range`] tiles an
//! arbitrary range with the fewest such blocks.
//!
//! # The page cache
//!
//! A [`PageCache`](pagecache::PageCache) holds up to a capacity of bytes
//! for many files; [`open`](pagecache::PageCache::open) gives a
//! [`CachedFile`](pagecache::CachedFile) over a backend
//! ([`FileBackend`](backend::FileBackend), [`RamDisk`](backend::RamDisk),
//! or your own [`Backend`](backend::Backend)). Reads:
//! [`read_at`](pagecache::CachedFile::read_at) copies out (a hit takes no
//! lock and writes nothing shared: it copies and validates a per-folio
//! version); [`read_folio`](pagecache::CachedFile::read_folio),
//! [`try_read_folio`](pagecache::CachedFile::try_read_folio) and
//! [`read_folio_in`](pagecache::CachedFile::read_folio_in) lend a folio's
//! bytes in place. Writes: [`write_at`](pagecache::CachedFile::write_at)
//! copies in; [`write_begin`](pagecache::CachedFile::write_begin) edits a
//! folio's bytes in place and publishes the edit all at once. Durability:
//! [`write_back`](pagecache::CachedFile::write_back) puts dirty data on the
//! backend, [`sync`](pagecache::CachedFile::sync) also flushes it, and a
//! writeback error is reported once per handle (the kernel's `errseq_t`).
//!
//! A zero-copy reference pins the bytes it lends: a writer to that folio,
//! on any thread including the holder's, writes a copy instead of waiting,
//! so the reference keeps the bytes it pinned and later reads see the new
//! ones.
//!
//! ```
//! use kxarray::backend::RamDisk;
//! use kxarray::pagecache::{CacheConfig, PageCache};
//!
//! let cache = PageCache::new(CacheConfig::default().capacity(1 << 20));
//! let file = cache.open(RamDisk::new(1 << 20)).unwrap();
//! file.write_at(&[1; 8192], 0).unwrap();
//!
//! // many pages parsed in place under one guard: no reference count per page
//! let guard = kxarray::pin();
//! let sum: u64 = (0..2)
//!     .map(|i| file.read_folio_in(i, &guard).unwrap().page(i).iter().map(|&b| u64::from(b)).sum::<u64>())
//!     .sum();
//! assert_eq!(sum, 8192);
//! drop(guard);
//!
//! let page = file.read_folio(0).unwrap();
//! file.write_at(&[2; 4096], 0).unwrap(); // does not wait for the reference
//! assert_eq!(page.page(0)[0], 1); // which keeps the bytes it pinned
//! assert_eq!(file.try_read_folio(0).unwrap().page(0)[0], 2);
//! file.sync().unwrap();
//! ```
//!
//! # Safety, and what hostile safe code cannot do
//!
//! No safe call causes undefined behaviour, whatever its arguments and
//! whatever other threads do at the same time. The `unsafe` code is
//! confined to the node handles, the entry word, the epoch frees, the
//! byte-wise copies and the node and folio memory, each block under a
//! `SAFETY` comment naming its invariant; it is checked by loom models of
//! the real code, Miri (tree borrows), AddressSanitizer and fuzzing. What
//! safe code cannot do, however hostile:
//!
//! - **Read freed memory through a foreign guard.** A [`Guard`] comes only
//!   from [`pin`], always on the collector every deferred free goes
//!   through; a crossbeam guard from another collector does not type-check:
//!
//! ```compile_fail,E0308
//! let xa: kxarray::XArray<Box<u64>> = kxarray::XArray::new();
//! let handle = crossbeam_epoch::Collector::new().register();
//! let foreign = handle.pin();
//! let _ = xa.load(1, &foreign);
//! ```
//!
//! - **Keep an entry past its guard.** An [`EntryRef`] borrows the guard it
//!   was read under:
//!
//! ```compile_fail,E0505
//! use kxarray::{Entry, XArray};
//! let xa: XArray<Box<u64>> = XArray::new();
//! xa.store(1, Entry::Item(Box::new(1))).unwrap();
//! let guard = kxarray::pin();
//! let e = xa.load(1, &guard).unwrap();
//! drop(guard);
//! assert!(e.item().is_some());
//! ```
//!
//! - **Deadlock by re-entering from a destructor.** An item removed through
//!   `&self` is dropped when the epoch collects, inside some later [`pin`],
//!   and [`XArray::lock`] pins *before* it takes the lock: a `Drop` that
//!   locks or stores into an array, the same one included, never runs under
//!   that array's lock.
//!
//! ```
//! use kxarray::{Entry, XArray};
//! use std::sync::OnceLock;
//!
//! static LOG: OnceLock<XArray<Box<u64>>> = OnceLock::new();
//! struct Logged(u64);
//! impl Drop for Logged {
//!     fn drop(&mut self) {
//!         // re-enters an array from a destructor
//!         LOG.get().unwrap().store(self.0, Entry::Value(self.0)).unwrap();
//!     }
//! }
//! let log = LOG.get_or_init(XArray::new);
//! let items: XArray<Box<Logged>> = XArray::new();
//! items.store(1, Entry::Item(Box::new(Logged(7)))).unwrap();
//! drop(items.erase(1)); // the drop is deferred to a later pin
//! let mut tries = 0;
//! while log.load_value(7).is_none() {
//!     kxarray::pin().flush(); // may run the drop
//!     drop(log.lock()); // pins first, then locks: never deadlocks
//!     tries += 1;
//!     assert!(tries < 1_000_000, "the deferred drop never ran");
//! }
//! ```
//!
//! - **Corrupt the tree with a panic.** A panic inside a write (an item's
//!   `Drop` run inline on the `&mut` paths, or an injected fault) poisons
//!   the array: the half-written tree is leaked, never read again; readers
//!   see an empty array and writers panic. A panicking `Drop` run by the
//!   epoch leaves the tree untouched, and one run while an [`XArray`] is
//!   dropped stops the teardown, leaking the rest: nothing is dropped
//!   twice.
//!
//! ```
//! use kxarray::{fault, Entry, XArray};
//! use std::panic::{catch_unwind, AssertUnwindSafe};
//!
//! let xa: XArray<Box<u32>> = XArray::new();
//! xa.store_order(0, 4, Entry::Value(1)).unwrap();
//! fault::panic_after_slot_writes(1); // the next multi-slot write panics half done
//! let r = catch_unwind(AssertUnwindSafe(|| xa.store_range(0, 100, Some(2))));
//! fault::panic_after_slot_writes(0);
//! assert!(r.is_err());
//! assert!(xa.is_poisoned());
//! assert_eq!(xa.load_value(0), None); // never the half-written tree
//! ```
//!
//! - **Block a writer with a pin.** A [`FolioRef`](pagecache::FolioRef) or
//!   [`FolioBorrow`](pagecache::FolioBorrow) may be held for as long as the
//!   holder likes: writes, truncation and invalidation of that folio, by
//!   any thread including the holder's, complete at once; the reference
//!   keeps its bytes, unchanged.
//!
//! ```
//! use kxarray::backend::RamDisk;
//! use kxarray::pagecache::{CacheConfig, PageCache};
//!
//! let cache = PageCache::new(CacheConfig::default().flusher(false));
//! let file = cache.open(RamDisk::new(1 << 16)).unwrap();
//! file.write_at(&[7; 4096], 0).unwrap();
//! let page = file.read_folio(0).unwrap();
//! file.write_at(&[8; 4096], 0).unwrap(); // same thread, same folio: no wait
//! file.invalidate(0..4096).unwrap();
//! assert!(page.page(0).iter().all(|&b| b == 7)); // not a byte moved
//! ```
//!
//! What hostile safe code *can* do is wait on itself: take an array's lock
//! twice on one thread, or write, truncate or zero-copy read the folio a
//! [`FolioWrite`](pagecache::FolioWrite) it holds is editing (both
//! documented where they apply); and hold a guard forever, which holds
//! back every free behind it (memory, never soundness).
//!
//! # Performance, and when not to use an XArray
//!
//! A load is one Acquire load per level (a 64-way tree: two levels cover
//! 4096 indices, four cover 16M), with no lock and no shared-cacheline write.
//! Dense or clustered `u64` keys (page indices, IDs) are where it shines;
//! sparse random 64-bit keys build tall, mostly empty paths (up to 11
//! levels), where a hash map uses less memory. Writers are serialized: for
//! write-heavy workloads from many threads, shard ([`ChunkedXArray`]) or use
//! a concurrent hash map. Items must be pointer-like ([`Item`]); values
//! are limited to 63 bits ([`MAX_VALUE`]). The repository's `docs/` pages
//! hold the measurements, each with the command that reproduces it.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("kxarray needs a 64-bit target (value entries are 63 bits)");

mod bytewise;
mod check;
mod cursor;
mod engine;
mod entry;
mod error;
pub mod fault;
mod geometry;
mod guard;
mod item;
mod lightpin;
mod mark;
mod node;
mod rejected;
mod sync;
mod view;
mod xarray;

pub mod aio;
pub mod backend;
pub mod chunked;
pub mod filemap;
pub mod fork;
pub mod ipc;
pub mod memory;
pub mod node_cache;
pub mod pagecache;
#[cfg(target_os = "linux")]
pub mod shared;

pub use chunked::ChunkedXArray;
pub use cursor::{Cursor, CursorMut};
pub use engine::{Conflicts, CursorIter, CursorState, Stale, XaState, MAX_RANGE_NODES};
pub use entry::MAX_VALUE;
pub use error::Error;
pub use geometry::{CHUNK_SHIFT, CHUNK_SIZE};
pub use guard::{pin, Guard};
pub use item::{CloneItem, Entry, EntryRef, Item, ItemMut, ItemRef, Retired};
pub use mark::Mark;
pub use rejected::Rejected;
pub use view::XaView;
pub use xarray::{Flags, IntoIter, Iter, XArray, XaLock};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
