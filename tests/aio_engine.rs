//! The I/O engine (`kxarray::aio`), each test on every engine the machine
//! runs (io_uring and the thread pool): many requests in flight with their
//! contents checked, errors reaching their own request only, a buffer kept
//! alive by the engine after its handle is dropped, forgotten or unwound,
//! futures, and hostile wakers.

mod harness;

mod aio_common;

use aio_common::{block_on, engines, pattern, patterned_file};
use kxarray::aio::{
    AlignedBuf, Completion, EngineKind, IoBuf, IoBufMut, IoEngine, CURRENT_POSITION,
};
use std::fs::File;
use std::future::Future;
use std::io::{self, Write};
use std::os::unix::io::FromRawFd;
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

const FILE_LEN: usize = 4 << 20;

fn check_block(buf: &[u8], offset: u64) {
    for (i, &b) in buf.iter().enumerate() {
        assert_eq!(
            b,
            pattern(offset + i as u64),
            "byte {i} of the read at {offset}"
        );
    }
}

/// A cheap xorshift, so offsets differ per thread and per run.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn many_reads_in_flight_from_several_threads_return_the_right_bytes() {
    let (_path, file) = patterned_file(FILE_LEN);
    for (name, engine) in engines() {
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let (file, engine) = (&file, &engine);
                s.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    for _ in 0..20 {
                        // 48 reads in flight at once, of varied sizes and
                        // offsets (some unaligned, some running past the end).
                        let reqs: Vec<(u64, Vec<u8>)> = (0..48)
                            .map(|_| {
                                let off = next(&mut x) % (FILE_LEN as u64 + 100);
                                let len = 1 + (next(&mut x) % 9000) as usize;
                                (off, vec![0xAA; len])
                            })
                            .collect();
                        let want: Vec<(u64, usize)> =
                            reqs.iter().map(|(o, b)| (*o, b.len())).collect();
                        let cs = engine.read_many(file, reqs);
                        assert_eq!(cs.len(), 48, "{name}");
                        for (c, (off, len)) in cs.into_iter().zip(want) {
                            let (n, buf) = c.wait();
                            let n = n.unwrap();
                            let expect = len.min(FILE_LEN.saturating_sub(off as usize));
                            assert_eq!(n, expect, "{name}: read of {len} at {off}");
                            check_block(&buf[..n], off);
                            assert!(buf[n..].iter().all(|&b| b == 0xAA), "{name}: past n");
                        }
                    }
                });
            }
        });
    }
}

fn writes_in_flight_land_where_they_were_sent() {
    for (name, engine) in engines() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let cs: Vec<_> = (0..64u64)
            .map(|i| engine.write(&file, i * 4096, vec![i as u8; 4096]))
            .collect();
        for c in cs {
            let (n, buf) = c.wait();
            assert_eq!(n.unwrap(), 4096, "{name}");
            assert_eq!(buf.len(), 4096, "{name}: the buffer comes back");
        }
        let rs = engine.read_many(&file, (0..64u64).map(|i| (i * 4096, AlignedBuf::new(4096))));
        for (i, c) in rs.into_iter().enumerate() {
            let (n, buf) = c.wait();
            assert_eq!(n.unwrap(), 4096, "{name}");
            assert!(buf.iter().all(|&b| b == i as u8), "{name}: block {i}");
        }
    }
}

/// A file opened with `O_DIRECT` on the temporary directory, if its
/// filesystem allows it (`o_direct_ran_here` reports it when not).
fn direct_file(len: usize) -> Option<(tempfile::TempPath, Arc<File>)> {
    use std::os::unix::fs::OpenOptionsExt;
    let (path, _) = patterned_file(len);
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
    {
        Ok(f) => Some((path, Arc::new(f))),
        Err(e) => {
            eprintln!("no O_DIRECT on the temporary directory: {e}");
            None
        }
    }
}

