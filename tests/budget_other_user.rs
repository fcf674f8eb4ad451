//! The shared memory budget against another user: whatever that user
//! plants where the victim's registry would be (a symlink, a FIFO, a file
//! or a directory of theirs at the per-user directory's name in a shared
//! sticky directory, as `/dev/shm` is; and, standing in for a damaged
//! runtime directory, a symlink, a FIFO, a directory, another user's file,
//! garbage or a huge file at the registry's own name), the victim creates
//! and overwrites nothing outside its own directory, joins within a
//! bounded wait, and falls back (sized alone) with one log line naming
//! what it found. Each victim is a forked child (its own process: the line
//! is once per process).
//!
//! Needs root, to make the other user (`useradd`); SKIPPED with a message
//! otherwise.

use kxarray::memory::{file_name, BudgetConfig, RegistryDir, Resizable, Scope, SharedBudget};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ATTACKER: &str = "kxarray-test-other";

/// The other user's uid and gid, made if needed; `None` when not root.
fn other_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, ATTACKER]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                ATTACKER,
            ])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            return None;
        }
    }
    Some((id("-u")?, id("-g")?))
}

/// Run `script` (sh) as the other user.
fn as_other(uid: u32, gid: u32, script: &str) {
    let st = Command::new("sh")
        .args(["-c", script])
        .uid(uid)
        .gid(gid)
        .status()
        .unwrap();
    assert!(st.success(), "as the other user: {script}");
}

struct Fake(AtomicU64);

impl Resizable for Fake {
    type Error = String;
    fn capacity(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    fn set_capacity(&self, b: u64) -> Result<(), String> {
        self.0.store(b, Ordering::Relaxed);
        Ok(())
    }
}

struct Lines(Arc<Mutex<Vec<String>>>);

impl log::Log for Lines {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

/// In a forked child: join a budget whose registry is in `shared`'s
/// per-user directory; the child's verdict as its exit status (0: fell
/// back, with exactly one line naming `what`, within the wait).
fn victim(shared: &Path, what: &str) -> i32 {
    let lines = Arc::new(Mutex::new(Vec::new()));
    if log::set_logger(Box::leak(Box::new(Lines(Arc::clone(&lines))))).is_err() {
        return 10;
    }
    log::set_max_level(log::LevelFilter::Warn);
    let t = Instant::now();
    let config = BudgetConfig {
        registry_dir: RegistryDir::InShared(shared.into()),
        ..BudgetConfig::new(64 << 20)
    };
    let Ok(b) = SharedBudget::join(Arc::new(Fake(AtomicU64::new(16 << 20))), config) else {
        return 11;
    };
    let took = t.elapsed();
    let s = b.stats();
    let lines = lines.lock().unwrap().clone();
    let named = lines.len() == 1 && lines[0].contains(what);
    eprintln!(
        "victim: fallback {} took {took:?} lines {lines:?}",
        s.fallback
    );
    // A hang guard far above the lock's 5 ms and far below a second.
    match (s.fallback, named, took < Duration::from_millis(500)) {
        (true, true, true) => 0,
        (false, _, _) => 1,
        (_, false, _) => 2,
        _ => 3,
    }
}

fn fork_victim(shared: &Path, what: &str) -> i32 {
    // SAFETY: the child runs `victim` and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(|| victim(shared, what)).unwrap_or(101);
        // SAFETY: leaving the child without the test harness's exit.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    }
}

/// A shared sticky directory as `/dev/shm` is (mode 1777).
fn shared_dir(tmp: &Path) -> PathBuf {
    let d = tmp.join("shm");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

/// Entries under `dir`, recursively, with their sizes (what a victim may
/// have created or changed there).
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p.clone());
            }
            out.push((p, m.len()));
        }
    }
    out.sort();
    out
}

