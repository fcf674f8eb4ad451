//! The shared cache through the page cache's own API: `CacheConfig::shared`
//! caches a file's pages in the region every such cache maps, other
//! backends stay private, a child after `fork` or a raw `clone` is a
//! member of its own (and a storm of them, made while threads read, leaves
//! nothing behind), and a change by a process that is no member is seen
//! wherever the private cache sees it.
//!
//! The tests fork or run other processes, so they take one lock each.

mod harness;
mod shared_common;

use kxarray::backend::{FileBackend, RamDisk};
use kxarray::pagecache::{CacheConfig, CachedFile, PageCache, SharedConfig};
use shared_common::private_dir;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static FORK: Mutex<()> = Mutex::new(());

fn shared_cache(dir: &Path, capacity: u64) -> PageCache {
    PageCache::new(
        CacheConfig::default()
            .capacity(capacity)
            .flusher(false)
            .shared_with(SharedConfig {
                dir: Some(dir.to_path_buf()),
                name: "pc".into(),
                max_bytes: Some(64 << 20),
            }),
    )
}

fn two_caches_share_a_files_pages_and_keep_a_ram_disk_private() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let a = shared_cache(d.path(), 4 << 20);
    let b = shared_cache(d.path(), 4 << 20);
    let (ra, rb) = (a.region().unwrap(), b.region().unwrap());
    assert_ne!(ra.member_slot(), rb.member_slot(), "two members");
    let path = d.path().join("f");
    std::fs::write(&path, vec![5u8; 1 << 16]).unwrap();
    let fa = a.open(FileBackend::create(&path).unwrap()).unwrap();
    let fb = b.open(FileBackend::create(&path).unwrap()).unwrap();
    assert!(fa.is_shared() && fb.is_shared());
    let mut buf = vec![0u8; 1 << 16];
    fa.read_at(&mut buf, 0).unwrap();
    let fills = ra.stats().fills;
    fb.read_at(&mut buf, 0).unwrap();
    assert_eq!(rb.stats().fills, fills, "b's reads were hits on a's frames");
    assert!(buf.iter().all(|&x| x == 5));
    fb.write_at(b"from b", 100).unwrap();
    let mut six = [0u8; 6];
    fa.read_at(&mut six, 100).unwrap();
    assert_eq!(&six, b"from b");
    fa.sync().unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[100..106], b"from b");
    // a RAM disk is no file other processes can open: private
    let ram = a.open(RamDisk::new(8192)).unwrap();
    assert!(!ram.is_shared());
    ram.write_at(b"x", 0).unwrap();
    assert_eq!(a.stats().dirty_bytes, 4096, "the private cache holds it");
    // zero-copy calls say why they are refused on a shared file
    let e = fa.read_folio(0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
    assert!(ram.read_folio(0).is_ok());
}

fn a_read_only_file_refuses_writes_at_the_call() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let a = shared_cache(d.path(), 4 << 20);
    let path = d.path().join("ro");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let fd = std::fs::File::open(&path).unwrap();
    let f = a.open(FileBackend::from_file(fd)).unwrap();
    assert!(f.is_shared());
    let e = f.write_at(b"no", 0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    let mut b = [0u8; 2];
    f.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [1, 1]);
}

/// Fork (or clone) a child that runs `f` and exits with its status
/// without running destructors (a child's death, as far as the region is
/// concerned: its slot is recovered); its exit status.
fn in_child(clone: bool, f: impl FnOnce() -> i32) -> i32 {
    let pid = start_child(clone, f);
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: {status}");
    libc::WEXITSTATUS(status)
}

/// [`in_child`] without the wait: the child's pid.
fn start_child(clone: bool, f: impl FnOnce() -> i32) -> libc::pid_t {
    let pid = if clone {
        // SAFETY: a raw clone with only SIGCHLD: a copy of the process
        // like fork, without glibc's atfork handlers; the child runs only
        // `f` and `_exit`s.
        unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::SIGCHLD as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            ) as libc::pid_t
        }
    } else {
        // SAFETY: the child runs only `f` and `_exit`s.
        unsafe { libc::fork() }
    };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // a panic ends the child too (it must not go on as the parent)
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(code) };
    }
    pid
}

