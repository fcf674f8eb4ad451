//! The shared cache in one process: two joins of one region are two
//! members (each its own open of the region file, so its own liveness
//! lock and slot), which is enough to see sharing, coherence and the
//! file-level paths; the multi-process tests (fork, kill) are in
//! `tests/shared_*.rs`.

use super::*;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn open(region: &Arc<Region>, path: &Path) -> SharedFile {
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    SharedFile::open(region.clone(), fd.into(), path.as_os_str().as_bytes()).unwrap()
}

/// Two members of one region of 64 frames, beside a file of 8 zero pages
/// (the directory lives as long as the first value).
fn two_members() -> (
    tempfile::TempDir,
    Arc<Region>,
    Arc<Region>,
    std::path::PathBuf,
) {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let b = Region::join(d.path(), "r", 1024).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![0u8; 8 * 4096]).unwrap();
    (d, a, b, data)
}

#[test]
fn two_members_share_one_copy() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(256 * 4096).unwrap();
    let b = Region::join(d.path(), "r", 1024).unwrap();
    assert_ne!(a.member_slot(), b.member_slot());
    assert_eq!(b.capacity(), 256 * 4096, "one capacity for the region");
    let data = d.path().join("data");
    let bytes: Vec<u8> = (0..64 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let fa = open(&a, &data);
    let fb = open(&b, &data);
    assert_eq!(fa.slot_index(), fb.slot_index());
    let mut buf = vec![0u8; bytes.len()];
    assert_eq!(fa.read_at(&mut buf, 0).unwrap(), bytes.len());
    assert_eq!(buf, bytes);
    let fills = a.stats().fills;
    assert_eq!(fills, 64);
    let mut buf2 = vec![0u8; bytes.len()];
    fb.read_at(&mut buf2, 0).unwrap();
    assert_eq!(buf2, bytes);
    assert_eq!(
        b.stats().fills,
        fills,
        "the second member read no page from the file"
    );
    // a write by one is seen by the other at once
    fb.write_at(b"hello", 4096 * 3 + 10).unwrap();
    let mut h = [0u8; 5];
    fa.read_at(&mut h, 4096 * 3 + 10).unwrap();
    assert_eq!(&h, b"hello");
    assert_eq!(a.stats().dirty_frames, 1);
    // a sync by the other member makes it durable
    fa.sync().unwrap();
    let on_disk = std::fs::read(&data).unwrap();
    assert_eq!(&on_disk[4096 * 3 + 10..4096 * 3 + 15], b"hello");
    assert_eq!(a.stats().dirty_frames, 0);
}

#[test]
fn writes_past_the_end_grow_the_file_and_truncation_drops_pages() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(128 * 4096).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, b"").unwrap();
    let f = open(&a, &data);
    assert_eq!(f.len(), 0);
    f.write_at(&[1u8; 10000], 5000).unwrap();
    assert_eq!(f.len(), 15000);
    let mut buf = vec![9u8; 15000];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 15000);
    assert!(buf[..5000].iter().all(|&b| b == 0));
    assert!(buf[5000..].iter().all(|&b| b == 1));
    f.set_len(6000).unwrap();
    assert_eq!(f.len(), 6000);
    f.set_len(9000).unwrap();
    let mut buf = vec![9u8; 9000];
    f.read_at(&mut buf, 0).unwrap();
    assert!(buf[5000..6000].iter().all(|&b| b == 1));
    assert!(
        buf[6000..].iter().all(|&b| b == 0),
        "truncated bytes read as zeros"
    );
    f.sync().unwrap();
    let disk = std::fs::read(&data).unwrap();
    assert_eq!(disk, buf);
}

#[test]
fn a_file_changed_by_a_non_member_while_closed_is_read_again() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![1u8; 8192]).unwrap();
    {
        let f = open(&a, &data);
        let mut b = [0u8; 8];
        f.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1; 8]);
    }
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(&data, vec![2u8; 8192]).unwrap();
    let f = open(&a, &data);
    let mut b = [0u8; 8];
    f.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [2; 8], "the change was seen at open");
}

