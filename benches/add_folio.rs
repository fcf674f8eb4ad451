//! `add_folio`: the pre-6.10 baseline (`legacy`) against the one-walk
//! algorithm (`optimised`), side by side in the same run.
//!
//! Cases (each a criterion group with both paths):
//! - `empty_o0`: an order-0 folio into an empty slot whose leaf node already
//!   exists (no node allocation is part of the case);
//! - `refault_o0`: an order-0 folio over an order-0 shadow;
//! - `split_o9_o0`: an order-0 folio over an order-9 (THP-sized) shadow,
//!   which must be split; every add gets a fresh order-9 shadow;
//! - `refault_o2`, `refault_o4`: a folio of order 2 / 4 over a shadow of the
//!   same order;
//! - `eexist`: an order-0 folio where a folio is already cached (`-EEXIST`).
//!
//! The mapping is realistic: 2-4 thousand cached order-0 pages spread over
//! indices `0..2^18`, so the tree is three levels deep and every leaf exists.
//! Only the add calls are timed (`iter_custom`): the folios of a batch are
//! built before the clock starts, and the state is restored after it stops
//! (the folio removed again, leaving a shadow; for the split case the order-9
//! shadow is rebuilt by adding and evicting an order-9 folio).
//!
//! After criterion's output a summary table is printed. Its ns/add column is
//! measured separately in the same process: per case, 10 rounds, each of 40
//! pairs of batches (256 adds) in which legacy and optimised alternate on
//! the same fixture; a round's value is its median batch, the table shows
//! the median round.
//! Walks and nodes per add are the `AddStats` totals of those rounds.
//!
//! `KXARRAY_BENCH_QUICK=1 cargo bench --bench add_folio` skips criterion and
//! prints only the table.

use criterion::{BenchmarkId, Criterion, SamplingMode};
use kxarray::filemap::legacy::add_folio_legacy_stats;
use kxarray::filemap::{AddStats, AddressSpace, Folio, Shadow, ShadowFields};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Folios added per timed batch (the split case has this many regions).
const BATCH: usize = 256;
/// Leaves (64 indices each) of the non-split fixtures: indices `0..2^18`.
const LEAVES: u64 = 4096;
/// Order-9 regions of the split fixture, one per 1024 indices.
const REGIONS: u64 = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Empty,
    Refault(u32),
    Split,
    Exists,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Legacy,
    Optimised,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Legacy => "legacy",
            Path::Optimised => "optimised",
        }
    }
}

struct Case {
    id: &'static str,
    label: &'static str,
    kind: Kind,
}

const CASES: [Case; 6] = [
    Case {
        id: "empty_o0",
        label: "empty slot, order 0",
        kind: Kind::Empty,
    },
    Case {
        id: "refault_o0",
        label: "order 0 over order-0 shadow",
        kind: Kind::Refault(0),
    },
    Case {
        id: "split_o9_o0",
        label: "order 0 over order-9 shadow (split)",
        kind: Kind::Split,
    },
    Case {
        id: "refault_o2",
        label: "order 2 over order-2 shadow",
        kind: Kind::Refault(2),
    },
    Case {
        id: "refault_o4",
        label: "order 4 over order-4 shadow",
        kind: Kind::Refault(4),
    },
    Case {
        id: "eexist",
        label: "conflict with a folio (EEXIST)",
        kind: Kind::Exists,
    },
];

fn shadow(n: u64) -> Shadow {
    Shadow::pack(ShadowFields {
        eviction: n,
        memcg: 1,
        node: 0,
        workingset: false,
    })
    .unwrap()
}

fn folio(index: u64, order: u32) -> Arc<Folio> {
    Arc::new(Folio::new(index, order).unwrap())
}

/// A mapping plus the slots the case adds at; restored after every batch.
struct Fixture {
    kind: Kind,
    space: AddressSpace,
    /// Base index of each target leaf (or order-9 region), shuffled; used
    /// cyclically so the folios of one batch are at distinct places.
    bases: Vec<u64>,
    next: usize,
    rng: SmallRng,
    evictions: u64,
}

impl Fixture {
    fn new(kind: Kind) -> Fixture {
        let space = AddressSpace::new();
        let mut rng = SmallRng::seed_from_u64(0x5eed ^ format!("{kind:?}").len() as u64);
        let mut bases: Vec<u64>;
        let mut evictions = 1;
        match kind {
            Kind::Split => {
                // order-9 shadows at j*1024, cached pages in the other half
                bases = (0..REGIONS).map(|j| j * 1024).collect();
                for &b in &bases {
                    for k in 0..8 {
                        space.add_folio(&folio(b + 512 + k * 64 + 63, 0)).unwrap();
                    }
                    let big = folio(b, 9);
                    space.add_folio(&big).unwrap();
                    assert!(space.remove_folio(&big, Some(shadow(evictions))));
                    evictions += 1;
                }
            }
            _ => {
                // a cached page at the end of every leaf
                bases = (0..LEAVES).map(|i| i * 64).collect();
                for &b in &bases {
                    space.add_folio(&folio(b + 63, 0)).unwrap();
                }
                if let Kind::Refault(order) = kind {
                    for &b in &bases {
                        let f = folio(b, order);
                        space.add_folio(&f).unwrap();
                        assert!(space.remove_folio(&f, Some(shadow(evictions))));
                        evictions += 1;
                    }
                }
            }
        }
        assert_eq!(space.pages().height(), 3, "{kind:?}: tree height");
        space.pages().check_invariants().unwrap();
        bases.shuffle(&mut rng);
        Fixture {
            kind,
            space,
            bases,
            next: 0,
            rng,
            evictions,
        }
    }