fn fork_child_is_a_member_of_its_own(clone: bool) {
    let d = private_dir();
    let cache = shared_cache(d.path(), 4 << 20);
    let region = cache.region().unwrap().clone();
    let path = d.path().join("f");
    std::fs::write(&path, vec![0u8; 1 << 16]).unwrap();
    let file = cache.open(FileBackend::create(&path).unwrap()).unwrap();
    let mut buf = [0u8; 16];
    file.read_at(&mut buf, 0).unwrap();
    let parent_slot = region.member_slot().unwrap();
    let code = in_child(clone, || {
        // the inherited handle: the first write joins a slot of its own
        if file.write_at(b"child", 4096).is_err() {
            return 10;
        }
        match region.member_slot() {
            Some(s) if s != parent_slot => {}
            _ => return 11,
        }
        let mut b = [0u8; 5];
        if file.read_at(&mut b, 4096).is_err() || &b != b"child" {
            return 12;
        }
        0
    });
    assert_eq!(code, 0, "the child's checks");
    assert_eq!(
        region.member_slot(),
        Some(parent_slot),
        "the parent's slot is its own still"
    );
    let mut b = [0u8; 5];
    file.read_at(&mut b, 4096).unwrap();
    assert_eq!(&b, b"child", "the child's write, in the shared frames");
    // the child died without leaving: the parent's reaper recovers it and
    // adopts its dirty page, which a sync then writes
    assert_eq!(region.reap(), 1);
    assert_eq!(region.stats().members, 1);
    file.sync().unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[4096..4101], b"child");
}

fn a_child_after_fork_joins_as_a_member_of_its_own() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    fork_child_is_a_member_of_its_own(false);
}

fn a_raw_clone_child_joins_as_a_member_of_its_own() {
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    fork_child_is_a_member_of_its_own(true);
}

