//! What an XArray holds: pointer-like *items* ([`Item`], implemented for
//! `Box<U>` and `Arc<U>`) and 63-bit *value entries*, seen through the owned
//! [`Entry`], the borrowed [`EntryRef`] and the retired [`Retired`].
//!
//! Ownership model: the array owns every item stored in it. An item removed
//! through a shared reference (`&XArray`) may still be read by lock-free
//! readers, so its drop is deferred through the epoch and the caller only gets
//! a view of it ([`EntryRef`] under a guard, or [`Retired`], which keeps its
//! own guard). Owned items come back only through `&mut XArray` methods,
//! where no reader can exist.

use crate::entry::{RawEntry, MAX_VALUE};
use crate::error::Error;
use crate::guard::Guard;
use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;
use std::sync::Arc;

/// A pointer-like type an XArray can own.
///
/// # Safety
///
/// `into_raw` must return a pointer that is non-null and aligned to at least
/// 4 bytes, that stays valid (and dereferenceable as `&Target` from any
/// thread) until it is passed back to `from_raw`, and `from_raw` must rebuild
/// the very value `into_raw` consumed. `clone_from_raw` must return a new
/// owner without consuming the one behind the pointer.
pub unsafe trait Item: Sized + Send + Sync + 'static {
    /// What the pointer points to.
    type Target: Sync;
    /// Gives up ownership, returning the raw pointer.
    fn into_raw(self) -> NonNull<Self::Target>;
    /// Takes back ownership of a pointer made by `into_raw`.
    ///
    /// # Safety
    /// `ptr` came from `into_raw` and has not been passed here before.
    unsafe fn from_raw(ptr: NonNull<Self::Target>) -> Self;
}

/// An [`Item`] that can make a second owner from a borrowed pointer: an
/// `Arc` clone (the kernel's `folio_try_get`) or a deep `Box` clone.
///
/// # Safety
/// `clone_from_raw` must return a new owner without consuming the one behind
/// the pointer.
pub unsafe trait CloneItem: Item {
    /// Makes a new owner from a pointer that stays owned elsewhere.
    ///
    /// # Safety
    /// `ptr` came from `into_raw` and its owner is still alive.
    unsafe fn clone_from_raw(ptr: NonNull<Self::Target>) -> Self;
}

const fn check_align<U>() {
    assert!(
        core::mem::align_of::<U>() >= 4,
        "kxarray items must be aligned to at least 4 bytes (the low 2 bits tag entries)"
    );
}

// SAFETY: Box::into_raw gives a unique, non-null pointer aligned to
// align_of::<U>() >= 4 (checked at compile time), valid until Box::from_raw.
unsafe impl<U: Send + Sync + 'static> Item for Box<U> {
    type Target = U;
    #[inline]
    fn into_raw(self) -> NonNull<U> {
        const { check_align::<U>() };
        // SAFETY: Box::into_raw never returns null.
        unsafe { NonNull::new_unchecked(Box::into_raw(self)) }
    }
    #[inline]
    unsafe fn from_raw(ptr: NonNull<U>) -> Self {
        // SAFETY: the caller passes a pointer from `into_raw`, once.
        unsafe { Box::from_raw(ptr.as_ptr()) }
    }
}

// SAFETY: a deep copy; the original Box is untouched.
unsafe impl<U: Clone + Send + Sync + 'static> CloneItem for Box<U> {
    #[inline]
    unsafe fn clone_from_raw(ptr: NonNull<U>) -> Self {
        // SAFETY: the owning Box is alive, so the pointee is valid to read.
        Box::new(unsafe { ptr.as_ref() }.clone())
    }
}

// SAFETY: Arc::into_raw gives a non-null pointer to the data, aligned to
// align_of::<U>() >= 4 (checked), valid while the strong count held by the
// array lasts; from_raw gives that count back.
unsafe impl<U: Send + Sync + 'static> Item for Arc<U> {
    type Target = U;
    #[inline]
    fn into_raw(self) -> NonNull<U> {
        const { check_align::<U>() };
        // SAFETY: Arc::into_raw never returns null.
        unsafe { NonNull::new_unchecked(Arc::into_raw(self) as *mut U) }
    }
    #[inline]
    unsafe fn from_raw(ptr: NonNull<U>) -> Self {
        // SAFETY: pointer from `into_raw`, owning one strong count.
        unsafe { Arc::from_raw(ptr.as_ptr()) }
    }
}

// SAFETY: bumps the strong count; the array keeps its own.
unsafe impl<U: Send + Sync + 'static> CloneItem for Arc<U> {
    #[inline]
    unsafe fn clone_from_raw(ptr: NonNull<U>) -> Self {
        // SAFETY: the array still owns one strong count, so the Arc is
        // alive and was made by `Arc::into_raw`.
        unsafe { Arc::increment_strong_count(ptr.as_ptr()) };
        // SAFETY: the count just added is the one the new owner releases.
        unsafe { Arc::from_raw(ptr.as_ptr()) }
    }
}

