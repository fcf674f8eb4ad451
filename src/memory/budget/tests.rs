//! The budget's members on fake cgroup trees with fake processes (each
//! holding its life byte through a registry description of its own), a
//! real child process killed with SIGKILL while it holds the registry's
//! lock, and a member in another PID namespace.

use super::*;
use crate::ipc::RuntimeDir;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicU64;

const M: u64 = 1 << 20;

/// A cache as a pair of numbers.
struct Fake {
    cap: AtomicU64,
    used: AtomicU64,
}

impl Resizable for Fake {
    type Error = String;
    fn capacity(&self) -> u64 {
        self.cap.load(Ordering::SeqCst)
    }
    fn set_capacity(&self, b: u64) -> Result<(), String> {
        self.cap.store(b, Ordering::SeqCst);
        Ok(())
    }
    fn used(&self) -> Option<u64> {
        Some(self.used.load(Ordering::SeqCst))
    }
}

fn fake(cap: u64, used: u64) -> Arc<Fake> {
    Arc::new(Fake {
        cap: AtomicU64::new(cap),
        used: AtomicU64::new(used),
    })
}

fn process(proc_root: &Path, pid: u32, start: u64) {
    let d = proc_root.join(pid.to_string());
    fs::create_dir_all(&d).unwrap();
    let mut f = vec!["0".to_string(); 50];
    f[0] = "S".into();
    f[19] = start.to_string();
    fs::write(d.join("stat"), format!("{pid} (fake) {}\n", f.join(" "))).unwrap();
}

/// A host with the memory controller on cgroup v1: this process and the
/// fake ones in `/svc`, limited to 512 MiB.
struct Tree {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    config: BudgetConfig,
    svc: PathBuf,
    /// The fake processes' registry descriptions (their life bytes).
    fakes: RefCell<HashMap<u32, Registry>>,
}

/// A private directory of the test's own (tempdirs are 0755).
fn private_tmp() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700)).unwrap();
    tmp
}

fn registry_in(dir: &Path, key: &str) -> Registry {
    Registry::open(&RuntimeDir::open(dir).unwrap(), key).unwrap()
}

impl Tree {
    fn new(want: u64) -> Tree {
        let tmp = private_tmp();
        let (p, c) = (tmp.path().join("proc"), tmp.path().join("cg"));
        fs::create_dir_all(p.join("self")).unwrap();
        fs::write(p.join("self/cgroup"), "4:memory:/svc\n0::/\n").unwrap();
        fs::write(
            p.join("meminfo"),
            "MemTotal: 25165824 kB\nMemAvailable: 20971520 kB\n",
        )
        .unwrap();
        process(&p, std::process::id(), 4242);
        let svc = c.join("memory/svc");
        fs::create_dir_all(&svc).unwrap();
        fs::write(svc.join("memory.limit_in_bytes"), (512 * M).to_string()).unwrap();
        fs::write(
            svc.join("memory.stat"),
            "total_active_file 0\ntotal_inactive_file 0\n",
        )
        .unwrap();
        let config = BudgetConfig {
            registry_dir: RegistryDir::Private(tmp.path().into()),
            proc_root: p,
            cgroup_root: c,
            ..BudgetConfig::new(want)
        };
        let t = Tree {
            dir: tmp.path().into(),
            _tmp: tmp,
            config,
            svc,
            fakes: RefCell::new(HashMap::new()),
        };
        t.usage(100 * M);
        t
    }

    fn usage(&self, bytes: u64) {
        fs::write(self.svc.join("memory.usage_in_bytes"), bytes.to_string()).unwrap();
    }

    fn registry(&self) -> Registry {
        registry_in(&self.dir, "cgroup-v1:/svc")
    }

    /// Fake processes each holding a full cache of `cap` and wanting
    /// `want`, each a member through a registry description of its own.
    fn others(&self, pids: &[u32], want: u64, cap: u64) {
        for &pid in pids {
            process(&self.config.proc_root, pid, 1);
            let mut r = self.registry();
            r.update(true, |t, look| {
                t.slots[look.mine.unwrap()] = Slot {
                    pid,
                    start_time: 1,
                    want,
                    demand: want,
                    capacity: cap,
                    used: cap,
                };
                (true, ())
            })
            .unwrap();
            self.fakes.borrow_mut().insert(pid, r);
        }
    }