#[test]
fn a_deleted_and_recreated_file_never_meets_its_predecessors_pages() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![1u8; 4096]).unwrap();
    let f1 = open(&a, &data);
    let mut b = [0u8; 4];
    f1.read_at(&mut b, 0).unwrap();
    std::fs::remove_file(&data).unwrap();
    std::fs::write(&data, vec![3u8; 4096]).unwrap();
    let f2 = open(&a, &data);
    assert_ne!(
        f1.slot_index(),
        f2.slot_index(),
        "another file: another slot"
    );
    f2.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [3; 4]);
}

/// Another file renamed over the path of one a member has open and has
/// read: the open handle is the old inode still (as the kernel's
/// descriptor is) and reads its bytes from its frames; an open of the path
/// now, by either member, is the new file, in another slot, read from the
/// file and never from the old one's frames; a write through the old
/// handle lands in the old file only.
#[test]
fn a_file_renamed_over_an_open_files_path_is_another_file() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let b = Region::join(d.path(), "r", 1024).unwrap();
    let path = d.path().join("data");
    let old: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8).collect();
    let new: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    std::fs::write(&path, &old).unwrap();
    let fa = open(&a, &path);
    let mut buf = vec![0u8; old.len()];
    fa.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, old);
    let tmp = d.path().join("data.new");
    std::fs::write(&tmp, &new).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let fills = a.stats().fills;
    let fb = open(&b, &path);
    let fa2 = open(&a, &path);
    assert_ne!(
        fb.slot_index(),
        fa.slot_index(),
        "another file: another slot"
    );
    assert_eq!(fa2.slot_index(), fb.slot_index(), "one file: one slot");
    assert_eq!((fb.len(), fa2.len()), (new.len() as u64, new.len() as u64));
    for (who, f) in [("b's new open", &fb), ("a's new open", &fa2)] {
        let mut got = vec![0xeeu8; old.len()];
        assert_eq!(f.read_at(&mut got, 0).unwrap(), new.len(), "{who}");
        assert!(got[..new.len()] == new[..], "{who} reads the new file");
    }
    assert_eq!(
        a.stats().fills,
        fills + 3,
        "the new file's pages were read from it, none found in the old one's frames"
    );
    buf.fill(0);
    assert_eq!(fa.read_at(&mut buf, 0).unwrap(), old.len());
    assert!(
        buf == old,
        "the handle open before the rename reads the old file"
    );
    assert_eq!(a.stats().fills, fills + 3, "from its frames");
    // a write through the old handle: the old file's, not the new one's
    fa.write_at(b"old inode", 100).unwrap();
    fa.write_at(&[7u8; 4096], 3 * 4096).unwrap();
    let mut w = [0u8; 9];
    fa.read_at(&mut w, 100).unwrap();
    assert_eq!(&w, b"old inode");
    for (who, f) in [("b's new open", &fb), ("a's new open", &fa2)] {
        let mut got = vec![0xeeu8; old.len()];
        assert_eq!(f.read_at(&mut got, 0).unwrap(), new.len(), "{who}");
        assert!(
            got[..new.len()] == new[..],
            "{who} sees no write of the old handle"
        );
    }
    fa.sync().unwrap();
    assert!(
        std::fs::read(&path).unwrap() == new,
        "the file at the path holds none of it after a sync"
    );
    assert_eq!(a.stats().dirty_frames, 0, "written back, to the old file");
}

/// Where a file's times come from the coarse clock, a change in the tick
/// of the one a look saw may leave size and times as they were: a look
/// taken in that tick is recorded so that no later look matches it (the
/// next open drops the clean frames and reads the file again), and a look
/// taken once the tick is over is trusted (the next open keeps them).
#[test]
fn a_look_taken_in_the_tick_of_a_change_is_checked_again_at_the_next_open() {
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let b = Region::join(d.path(), "r", 1024).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![4u8; 4 * 4096]).unwrap();
    let fa = open(&a, &data);
    let mut buf = vec![0u8; 4 * 4096];
    fa.read_at(&mut buf, 0).unwrap();
    assert_eq!(fa.cached_pages(), 4);
    let fd = std::fs::File::open(&data).unwrap();
    let now = files::look(fd.as_fd()).unwrap();
    let slot = a.map().file(fa.slot_index());
    // what a member records when its look falls in the tick of the change
    slot.set_seen(files::Seen { racy: true, ..now });
    let _fb = open(&b, &data);
    assert_eq!(
        fa.cached_pages(),
        0,
        "the open after a racy look read again"
    );
    let deadline = Instant::now() + Duration::from_secs(1);
    let later = loop {
        let l = files::look(fd.as_fd()).unwrap();
        if !l.racy {
            break l;
        }
        assert!(Instant::now() < deadline, "the coarse clock never ticked");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(later, now, "nothing changed the file");
    slot.set_seen(later);
    fa.read_at(&mut buf, 0).unwrap();
    let _fc = open(&b, &data);
    assert_eq!(fa.cached_pages(), 4, "a look after the tick is trusted");
    assert!(buf.iter().all(|&x| x == 4));
}