    /// The folios of the next batch (untimed).
    fn prepare(&mut self, n: usize, out: &mut Vec<Arc<Folio>>) {
        out.clear();
        // a batch never wraps, so its folios are at distinct places
        if self.next + n > self.bases.len() {
            self.next = 0;
            self.bases.shuffle(&mut self.rng);
        }
        for _ in 0..n {
            let base = self.bases[self.next];
            self.next += 1;
            let f = match self.kind {
                Kind::Empty => folio(base + self.rng.random_range(0..63), 0),
                Kind::Refault(order) => folio(base, order),
                Kind::Split => folio(base + self.rng.random_range(0..512), 0),
                Kind::Exists => folio(base + 63, 0),
            };
            out.push(f);
        }
    }

    /// Put the mapping back as it was before the batch (untimed).
    fn restore(&mut self, batch: &[Arc<Folio>]) {
        for f in batch {
            self.evictions += 1;
            let s = shadow(self.evictions);
            match self.kind {
                Kind::Empty => assert!(self.space.remove_folio(f, None)),
                Kind::Refault(_) => assert!(self.space.remove_folio(f, Some(s))),
                Kind::Split => {
                    assert!(self.space.remove_folio(f, Some(s)));
                    let big = folio(f.index() & !511, 9);
                    assert!(self.space.add_folio(&big).unwrap().is_some());
                    assert!(self.space.remove_folio(&big, Some(s)));
                }
                Kind::Exists => {}
            }
        }
    }

    fn expect_err(&self) -> bool {
        self.kind == Kind::Exists
    }
}

/// Add every folio of `batch` with `path`; only this is timed.
#[inline(never)]
fn timed_adds(
    path: Path,
    space: &AddressSpace,
    batch: &[Arc<Folio>],
    st: &mut AddStats,
    expect_err: bool,
) -> (Duration, u64) {
    let mut bad = 0u64;
    let t = Instant::now();
    match path {
        Path::Legacy => {
            for f in batch {
                let r = add_folio_legacy_stats(black_box(space), black_box(f), st);
                bad += (r.is_err() != expect_err) as u64;
                black_box(r.ok());
            }
        }
        Path::Optimised => {
            for f in batch {
                let r = space.add_folio_stats(black_box(f), st);
                bad += (r.is_err() != expect_err) as u64;
                black_box(r.ok());
            }
        }
    }
    (t.elapsed(), bad)
}

/// Run `n` adds with `path` in batches; returns the timed total.
fn run(
    fx: &mut Fixture,
    path: Path,
    n: u64,
    st: &mut AddStats,
    buf: &mut Vec<Arc<Folio>>,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0u64;
    while done < n {
        let b = (n - done).min(BATCH as u64) as usize;
        fx.prepare(b, buf);
        let (d, bad) = timed_adds(path, &fx.space, buf, st, fx.expect_err());
        assert_eq!(
            bad,
            0,
            "{:?}/{}: unexpected add result",
            fx.kind,
            path.name()
        );
        total += d;
        fx.restore(buf);
        done += b as u64;
    }
    total
}

struct Row {
    label: &'static str,
    walks: [f64; 2],
    nodes: [f64; 2],
    ns: [f64; 2],
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Interleaved measurement for the table: `rounds` rounds; a round is
/// `batches` pairs of one batch of [`BATCH`] adds per path, alternating
/// which path goes first, so noise (other processes, frequency changes)
/// hits both paths equally. A round's ns/add is the median of its batches
/// (a preempted batch is an outlier, not a shift); the table shows the
/// median round.
fn measure(case: &Case, rounds: usize, batches: usize) -> Row {
    let mut fx = Fixture::new(case.kind);
    let mut buf = Vec::with_capacity(BATCH);
    let paths = [Path::Legacy, Path::Optimised];
    // warm-up (also faults in the allocator's pools)
    for p in paths {
        let mut st = AddStats::default();
        run(&mut fx, p, 4 * BATCH as u64, &mut st, &mut buf);
    }
    let mut stats = [AddStats::default(); 2];
    let mut per_round: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        let mut per_batch: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for b in 0..batches {
            let order: [usize; 2] = if (r + b) % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let d = run(&mut fx, paths[i], BATCH as u64, &mut stats[i], &mut buf);
                per_batch[i].push(d.as_nanos() as f64 / BATCH as f64);
            }
        }
        for i in 0..2 {
            per_round[i].push(median(&mut per_batch[i]));
        }
    }
    fx.space.pages().check_invariants().unwrap();
    let adds = (rounds * batches * BATCH) as f64;
    Row {
        label: case.label,
        walks: [stats[0].walks as f64 / adds, stats[1].walks as f64 / adds],
        nodes: [stats[0].nodes as f64 / adds, stats[1].nodes as f64 / adds],
        ns: [median(&mut per_round[0]), median(&mut per_round[1])],
    }
}