/// Wait for child `pid` for at most `within`: its status, or `None` when
/// it did not end (it is killed and reaped then).
fn wait_within(pid: libc::pid_t, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    let mut status = 0;
    loop {
        // SAFETY: our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if r == pid {
            return Some(status);
        }
        if Instant::now() >= deadline {
            // SAFETY: our child, not reaped yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sets its flag when dropped (a panic included).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A fork storm with reads in flight: three threads of a member read a
/// file of known pages in a loop (a quarter of it fits in the region, so
/// they fill and evict all along) while its main thread makes 32 children
/// in a row, by `fork` and by raw `clone` in turn. Each child opens the
/// file through the inherited cache (a member of its own) and reads and
/// checks every page; every third is SIGKILLed in the middle of its reads,
/// the others close the file and exit. A child that inherited a lock a
/// reading thread held at the fork would hang; a slot, a frame lock or a
/// dirty frame a dead child left would stay. So: every read was right, in
/// the parent and in each child that exited, no child hung, and once the
/// reaper has run, the parent is the one member, no frame is locked or
/// dirty, and every child's membership was recovered once.
fn a_fork_storm_with_reads_in_flight_leaves_nothing_behind() {
    use shared_common::{pattern, Rng, PAGE};
    const PAGES: u32 = 128;
    const CHILDREN: u32 = 32;
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let cache = shared_cache(d.path(), 4 << 20);
    let region = cache.region().unwrap().clone();
    region
        .set_capacity(u64::from(PAGES / 4) * PAGE as u64)
        .unwrap();
    let pages: Vec<Vec<u8>> = (0..PAGES).map(|p| pattern(0, p, 1)).collect();
    let path = d.path().join("f");
    std::fs::write(&path, pages.concat()).unwrap();
    let file = cache.open(FileBackend::open(&path).unwrap()).unwrap();
    assert!(file.is_shared());
    let parent_slot = region.member_slot().unwrap();
    let recovered = region.stats().recovered;
    // every page read and checked
    let pass = |f: &CachedFile, buf: &mut [u8]| {
        (0..PAGES as usize).all(|p| {
            f.read_at(buf, (p * PAGE) as u64).is_ok_and(|n| n == PAGE) && *buf == pages[p][..]
        })
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..3u64)
            .map(|t| {
                let (file, pages, stop) = (&file, &pages, &stop);
                // nothing allocated in the loop: a raw clone's child runs no
                // atfork handler, and takes the allocator's locks as they were
                s.spawn(move || {
                    let mut rng = Rng(t + 1);
                    let mut buf = vec![0u8; PAGE];
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let p = rng.below(u64::from(PAGES)) as usize;
                        let n = file.read_at(&mut buf, (p * PAGE) as u64).unwrap();
                        if n != PAGE || buf != pages[p] {
                            return Err(format!("reader {t}: page {p} read wrong ({n} bytes)"));
                        }
                        reads += 1;
                    }
                    Ok(reads)
                })
            })
            .collect();
        let _stop = SetOnDrop(&stop);
        for i in 0..CHILDREN {
            let (clone, kill) = (i % 2 == 1, i % 3 == 2);
            let mut fds = [0; 2];
            // SAFETY: a two-descriptor array for pipe2 to fill.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            let [rd, wr] = fds;
            let pid = start_child(clone, || {
                let Ok(f) = FileBackend::open(&path).and_then(|b| cache.open(b)) else {
                    return 10;
                };
                if !f.is_shared() || region.member_slot().is_none_or(|m| m == parent_slot) {
                    return 11;
                }
                let mut buf = vec![0u8; PAGE];
                if !pass(&f, &mut buf) {
                    return 12;
                }
                if kill {
                    // SAFETY: the pipe's write end, one byte of ours.
                    if unsafe { libc::write(wr, b"r".as_ptr().cast(), 1) } != 1 {
                        return 13;
                    }
                    while pass(&f, &mut buf) {}
                    return 12;
                }
                let ok = pass(&f, &mut buf);
                drop(f);
                if ok {
                    0
                } else {
                    12
                }
            });
            // SAFETY: the parent's copy of the write end: the child's is
            // then the only one, and its end is the pipe's end.
            unsafe { libc::close(wr) };
            let what = format!("child {i} (by {})", if clone { "clone" } else { "fork" });
            if kill {
                let mut p = libc::pollfd {
                    fd: rd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                let mut b = 0u8;
                // SAFETY: one pollfd.
                let ready = unsafe { libc::poll(&mut p, 1, 10_000) } == 1
                    // SAFETY: one byte into `b`.
                    && unsafe { libc::read(rd, (&mut b as *mut u8).cast(), 1) } == 1;
                if ready {
                    // SAFETY: our child, not reaped yet.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let st = wait_within(pid, Duration::from_secs(10));
                assert!(ready, "{what} never finished its first pass: {st:?}");
                let st = st.unwrap_or_else(|| panic!("{what} hung"));
                assert!(
                    libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGKILL,
                    "{what} failed before the kill: status {st:#x}"
                );
            } else {
                let st = wait_within(pid, Duration::from_secs(10))
                    .unwrap_or_else(|| panic!("{what} hung"));
                assert!(
                    libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
                    "{what} failed: status {st:#x}"
                );
            }
            // SAFETY: our read end.
            unsafe { libc::close(rd) };
        }
        drop(_stop);
        for r in readers {
            let reads = r.join().expect("a reading thread panicked").unwrap();
            assert!(reads > 0, "a reader read nothing");
        }
    });
    region.reap();
    let s = region.stats();
    assert_eq!(s.members, 1, "the parent is the one member: {s}");
    assert_eq!((s.locked_frames, s.dirty_frames), (0, 0), "{s}");
    assert_eq!(
        s.recovered - recovered,
        u64::from(CHILDREN),
        "every child's membership recovered once: {s}"
    );
    let mut buf = vec![0u8; PAGE];
    assert!(
        pass(&file, &mut buf),
        "the pages read right after the storm"
    );
}

/// Each handle's length and bytes against the file's now: a read from 0
/// past the end returns the file's bytes and stops at its end, a read
/// across the end is short, a read at the end returns nothing.
fn agree(when: &str, path: &Path, handles: &[(&str, &CachedFile)]) {
    let disk = std::fs::read(path).unwrap();
    let len = disk.len();
    for &(who, f) in handles {
        assert_eq!(f.len(), len as u64, "{when}: {who}'s length");
        let mut buf = vec![0xeeu8; len + 3 * 4096];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), len, "{when}: {who}");
        if let Some(at) = (0..len).find(|&i| buf[i] != disk[i]) {
            panic!(
                "{when}: {who} reads {:#04x} at {at}, the file holds {:#04x}",
                buf[at], disk[at]
            );
        }
        let mut tail = [0u8; 100];
        let n = f.read_at(&mut tail, len as u64 - 10).unwrap();
        assert_eq!(n, 10, "{when}: {who}: a short read at the end");
        assert_eq!(tail[..10], disk[len - 10..], "{when}: {who}");
        assert_eq!(
            f.read_at(&mut tail, len as u64).unwrap(),
            0,
            "{when}: {who}"
        );
    }
}

