//! Prefetch of a B-tree interior page's children during a scan
//! (after turso #8398): when a handle reads an interior page and then its first
//! two children in the page's order, the rest of its children are
//! submitted at once (`WillNeed`), wherever they lie in the file. A scan
//! reads every child of each interior page in order; a point lookup reads
//! one child per interior page, so it never prefetches; children in a few
//! runs of adjacent pages are left to readahead. Readahead cannot
//! do this for leaves scattered through the file (a table filled in random
//! key order): their order is the tree's, not the file's.
//!
//! Owns [`Children`] (one per database handle; no locks). Invariant: a
//! prefetch is advice (what a read returns never depends on it), and
//! parsing trusts nothing in the page: a child number out of range, a cell
//! pointer past the page, or a page that is not an interior page means no
//! prefetch.

/// The B-tree page flags of interior pages (index, table).
const INTERIOR: [u8; 2] = [0x02, 0x05];

/// Fewest runs of adjacent pages the rest of the children must make for
/// a prefetch (fewer: the cache's readahead follows them).
const MIN_RUNS: usize = 4;

/// Most children a prefetch submits (an interior page of 4 KiB holds a few
/// hundred).
const MAX_KIDS: usize = 1024;

/// The children of the last interior page read, and how far a scan went
/// through them.
#[derive(Debug, Default)]
pub(crate) struct Children {
    /// Child page numbers in the tree's order (the right child last).
    kids: Vec<u32>,
    /// How many of them were read in that order.
    next: usize,
    /// Whether the rest were prefetched.
    sent: bool,
}

impl Children {
    /// Note a read of page `pgno` (1-based) holding `page`, of a file of
    /// `pages` pages. Returns the byte ranges to prefetch now (adjacent
    /// pages merged), when the read is the second child of the last
    /// interior page read in its order.
    pub(crate) fn on_read(&mut self, pgno: u32, page: &[u8], pages: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if self.kids.get(self.next) == Some(&pgno) {
            self.next += 1;
            if self.next == 2 && !self.sent {
                self.sent = true;
                let psize = page.len() as u64;
                let mut rest: Vec<u32> = self.kids[2..].to_vec();
                rest.sort_unstable();
                for k in rest {
                    let off = u64::from(k - 1) * psize;
                    match out.last_mut() {
                        Some((o, l)) if *o + *l == off => *l += psize,
                        _ => out.push((off, psize)),
                    }
                }
                // Children in a few runs of adjacent pages are readahead's
                // to read (a table filled in key order): submitting them
                // again only costs lookups.
                if out.len() < MIN_RUNS {
                    out.clear();
                }
            }
        }
        if let Some(kids) = interior_children(pgno, page, pages) {
            *self = Children {
                kids,
                next: 0,
                sent: false,
            };
        }
        out
    }
}

/// The child page numbers of `page` (page `pgno`) if it is a B-tree
/// interior page whose every child lies in a file of `pages` pages.
fn interior_children(pgno: u32, page: &[u8], pages: u64) -> Option<Vec<u32>> {
    let hdr = if pgno == 1 { 100 } else { 0 };
    let be16 = |at: usize| -> Option<usize> {
        Some(usize::from(u16::from_be_bytes(
            page.get(at..at + 2)?.try_into().ok()?,
        )))
    };
    let be32 = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(page.get(at..at + 4)?.try_into().ok()?))
    };
    if !INTERIOR.contains(page.get(hdr)?) {
        return None;
    }
    let cells = be16(hdr + 3)?;
    if cells == 0 || cells >= MAX_KIDS {
        return None;
    }
    let valid = |k: u32| k != 0 && u64::from(k) <= pages;
    let mut kids = Vec::with_capacity(cells + 1);
    for i in 0..cells {
        let k = be32(be16(hdr + 12 + 2 * i)?)?;
        if !valid(k) {
            return None;
        }
        kids.push(k);
    }
    let right = be32(hdr + 8)?;
    if !valid(right) {
        return None;
    }
    kids.push(right);
    Some(kids)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    /// A table interior page (page `pgno`, not 1) with `kids` children:
    /// cells at the end of the page, each a child number and a key.
    fn interior(kids: &[u32]) -> Vec<u8> {
        let mut p = vec![0u8; P];
        p[0] = 0x05;
        let cells = kids.len() - 1;
        p[3..5].copy_from_slice(&(cells as u16).to_be_bytes());
        p[8..12].copy_from_slice(&kids[cells].to_be_bytes());
        let mut at = P;
        for (i, k) in kids[..cells].iter().enumerate() {
            at -= 5;
            p[at..at + 4].copy_from_slice(&k.to_be_bytes());
            p[at + 4] = i as u8; // the key, a one-byte varint
            p[12 + 2 * i..14 + 2 * i].copy_from_slice(&(at as u16).to_be_bytes());
        }
        p
    }

    fn leaf() -> Vec<u8> {
        let mut p = vec![0u8; P];
        p[0] = 0x0d;
        p
    }

    #[test]
    fn a_scan_prefetches_the_rest_of_the_children_merged_into_runs() {
        let mut c = Children::default();
        let kids = [40, 7, 90, 8, 9, 10, 3, 60];
        assert!(c.on_read(2, &interior(&kids), 100).is_empty());
        assert!(c.on_read(40, &leaf(), 100).is_empty());
        // The second child in the tree's order: the rest, sorted, merged.
        let got = c.on_read(7, &leaf(), 100);
        let pg = |n: u64| (n - 1) * P as u64;
        let p = P as u64;
        assert_eq!(
            got,
            vec![(pg(3), p), (pg(8), 3 * p), (pg(60), p), (pg(90), p)]
        );
        // Once per interior page.
        assert!(c.on_read(90, &leaf(), 100).is_empty());
        assert!(c.on_read(8, &leaf(), 100).is_empty());
    }

    #[test]
    fn point_lookups_and_bad_pages_prefetch_nothing() {
        let mut c = Children::default();
        // One child per interior page, as a lookup reads.
        assert!(c.on_read(2, &interior(&[40, 7, 90]), 100).is_empty());
        assert!(c.on_read(7, &interior(&[50, 51, 52]), 100).is_empty());
        assert!(c.on_read(52, &leaf(), 100).is_empty());
        assert!(c.on_read(3, &interior(&[60, 61]), 100).is_empty());
        assert!(c.on_read(61, &leaf(), 100).is_empty());
        // A scan of children in a few runs (a table filled in key order):
        // readahead's.
        let mut c = Children::default();
        let kids: Vec<u32> = (10..40).chain(50..60).collect();
        assert!(c.on_read(2, &interior(&kids), 100).is_empty());
        assert!(c.on_read(10, &leaf(), 100).is_empty());
        assert!(c.on_read(11, &leaf(), 100).is_empty());
        // A child past the end of the file: not an interior page to trust.
        let mut c = Children::default();
        assert!(c.on_read(2, &interior(&[40, 700, 41]), 100).is_empty());
        assert!(c.on_read(40, &leaf(), 100).is_empty());
        assert!(c.on_read(700, &leaf(), 100).is_empty());
        // A cell pointer past the page.
        let mut p = interior(&[40, 41, 42]);
        p[12..14].copy_from_slice(&(P as u16 - 2).to_be_bytes());
        assert_eq!(interior_children(2, &p, 100), None);
        assert_eq!(interior_children(2, &leaf(), 100), None);
        assert_eq!(interior_children(2, &[0x05], 100), None);
    }
}