#[test]
fn another_users_plants_at_the_per_user_directory_are_refused() {
    let Some((uid, gid)) = other_user() else {
        eprintln!("SKIPPED: not root: cannot make another user to plant the registry's names");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The other user's own directory, where a symlink points.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
    // SAFETY: chown of a path we made; no memory involved.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, gid) }, 0);
    let name = format!("kxarray-{me}");
    let cases: [(&str, String, &str); 5] = [
        (
            "symlink",
            format!("ln -s {} {{d}}/{name}", theirs.display()),
            "symbolic link",
        ),
        (
            "open directory",
            format!("mkdir -m 0777 {{d}}/{name}"),
            "owned by uid",
        ),
        (
            "private directory",
            format!("mkdir -m 0700 {{d}}/{name}"),
            "owned by uid",
        ),
        ("FIFO", format!("mkfifo {{d}}/{name}"), "not a directory"),
        ("file", format!("touch {{d}}/{name}"), "not a directory"),
    ];
    for (what, script, says) in cases {
        let shared = shared_dir(&tmp.path().join(what.replace(' ', "-")).tap_mkdir());
        as_other(uid, gid, &script.replace("{d}", shared.to_str().unwrap()));
        let before = (tree(&shared), tree(&theirs));
        let verdict = fork_victim(&shared, says);
        assert_eq!(verdict, 0, "{what}: the victim's verdict");
        assert_eq!(
            (tree(&shared), tree(&theirs)),
            before,
            "{what}: something was created or changed"
        );
    }
}

#[test]
fn whatever_is_at_the_registrys_name_is_refused_and_left_alone() {
    let Some((uid, gid)) = other_user() else {
        eprintln!("SKIPPED: not root: cannot make another user's file at the registry's name");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let tmp = tempfile::tempdir().unwrap();
    let key = Scope::from_system().unwrap().key;
    // A file of the victim's elsewhere, which a symlink points to.
    let elsewhere = tmp.path().join("victims-file");
    std::fs::write(&elsewhere, b"").unwrap();
    type Plant = Box<dyn Fn(&Path)>;
    let chown = move |p: &Path| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: chown of a path the test made.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, gid) }, 0);
    };
    let e2 = elsewhere.clone();
    let cases: Vec<(&str, Plant, &str)> = vec![
        (
            "symlink",
            Box::new(move |p| symlink(&e2, p).unwrap()),
            "symbolic link",
        ),
        (
            "FIFO",
            Box::new(|p| {
                let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
                // SAFETY: mkfifo of a path in the test's directory.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
            "FIFO",
        ),
        (
            "directory",
            Box::new(|p| std::fs::create_dir(p).unwrap()),
            "directory",
        ),
        (
            "foreign file",
            Box::new(move |p| {
                std::fs::write(p, b"").unwrap();
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
                chown(p);
            }),
            "owned by uid",
        ),
        (
            "garbage",
            Box::new(|p| {
                std::fs::write(p, vec![0x5Au8; 3000]).unwrap();
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
            }),
            "not a registry",
        ),
        (
            "huge file",
            Box::new(|p| {
                let f = std::fs::File::create(p).unwrap();
                f.set_len(1 << 30).unwrap();
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
            }),
            "at most",
        ),
    ];
    for (what, plant, says) in cases {
        let shared = shared_dir(&tmp.path().join(what.replace(' ', "-")).tap_mkdir());
        let dir = shared.join(format!("kxarray-{me}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        plant(&dir.join(file_name(&key)));
        let before = (tree(&shared), std::fs::read(&elsewhere).unwrap());
        let verdict = fork_victim(&shared, says);
        assert_eq!(verdict, 0, "{what}: the victim's verdict");
        assert_eq!(
            (tree(&shared), std::fs::read(&elsewhere).unwrap()),
            before,
            "{what}: something was created or changed"
        );
    }
}

trait TapMkdir {
    fn tap_mkdir(self) -> PathBuf;
}

impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> PathBuf {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}