#[test]
fn eviction_keeps_the_region_within_capacity_and_reads_right() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(32 * 4096).unwrap();
    let data = d.path().join("data");
    let bytes: Vec<u8> = (0..200 * 4096u32).map(|i| (i / 4096) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let f = open(&a, &data);
    for round in 0..3 {
        for p in 0..200u64 {
            let mut b = [0u8; 100];
            f.read_at(&mut b, p * 4096 + 7).unwrap();
            assert!(b.iter().all(|&x| x == p as u8), "round {round} page {p}");
        }
    }
    let s = a.stats();
    assert!(s.cached_frames <= 32, "{s}");
    assert!(s.evictions >= 500, "{s}");
}

/// A process's hint names the frame a page was found in last; once that
/// frame is evicted and holds another page, the hint must not serve it.
#[test]
fn a_stale_hint_is_never_served() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(8 * 4096).unwrap();
    let data = d.path().join("data");
    let bytes: Vec<u8> = (0..64 * 4096u32).map(|i| (i / 4096) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let f = open(&a, &data);
    let mut b = [0u8; 64];
    for p in 0..8u64 {
        f.read_at(&mut b, p * 4096).unwrap(); // a miss: filled
        f.read_at(&mut b, p * 4096).unwrap(); // a hit through the index: hinted
    }
    for p in 8..64u64 {
        f.read_at(&mut b, p * 4096).unwrap(); // every frame reused
        f.read_at(&mut b, p * 4096).unwrap();
    }
    for p in 0..8u64 {
        f.read_at(&mut b, p * 4096).unwrap();
        assert!(
            b.iter().all(|&x| x == p as u8),
            "page {p} read {:?}",
            &b[..4]
        );
    }
    assert!(a.stats().evictions >= 56);
}

#[test]
fn a_frame_dirty_again_under_another_members_writeback_waits_for_its_end() {
    use super::frame::{FrameHeader, Owner, DIRTY, VALID, WRITEBACK};
    let (_d, a, b, data) = two_members();
    let fa = open(&a, &data);
    let fb = open(&b, &data);
    fa.write_at(&[1u8; 4096], 3 * 4096).unwrap();
    let slot = fa.slot_index();
    let tag = frame::Tag::new(slot, a.map().file(slot).epoch(), 3);
    let f = a.lookup_frame(tag).unwrap();
    let h = a.map().frame(f).unwrap();
    // a's writeback of the frame begins (as `write_back_file` does), and
    // a write makes the frame dirty again while it is in flight
    let ma = Owner::of_slot(a.member_slot().unwrap());
    h.lock(ma, &mut |_| unreachable!());
    h.unlock(ma, WRITEBACK | FrameHeader::wb_bits(ma), DIRTY);
    fa.write_at(&[2u8; 4096], 3 * 4096).unwrap();
    assert_eq!(
        h.state() & (VALID | DIRTY | WRITEBACK),
        VALID | DIRTY | WRITEBACK
    );
    // b's writeback of the same frame must not start a second one: the
    // first one's end would clear the flag both share, and the frame could
    // then be reused for another page before b's write reached the file
    let mb = Owner::of_slot(b.member_slot().unwrap());
    let io = b.local.file(fb.slot_index()).unwrap();
    b.write_back_file(mb, &io, &[(3, f)]).unwrap();
    let st = h.state();
    assert_eq!(
        FrameHeader::writeback_owner(st),
        Some(ma),
        "the writeback in flight is still a's alone"
    );
    assert_ne!(st & DIRTY, 0, "the second write is still to be written");
    // a's writeback ends; a sync by b then writes the second write
    h.end_writeback(0);
    a.map().file(slot).dirty_dec();
    fb.sync().unwrap();
    let disk = std::fs::read(&data).unwrap();
    assert!(disk[3 * 4096..4 * 4096].iter().all(|&x| x == 2));
    assert_eq!(h.state() & (DIRTY | WRITEBACK), 0);
}

