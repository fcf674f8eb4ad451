//! Shared helpers of the I/O engine's tests: the engines to run each test
//! on, a patterned temporary file, a minimal `block_on`, and per-thread CPU
//! time from /proc.
#![allow(dead_code)]

use kxarray::aio::{EngineChoice, IoEngine, IoSettings};
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Every engine this machine can run: the thread pool always, io_uring
/// when it can be set up (otherwise the binary's `io_uring_ran_here` test
/// reports itself ignored with the reason, unless
/// `KXARRAY_TEST_REQUIRE_URING=1` makes that a failure).
pub(crate) fn engines() -> Vec<(&'static str, IoEngine)> {
    let mut v = vec![(
        "threads",
        IoEngine::new(
            &IoSettings::default()
                .engine(EngineChoice::Threads)
                .threads(4),
        )
        .unwrap(),
    )];
    match IoEngine::new(&IoSettings::default().engine(EngineChoice::Uring).rings(2)) {
        Ok(e) => v.push(("uring", e)),
        Err(e) => {
            assert!(
                std::env::var("KXARRAY_TEST_REQUIRE_URING").is_err(),
                "io_uring required but unavailable: {e}"
            );
            eprintln!("no io_uring engine here: {e}");
        }
    }
    v
}

/// Whether io_uring can be set up here, else why not: the tests that
/// converted to `harness = false` report it as a test of its own, so that
/// a machine without io_uring shows that their io_uring halves did not
/// run.
pub(crate) fn uring_here() -> Result<(), String> {
    IoEngine::new(&IoSettings::default().engine(EngineChoice::Uring).rings(1))
        .map(drop)
        .map_err(|e| {
            format!("io_uring unavailable here ({e}): the tests ran on the thread pool only")
        })
}

/// Whether the temporary directory takes `O_DIRECT`, else why not (as
/// [`uring_here`], for the tests whose direct halves it skips).
pub(crate) fn direct_here() -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(f.path())
        .map(drop)
        .map_err(|e| {
            format!("the temporary directory refuses O_DIRECT ({e}): the tests ran buffered only")
        })
}

/// The byte at `offset` of a patterned file: differs between neighbouring
/// 4 KiB blocks and within one.
pub(crate) fn pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(2654435761) >> 13) as u8 ^ (offset / 4096) as u8
}

/// A temporary file of `len` patterned bytes.
pub(crate) fn patterned_file(len: usize) -> (tempfile::TempPath, Arc<File>) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..len as u64).map(pattern).collect();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    let (file, path) = f.into_parts();
    (path, Arc::new(file))
}

struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Run a future to completion on this thread (parks between polls).
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// CPU time (ns) of a thread of this process, from
/// /proc/self/task/TID/schedstat (its first field), or from the stat
/// file's utime + stime in clock ticks (10 ms) when schedstat is absent.
pub(crate) fn thread_cpu_ns(tid: &str) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        return s.split_whitespace().next()?.parse().ok();
    }
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// The engine threads of this process (names starting with `kx-aio-`):
/// (tid, name).
pub(crate) fn engine_threads() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let tid = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Ok(name) = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")) {
            let name = name.trim().to_string();
            if name.starts_with("kx-aio-") {
                v.push((tid, name));
            }
        }
    }
    v
}

/// This thread's id, as /proc names it.
pub(crate) fn my_tid() -> String {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }.to_string()
}

/// A pipe: a read end the engine can keep in flight as long as the test
/// wants (until it writes the write end).
pub(crate) fn pipe() -> (Arc<File>, File) {
    use std::os::unix::io::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors, owned by nothing else.
    let r = unsafe { File::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { File::from_raw_fd(fds[1]) };
    (Arc::new(r), w)
}

/// `c`'s outcome, waited for on another thread, or `None` when it has not
/// come within `limit` (a hang guard, not a speed check: the limit is
/// far above what the request needs).
pub(crate) fn wait_within<B: Send + 'static>(
    c: kxarray::aio::Completion<B>,
    limit: std::time::Duration,
) -> Option<kxarray::aio::BufResult<B>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait());
    });
    rx.recv_timeout(limit).ok()
}

/// Run `f` on another thread; whether it returned within `limit` (a hang
/// guard, as above).
pub(crate) fn returns_within(
    f: impl FnOnce() + Send + 'static,
    limit: std::time::Duration,
) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}

/// Fork; the child runs `f` and `_exit`s with its result (101 when it
/// panics), without printing. Returns the child's pid.
pub(crate) fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    child_by(How::Fork, f)
}

/// How a child is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum How {
    /// `fork(3)`: the `pthread_atfork` handlers run.
    Fork,
    /// glibc's `_Fork`: a fork that runs no atfork handler.
    UnderscoreFork,
    /// The raw `clone(2)` system call with `SIGCHLD` only: the C library
    /// knows nothing of it.
    RawClone,
}

/// [`fork_child`] made `how`.
pub(crate) fn child_by(how: How, f: impl FnOnce() -> i32) -> libc::pid_t {
    extern "C" {
        fn _Fork() -> libc::pid_t;
    }
    // Each arm: the child runs only `f` and then `_exit`s, never returning
    // into the test harness; `f` uses the allocator (safe after fork in
    // glibc) and the library under test. The raw clone shares nothing (no
    // CLONE_VM): a copy of the address space, as fork.
    let pid = match how {
        // SAFETY: see above.
        How::Fork => unsafe { libc::fork() },
        // SAFETY: see above.
        How::UnderscoreFork => unsafe { _Fork() },
        How::RawClone => {
            // SAFETY: see above.
            (unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    libc::SIGCHLD as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                )
            }) as libc::pid_t
        }
    };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        std::panic::set_hook(Box::new(|_| {}));
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) }
    }
    pid
}

/// The exit status of child `pid`, or `None` (the child killed) when it
/// has not exited within `limit` (a hang guard).
pub(crate) fn wait_child(pid: libc::pid_t, limit: std::time::Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        assert!(r == 0, "waitpid: {}", std::io::Error::last_os_error());
        if start.elapsed() > limit {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above; reaps it.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Make `io_uring_enter` (system call 426 on every Linux architecture)
/// fail with `EPERM` for every thread of this process, as a container's
/// seccomp profile may: a classic BPF program installed with seccomp(2)
/// and `SECCOMP_FILTER_FLAG_TSYNC`. For a forked child only (a filter
/// cannot be removed).
pub(crate) fn refuse_io_uring_enter() -> std::io::Result<()> {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ | BPF_K, BPF_RET | BPF_K
    // (BPF_LD, BPF_W and BPF_K are 0).
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_RET_K: u16 = 0x06;
    const IO_URING_ENTER: u32 = 426;
    let prog = [
        // A = seccomp_data.nr
        SockFilter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        SockFilter {
            code: BPF_JMP_JEQ_K,
            jt: 0,
            jf: 1,
            k: IO_URING_ENTER,
        },
        SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let fprog = SockFprog {
        len: prog.len() as u16,
        filter: prog.as_ptr(),
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `prog`, both alive across the call; the
    // kernel copies the program.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &fprog as *const SockFprog,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A logger printing each record on standard output as `LOG <LEVEL>
/// <message>`, for a child process whose output a test reads.
pub(crate) fn log_to_stdout() {
    struct Stdout;
    impl log::Log for Stdout {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, r: &log::Record<'_>) {
            println!("LOG {} {}", r.level(), r.args());
        }
        fn flush(&self) {}
    }
    static LOGGER: Stdout = Stdout;
    log::set_logger(&LOGGER).expect("no logger yet");
    log::set_max_level(log::LevelFilter::Trace);
}