fn an_error_reaches_its_own_request_only() {
    let (_path, good) = patterned_file(FILE_LEN);
    let dir = Arc::new(File::open(std::env::temp_dir()).unwrap());
    let (_wpath, _) = patterned_file(4096);
    let write_only = Arc::new(
        std::fs::OpenOptions::new()
            .write(true)
            .open(&_wpath)
            .unwrap(),
    );
    let direct = direct_file(1 << 20);
    for (name, engine) in engines() {
        // Everything in flight before anything is waited for.
        let mut good_reads = Vec::new();
        let mut bad = Vec::new();
        for i in 0..40u64 {
            good_reads.push((
                i * 8192 + 3,
                engine.read(&good, i * 8192 + 3, vec![0u8; 4096]),
            ));
            match i % 4 {
                0 => bad.push((
                    "EISDIR",
                    libc::EISDIR,
                    later(engine.read(&dir, 0, vec![0u8; 4096])),
                )),
                1 => bad.push((
                    "EBADF",
                    libc::EBADF,
                    later(engine.read(&write_only, 0, vec![0u8; 16])),
                )),
                2 => {
                    if let Some((_, d)) = &direct {
                        // One byte off a page: O_DIRECT refuses the buffer.
                        let c = engine.read(d, 0, MisalignedBy1(AlignedBuf::new(8192)));
                        bad.push(("EINVAL", libc::EINVAL, later(c)));
                    }
                }
                _ => {
                    let c = engine.read(&good, u64::MAX - 1, vec![0u8; 8]);
                    bad.push(("offset", libc::EINVAL, later(c)));
                }
            }
        }
        for (off, c) in good_reads {
            let (n, buf) = c.wait();
            assert_eq!(n.unwrap(), 4096, "{name}");
            check_block(&buf, off);
        }
        assert!(bad.len() >= 30, "{name}");
        for (what, errno, outcome) in bad {
            let e = outcome().expect_err(what);
            if what == "offset" {
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name}: {e}");
            } else {
                assert_eq!(e.raw_os_error(), Some(errno), "{name}: {what}: {e}");
            }
        }
        // A direct read into an aligned buffer, and the bounce path for a
        // misaligned one, both succeed on the same descriptor.
        if let Some((_, d)) = &direct {
            let (n, b) = engine.read(d, 8192, AlignedBuf::new(4096)).wait();
            assert_eq!(n.unwrap(), 4096, "{name}");
            check_block(&b, 8192);
            let (n, b) = engine
                .read_aligned(d, 12288, MisalignedBy1(AlignedBuf::new(8193)), 4096)
                .wait();
            assert_eq!(n.unwrap(), 8192, "{name}: through the bounce buffer");
            check_block(b.as_slice(), 12288);
        }
    }
}

/// An aligned buffer seen one byte in: a misaligned `IoBufMut`.
struct MisalignedBy1(AlignedBuf);

// SAFETY: forwards to the aligned buffer, one byte in, one byte shorter:
// still its own heap allocation, stable across moves.
unsafe impl IoBuf for MisalignedBy1 {
    fn stable_ptr(&self) -> *const u8 {
        self.0.stable_ptr().wrapping_add(1)
    }
    fn bytes_len(&self) -> usize {
        self.0.len() - 1
    }
}

// SAFETY: as above.
unsafe impl IoBufMut for MisalignedBy1 {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.stable_mut_ptr().wrapping_add(1)
    }
}

/// A request's outcome, waited for later.
type Outcome = Box<dyn FnOnce() -> io::Result<usize>>;

fn later<B: Send + 'static>(c: Completion<B>) -> Outcome {
    Box::new(move || c.wait().0)
}

/// A pipe: a read end the engine can keep in flight as long as the test
/// wants (until it writes the write end).
fn pipe() -> (Arc<File>, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors, owned by nothing else.
    let r = unsafe { File::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { File::from_raw_fd(fds[1]) };
    (Arc::new(r), w)
}

/// A read buffer that reports, when dropped, what it held: the test sees
/// when (and whether) the engine let go of it. Under AddressSanitizer a
/// buffer freed early turns the read of its bytes here into a
/// use-after-free report.
struct Witness {
    bytes: Vec<u8>,
    dropped: mpsc::Sender<Vec<u8>>,
}

// SAFETY: the bytes are the vector's heap block, stable across moves.
unsafe impl IoBuf for Witness {
    fn stable_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
    fn bytes_len(&self) -> usize {
        self.bytes.len()
    }
}

// SAFETY: as above.
unsafe impl IoBufMut for Witness {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.dropped.send(self.bytes.clone());
    }
}

fn witness(len: usize) -> (Witness, mpsc::Receiver<Vec<u8>>) {
    let (tx, rx) = mpsc::channel();
    (
        Witness {
            bytes: vec![0; len],
            dropped: tx,
        },
        rx,
    )
}

