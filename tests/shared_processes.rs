//! The shared cache between real processes: a differential run against a
//! byte model, a kill probe (members SIGKILLed at random points while the
//! others run), and fork.
//!
//! Every writer owns a stripe of pages (page `p` belongs to writer
//! `p % WRITERS`) and writes whole pages of a pattern naming the writer,
//! the page and a sequence number that only grows; readers read every page.
//! So any read can be checked: a page is zeros or one whole write; a
//! writer's own pages are exactly its last write; no reader ever sees a
//! page's sequence go back. What a killed writer acknowledged (appended to
//! its log after `write_at` returned) must be read back afterwards, through
//! the region and from the file after a sync.

mod shared_common;

use kxarray::shared::Region;
use shared_common::*;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WRITERS: u32 = 3;
const PAGES: u32 = 96;
const MAX_FRAMES: u64 = 4096;

/// What a child does, from its role string `dir;file;writer;incarnation;seconds;log`.
fn child(role: &str) -> i32 {
    let f: Vec<&str> = role.split(';').collect();
    let dir = Path::new(f[0]);
    let data = Path::new(f[1]);
    let writer: u32 = f[2].parse().unwrap();
    let incarnation: u64 = f[3].parse().unwrap();
    let seconds: f64 = f[4].parse().unwrap();
    let log_path = f[5];
    let region = Region::join(dir, "r", MAX_FRAMES).unwrap();
    let file = open(&region, data);
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log_path)
        .unwrap();
    let mut rng = Rng(u64::from(writer) * 1_000_003 + incarnation * 7919);
    let mut mine: HashMap<u32, u64> = HashMap::new();
    let mut seen: HashMap<u32, u64> = HashMap::new();
    let mut seq = incarnation << 32;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut worst = Duration::ZERO;
    let mut buf = vec![0u8; PAGE];
    while Instant::now() < deadline {
        let t = Instant::now();
        match rng.below(100) {
            0..=64 => {
                let p = rng.below(u64::from(PAGES)) as u32;
                file.read_at(&mut buf, u64::from(p) * PAGE as u64).unwrap();
                match decode(p, &buf) {
                    Err(e) => {
                        // what the file holds and a second read, to tell a
                        // frame's fault from a writeback's
                        use std::os::unix::fs::FileExt;
                        let at = u64::from(p) * PAGE as u64;
                        let mut disk = vec![0u8; PAGE];
                        let _ =
                            std::fs::File::open(data).and_then(|f| f.read_exact_at(&mut disk, at));
                        let mut again = vec![0u8; PAGE];
                        let _ = file.read_at(&mut again, at);
                        eprintln!(
                            "reader {writer}: {e}; the file: {:?}; read again: {:?}; {}",
                            decode(p, &disk),
                            decode(p, &again),
                            region.stats()
                        );
                        return 2;
                    }
                    Ok(got) => {
                        let s = got.map_or(0, |(w, s)| {
                            assert_eq!(w, p % WRITERS, "page {p} written by a non-owner");
                            s
                        });
                        if let Some(&prev) = seen.get(&p) {
                            if s < prev {
                                eprintln!("reader {writer}: page {p} went back from {prev} to {s}");
                                return 3;
                            }
                        }
                        seen.insert(p, s);
                        if let Some(&m) = mine.get(&p) {
                            if s != m {
                                eprintln!("writer {writer}: own page {p} holds {s}, wrote {m}");
                                return 4;
                            }
                        }
                    }
                }
            }
            65..=94 => {
                let p = (rng.below(u64::from(PAGES / WRITERS)) as u32) * WRITERS + writer;
                seq += 1;
                file.write_at(&pattern(writer, p, seq), u64::from(p) * PAGE as u64)
                    .unwrap();
                mine.insert(p, seq);
                seen.insert(p, seq);
                writeln!(log, "{p} {seq}").unwrap();
            }
            _ => file.sync_data().unwrap(),
        }
        worst = worst.max(t.elapsed());
    }
    if worst > Duration::from_secs(1) {
        eprintln!("member {writer} stalled {worst:?}");
        return 5;
    }
    0
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let d = private_dir();
    let data = d.path().join("data");
    std::fs::write(&data, vec![0u8; PAGES as usize * PAGE]).unwrap();
    let r = Region::join(d.path(), "r", MAX_FRAMES).unwrap();
    // a third of the pages fit: every member evicts and refills
    r.set_capacity(u64::from(PAGES / 3) * PAGE as u64).unwrap();
    drop(r);
    (d, data)
}