/// An [`Item`] whose owner is unique (`Box`), so the array can lend a
/// mutable reference to its target through `&mut XArray`.
///
/// # Safety
/// Holding the owner must imply exclusive access to the target.
pub unsafe trait ItemMut: Item {}

// SAFETY: a Box is the unique owner of its allocation.
unsafe impl<U: Send + Sync + 'static> ItemMut for Box<U> {}

/// An owned entry, as passed to a store.
pub enum Entry<T> {
    /// A pointer-like item the array takes ownership of.
    Item(T),
    /// A value entry (the kernel's `xa_mk_value`): `0..=i64::MAX`.
    Value(u64),
}

impl<T> Entry<T> {
    /// The value, if this is a value entry.
    pub fn value(&self) -> Option<u64> {
        match self {
            Entry::Value(v) => Some(*v),
            Entry::Item(_) => None,
        }
    }
    /// The item, if this is one.
    pub fn into_item(self) -> Option<T> {
        match self {
            Entry::Item(t) => Some(t),
            Entry::Value(_) => None,
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Entry<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::Item(t) => f.debug_tuple("Item").field(t).finish(),
            Entry::Value(v) => f.debug_tuple("Value").field(v).finish(),
        }
    }
}

impl<T: PartialEq> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Entry::Item(a), Entry::Item(b)) => a == b,
            (Entry::Value(a), Entry::Value(b)) => a == b,
            _ => false,
        }
    }
}

impl<T: Item> Entry<T> {
    /// Encode, giving the entry back on a bad value.
    pub(crate) fn into_raw(self) -> Result<RawEntry, (Error, Entry<T>)> {
        match self {
            Entry::Value(v) if v > MAX_VALUE => Err((Error::ValueOutOfRange(v), self)),
            Entry::Value(v) => Ok(RawEntry::value(v)),
            Entry::Item(t) => {
                let p = t.into_raw();
                match RawEntry::item(p) {
                    Some(raw) => Ok(raw),
                    // SAFETY: `p` came from into_raw just above.
                    None => unreachable_misaligned(unsafe { T::from_raw(p) }),
                }
            }
        }
    }

    /// Decode an entry the caller owns.
    ///
    /// # Safety
    /// `raw` is a user entry whose item (if any) nobody else owns or reads.
    pub(crate) unsafe fn from_raw(raw: RawEntry) -> Entry<T> {
        if raw.is_value() {
            Entry::Value(raw.to_value())
        } else {
            // SAFETY: per the contract, we own the item behind `raw`.
            Entry::Item(unsafe { T::from_raw(raw.to_item()) })
        }
    }
}

#[cold]
fn unreachable_misaligned<T, R>(t: T) -> R {
    drop(t);
    // The Item contract promises 4-byte alignment; an implementation that
    // breaks it is a bug in that (unsafe) implementation.
    panic!("kxarray: Item::into_raw returned a pointer that is not 4-byte aligned")
}

/// A borrowed item: a shared reference to the target, valid for the guard
/// (or lock, or `&XArray`) it was loaded under.
pub struct ItemRef<'g, T: Item> {
    ptr: NonNull<T::Target>,
    _life: PhantomData<Borrowed<'g, T>>,
}

/// Variance and auto-trait marker for [`ItemRef`]: a shared borrow of the
/// target for `'g`, and no ownership of `T`.
type Borrowed<'g, T> = (&'g <T as Item>::Target, fn() -> T);

impl<T: Item> Clone for ItemRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Item> Copy for ItemRef<'_, T> {}

impl<'g, T: Item> ItemRef<'g, T> {
    /// # Safety
    /// The item behind `ptr` outlives `'g`.
    #[inline]
    pub(crate) unsafe fn new(ptr: NonNull<T::Target>) -> Self {
        ItemRef {
            ptr,
            _life: PhantomData,
        }
    }
    /// The target, for the whole lifetime `'g` (not just this borrow).
    #[inline]
    pub fn get(self) -> &'g T::Target {
        // SAFETY: `new`'s contract: the item lives for 'g.
        unsafe { self.ptr.as_ref() }
    }
    /// A new owner of the item (an `Arc` clone, or a deep `Box` clone): the
    /// kernel's `folio_try_get`.
    #[inline]
    pub fn to_owned(self) -> T
    where
        T: CloneItem,
    {
        // SAFETY: the item is alive for 'g and still owned by the array (or
        // by a deferred destructor that has not run yet).
        unsafe { T::clone_from_raw(self.ptr) }
    }
    /// Whether two references name the same item.
    #[inline]
    pub fn ptr_eq(self, other: ItemRef<'_, T>) -> bool {
        self.ptr == other.ptr
    }
    /// The raw address, for identity checks.
    #[inline]
    pub fn as_ptr(self) -> *const T::Target {
        self.ptr.as_ptr()
    }
}