/// Wait for the kernel's coarse clock (what a file's times are taken from
/// where they are not fine-grained) to tick: what follows at once runs in
/// one tick, as far as a few milliseconds allow.
fn next_tick() {
    let coarse = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) };
        (t.tv_sec, t.tv_nsec)
    };
    let start = coarse();
    let deadline = Instant::now() + Duration::from_millis(100);
    while coarse() == start && Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// A process that is not a member ran `cmd`.
fn run(cmd: &mut std::process::Command) {
    let st = cmd.status().unwrap();
    assert!(st.success(), "{cmd:?}: {st}");
}

/// A file changed by processes that are not members while members have it
/// open and cached: cut shorter by `truncate(1)`, grown by a write past
/// its end, rewritten inside, emptied by the shell and grown again, cut
/// and grown back to its size right after a member's sync (only the times
/// can tell, and where they come from the coarse clock, a change in the
/// tick of the sync's writeback keeps them), a range rewritten. The
/// private cache sees such a change where its caller says so:
/// `refresh_len` (the length, and the page holding the lower of the two
/// ends), `revalidate` (everything), `revalidate_range` (the range), and a
/// new open (nothing of the file cached yet). At each of those points every
/// member's handle reads what the private one reads, which is what the
/// file holds: the new bytes, a short read at the new end, zeros where it
/// was cut and grown again, never a frame of the old bytes.
fn a_change_by_a_non_member_is_seen_where_the_private_cache_sees_it() -> harness::Outcome {
    let truncate = harness::tool("truncate", "coreutils")?;
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    use std::os::unix::fs::FileExt;
    use std::process::Command;
    let d = private_dir();
    let path = d.path().join("f");
    // no zero byte: a page of zeros read is a hole, not the old bytes
    let first: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8 | 1).collect();
    std::fs::write(&path, &first).unwrap();
    let other = || OpenOptions::new().write(true).open(&path).unwrap();
    let (a, b) = (
        shared_cache(d.path(), 4 << 20),
        shared_cache(d.path(), 4 << 20),
    );
    let private = PageCache::new(CacheConfig::default().flusher(false));
    let open = |c: &PageCache| c.open(FileBackend::open(&path).unwrap()).unwrap();
    let (fa, fb, fp) = (open(&a), open(&b), open(&private));
    assert!(fa.is_shared() && fb.is_shared() && !fp.is_shared());
    let all = [("private", &fp), ("member a", &fa), ("member b", &fb)];
    agree("cached", &path, &all);
    assert_eq!(a.region().unwrap().stats().cached_frames, 4);

    run(Command::new(&truncate).args(["-s", "5000"]).arg(&path));
    fp.refresh_len().unwrap();
    fa.refresh_len().unwrap();
    agree("refresh_len after a cut to 5000", &path, &all);
    other().write_all_at(&[0xb2; 1000], 6000).unwrap();
    fp.refresh_len().unwrap();
    fa.refresh_len().unwrap();
    agree("refresh_len after a write at 6000..7000", &path, &all);

    other().write_all_at(&[0xc3; 100], 0).unwrap();
    other().write_all_at(&[0xc4; 100], 4096 + 50).unwrap();
    fp.revalidate().unwrap();
    fb.revalidate().unwrap();
    agree("revalidate after a rewrite", &path, &all);

    run(Command::new("sh").args(["-c", ": > \"$0\""]).arg(&path));
    other().write_all_at(&[0xd5; 3000], 0).unwrap();
    run(Command::new(&truncate).args(["-s", "12000"]).arg(&path));
    let (fa2, fp2) = (open(&a), open(&private));
    agree(
        "a new open after an emptying, a write and a growth",
        &path,
        &[
            ("private, opened again", &fp2),
            ("member a, opened again", &fa2),
            ("member a", &fa),
            ("member b", &fb),
        ],
    );

    next_tick();
    fa.write_at(b"member", 2000).unwrap();
    fa.sync().unwrap();
    let o = other();
    o.set_len(1000).unwrap();
    o.set_len(12000).unwrap();
    let (fb2, fp3) = (open(&b), open(&private));
    agree(
        "a new open after a member's sync and a cut to 1000 and back to 12000 at once",
        &path,
        &[
            ("private, opened again", &fp3),
            ("member b, opened again", &fb2),
            ("member a", &fa),
        ],
    );

    o.write_all_at(&[0xe6; 10], 100).unwrap();
    fp3.revalidate_range(100..110).unwrap();
    fb2.revalidate_range(100..110).unwrap();
    agree(
        "revalidate_range after a rewrite of 100..110",
        &path,
        &[("private", &fp3), ("member b", &fb2), ("member a", &fa)],
    );
    Ok(())
}