/// Submit a read of a pipe, let `abandon` get rid of the handle, check the
/// engine still holds the buffer, then write the pipe: the buffer is
/// dropped only after the kernel filled it.
fn abandoned_read_keeps_its_buffer(
    engine: &IoEngine,
    name: &str,
    abandon: fn(Completion<Witness>),
) {
    let (r, mut w) = pipe();
    let (buf, dropped) = witness(64);
    let c = engine.read(&r, CURRENT_POSITION, buf);
    abandon(c);
    drop(r); // the engine holds the descriptor too
    assert_eq!(
        dropped.recv_timeout(Duration::from_millis(100)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "{name}: the buffer was dropped while its read was in flight"
    );
    w.write_all(b"late bytes").unwrap();
    let got = dropped
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{name}: the buffer was never dropped: {e}"));
    assert_eq!(&got[..10], b"late bytes", "{name}");
}

fn a_dropped_handle_leaves_its_buffer_with_the_engine_until_completion() {
    for (name, engine) in engines() {
        abandoned_read_keeps_its_buffer(&engine, name, drop);
    }
}

fn a_handle_dropped_by_a_panic_leaves_its_buffer_with_the_engine() {
    for (name, engine) in engines() {
        abandoned_read_keeps_its_buffer(&engine, name, |c| {
            let r = std::thread::spawn(move || {
                let _held = c;
                panic!("the caller panics holding the handle");
            })
            .join();
            assert!(r.is_err());
        });
    }
}

fn a_future_dropped_after_its_first_poll_leaves_its_buffer_with_the_engine() {
    for (name, engine) in engines() {
        abandoned_read_keeps_its_buffer(&engine, name, |mut c| {
            let mut cx = Context::from_waker(Waker::noop());
            assert!(std::pin::Pin::new(&mut c).poll(&mut cx).is_pending());
            drop(c);
        });
    }
}

fn a_forgotten_handle_leaks_its_buffer_but_never_frees_it_early() {
    for (name, engine) in engines() {
        let (r, mut w) = pipe();
        let (buf, dropped) = witness(64);
        std::mem::forget(engine.read(&r, CURRENT_POSITION, buf));
        w.write_all(b"x").unwrap();
        // The engine hands the buffer to the (leaked) slot: never dropped.
        assert!(
            dropped.recv_timeout(Duration::from_millis(200)).is_err(),
            "{name}"
        );
    }
}

fn futures_complete_under_a_plain_block_on_and_in_any_order() {
    let (_path, file) = patterned_file(FILE_LEN);
    for (name, engine) in engines() {
        let cs: Vec<_> = (0..32u64)
            .map(|i| (i * 12345, engine.read(&file, i * 12345, vec![0u8; 3000])))
            .collect();
        // Await the last first.
        for (off, c) in cs.into_iter().rev() {
            let (n, buf) = block_on(c);
            assert_eq!(n.unwrap(), 3000, "{name}");
            check_block(&buf, off);
        }
        // A future woken by a write from another thread.
        let (r, mut w) = pipe();
        let c = engine.read(&r, CURRENT_POSITION, vec![0u8; 5]);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.write_all(b"woken").unwrap();
        });
        let (n, buf) = block_on(c);
        assert_eq!((n.unwrap(), &buf[..]), (5, &b"woken"[..]), "{name}");
        t.join().unwrap();
    }
}

/// A waker that runs `f` when woken (on whatever thread completes the
/// request: a reaper, a pool worker, or a waiter draining the ring).
struct CallOnWake<F: Fn() + Send + Sync>(F);
impl<F: Fn() + Send + Sync + 'static> Wake for CallOnWake<F> {
    fn wake(self: Arc<Self>) {
        (self.0)();
    }
}

fn poll_with<F: Fn() + Send + Sync + 'static, B: Send + 'static>(c: &mut Completion<B>, f: F) {
    let waker = Waker::from(Arc::new(CallOnWake(f)));
    let mut cx = Context::from_waker(&waker);
    assert!(std::pin::Pin::new(c).poll(&mut cx).is_pending());
}

