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
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("kxarray needs a 64-bit target (value entries are 63 bits)");

mod check;
mod cursor;
mod engine;
mod entry;
mod error;
pub mod fault;
mod geometry;
mod guard;
mod item;
mod mark;
mod node;
mod rejected;
mod sync;
mod view;
mod xarray;

pub mod backend;
pub mod chunked;
pub mod filemap;
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
