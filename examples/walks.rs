//! Prints the walk and node counts of `add_folio` and its pre-6.10 baseline
//! for the four cases of the kernel's table.
use kxarray::filemap::legacy::add_folio_legacy_stats;
use kxarray::filemap::{AddStats, AddressSpace, Folio, Shadow, ShadowFields};
use std::sync::Arc;

fn folio(i: u64, o: u32) -> Arc<Folio> {
    Arc::new(Folio::new(i, o).unwrap())
}

fn setup(case: &str) -> (AddressSpace, Arc<Folio>) {
    let m = AddressSpace::new();
    m.add_folio(&folio(1 << 16, 0)).unwrap();
    let s = Shadow::pack(ShadowFields {
        eviction: 5,
        ..Default::default()
    })
    .unwrap();
    match case {
        "empty range" => (m, folio(1024, 0)),
        "shadow of the same order" => {
            let f = folio(1024, 0);
            m.add_folio(&f).unwrap();
            m.remove_folio(&f, Some(s));
            (m, folio(1024, 0))
        }
        "order-9 shadow, order-0 folio" => {
            let f = folio(1024, 9);
            m.add_folio(&f).unwrap();
            m.remove_folio(&f, Some(s));
            (m, folio(1024 + 77, 0))
        }
        _ => {
            m.add_folio(&folio(1024, 0)).unwrap();
            (m, folio(1024, 0))
        }
    }
}

fn main() {
    println!("| case | legacy walks | legacy nodes | optimised walks | optimised nodes |");
    println!("|---|---|---|---|---|");
    for case in [
        "empty range",
        "shadow of the same order",
        "order-9 shadow, order-0 folio",
        "conflict with a folio (EEXIST)",
    ] {
        let (m, f) = setup(case);
        let mut legacy = AddStats::default();
        let _ = add_folio_legacy_stats(&m, &f, &mut legacy);
        let (m, f) = setup(case);
        let mut opt = AddStats::default();
        let _ = m.add_folio_stats(&f, &mut opt);
        println!(
            "| {case} | {} | {} | {} | {} |",
            legacy.walks, legacy.nodes, opt.walks, opt.nodes
        );
    }
}