    /// A fake process dies: its description is closed (the kernel drops
    /// its life byte), its `/proc` entry goes.
    fn kill(&self, pid: u32) {
        drop(self.fakes.borrow_mut().remove(&pid));
        fs::remove_dir_all(self.config.proc_root.join(pid.to_string())).unwrap();
    }
}

/// Four processes already share 256 MiB (half of 512 MiB): a fifth gets a
/// fifth; when two die, the three left get a third each, without the dead
/// ones' help; past the shrink mark the cache gives back its part.
#[test]
fn five_fake_processes_divide_and_rebalance() {
    let tree = Tree::new(256 * M);
    tree.others(&[9001, 9002, 9003, 9004], 256 * M, 51 * M);
    let cache = fake(16 * M, 0);
    let mut m = Member::new(Arc::clone(&cache), tree.config.clone());
    m.tick();
    let fifth = 256 * M / 5 / 4096 * 4096;
    let s = m.stats.lock().unwrap().clone();
    assert_eq!(
        (s.key.as_str(), s.members, s.share, s.fallback),
        ("cgroup-v1:/svc", 5, fifth, false)
    );
    assert_eq!((cache.capacity(), s.reason), (fifth, Reason::Grow));
    cache.used.store(fifth, Ordering::SeqCst);

    tree.kill(9001);
    tree.kill(9003);
    m.tick();
    let s = m.stats.lock().unwrap().clone();
    let third = 256 * M / 3 / 4096 * 4096;
    assert_eq!(
        (s.members, s.share, s.reason),
        (3, third, Reason::Reclaimed)
    );
    assert_eq!(cache.capacity(), third);
    let live = tree
        .registry()
        .update(false, |t, _| {
            (false, t.slots.iter().filter(|s| s.pid != 0).count())
        })
        .unwrap();
    assert_eq!(live, 3);

    // 480 MiB used, 45 MiB past the mark (85% of 512); this cache holds
    // a third of the members' capacities... 85 of 187 MiB: gives back 45 * 85/187.
    cache.used.store(third, Ordering::SeqCst);
    tree.usage(480 * M);
    m.tick();
    let s = m.stats.lock().unwrap().clone();
    assert_eq!(s.reason, Reason::NearLimit);
    let excess = 480 * M - ((512 * M) as f64 * 0.85) as u64;
    let part = (excess as u128 * third as u128 / (third + 2 * 51 * M) as u128) as u64;
    assert_eq!(cache.capacity(), (third - part) / 4096 * 4096);

    // Leaving frees the slot.
    m.leave();
    let live = tree
        .registry()
        .update(false, |t, _| {
            (false, t.slots.iter().filter(|s| s.pid != 0).count())
        })
        .unwrap();
    assert_eq!(live, 2);
}

/// A member that does not fill its capacity asks only for what it holds
/// (after `idle_after`), and the others' shares grow by the rest.
#[test]
fn an_idle_cache_leaves_the_rest() {
    let tree = Tree::new(256 * M);
    tree.others(&[9001], 256 * M, 128 * M);
    let cfg = BudgetConfig {
        idle_after: Duration::ZERO,
        ..tree.config.clone()
    };
    let cache = fake(16 * M, 0);
    let mut m = Member::new(Arc::clone(&cache), cfg);
    m.joined -= Duration::from_secs(1);
    m.last_full -= Duration::from_secs(1);
    cache.used.store(4 * M, Ordering::SeqCst);
    m.tick();
    let s = m.stats.lock().unwrap().clone();
    // It asks for max(4 + 1, 16) MiB: the other may take 240 MiB.
    assert_eq!(s.share, 16 * M);
    let demands = tree
        .registry()
        .update(false, |t, _| {
            (
                false,
                t.slots
                    .iter()
                    .filter(|s| s.pid != 0)
                    .map(|s| s.demand)
                    .collect::<Vec<_>>(),
            )
        })
        .unwrap();
    assert!(demands.contains(&(16 * M)));
    assert_eq!(
        budget_shares(256 * M, &demands).iter().max(),
        Some(&(240 * M))
    );
}

