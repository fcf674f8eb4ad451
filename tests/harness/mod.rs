//! The test harness of the test binaries whose tests need something the
//! machine may lack (a tool such as `sqlite3`, `fio` or `strace`, a memory
//! cgroup, `O_DIRECT` on the temporary directory, io_uring, PSI): a test
//! that cannot run says so where `cargo test` reports it, as
//! `test name ... ignored (no sqlite3 on PATH: apt-get install -y sqlite3)`,
//! and counts among the ignored in the summary line, instead of passing
//! without having run.
//!
//! Such a binary is declared with `harness = false` in its crate's
//! `Cargo.toml` and ends with `harness::main!`, which lists its tests
//! (and the child-process entries other tests start, ignored unless asked
//! for). A test is a plain `fn()` (it passes unless it panics) or a
//! `fn() -> Outcome` that may return [`skip`]`(reason)`; either may stop
//! at any point with [`skip_now`] or [`require`] (an unwind the harness
//! reports as skipped, not failed). Built on
//! `libtest-mimic`, which takes libtest's command line (`--exact`,
//! `--ignored`, `--skip`, `--test-threads`, `--list`...). It does not
//! capture what a test prints (that shows as it runs); panic messages are
//! kept and shown only when a test failed (or at once with
//! `--nocapture`), as libtest shows them. Shared by the three crates'
//! tests (`#[path]`).
//!
//! Invariant (checked by `tests/front_door.rs`): a `harness = false` test
//! file has no `#[test]` function, which libtest-mimic would never run.

#![allow(dead_code)]

use std::path::PathBuf;

/// Why a test did not run: shown after `ignored` in `cargo test`'s output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skip(pub(crate) String);

/// What a test that may not be able to run returns.
pub(crate) type Outcome = Result<(), Skip>;

/// The outcome of a test that cannot run here, for `reason`.
pub(crate) fn skip(reason: impl Into<String>) -> Outcome {
    Err(Skip(reason.into()))
}

/// Stop the running test as skipped, for `reason`, from anywhere in its
/// body (a test of `fn()` included): unwinds with a [`Skip`] that
/// [`run`] reports as `ignored (reason)`, not as a failure.
pub(crate) fn skip_now(reason: impl Into<String>) -> ! {
    std::panic::panic_any(Skip(reason.into()))
}

/// The value `r` holds, or the test skipped for its reason.
pub(crate) fn require<T>(r: Result<T, Skip>) -> T {
    r.unwrap_or_else(|Skip(why)| skip_now(why))
}

/// What a listed test function returns: nothing (it ran) or an
/// [`Outcome`].
pub(crate) trait IntoOutcome {
    /// As an [`Outcome`].
    fn into_outcome(self) -> Outcome;
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Outcome {
        Ok(())
    }
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Outcome {
        self
    }
}

/// The executable `name` on `PATH`, or the reason a test needing it
/// skips, naming the Debian package that installs it.
pub(crate) fn tool(name: &str, package: &str) -> Result<PathBuf, Skip> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| Skip(format!("no {name} on PATH: apt-get install -y {package}")))
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether the filesystem of `dir` accepts `O_DIRECT` (tmpfs before Linux
/// 6.6 and some overlay setups refuse it), or the reason a test needing
/// it skips.
pub(crate) fn direct_io(dir: &std::path::Path) -> Result<(), Skip> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(format!(".kx-direct-probe-{}", std::process::id()));
    let r = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = std::fs::remove_file(&probe);
    r.map(drop).map_err(|e| {
        Skip(format!(
            "the filesystem of {} refuses O_DIRECT: {e}",
            dir.display()
        ))
    })
}

/// One test of a `harness::main!` list.
pub(crate) struct Test {
    /// Its name, as `cargo test` shows it and filters by.
    pub(crate) name: &'static str,
    /// The test.
    pub(crate) run: fn() -> Outcome,
    /// A child-process entry: ignored unless `--ignored` (or
    /// `--include-ignored`) runs it.
    pub(crate) child: bool,
}

/// Run `tests` as libtest does, with libtest's command line.
pub(crate) fn run(tests: Vec<Test>) -> ! {
    let mut args = libtest_mimic::Arguments::from_args();
    if args.test_threads.is_none() {
        // libtest's variable, which libtest-mimic does not read.
        args.test_threads = std::env::var("RUST_TEST_THREADS")
            .ok()
            .and_then(|v| v.parse().ok());
    }
    // A skip's unwind is not a panic to report. Other panics' messages
    // (with their location) are kept, not printed, as libtest's output
    // capture keeps them: many tests panic on purpose (in the code under
    // test's threads too); they are printed at the end if a test failed,
    // and at once with --nocapture.
    let default_hook = std::panic::take_hook();
    let nocapture = args.nocapture;
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<Skip>().is_some() {
            return;
        }
        if nocapture {
            return default_hook(info);
        }
        let thread = std::thread::current();
        let line = format!("thread '{}' {info}", thread.name().unwrap_or("<unnamed>"));
        PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }));
    let trials = tests
        .into_iter()
        .map(|t| {
            let run = t.run;
            let trial = libtest_mimic::Trial::ignorable_test(t.name, move || {
                match std::panic::catch_unwind(run) {
                    Ok(Ok(())) => Ok(libtest_mimic::Completion::Completed),
                    Ok(Err(Skip(why))) => Ok(libtest_mimic::Completion::ignored_with(why)),
                    Err(payload) => match payload.downcast::<Skip>() {
                        Ok(skip) => Ok(libtest_mimic::Completion::ignored_with(skip.0)),
                        // libtest-mimic reports the panic as a failure.
                        Err(other) => std::panic::resume_unwind(other),
                    },
                }
            });
            if t.child {
                trial.with_kind("child").with_ignored_flag(true)
            } else {
                trial
            }
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() {
        let panics = PANICS.lock().unwrap_or_else(|e| e.into_inner());
        if !panics.is_empty() {
            eprintln!("\npanics during the run (the failing tests' among them):");
            for p in panics.iter() {
                eprintln!("  {p}");
            }
        }
    }
    conclusion.exit()
}

/// The panic messages of the run, kept for a failing run's report.
static PANICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The `main` of a `harness = false` test binary: its tests, and the
/// child-process entries its tests start (`--ignored --exact NAME`).
///
/// ```ignore
/// harness::main!(tests: [roundtrip, needs_the_shell], children: [child]);
/// ```
macro_rules! main {
    (tests: [$($t:ident),* $(,)?] $(, children: [$($c:ident),* $(,)?])? $(,)?) => {
        fn main() {
            use $crate::harness::IntoOutcome as _;
            $crate::harness::run(vec![
                $($crate::harness::Test {
                    name: stringify!($t),
                    run: || $t().into_outcome(),
                    child: false,
                },)*
                $($($crate::harness::Test {
                    name: stringify!($c),
                    run: || $c().into_outcome(),
                    child: true,
                },)*)?
            ])
        }
    };
}
pub(crate) use main;