fn hostile_wakers_neither_stop_nor_deadlock_the_engine() {
    let (_path, file) = patterned_file(FILE_LEN);
    for (name, engine) in engines() {
        // 1. A waker that panics: the engine goes on.
        let (r, mut w) = pipe();
        let mut c = engine.read(&r, CURRENT_POSITION, vec![0u8; 1]);
        poll_with(&mut c, || panic!("a hostile waker"));
        w.write_all(b"p").unwrap();
        let (n, _) = c.wait();
        assert_eq!(n.unwrap(), 1, "{name}");

        // 2. A waker that submits a read and waits for it, from inside the
        // completion (on the engine's own thread).
        let (r, mut w) = pipe();
        let mut c = engine.read(&r, CURRENT_POSITION, vec![0u8; 1]);
        let (tx, rx) = mpsc::channel();
        let (e2, f2) = (engine.clone(), Arc::clone(&file));
        poll_with(&mut c, move || {
            let (n, buf) = e2.read(&f2, 4096, vec![0u8; 100]).wait();
            let _ = tx.send((n.map_err(|e| e.to_string()), buf));
        });
        w.write_all(b"q").unwrap();
        let (n, buf) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("nested wait finished");
        assert_eq!(n.unwrap(), 100, "{name}");
        check_block(&buf, 4096);
        assert_eq!(c.wait().0.unwrap(), 1, "{name}");

        // 3. A waker holding the last handle on an engine: the engine is
        // dropped on its own thread, which must not join itself.
        let own = IoEngine::new(
            &kxarray::aio::IoSettings::default().engine(match engine.kind() {
                EngineKind::Uring => kxarray::aio::EngineChoice::Uring,
                EngineKind::Threads => kxarray::aio::EngineChoice::Threads,
            }),
        )
        .unwrap();
        let (r, mut w) = pipe();
        let mut c = own.read(&r, CURRENT_POSITION, vec![0u8; 1]);
        let holder = std::sync::Mutex::new(Some(own));
        let (tx, rx) = mpsc::channel();
        poll_with(&mut c, move || {
            drop(holder.lock().unwrap().take());
            let _ = tx.send(());
        });
        w.write_all(b"d").unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waker ran and dropped the engine");
        assert_eq!(c.wait().0.unwrap(), 1, "{name}");
    }
}

fn dropping_an_engine_waits_for_its_requests() {
    for (name, engine) in engines() {
        let (r, mut w) = pipe();
        let (buf, dropped) = witness(8);
        let c = engine.read(&r, CURRENT_POSITION, buf);
        drop(c);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            w.write_all(b"drained!").unwrap();
        });
        drop(engine); // blocks until the read completes
        let got = dropped.try_recv().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&got, b"drained!", "{name}");
        t.join().unwrap();
    }
}

/// The line saying which engine runs is one `info` record of the `log`
/// facade (a child process with a logger printing records on its standard
/// output), never written to standard error by the library itself.
fn the_environment_variable_forces_the_global_engine() {
    if let Ok(want) = std::env::var("KX_AIO_CHILD_EXPECT") {
        aio_common::log_to_stdout();
        let kind = IoEngine::global().kind();
        assert_eq!(format!("{kind:?}"), want);
        return;
    }
    let me = std::env::current_exe().unwrap();
    for (value, want) in [("threads", "Threads"), ("uring", "Uring")] {
        if value == "uring" && engines().len() < 2 {
            continue; // io_uring unavailable here: forcing it falls back
        }
        let out = std::process::Command::new(&me)
            .args([
                "--exact",
                "the_environment_variable_forces_the_global_engine",
                "--nocapture",
            ])
            .env("KXARRAY_IO_ENGINE", value)
            .env("KX_AIO_CHILD_EXPECT", want)
            .output()
            .unwrap();
        let (so, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{value}: {err}");
        // One record says which engine runs and that it was forced.
        let lines: Vec<&str> = so.lines().filter(|l| l.contains("I/O engine")).collect();
        assert_eq!(lines.len(), 1, "{so}");
        assert!(
            lines[0].starts_with("LOG INFO kxarray: I/O engine: "),
            "{so}"
        );
        assert!(
            lines[0].contains(&format!("forced by KXARRAY_IO_ENGINE={value}")),
            "{so}"
        );
        assert!(
            !err.contains("kxarray"),
            "the library wrote to stderr: {err}"
        );
    }
}

/// Reported as ignored, with the reason, when io_uring cannot be set up
/// here: the tests above then ran on the thread pool alone.
fn io_uring_ran_here() -> harness::Outcome {
    aio_common::uring_here().map_err(harness::Skip)
}

/// Reported as ignored, with the reason, when the temporary directory
/// refuses `O_DIRECT`: the tests above then skipped their direct halves.
fn o_direct_ran_here() -> harness::Outcome {
    aio_common::direct_here().map_err(harness::Skip)
}

harness::main!(
    tests: [
        many_reads_in_flight_from_several_threads_return_the_right_bytes,
        writes_in_flight_land_where_they_were_sent,
        an_error_reaches_its_own_request_only,
        a_dropped_handle_leaves_its_buffer_with_the_engine_until_completion,
        a_handle_dropped_by_a_panic_leaves_its_buffer_with_the_engine,
        a_future_dropped_after_its_first_poll_leaves_its_buffer_with_the_engine,
        a_forgotten_handle_leaks_its_buffer_but_never_frees_it_early,
        futures_complete_under_a_plain_block_on_and_in_any_order,
        hostile_wakers_neither_stop_nor_deadlock_the_engine,
        dropping_an_engine_waits_for_its_requests,
        the_environment_variable_forces_the_global_engine,
        io_uring_ran_here,
        o_direct_ran_here,
    ],
);