/// A region file another user owns at the region's name is refused (the
/// cache then keeps its files private), and nothing in it is written.
fn another_users_region_file_is_refused() -> harness::Outcome {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return harness::skip("needs root to make a file another user owns");
    }
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    drop(kxarray::shared::Region::join(d.path(), "pc", 1 << 14).unwrap());
    let path = d.path().join("pc");
    let before = std::fs::read(&path).unwrap();
    let p = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; uid 65534 is nobody.
    assert_eq!(unsafe { libc::chown(p.as_ptr(), 65534, 65534) }, 0);
    assert!(matches!(
        kxarray::shared::Region::join(d.path(), "pc", 1 << 14),
        Err(kxarray::shared::RegionError::Refused(_))
    ));
    let cache = shared_cache(d.path(), 4 << 20);
    assert!(cache.region().is_none(), "the cache fell back to private");
    let f = d.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    assert!(!cache
        .open(FileBackend::create(&f).unwrap())
        .unwrap()
        .is_shared());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the foreign file is untouched"
    );
    Ok(())
}

/// The region is one member of the memory budget whatever the number of
/// processes (here caches, each a member of the region with its own open
/// of it) that map it: two shared caches in a budget make three members
/// (each cache, and the region once), the first to miss holds the region's
/// place and sizes it within its share, and when the holder goes, the
/// other takes the place at a miss a second later.
fn the_region_is_one_member_of_the_budget_whoever_holds_it() {
    use kxarray::memory::{BudgetConfig, RegistryDir};
    let _one = FORK.lock().unwrap_or_else(|e| e.into_inner());
    let d = private_dir();
    let reg = private_dir();
    let config = || BudgetConfig {
        registry_dir: RegistryDir::Private(reg.path().into()),
        thread_after: Duration::ZERO,
        interval: Duration::from_millis(20),
        ..BudgetConfig::new(24 << 20)
    };
    let path = d.path().join("f");
    std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
    let a = shared_cache(d.path(), 4 << 20);
    let b = shared_cache(d.path(), 4 << 20);
    let ba = a.join_budget(config()).unwrap();
    let bb = b.join_budget(config()).unwrap();
    let fa = a.open(FileBackend::open(&path).unwrap()).unwrap();
    let fb = b.open(FileBackend::open(&path).unwrap()).unwrap();
    let mut page = [0u8; 4096];
    fa.read_at(&mut page, 0).unwrap(); // a miss in a: a takes the place
    fb.read_at(&mut page, 4096).unwrap(); // b asks, a holds it
    let (ra, rb) = (a.region().unwrap(), b.region().unwrap());
    assert!(ra.holds_budget() && !rb.holds_budget());
    let deadline = Instant::now() + Duration::from_secs(10);
    while bb.stats().members != 3 || ba.stats().members != 3 {
        assert!(
            Instant::now() < deadline,
            "members: a sees {}, b sees {} (two caches and the region: 3)",
            ba.stats().members,
            bb.stats().members
        );
        fb.read_at(&mut page, 0).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let cap = rb.capacity();
    assert!(
        cap > 0 && cap <= 24 << 20,
        "the region within its share: {cap}"
    );
    // The holder goes; the other takes the place at a miss a second on.
    drop((fa, ba, a));
    std::thread::sleep(Duration::from_millis(1100));
    let mut at = 8192;
    while !rb.holds_budget() {
        assert!(Instant::now() < deadline, "b never took the place");
        fb.read_at(&mut page, at).unwrap();
        at += 4096;
        std::thread::sleep(Duration::from_millis(20));
    }
    while bb.stats().members != 2 {
        assert!(Instant::now() < deadline, "members: {}", bb.stats().members);
        fb.read_at(&mut page, 0).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

harness::main!(
    tests: [
        two_caches_share_a_files_pages_and_keep_a_ram_disk_private,
        a_read_only_file_refuses_writes_at_the_call,
        a_child_after_fork_joins_as_a_member_of_its_own,
        a_raw_clone_child_joins_as_a_member_of_its_own,
        another_users_region_file_is_refused,
        the_region_is_one_member_of_the_budget_whoever_holds_it,
        a_change_by_a_non_member_is_seen_where_the_private_cache_sees_it,
        a_fork_storm_with_reads_in_flight_leaves_nothing_behind,
    ],
);