#[test]
fn no_member_writes_back_the_frames_of_a_file_another_holds_the_writer_mark_of() {
    let (_d, a, b, data) = two_members();
    let fa = open(&a, &data);
    let fb = open(&b, &data);
    // a's change, not final: it may yet be rolled back in the file by a
    // process outside the region, which a writeback after that would undo
    fa.mark_writer().unwrap();
    for p in 0..8u64 {
        fa.write_at(&[9u8; 4096], p * 4096).unwrap();
    }
    fb.sync().unwrap();
    let cap = b.set_capacity(0).unwrap();
    let disk = std::fs::read(&data).unwrap();
    assert!(disk.iter().all(|&x| x == 0), "a's change reached the file");
    assert!(
        cap >= 4096,
        "the shrink kept the dirty frames ({cap} bytes)"
    );
    assert_eq!(a.stats().dirty_frames, 8);
    // final: anyone's sync writes it
    fa.clear_writer();
    fb.sync().unwrap();
    let disk = std::fs::read(&data).unwrap();
    assert!(disk.iter().all(|&x| x == 9));
    assert_eq!(b.stats().dirty_frames, 0);
}

#[test]
fn a_sync_beside_compactions_of_the_dirty_list_writes_every_dirty_page() {
    use std::sync::atomic::AtomicBool;
    let (_d, a, _b, data) = two_members();
    let f = open(&a, &data);
    let m = a.member_slot().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // another thread of the member compacts its dirty list without pause
    // (as a loop of writes and syncs of another file does), each pass slow
    let busy = {
        let (a, stop) = (Arc::clone(&a), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let g = a.local.dirty.lock();
                a.map().member(m).dirty_retain(|_| {
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(5) {}
                    true
                });
                drop(g);
                std::thread::yield_now();
            }
        })
    };
    for round in 1..=20u8 {
        for p in 0..8u64 {
            f.write_at(&[round; 4096], p * 4096).unwrap();
        }
        f.sync().unwrap();
        let disk = std::fs::read(&data).unwrap();
        let missed = (0..8).filter(|&p| disk[p * 4096] != round).count();
        assert_eq!(missed, 0, "round {round}: pages the sync left unwritten");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
}

#[test]
fn a_write_with_no_room_on_the_dirty_list_goes_through_its_frame() {
    use super::frame::{FrameHeader, Owner, DIRTY, WRITEBACK};
    use super::layout::DIRTY_MAX;
    use super::member::DirtyEntry;
    let (_d, a, b, data) = two_members();
    let fa = open(&a, &data);
    // a's dirty list full of a frame it cannot write back (b's writeback
    // of it in flight, dirty again meanwhile)
    fa.write_at(&[1u8; 4096], 0).unwrap();
    let slot = fa.slot_index();
    let epoch = a.map().file(slot).epoch();
    let f0 = a.lookup_frame(frame::Tag::new(slot, epoch, 0)).unwrap();
    let h0 = a.map().frame(f0).unwrap();
    let ma = Owner::of_slot(a.member_slot().unwrap());
    let mb = Owner::of_slot(b.member_slot().unwrap());
    h0.lock(ma, &mut |_| unreachable!());
    h0.unlock(ma, WRITEBACK | FrameHeader::wb_bits(mb), 0);
    let list = a.map().member(ma.slot());
    while list.dirty_len() < DIRTY_MAX {
        assert!(list.dirty_push(DirtyEntry { frame: f0, at: 0 }));
    }
    // page 5 cached clean, then written with no reservation to be had
    let mut page = vec![7u8; 4096];
    fa.read_at(&mut page, 5 * 4096).unwrap();
    assert!(page.iter().all(|&x| x == 0));
    fa.write_at(&[9u8; 100], 5 * 4096 + 10).unwrap();
    fa.read_at(&mut page, 5 * 4096).unwrap();
    assert!(
        page[10..110].iter().all(|&x| x == 9),
        "the frame holds the write"
    );
    let disk = std::fs::read(&data).unwrap();
    assert!(
        disk[5 * 4096 + 10..5 * 4096 + 110].iter().all(|&x| x == 9),
        "the file holds it too"
    );
    let f5 = a.lookup_frame(frame::Tag::new(slot, epoch, 5)).unwrap();
    assert_eq!(a.map().frame(f5).unwrap().state() & DIRTY, 0, "clean");
    // b's writeback ends; everything can be written again
    h0.end_writeback(0);
    a.map().file(slot).dirty_dec();
    fa.sync().unwrap();
    assert_eq!(a.stats().dirty_frames, 0);
}