/// No registry (its directory does not exist): sized alone with half of
/// what it wants, and the fallback is in the stats.
#[test]
fn fallback_without_a_registry() {
    let tree = Tree::new(200 * M);
    let cfg = BudgetConfig {
        registry_dir: RegistryDir::Private(tree.dir.join("absent")),
        ..tree.config.clone()
    };
    let cache = fake(300 * M, 300 * M);
    let mut m = Member::new(Arc::clone(&cache), cfg);
    assert_eq!(cache.capacity(), 200 * M); // never above what it wants
    cache.used.store(200 * M, Ordering::SeqCst);
    m.tick();
    let s = m.stats.lock().unwrap().clone();
    assert!(s.fallback);
    assert_eq!(
        (s.share, cache.capacity(), s.reason),
        (100 * M, 100 * M, Reason::Rebalance)
    );
}

/// Garbage in the cgroup files: no panic, the cache keeps within what it
/// wants, and a foreign registry file is left as it was.
#[test]
fn garbage_is_survived() {
    let tree = Tree::new(64 * M);
    fs::write(tree.svc.join("memory.usage_in_bytes"), "lots").unwrap();
    let path = tree.dir.join(file_name("cgroup-v1:/svc"));
    fs::write(&path, vec![7u8; 5000]).unwrap();
    let cache = fake(16 * M, 0);
    let mut m = Member::new(Arc::clone(&cache), tree.config.clone());
    m.tick();
    assert!(cache.capacity() <= 64 * M);
    assert!(m.stats.lock().unwrap().fallback);
    assert_eq!(fs::read(&path).unwrap(), vec![7u8; 5000]);
    fs::write(tree.config.proc_root.join("self/cgroup"), "\u{0}garbage").unwrap();
    let mut m = Member::new(Arc::clone(&cache), tree.config.clone());
    m.tick();
    assert!(cache.capacity() <= 64 * M);
}

/// The env var that makes the test binary a child of the tests below: the
/// private directory of the registry.
const CHILD_ENV: &str = "KXARRAY_BUDGET_TEST_CHILD";
/// What the child does: `hold` (join, then hold the table's lock until
/// killed) or `member` (join, then sleep until killed).
const MODE_ENV: &str = "KXARRAY_BUDGET_TEST_MODE";
const HUGE: u64 = 1 << 50;

/// Not a test of its own: run by the tests below in a child process, it
/// joins the registry named by `CHILD_ENV` as a member wanting `HUGE`
/// (its slot's pid is its own, as its PID namespace numbers it), says
/// READY, then holds the lock (`hold`) or not (`member`) until killed.
#[test]
#[ignore = "the child process of the tests below"]
fn budget_child() {
    let dir = PathBuf::from(std::env::var(CHILD_ENV).expect("run by the parent test"));
    let hold = std::env::var(MODE_ENV).is_ok_and(|m| m == "hold");
    let key = Scope::from_system().unwrap().key;
    let mut r = registry_in(&dir, &key);
    let pid = std::process::id();
    let start = start_time(Path::new("/proc"), pid).map_or(0, |(s, _)| s);
    r.update(true, |t, look| {
        t.slots[look.mine.unwrap()] = Slot {
            pid,
            start_time: start,
            want: HUGE,
            demand: HUGE,
            capacity: 0,
            used: 0,
        };
        (true, ())
    })
    .unwrap();
    if !hold {
        println!("READY pid {pid}");
        std::thread::sleep(Duration::from_secs(3600));
    }
    r.update(false, |_, _| {
        println!("READY pid {pid}");
        std::thread::sleep(Duration::from_secs(3600));
        (false, ())
    })
    .unwrap();
}