fn criterion_groups(c: &mut Criterion) {
    for case in &CASES {
        let mut g = c.benchmark_group(format!("add_folio/{}", case.id));
        g.sampling_mode(SamplingMode::Flat)
            .sample_size(20)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(1200));
        let mut fx = Fixture::new(case.kind);
        let mut buf = Vec::with_capacity(BATCH);
        for path in [Path::Legacy, Path::Optimised] {
            g.bench_function(BenchmarkId::from_parameter(path.name()), |b| {
                b.iter_custom(|iters| {
                    let mut st = AddStats::default();
                    run(&mut fx, path, iters, &mut st, &mut buf)
                })
            });
        }
        g.finish();
    }
}

fn print_table(rows: &[Row], rounds: usize, batches: usize) {
    println!();
    println!(
        "add_folio summary: {rounds} rounds x {batches} alternating legacy/optimised batches of {BATCH} adds each, same process and fixture, tree height 3; ns/add = median round of per-round median batches"
    );
    println!(
        "| case | legacy walks/add | legacy nodes/add | legacy ns/add | optimised walks/add | optimised nodes/add | optimised ns/add | legacy/optimised (gain) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let ratio = r.ns[0] / r.ns[1];
        println!(
            "| {} | {:.2} walks | {:.2} nodes | {:.1} | {:.2} walks | {:.2} nodes | {:.1} | {:.3}x ({:+.1}%) |",
            r.label,
            r.walks[0],
            r.nodes[0],
            r.ns[0],
            r.walks[1],
            r.nodes[1],
            r.ns[1],
            ratio,
            (ratio - 1.0) * 100.0
        );
    }
    // The targets, checked against this run.
    let find = |l: &str| rows.iter().find(|r| r.label == l).unwrap();
    let empty = find(CASES[0].label);
    let refault = find(CASES[1].label);
    let split = find(CASES[2].label);
    let exists = find(CASES[5].label);
    let same = [
        find(CASES[1].label),
        find(CASES[3].label),
        find(CASES[4].label),
    ];
    let ok = |b: bool| if b { "ok" } else { "MISSED" };
    let gain = |r: &Row| (r.ns[0] / r.ns[1] - 1.0) * 100.0;
    println!();
    println!("targets (optimised):");
    println!(
        "  empty slot: 1 walk ............................ {:.2} walks, {:.2} nodes  {}",
        empty.walks[1],
        empty.nodes[1],
        ok(empty.walks[1] == 1.0 && empty.nodes[1] == 0.0)
    );
    println!(
        "  same-order shadow: 1 walk ..................... {}  {}",
        same.iter()
            .map(|r| format!("{:.2}", r.walks[1]))
            .collect::<Vec<_>>()
            .join(" / "),
        ok(same.iter().all(|r| r.walks[1] == 1.0 && r.nodes[1] == 0.0))
    );
    println!(
        "  order-9 split: <= 2 walks, 1 node ............. {:.2} walks, {:.2} nodes  {}",
        split.walks[1],
        split.nodes[1],
        ok(split.walks[1] <= 2.0 && split.nodes[1] == 1.0)
    );
    println!(
        "  EEXIST: 1 walk, no node ....................... {:.2} walks, {:.2} nodes  {}",
        exists.walks[1],
        exists.nodes[1],
        ok(exists.walks[1] == 1.0 && exists.nodes[1] == 0.0)
    );
    println!(
        "  order-0 refault gain >= +7.5% ................. {:+.1}%  {}",
        gain(refault),
        ok(gain(refault) >= 7.5)
    );
    println!(
        "  split-heavy (order-9 shadow) gain >= +12.5% ... {:+.1}%  {}",
        gain(split),
        ok(gain(split) >= 12.5)
    );
}

fn main() {
    let quick = std::env::var("KXARRAY_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let start = Instant::now();
    if !quick {
        let mut c = Criterion::default().configure_from_args();
        criterion_groups(&mut c);
        c.final_summary();
    }
    let rounds = 10;
    let batches = if quick { 8 } else { 40 };
    let rows: Vec<Row> = CASES.iter().map(|c| measure(c, rounds, batches)).collect();
    print_table(&rows, rounds, batches);
    eprintln!("\n(total {:.1}s)", start.elapsed().as_secs_f64());
}