#[test]
fn a_write_no_frame_could_take_is_never_hidden_by_a_racing_fill() {
    // A tiny region whose frames a writer keeps dirty: many of its writes
    // find no frame and go through to the file, while another member's
    // reads fill frames with the same pages and a third thread's syncs
    // clean them. The writer reads each page back after writing it.
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(4 * 4096).unwrap();
    let b = Region::join(d.path(), "r", 1024).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![0u8; 16 * 4096]).unwrap();
    let fa = Arc::new(open(&a, &data));
    let fb = Arc::new(open(&b, &data));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = |f: Arc<SharedFile>, sync: bool| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let mut x = 12345u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if sync {
                    f.sync_data().unwrap();
                } else {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    f.read_at(&mut buf, (x >> 33) % 16 * 4096).unwrap();
                }
            }
        })
    };
    let others = [run(fb.clone(), false), run(fb.clone(), true)];
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    let mut x = 99u64;
    let mut buf = vec![0u8; 4096];
    let mut seq = 0u64;
    let mut wrong = None;
    while std::time::Instant::now() < until && wrong.is_none() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let p = (x >> 33) % 16;
        seq += 1;
        let mut page = vec![0u8; 4096];
        page[..8].copy_from_slice(&seq.to_le_bytes());
        page[8..16].copy_from_slice(&p.to_le_bytes());
        fa.write_at(&page, p * 4096).unwrap();
        fa.read_at(&mut buf, p * 4096).unwrap();
        if buf != page {
            wrong = Some((p, seq, u64::from_le_bytes(buf[..8].try_into().unwrap())));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in others {
        t.join().unwrap();
    }
    assert_eq!(wrong, None, "(page, written, read back) after {seq} writes");
}

/// `f` finishes within 10 s (a resize waiting on a lock no one will
/// release would hang the test).
fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("finished within 10 s")
}

#[test]
fn a_resize_that_panics_leaves_the_resize_lock_free() {
    use super::frame::Owner;
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![0u8; 64 * 4096]).unwrap();
    let f = open(&a, &data);
    for p in 0..64u64 {
        f.write_at(&[3u8; 4096], p * 4096).unwrap(); // dirty frames above any shrink
    }
    let me = Owner::of_slot(a.member_slot().unwrap());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.resize(4 * 4096, me, &mut |_| panic!("a writeback that panics"))
    }));
    assert!(r.is_err());
    // the process goes on (a VFS catches panics at its boundary): its next
    // resize, and another member's, must not wait for the lock
    let a2 = a.clone();
    within_10s(move || a2.set_capacity(32 * 4096).unwrap());
    let b = Region::join(d.path(), "r", 1024).unwrap();
    within_10s(move || b.set_capacity(16 * 4096).unwrap());
    f.sync().unwrap();
}

#[test]
fn a_table_lock_naming_a_slot_its_member_left_is_released_by_the_next() {
    use super::layout::hdr;
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let slot = a.member_slot().unwrap();
    // the resize lock left naming the slot by a member that then left
    a.map().header_u32(hdr::RESIZE).store(
        frame::Owner::of_slot(slot).bits(),
        crate::sync::Ordering::Release,
    );
    drop(a);
    let b = Region::join(d.path(), "r", 1024).unwrap();
    assert_eq!(b.member_slot(), Some(slot), "the first free slot again");
    within_10s(move || b.set_capacity(16 * 4096).unwrap());
}

#[test]
fn a_shrink_touches_no_metadata_of_frames_never_used() {
    use std::os::unix::fs::MetadataExt;
    let d = dir();
    // a region sized for 4 GiB holding a small file, shrunk to 8 MiB
    let a = Region::join(d.path(), "r", 1 << 20).unwrap();
    a.set_capacity(4 << 30).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![5u8; 64 * 4096]).unwrap();
    let f = open(&a, &data);
    let mut buf = vec![0u8; 64 * 4096];
    f.read_at(&mut buf, 0).unwrap();
    let held = || std::fs::metadata(a.path()).unwrap().blocks() * 512;
    let before = held();
    a.set_capacity(8 << 20).unwrap();
    // (the frames' headers alone are 32 MiB for 2^20 frames)
    assert!(
        held() < before + (1 << 20),
        "the shrink allocated {} bytes of the region's file",
        held() - before
    );
    f.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&x| x == 5));
}

