//! Shadow entries: the value entries an evicted folio leaves behind, so a
//! later refault can tell how long the page was gone (`mm/workingset.c`).
//!
//! Layout of the 63-bit value, low bits first:
//! `workingset:1 | node:NODE_BITS | memcg:MEMCG_BITS | eviction:rest`.
//! The eviction counter is truncated to the bits left, as the kernel's
//! `EVICTION_MASK` does; everything else round-trips exactly.

use crate::MAX_VALUE;

/// Bits for the NUMA node id.
pub const NODE_BITS: u32 = 6;
/// Bits for the memory cgroup id.
pub const MEMCG_BITS: u32 = 16;
const WORKINGSET_BITS: u32 = 1;
/// Bits left for the eviction counter.
pub const EVICTION_BITS: u32 = 63 - WORKINGSET_BITS - NODE_BITS - MEMCG_BITS;

/// A packed shadow entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shadow(u64);

/// The fields of a shadow entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ShadowFields {
    /// The eviction timestamp (the lruvec's non-resident age).
    pub eviction: u64,
    /// Memory cgroup id.
    pub memcg: u16,
    /// NUMA node.
    pub node: u8,
    /// The folio was in the workingset when evicted.
    pub workingset: bool,
}

impl Shadow {
    /// Pack (`pack_shadow`). The eviction counter keeps its low
    /// [`EVICTION_BITS`] bits; a node id above `2^NODE_BITS - 1` is an error.
    ///
    /// # Errors
    /// [`Error::ValueOutOfRange`](crate::Error::ValueOutOfRange) with the
    /// node id when it does not fit in [`NODE_BITS`] bits.
    ///
    /// ```
    /// use kxarray::filemap::{Shadow, ShadowFields, NODE_BITS};
    /// let f = ShadowFields { eviction: 123456, memcg: 7, node: 1, workingset: true };
    /// assert_eq!(Shadow::pack(f).unwrap().unpack(), f);
    /// let too_big = ShadowFields { node: 1 << NODE_BITS, ..f };
    /// assert_eq!(Shadow::pack(too_big), Err(kxarray::Error::ValueOutOfRange(64)));
    /// ```
    pub fn pack(f: ShadowFields) -> Result<Shadow, crate::Error> {
        if f.node as u32 >= 1 << NODE_BITS {
            return Err(crate::Error::ValueOutOfRange(f.node as u64));
        }
        let eviction = f.eviction & ((1u64 << EVICTION_BITS) - 1);
        let mut v = eviction;
        v = (v << MEMCG_BITS) | f.memcg as u64;
        v = (v << NODE_BITS) | f.node as u64;
        v = (v << WORKINGSET_BITS) | f.workingset as u64;
        debug_assert!(v <= MAX_VALUE);
        Ok(Shadow(v))
    }
    /// Unpack (`unpack_shadow`).
    ///
    /// ```
    /// use kxarray::filemap::{Shadow, ShadowFields, EVICTION_BITS};
    ///
    /// let eviction = (1 << EVICTION_BITS) + 3;
    /// let f = ShadowFields { eviction, memcg: 2, node: 5, workingset: false };
    /// let back = Shadow::pack(f).unwrap().unpack();
    /// assert_eq!((back.memcg, back.node, back.workingset), (2, 5, false));
    /// assert_eq!(back.eviction, 3); // the counter keeps its low EVICTION_BITS bits
    /// ```
    pub fn unpack(self) -> ShadowFields {
        let mut v = self.0;
        let workingset = v & 1 != 0;
        v >>= WORKINGSET_BITS;
        let node = (v & ((1 << NODE_BITS) - 1)) as u8;
        v >>= NODE_BITS;
        let memcg = (v & ((1 << MEMCG_BITS) - 1)) as u16;
        v >>= MEMCG_BITS;
        ShadowFields {
            eviction: v,
            memcg,
            node,
            workingset,
        }
    }
    /// The value-entry payload.
    ///
    /// ```
    /// use kxarray::filemap::{AddressSpace, Folio, Shadow, ShadowFields};
    /// use kxarray::EntryRef;
    /// use std::sync::Arc;
    ///
    /// let mapping = AddressSpace::new();
    /// let folio = Arc::new(Folio::new(0, 0).unwrap());
    /// mapping.add_folio(&folio).unwrap();
    /// let shadow = Shadow::pack(ShadowFields { eviction: 77, ..Default::default() }).unwrap();
    /// mapping.remove_folio(&folio, Some(shadow));
    /// let guard = kxarray::pin();
    /// let stored = mapping.pages().load(0, &guard); // the entry the tree holds
    /// assert!(matches!(stored, Some(EntryRef::Value(v)) if v == shadow.to_value()));
    /// ```
    pub fn to_value(self) -> u64 {
        self.0
    }
    /// A shadow from a value entry read out of the page cache (bits above
    /// [`MAX_VALUE`] are dropped).
    ///
    /// ```
    /// use kxarray::filemap::{Shadow, ShadowFields};
    ///
    /// let f = ShadowFields { eviction: 5, node: 2, ..Default::default() };
    /// let shadow = Shadow::pack(f).unwrap();
    /// assert_eq!(Shadow::from_value(shadow.to_value()), shadow);
    /// assert_eq!(Shadow::from_value(u64::MAX).to_value(), kxarray::MAX_VALUE);
    /// ```
    pub fn from_value(v: u64) -> Shadow {
        Shadow(v & MAX_VALUE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips_and_truncates_eviction() {
        let f = ShadowFields {
            eviction: (1 << EVICTION_BITS) + 5,
            memcg: u16::MAX,
            node: 63,
            workingset: true,
        };
        let s = Shadow::pack(f).unwrap();
        assert!(s.to_value() <= MAX_VALUE);
        let u = s.unpack();
        assert_eq!(u.eviction, 5, "counter keeps its low bits");
        assert_eq!((u.memcg, u.node, u.workingset), (u16::MAX, 63, true));
        assert_eq!(Shadow::from_value(s.to_value()), s);
        assert!(Shadow::pack(ShadowFields { node: 64, ..f }).is_err());
    }
}
