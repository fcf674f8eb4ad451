//! The library never prints on its own: the I/O
//! engine's line, its warnings and the pressure monitor's default sink are
//! records of the `log` facade, silent until the application installs a
//! logger. Each test looks at the records a capturing logger got, or at
//! the standard error of a child process with no logger.

mod aio_common;

use kxarray::aio::{EngineChoice, IoEngine, IoSettings, CURRENT_POSITION};
use kxarray::memory::LogSink;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

/// The records this process logged: (level, message).
fn records() -> &'static Mutex<Vec<(log::Level, String)>> {
    struct Capture;
    static SEEN: OnceLock<Mutex<Vec<(log::Level, String)>>> = OnceLock::new();
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, r: &log::Record<'_>) {
            let seen = SEEN.get_or_init(|| Mutex::new(Vec::new()));
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.push((r.level(), r.args().to_string()));
        }
        fn flush(&self) {}
    }
    static LOGGER: Capture = Capture;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&LOGGER).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
    SEEN.get_or_init(|| Mutex::new(Vec::new()))
}

/// How many records of `level` match `f`.
fn logged(level: log::Level, f: impl Fn(&str) -> bool) -> usize {
    records()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(l, m)| *l == level && f(m))
        .count()
}

/// Whether more than `before` such records are there within `limit` (the
/// engine logs after the waiter may already have its outcome; a hang
/// guard, not a speed check).
fn logged_within(
    level: log::Level,
    f: impl Fn(&str) -> bool,
    before: usize,
    limit: Duration,
) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if logged(level, &f) > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn the_pressure_monitors_default_sink_is_the_log_facade() {
    records();
    LogSink::default().log("shrink: a test line");
    assert_eq!(
        logged(log::Level::Info, |m| m == "kxarray: shrink: a test line"),
        1
    );
}

struct Panics;
impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("a hostile waker");
    }
}

#[test]
fn a_panicking_waker_is_logged_as_an_error() {
    records();
    let panicked = |m: &str| m.contains("waker or buffer destructor panicked");
    for (name, engine) in aio_common::engines() {
        let before = logged(log::Level::Error, panicked);
        let (r, mut w) = aio_common::pipe();
        let mut c = engine.read(&r, CURRENT_POSITION, vec![0u8; 1]);
        let waker = Waker::from(Arc::new(Panics));
        assert!(std::pin::Pin::new(&mut c)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        w.write_all(b"p").unwrap();
        // Not waited for yet: a wait would replace the hostile waker.
        assert!(
            logged_within(log::Level::Error, panicked, before, Duration::from_secs(30)),
            "{name}: no error record"
        );
        let (n, _) = aio_common::wait_within(c, Duration::from_secs(30)).expect("completes");
        assert_eq!(n.unwrap(), 1, "{name}");
    }
}

use std::future::Future;

/// With no logger installed, making the global engine, engines of both
/// kinds and a pressure line print nothing.
#[test]
fn the_library_writes_nothing_to_standard_error() {
    if std::env::var("KX_LOG_CHILD").is_ok() {
        IoEngine::global();
        let _ = IoEngine::new(&IoSettings::default().engine(EngineChoice::Threads));
        let _ = IoEngine::new(&IoSettings::default().engine(EngineChoice::Auto));
        LogSink::default().log("a pressure line");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_library_writes_nothing_to_standard_error",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KX_LOG_CHILD", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("kxarray"), "the library printed: {err}");
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(!so.contains("kxarray"), "the library printed: {so}");
}