#[test]
fn reads_beside_shrinks_and_growths_never_see_a_punched_page() {
    // One member resizes the region up and down without pause (a budget
    // in a small cgroup does so often); two threads of another read every
    // page and check it. A frame taken by a miss after a shrink passed it
    // would have its memory punched out from under it: a page of zeros.
    let d = dir();
    let a = Region::join(d.path(), "r", 4096).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let b = Region::join(d.path(), "r", 4096).unwrap();
    let data = d.path().join("data");
    let bytes: Vec<u8> = (0..256 * 4096u32).map(|i| (i / 4096) as u8 | 1).collect();
    std::fs::write(&data, &bytes).unwrap();
    let fb = Arc::new(open(&b, &data));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (f, stop) = (fb.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                let mut x = t + 7;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let p = (x >> 33) % 256;
                    f.read_at(&mut buf, p * 4096).unwrap();
                    if buf.iter().any(|&v| v != p as u8 | 1) {
                        return Some((p, buf[0]));
                    }
                }
                None
            })
        })
        .collect();
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    let mut n = 0u64;
    while std::time::Instant::now() < until {
        n += 1;
        a.set_capacity(if n.is_multiple_of(2) {
            64 * 4096
        } else {
            (8 + n % 16) * 4096
        })
        .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert_eq!(
            r.join().unwrap(),
            None,
            "(page, a byte read) after {n} resizes"
        );
    }
}

#[test]
fn shrinking_writes_back_and_gives_memory_back() {
    let d = dir();
    let a = Region::join(d.path(), "r", 1024).unwrap();
    a.set_capacity(64 * 4096).unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![0u8; 64 * 4096]).unwrap();
    let f = open(&a, &data);
    for p in 0..64u64 {
        f.write_at(&[p as u8 + 1; 4096], p * 4096).unwrap();
    }
    assert_eq!(a.stats().dirty_frames, 64);
    assert_eq!(a.set_capacity(8 * 4096).unwrap(), 8 * 4096);
    let s = a.stats();
    assert!(s.cached_frames <= 8 && s.backed == 8 * 4096, "{s}");
    let disk = std::fs::read(&data).unwrap();
    // frames above the new capacity were written back before they left
    let written = (0..64).filter(|&p| disk[p * 4096] == p as u8 + 1).count();
    assert!(written >= 56, "{written} of 64 pages on disk");
    let mut b = [0u8; 1];
    for p in 0..64u64 {
        f.read_at(&mut b, p * 4096).unwrap();
        assert_eq!(b[0], p as u8 + 1);
    }
}