impl<T: Item> core::ops::Deref for ItemRef<'_, T> {
    type Target = T::Target;
    #[inline]
    fn deref(&self) -> &T::Target {
        // SAFETY: see `get`.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Item> fmt::Debug for ItemRef<'_, T>
where
    T::Target: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A borrowed entry, as returned by loads and iteration.
pub enum EntryRef<'g, T: Item> {
    /// An item, borrowed.
    Item(ItemRef<'g, T>),
    /// A value entry.
    Value(u64),
}

impl<T: Item> Clone for EntryRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Item> Copy for EntryRef<'_, T> {}

impl<'g, T: Item> EntryRef<'g, T> {
    /// # Safety
    /// `raw` is a user entry whose item (if any) outlives `'g`.
    #[inline]
    pub(crate) unsafe fn from_raw(raw: RawEntry) -> Self {
        if raw.is_value() {
            EntryRef::Value(raw.to_value())
        } else {
            debug_assert!(raw.is_item(), "not a user entry: {raw:?}");
            // SAFETY: forwarded contract.
            EntryRef::Item(unsafe { ItemRef::new(raw.to_item()) })
        }
    }
    /// Decode an optional user entry (NULL and ZERO read as `None`).
    ///
    /// # Safety
    /// As `from_raw`.
    #[inline]
    pub(crate) unsafe fn from_raw_opt(raw: RawEntry) -> Option<Self> {
        if raw.is_user() {
            // SAFETY: forwarded contract.
            Some(unsafe { Self::from_raw(raw) })
        } else {
            None
        }
    }
    /// Encode, rejecting a value above [`MAX_VALUE`] (a caller can build any
    /// `EntryRef::Value`, not only ones loaded from an array).
    pub(crate) fn to_raw(self) -> Result<RawEntry, Error> {
        match self {
            EntryRef::Value(v) if v > MAX_VALUE => Err(Error::ValueOutOfRange(v)),
            EntryRef::Value(v) => Ok(RawEntry::value(v)),
            EntryRef::Item(r) => Ok(RawEntry::item(r.ptr).expect("items are aligned")),
        }
    }
    /// The value, if this is a value entry.
    #[inline]
    pub fn value(self) -> Option<u64> {
        match self {
            EntryRef::Value(v) => Some(v),
            EntryRef::Item(_) => None,
        }
    }
    /// The item, if this is one.
    #[inline]
    pub fn item(self) -> Option<ItemRef<'g, T>> {
        match self {
            EntryRef::Item(r) => Some(r),
            EntryRef::Value(_) => None,
        }
    }
    /// Whether this is a value entry.
    #[inline]
    pub fn is_value(self) -> bool {
        matches!(self, EntryRef::Value(_))
    }
    /// Identity comparison: the same item pointer, or the same value.
    #[inline]
    pub fn same(self, other: EntryRef<'_, T>) -> bool {
        match (self, other) {
            (EntryRef::Item(a), EntryRef::Item(b)) => a.ptr == b.ptr,
            (EntryRef::Value(a), EntryRef::Value(b)) => a == b,
            _ => false,
        }
    }
}

impl<T: Item> PartialEq for EntryRef<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.same(*other)
    }
}

impl<T: Item> fmt::Debug for EntryRef<'_, T>
where
    T::Target: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryRef::Item(r) => f.debug_tuple("Item").field(&**r).finish(),
            EntryRef::Value(v) => f.debug_tuple("Value").field(v).finish(),
        }
    }
}

/// An entry removed through `&XArray`: a value, or an item whose drop has
/// been deferred until every reader that could see it has left. It keeps an
/// epoch guard of its own, so the item stays readable while it lives.
pub struct Retired<T: Item> {
    raw: RawEntry,
    _guard: Option<Guard>,
    _t: PhantomData<fn() -> T>,
}

impl<T: Item> Retired<T> {
    /// # Safety
    /// `raw` is a user entry; if it is an item, its destruction was deferred
    /// through a guard that is still pinned by this thread (or is `guard`).
    pub(crate) unsafe fn new(raw: RawEntry, guard: Guard) -> Self {
        Retired {
            raw,
            _guard: if raw.is_item() { Some(guard) } else { None },
            _t: PhantomData,
        }
    }
    /// The entry, borrowed from this handle.
    #[inline]
    pub fn get(&self) -> EntryRef<'_, T> {
        // SAFETY: the guard we hold, pinned on the default collector the
        // item's drop was deferred into, keeps the item alive.
        unsafe { EntryRef::from_raw(self.raw) }
    }
    /// The value, if this was a value entry.
    #[inline]
    pub fn value(&self) -> Option<u64> {
        self.get().value()
    }
    /// Whether this was a value entry.
    #[inline]
    pub fn is_value(&self) -> bool {
        self.raw.is_value()
    }
    /// A new owner of the retired item (for `Arc`, a clone of the pointer).
    pub fn to_owned(&self) -> Option<T>
    where
        T: CloneItem,
    {
        self.get().item().map(ItemRef::to_owned)
    }
}

impl<T: Item> fmt::Debug for Retired<T>
where
    T::Target: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Retired").field(&self.get()).finish()
    }
}
