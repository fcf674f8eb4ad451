//! The page cache's `add_folio` as it was before Linux 6.10, kept as the
//! measured baseline.
//!
//! This is a faithful port of the pre-patch `__filemap_add_folio` onto the
//! same cursor API, so that walk counts compare like for like:
//!
//! 1. an unlocked walk for the order of the current slot (`xa_get_order`);
//! 2. if that order is larger than the folio's, an unlocked load and a
//!    uniform split preallocation filled with what that load saw
//!    (`xas_split_alloc`: 8 nodes for an order-9 shadow and an order-0 folio);
//! 3. under the lock, the ranged conflict scan;
//! 4. if a shadow was found, the order again under the lock, from a fresh
//!    walk (`xa_get_order`), a split with whatever was preallocated, and a
//!    cursor reset;
//! 5. the store (walking again after the reset).
//!
//! Like the kernel's `xas_split`, the port does not look at whether the
//! split happened: when the shadow changed between the unlocked
//! preallocation and the locked split (or was not large when the unlocked
//! check ran), the split is refused and the store then replaces the whole
//! large entry, putting the folio at indices it does not cover. That is the
//! 2024 large-folio data-loss race, which the optimised path closes by
//! re-validating the entry and order under the lock.

use super::{AddError, AddStats, AddressSpace, Folio, Shadow};
use crate::{fault, pin, EntryRef, XaState};
use std::sync::Arc;

/// `add_folio` before Linux 6.10; see the module docs.
///
/// ```
/// use kxarray::filemap::legacy::add_folio_legacy;
/// use kxarray::filemap::{AddError, AddressSpace, Folio};
/// use std::sync::Arc;
///
/// let mapping = AddressSpace::new();
/// let folio = Arc::new(Folio::new(4, 2).unwrap());
/// assert_eq!(add_folio_legacy(&mapping, &folio).unwrap(), None);
/// assert!(Arc::ptr_eq(&mapping.lookup(6).unwrap(), &folio));
/// let overlap = Arc::new(Folio::new(7, 0).unwrap());
/// assert_eq!(add_folio_legacy(&mapping, &overlap), Err(AddError::Exists));
/// assert_eq!(mapping.nr_pages(), 4);
/// ```
pub fn add_folio_legacy(
    space: &AddressSpace,
    folio: &Arc<Folio>,
) -> Result<Option<Shadow>, AddError> {
    let mut stats = AddStats::default();
    add_folio_legacy_stats(space, folio, &mut stats)
}

/// [`add_folio_legacy`], adding what the call cost to `stats`.
///
/// ```
/// use kxarray::filemap::legacy::add_folio_legacy_stats;
/// use kxarray::filemap::{AddStats, AddressSpace, Folio, Shadow, ShadowFields};
/// use std::sync::Arc;
///
/// // One page refaulting into an order-9 shadow, by each algorithm.
/// let refault = |legacy: bool| {
///     let mapping = AddressSpace::new();
///     let big = Arc::new(Folio::new(0, 9).unwrap());
///     mapping.add_folio(&big).unwrap();
///     let shadow = Shadow::pack(ShadowFields { eviction: 7, ..Default::default() }).unwrap();
///     mapping.remove_folio(&big, Some(shadow));
///     let (page, mut stats) = (Arc::new(Folio::new(5, 0).unwrap()), AddStats::default());
///     let got = if legacy {
///         add_folio_legacy_stats(&mapping, &page, &mut stats)
///     } else {
///         mapping.add_folio_stats(&page, &mut stats)
///     };
///     assert_eq!(got.unwrap(), Some(shadow));
///     stats
/// };
/// let (old, new) = (refault(true), refault(false));
/// assert!(old.walks > new.walks && old.nodes > new.nodes); // 5 walks and 8 nodes against 1 and 1
/// ```
pub fn add_folio_legacy_stats(
    space: &AddressSpace,
    folio: &Arc<Folio>,
    stats: &mut AddStats,
) -> Result<Option<Shadow>, AddError> {
    let xa = &space.pages;
    let index = folio.index();
    let forder = folio.order();
    let nr = folio.nr_pages();
    let allocs0 = fault::allocations();
    let guard = pin();
    let mut xas = XaState::with_order(xa, &guard, index, forder)?;
    let mut other_walks = 0u64;
    // xa_get_order(): a walk of its own.
    let get_order = |walks: &mut u64| -> u32 {
        let mut probe = XaState::new(xa, &guard, index);
        let order = match probe.load() {
            Some(_) => probe.get_order(),
            None => 0,
        };
        *walks += probe.walks();
        order
    };
    let result = loop {
        // (1) unlocked order check
        let order = get_order(&mut other_walks);
        if order > forder {
            // (2) unlocked load + split preallocation filled with it
            let mut probe = XaState::new(xa, &guard, index);
            let seen = probe.load();
            other_walks += probe.walks();
            if let Some(EntryRef::Value(v)) = seen {
                if let Err(e) = xas.split_alloc(v, order) {
                    break Err(e.into());
                }
            }
        }
        let lock = xa.lock();
        // (3) conflict scan
        let mut old: Option<u64> = None;
        let mut shadow_pages = 0u64;
        let mut exists = false;
        while let Some(e) = xas.find_conflict(&lock) {
            match e {
                EntryRef::Item(_) => {
                    exists = true;
                    break;
                }
                EntryRef::Value(v) => {
                    old = Some(v);
                    shadow_pages += 1 << xas.get_order();
                }
            }
        }
        if exists {
            xas.destroy();
            break Err(AddError::Exists);
        }
        if let Some(v) = old {
            // (4) the order again, from a fresh walk under the lock
            let order = get_order(&mut other_walks);
            if order > forder {
                // Faithful to the kernel: xas_split() reports nothing. A
                // stale or missing preallocation is not noticed here.
                let _ = xas.split(&lock, v, order);
                xas.reset();
                shadow_pages = nr;
            }
        }
        // (5) store
        match space.store_folio(&mut xas, lock, folio, shadow_pages, stats) {
            Ok(true) => break Ok(old.map(Shadow::from_value)),
            Ok(false) => continue,
            Err(e) => break Err(e),
        }
    };
    stats.walks += xas.walks() + other_walks;
    stats.nodes += fault::allocations() - allocs0;
    result
}