/// The last sequence each page's owner acknowledged, from the logs.
fn acknowledged(logs: &[PathBuf]) -> HashMap<u32, u64> {
    let mut acked = HashMap::new();
    for l in logs {
        let text = std::fs::read_to_string(l).unwrap_or_default();
        for line in text.lines() {
            let mut it = line.split(' ');
            let (Some(p), Some(s), None) = (it.next(), it.next(), it.next()) else {
                continue; // a line cut by the kill
            };
            let (Ok(p), Ok(s)) = (p.parse::<u32>(), s.parse::<u64>()) else {
                continue;
            };
            let e = acked.entry(p).or_insert(0);
            *e = (*e).max(s);
        }
    }
    acked
}

/// Every page through a new member, and from the file after its sync:
/// each at least its acknowledged write, whole.
fn verify(dir: &Path, data: &Path, acked: &HashMap<u32, u64>) {
    let region = Region::join(dir, "r", MAX_FRAMES).unwrap();
    region.reap();
    let file = open(&region, data);
    let mut buf = vec![0u8; PAGE];
    let mut through_region = Vec::new();
    for p in 0..PAGES {
        file.read_at(&mut buf, u64::from(p) * PAGE as u64).unwrap();
        let got = decode(p, &buf).unwrap();
        let s = got.map_or(0, |(_, s)| s);
        let want = acked.get(&p).copied().unwrap_or(0);
        assert!(
            s >= want,
            "page {p}: acknowledged seq {want}, region holds {s}"
        );
        through_region.push(buf.clone());
    }
    file.sync().unwrap();
    let disk = std::fs::read(data).unwrap();
    for p in 0..PAGES as usize {
        assert_eq!(
            &disk[p * PAGE..(p + 1) * PAGE],
            &through_region[p][..],
            "page {p} on disk after sync"
        );
    }
    let s = region.stats();
    assert_eq!(s.locked_frames, 0, "no frame stays locked: {s}");
    assert_eq!(s.dirty_frames, 0, "synced: {s}");
}

#[test]
fn members_read_and_write_one_copy_against_a_model() {
    if let Some(r) = role() {
        std::process::exit(child(&r));
    }
    let (d, data) = setup();
    let mut logs = Vec::new();
    let mut kids = Vec::new();
    for w in 0..WRITERS {
        let log = d.path().join(format!("log{w}"));
        let role = format!(
            "{};{};{w};1;2.0;{}",
            d.path().display(),
            data.display(),
            log.display()
        );
        kids.push(spawn(
            "members_read_and_write_one_copy_against_a_model",
            &role,
        ));
        logs.push(log);
    }
    for mut k in kids {
        assert!(k.wait().unwrap().success(), "a member's checks failed");
    }
    verify(d.path(), &data, &acknowledged(&logs));
}

#[test]
fn members_killed_at_random_points_lose_nothing_they_acknowledged() {
    if let Some(r) = role() {
        std::process::exit(child(&r));
    }
    let kills: u32 = std::env::var("KXARRAY_KILL_PROBE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let (d, data) = setup();
    let name = "members_killed_at_random_points_lose_nothing_they_acknowledged";
    let mut logs = Vec::new();
    let mut incarnation = 0u64;
    let mut start = |w: u32, logs: &mut Vec<PathBuf>, seconds: f64| {
        incarnation += 1;
        let log = d.path().join(format!("log{w}-{incarnation}"));
        let role = format!(
            "{};{};{w};{incarnation};{seconds};{}",
            d.path().display(),
            data.display(),
            log.display()
        );
        logs.push(log);
        spawn(name, &role)
    };
    let mut kids: Vec<_> = (0..WRITERS).map(|w| start(w, &mut logs, 600.0)).collect();
    let mut rng = Rng(42);
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(5 + rng.below(40)));
        let w = rng.below(u64::from(WRITERS)) as usize;
        kids[w].kill().unwrap();
        let st = kids[w].wait().unwrap();
        assert!(
            st.code().is_none(),
            "member {w} failed its checks before the kill: {st}"
        );
        kids[w] = start(w as u32, &mut logs, 600.0);
    }
    // the survivors and the last ones: a clean end
    for k in &mut kids {
        k.kill().unwrap();
        let st = k.wait().unwrap();
        assert!(st.code().is_none(), "a member failed its checks: {st}");
    }
    verify(d.path(), &data, &acknowledged(&logs));
    let r = Region::join(d.path(), "r", MAX_FRAMES).unwrap();
    r.reap();
    let s = r.stats();
    assert_eq!(s.members, 1, "every dead member's slot recovered: {s}");
    eprintln!("kill probe: {kills} kills; {s}");
}
