//! # kxarray
//!
//! The Linux kernel's XArray in user space: a 64-way radix tree indexed by
//! `u64` that holds pointer-like items and 63-bit value entries, with
//! multi-index entries of any order, three search marks, range stores, ID
//! allocation, and an `xas_*`-style cursor ([`XaState`]) whose operations
//! continue from where the last one stopped instead of walking from the root.
//!
//! Writers serialize on one lock ([`XArray::lock`]); readers take no lock at
//! all: they pin an epoch [`Guard`] ([`pin`], crossbeam-epoch's default collector), the RCU analog, and
//! removed nodes and items are reclaimed only after every reader that could
//! see them has left.
//!
//! On top sits [`filemap`], a page cache of folios with shadow entries,
//! dirty/writeback tags, and the one-walk `add_folio` of Linux 6.10.
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
//! # Guards and memory
//!
//! A lock-free read pins the epoch with a [`Guard`] ([`pin`]); every
//! [`EntryRef`] borrows it, so an entry stays readable until the guard is
//! dropped even if a writer erased it meanwhile. Removed nodes and items are
//! freed only after every guard pinned before the removal is gone: a guard
//! (or a [`Retired`], which holds one) kept for a long time therefore holds
//! back the reclamation of everything removed since, crate-wide, not just in
//! one array. Pin per operation or per batch, never across blocking calls.
//! Through `&mut self` ([`XArray::replace`], [`XArray::remove`]) no guard is
//! involved and removed items come back owned.
//!
//! # Locking
//!
//! Writers serialize on one lock per array ([`XArray::lock`], the kernel's
//! `xa_lock`); the one-call methods on [`XArray`] take it for the call, the
//! methods on the held [`XaLock`] and on a [`CursorMut`] run under it.
//! Readers never take it and are never blocked by it. The lock is not
//! reentrant: a method that takes it must not be called while the same
//! thread holds it. A panic inside a write poisons the array
//! ([`XArray::is_poisoned`]); the writing methods then panic.
//!
//! # Iteration under concurrent writers
//!
//! Iterators ([`XArray::iter`], [`Cursor::find`]) are lock-free and weakly
//! consistent, as in the kernel: every entry returned was present at its
//! index at some instant during the iteration, indices come in increasing
//! order, entries stored or erased meanwhile may or may not be seen, and no
//! entry is returned twice.
//!
//! # Multi-index entries
//!
//! [`XArray::store_order`] stores one entry over an aligned block of
//! `2^order` indices; every index of the block loads it, marks apply to the
//! whole block, an iteration returns it once (at its first index), and a
//! store to any index of it replaces all of it. [`CursorMut::split`] and
//! [`CursorMut::try_split`] break one up. [`XArray::store_range`] tiles an
//! arbitrary range with the fewest such blocks.
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
//! are limited to 63 bits ([`MAX_VALUE`]).
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

pub mod backend;
pub mod chunked;
pub mod filemap;
pub mod node_cache;
pub mod pagecache;

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