#[test]
fn a_hostile_region_file_is_refused() {
    let d = dir();
    std::fs::write(d.path().join("garbage"), vec![0x55u8; 1 << 20]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        d.path().join("garbage"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    assert!(matches!(
        Region::join(d.path(), "garbage", 1024),
        Err(RegionError::Refused(_))
    ));
    std::os::unix::fs::symlink("/etc/passwd", d.path().join("link")).unwrap();
    assert!(matches!(
        Region::join(d.path(), "link", 1024),
        Err(RegionError::Refused(_))
    ));
    let open_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        Region::join(open_dir.path(), "r", 1024),
        Err(RegionError::Refused(_))
    ));
    // a region made right, then given group access
    let r = Region::join(d.path(), "ok", 1024).unwrap();
    drop(r);
    std::fs::set_permissions(d.path().join("ok"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(matches!(
        Region::join(d.path(), "ok", 1024),
        Err(RegionError::Refused(_))
    ));
}

#[test]
fn every_hostile_name_is_refused_and_nothing_outside_is_written() {
    let d = dir();
    use std::os::unix::fs::PermissionsExt;
    // a FIFO, a directory, a huge sparse file of garbage, a right header
    // with the wrong length
    let fifo = std::ffi::CString::new(d.path().join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(d.path().join("dir")).unwrap();
    let huge = std::fs::File::create(d.path().join("huge")).unwrap();
    huge.set_len(1 << 40).unwrap();
    std::fs::set_permissions(
        d.path().join("huge"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    drop(Region::join(d.path(), "short", 1024).unwrap());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join("short"))
        .unwrap();
    f.set_len(1 << 20).unwrap();
    for name in ["fifo", "dir", "huge", "short"] {
        let t = std::time::Instant::now();
        let r = Region::join(d.path(), name, 1024);
        assert!(r.is_err(), "{name} accepted");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{name}: no wait"
        );
    }
    // a directory that is a symbolic link to somewhere else: refused, and
    // nothing is made there
    let elsewhere = dir();
    let link = d.path().join("linked");
    std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
    assert!(matches!(
        Region::join(&link, "r", 1024),
        Err(RegionError::Refused(_)) | Err(RegionError::Io(..))
    ));
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).unwrap().count(),
        0,
        "nothing made through the link"
    );
}

#[test]
fn a_sync_reads_the_lists_of_members_with_dirty_frames_and_theirs_only() {
    use super::layout::hdr;
    let (_d, a, b, data) = two_members();
    let fa = open(&a, &data);
    let fb = open(&b, &data);
    let mask = || {
        a.hword(hdr::DIRTY_MEMBERS)
            .load(crate::sync::Ordering::Acquire)
    };
    let bit_a = 1u64 << a.member_slot().unwrap();
    let bit_b = 1u64 << b.member_slot().unwrap();
    assert_eq!(mask(), 0, "no member has dirtied a frame");
    // a's write marks a's list; b's sync finds it there and writes it
    fa.write_at(&[7u8; 4096], 2 * 4096).unwrap();
    assert_eq!(mask(), bit_a);
    fb.sync().unwrap();
    let disk = std::fs::read(&data).unwrap();
    assert!(
        disk[2 * 4096..3 * 4096].iter().all(|&x| x == 7),
        "b's sync wrote a's page"
    );
    // a's own sync leaves its list empty: its bit goes
    fa.write_at(&[8u8; 4096], 4 * 4096).unwrap();
    fb.write_at(&[9u8; 4096], 5 * 4096).unwrap();
    assert_eq!(mask(), bit_a | bit_b);
    fa.sync().unwrap();
    assert_eq!(mask() & bit_a, 0, "a's list is empty after its sync");
    // b's entry was written back by a's sync; b's next writeback empties
    // its list too
    fb.sync().unwrap();
    assert_eq!(mask(), 0);
    let disk = std::fs::read(&data).unwrap();
    assert!(disk[4 * 4096..5 * 4096].iter().all(|&x| x == 8));
    assert!(disk[5 * 4096..6 * 4096].iter().all(|&x| x == 9));
    // a member leaving with a dirty frame writes it back and clears its bit
    fb.write_at(&[10u8; 4096], 6 * 4096).unwrap();
    assert_eq!(mask(), bit_b);
    drop(fb);
    drop(b);
    assert_eq!(mask(), 0, "the leaver's bit is cleared");
    let disk = std::fs::read(&data).unwrap();
    assert!(disk[6 * 4096..7 * 4096].iter().all(|&x| x == 10));
}

#[test]
fn a_deleted_files_pages_go_at_the_regions_last_close_of_it() {
    let (_d, a, b, data) = two_members();
    let kept = data.with_file_name("kept");
    std::fs::write(&kept, vec![0u8; 4 * 4096]).unwrap();
    let fa = open(&a, &data);
    let fb = open(&b, &data);
    let fk = open(&a, &kept);
    let mut buf = vec![0u8; 8 * 4096];
    fa.read_at(&mut buf, 0).unwrap();
    fk.read_at(&mut buf[..4 * 4096], 0).unwrap();
    let (slot, kslot) = (fa.slot_index(), fk.slot_index());
    let epoch = |s: usize| a.map().file(s).epoch();
    let (e0, k0) = (epoch(slot), epoch(kslot));
    std::fs::remove_file(&data).unwrap();
    drop(fa);
    assert_eq!(epoch(slot), e0, "another member has it open");
    assert_eq!(fb.cached_pages(), 8, "and reads its pages from the frames");
    drop(fb);
    assert_ne!(
        epoch(slot),
        e0,
        "the last close of a deleted file retires its pages"
    );
    drop(fk);
    assert_eq!(
        epoch(kslot),
        k0,
        "a file with a name keeps its pages after its last close"
    );
    let fk = open(&b, &kept);
    assert_eq!(fk.cached_pages(), 4);
}