/// The child above, as `program` with `args` before the test binary (an
/// `unshare`), waited for until it says READY; `None` when it could not
/// start (the message says why).
fn spawn_child(dir: &Path, mode: &str, wrapper: &[&str]) -> Option<(std::process::Child, String)> {
    let exe = std::env::current_exe().unwrap();
    let test = [
        "--ignored",
        "--exact",
        "memory::budget::tests::budget_child",
        "--nocapture",
    ];
    let mut cmd = match wrapper.split_first() {
        Some((prog, rest)) => {
            let mut c = Command::new(prog);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let mut child = cmd
        .args(test)
        .env(CHILD_ENV, dir)
        .env(MODE_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.find_map(|l| l.ok().filter(|l| l.contains("READY")));
    match ready {
        Some(line) => Some((child, line)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

/// A member in the test's cgroup scope with this registry directory.
fn member_in(dir: &Path) -> (Arc<Fake>, Member<Fake>) {
    let cache = fake(16 * M, 0);
    let config = BudgetConfig {
        registry_dir: RegistryDir::Private(dir.into()),
        ..BudgetConfig::new(HUGE)
    };
    let m = Member::new(Arc::clone(&cache), config);
    (cache, m)
}

/// A real child process joins the budget, takes the registry's lock and
/// is killed with SIGKILL while holding it: the kernel releases the lock
/// and the child's life byte, the next look frees its slot, and its share
/// comes back to the member left.
#[test]
fn a_sigkilled_members_share_comes_back() {
    let dir = private_tmp();
    let (mut child, _) = spawn_child(dir.path(), "hold", &[]).expect("the child did not start");
    let key = Scope::from_system().unwrap().key;
    let mut r = registry_in(dir.path(), &key);
    assert!(r.is_locked_elsewhere().unwrap(), "the child holds the lock");

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !r.is_locked_elsewhere().unwrap(),
        "the kernel released the lock"
    );

    let (_cache, mut m) = member_in(dir.path());
    let total = {
        let u = m.scope.as_ref().unwrap().usage().unwrap();
        (u.limit as f64 * m.config.fraction) as u64 / 4096 * 4096
    };
    m.tick();
    let s = m.stats.lock().unwrap().clone();
    assert_eq!((s.members, s.share), (1, total), "{s:?}");
    let gen = r.update(false, |t, _| (false, t.generation)).unwrap();
    assert_eq!(
        gen, 3,
        "the child joined (1), its slot was freed (2), this member joined (3)"
    );
}

/// The same child, alive and not holding the lock: the member shares with
/// it, then its share comes back once the child is killed.
#[test]
fn share_is_halved_then_restored() {
    let dir = private_tmp();
    let (mut child, _) = spawn_child(dir.path(), "member", &[]).expect("the child did not start");
    let (_cache, mut m) = member_in(dir.path());
    m.tick();
    let before = m.stats.lock().unwrap().clone();
    assert_eq!(before.members, 2);
    child.kill().unwrap();
    child.wait().unwrap();
    m.tick();
    let after = m.stats.lock().unwrap().clone();
    assert_eq!(after.members, 1);
    // Half the total, then all of it (each in whole pages).
    assert!(
        after.share.abs_diff(before.share * 2) <= 4096,
        "{before:?} {after:?}"
    );
}

/// A member in a new PID namespace (`unshare --pid --fork`: its pid there
/// is 1, which on the host is init, started at another time) beside one on
/// the host: two members, the budget divided between them, and the host's
/// share back once it is killed. Judged by pid and start time, each took
/// the other for dead and the whole budget. SKIPPED where a PID namespace
/// cannot be made (no `unshare`, not permitted).
#[test]
fn a_member_in_another_pid_namespace_is_alive() {
    let dir = private_tmp();
    let Some((mut child, line)) = spawn_child(
        dir.path(),
        "member",
        &["unshare", "--pid", "--fork", "--kill-child"],
    ) else {
        eprintln!("SKIPPED: cannot run a child in a new PID namespace (unshare --pid --fork)");
        return;
    };
    assert!(
        line.ends_with("pid 1"),
        "the child runs in its own PID namespace: {line}"
    );
    let (_cache, mut m) = member_in(dir.path());
    m.tick();
    let both = m.stats.lock().unwrap().clone();
    let total = {
        let u = m.scope.as_ref().unwrap().usage().unwrap();
        (u.limit as f64 * m.config.fraction) as u64 / 4096 * 4096
    };
    assert_eq!(both.members, 2, "{both:?}");
    assert!(both.share.abs_diff(total / 2) <= 4096, "{both:?}");
    child.kill().unwrap(); // unshare; its child (the member) dies with it
    child.wait().unwrap();
    // The namespace's init is gone with its parent; the member's life byte
    // goes when the kernel has reaped it.
    let start = Instant::now();
    loop {
        m.tick();
        let s = m.stats.lock().unwrap().clone();
        if s.members == 1 {
            assert_eq!(s.share, total);
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
