//! `MemoryLimits::read` over fake `/proc` and `/sys/fs/cgroup` trees in a
//! temporary directory: cgroup v2, hybrid v1 hosts, containers without a
//! cgroup namespace, and garbage in every file (typed errors, no panic).

use kxarray::memory::{Bound, CapacityPolicy, LimitsError, MemoryLimits};
use proptest::prelude::*;
use std::fs;
use std::path::{Path, PathBuf};

/// A fake system: `proc/` and `cgroup/` under a temporary directory.
struct Fake {
    _tmp: tempfile::TempDir,
    proc_root: PathBuf,
    cgroup: PathBuf,
}

impl Fake {
    /// `MemTotal` of `mem_kb` and the given `/proc/self/cgroup` text.
    fn new(mem_kb: u64, self_cgroup: &str) -> Fake {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let cgroup = tmp.path().join("cgroup");
        fs::create_dir_all(proc_root.join("self")).unwrap();
        fs::create_dir_all(&cgroup).unwrap();
        fs::write(
            proc_root.join("meminfo"),
            format!("MemTotal:       {mem_kb} kB\nMemFree:          1000 kB\n"),
        )
        .unwrap();
        fs::write(proc_root.join("self/cgroup"), self_cgroup).unwrap();
        Fake {
            _tmp: tmp,
            proc_root,
            cgroup,
        }
    }

    /// Write `rel` (under the cgroup root), creating its directory.
    fn put(&self, rel: &str, text: &[u8]) -> PathBuf {
        let p = self.cgroup.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, text).unwrap();
        p
    }

    fn read(&self) -> Result<MemoryLimits, LimitsError> {
        MemoryLimits::read(&self.proc_root, &self.cgroup)
    }
}

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

#[test]
fn v2_tightest_ancestor_binds() {
    let f = Fake::new(32 << 20, "0::/a/b/c\n");
    f.put("cgroup.controllers", b"cpu memory\n");
    f.put("a/memory.max", b"1073741824\n"); // the grandparent: 1 GiB
    f.put("a/b/memory.max", b"4294967296\n");
    f.put("a/b/c/memory.max", b"max\n");
    f.put("a/b/memory.high", b"max\n");
    f.put("a/b/c/memory.high", b"2147483648\n");
    let l = f.read().unwrap();
    assert_eq!(l.physical, Some(32 * G));
    let max = l.max.clone().unwrap();
    assert_eq!((max.bytes, max.file), (G, f.cgroup.join("a/memory.max")));
    assert_eq!(l.high.as_ref().unwrap().bytes, 2 * G);
    assert_eq!(l.cgroup, Some(f.cgroup.join("a/b/c")));
    assert_eq!(l.budget(), Some((G, Bound::CgroupMax)));
    let c = CapacityPolicy::default().capacity(&l);
    assert_eq!((c.bytes, c.bound), ((1024 - 64) / 4 * M, Bound::CgroupMax));
}

#[test]
fn all_max_is_physical() {
    let f = Fake::new(8 << 20, "0::/user.slice\n");
    f.put("cgroup.controllers", b"memory\n");
    f.put("user.slice/memory.max", b"max\n");
    f.put("user.slice/memory.high", b"max\n");
    let l = f.read().unwrap();
    assert_eq!((&l.max, &l.high), (&None, &None));
    assert_eq!(l.budget(), Some((8 * G, Bound::Physical)));
}

/// A hybrid host (this kind runs the CI machine): the v2 hierarchy at
/// `unified/` has no memory files, the v1 memory controller holds the
/// limit; v1's "unlimited" (the largest page-aligned i64) is no limit.
#[test]
fn hybrid_v1_memory_controller() {
    let f = Fake::new(
        16 << 20,
        "4:memory:/process_api/job\n3:cpu,cpuacct:/\n0::/\n",
    );
    f.put("unified/cgroup.controllers", b"");
    f.put(
        "unified/memory.pressure",
        b"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    );
    f.put("memory/memory.limit_in_bytes", b"9223372036854771712\n");
    f.put(
        "memory/process_api/memory.limit_in_bytes",
        b"9223372036854771712\n",
    );
    f.put(
        "memory/process_api/job/memory.limit_in_bytes",
        b"536870912\n",
    );
    let l = f.read().unwrap();
    let max = l.max.unwrap();
    assert_eq!(max.bytes, 512 * M);
    assert!(max
        .file
        .ends_with("memory/process_api/job/memory.limit_in_bytes"));
    assert_eq!(l.high, None);
    assert_eq!(l.cgroup, Some(f.cgroup.join("unified")));
}

/// Unlimited everywhere on the hybrid host: physical memory binds.
#[test]
fn hybrid_unlimited() {
    let f = Fake::new(16 << 20, "4:memory:/x\n0::/\n");
    f.put("unified/cgroup.controllers", b"");
    f.put("memory/x/memory.limit_in_bytes", b"9223372036854771712\n");
    assert_eq!(f.read().unwrap().budget(), Some((16 * G, Bound::Physical)));
}

/// A container that mounts its own cgroup as the root without a cgroup
/// namespace: `/proc/self/cgroup` names a path that is not under the
/// mount, and the root's files are the container's.
#[test]
fn container_without_namespace() {
    let f = Fake::new(64 << 20, "0::/docker/0123abcd\n");
    f.put("cgroup.controllers", b"memory\n");
    f.put("memory.max", b"268435456\n");
    let l = f.read().unwrap();
    assert_eq!(l.max.unwrap().bytes, 256 * M);
    assert_eq!(l.cgroup, Some(f.cgroup.clone()));
}

/// The longest tail that exists: `/kubepods/pod1/ctr` seen from a mount
/// rooted at `kubepods`.
#[test]
fn longest_existing_tail() {
    let f = Fake::new(64 << 20, "0::/kubepods/pod1/ctr\n");
    f.put("cgroup.controllers", b"memory\n");
    f.put("pod1/memory.max", b"1073741824\n");
    f.put("pod1/ctr/memory.max", b"max\n");
    let l = f.read().unwrap();
    assert_eq!(l.cgroup, Some(f.cgroup.join("pod1/ctr")));
    assert_eq!(l.max.unwrap().bytes, G);
}

#[test]
fn nothing_there() {
    let tmp = tempfile::tempdir().unwrap();
    let l = MemoryLimits::read(&tmp.path().join("no"), &tmp.path().join("none")).unwrap();
    assert_eq!(l, MemoryLimits::default());
    // No /proc/self/cgroup: physical memory only.
    let f = Fake::new(1 << 20, "");
    fs::remove_file(f.proc_root.join("self/cgroup")).unwrap();
    f.put("cgroup.controllers", b"memory\n");
    f.put("memory.max", b"1\n");
    let l = f.read().unwrap();
    assert_eq!((l.physical, l.max), (Some(G), None));
}

/// Each file holding garbage is a parse error naming that file.
#[test]
fn garbage_is_a_typed_error() {
    let garbage: [&[u8]; 7] = [
        b"",
        b"lots",
        b"-5",
        b"12 34",
        b"\xff\xfe",
        b"1e9",
        b"99999999999999999999999",
    ];
    for g in garbage {
        let f = Fake::new(1 << 20, "0::/a\n");
        f.put("cgroup.controllers", b"memory\n");
        let bad = f.put("a/memory.max", g);
        match f.read() {
            Err(LimitsError::Parse { path, .. }) => assert_eq!(path, bad),
            other => panic!("{g:?}: {other:?}"),
        }
        let f = Fake::new(1 << 20, "0::/a\n");
        f.put("cgroup.controllers", b"memory\n");
        let bad = f.put("a/memory.high", g);
        assert!(matches!(f.read(), Err(LimitsError::Parse { path, .. }) if path == bad));
    }
    for g in [
        "",
        "no colons",
        "x::/a",
        "0::relative",
        "0::/a/../../etc",
        "0:/a",
    ] {
        let f = Fake::new(1 << 20, g);
        if g.is_empty() {
            assert!(f.read().is_ok()); // an empty file names no cgroup
            continue;
        }
        let e = f.read().unwrap_err();
        assert!(
            matches!(&e, LimitsError::Parse { path, .. } if path.ends_with("self/cgroup")),
            "{g:?}: {e}"
        );
    }
    for g in [
        "",
        "MemFree: 5 kB\n",
        "MemTotal: 5\n",
        "MemTotal: -5 kB\n",
        "MemTotal: 99999999999999999999 kB\n",
    ] {
        let f = Fake::new(1, "");
        fs::write(f.proc_root.join("meminfo"), g).unwrap();
        assert!(
            matches!(f.read(), Err(LimitsError::Parse { path, .. }) if path.ends_with("meminfo")),
            "{g:?}"
        );
    }
    // MemTotal in kB that overflows u64 once multiplied by 1024.
    let f = Fake::new(u64::MAX / 1000, "");
    assert!(f.read().is_err());
}

/// A huge file is refused after 64 KiB, not read whole; a directory where
/// a file should be is an I/O error; the message quotes at most 64 bytes.
#[test]
fn huge_files_and_directories() {
    let f = Fake::new(1 << 20, "0::/a\n");
    f.put("cgroup.controllers", b"memory\n");
    f.put("a/memory.max", &vec![b'7'; 1 << 20]);
    let e = f.read().unwrap_err();
    let LimitsError::Parse { content, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(content.len(), 64);
    assert!(e.to_string().len() < 300);

    let f = Fake::new(1 << 20, "0::/a\n");
    f.put("cgroup.controllers", b"memory\n");
    fs::create_dir_all(f.cgroup.join("a/memory.max")).unwrap();
    let e = f.read().unwrap_err();
    assert!(
        matches!(&e, LimitsError::Io { path, .. } if path.ends_with("a/memory.max")),
        "{e}"
    );
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::IsADirectory
    );
}

fn files() -> [&'static str; 5] {
    [
        "meminfo",
        "self/cgroup",
        "memory.max",
        "a/memory.max",
        "a/memory.high",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Arbitrary bytes in any file: `read` returns, and an error names one
    /// of the files written.
    #[test]
    fn arbitrary_contents_never_panic(which in 0usize..5, bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let f = Fake::new(1 << 20, "0::/a\n");
        f.put("cgroup.controllers", b"memory\n");
        f.put("memory.max", b"max\n");
        f.put("a/memory.max", b"1048576\n");
        let rel = files()[which];
        let path: PathBuf = if which < 2 { f.proc_root.join(rel) } else { f.cgroup.join(rel) };
        fs::write(&path, &bytes).unwrap();
        match f.read() {
            Ok(l) => prop_assert!(l.physical.is_some() || which == 0),
            Err(LimitsError::Parse { path: p, .. }) => prop_assert_eq!(p, path),
            Err(e) => prop_assert!(false, "unexpected {}", e),
        }
    }

    /// Any number in a limit file: the capacity stays whole pages, at least
    /// one page and at most the budget.
    #[test]
    fn any_limit_any_capacity(max in any::<u64>(), high in any::<u64>(), mem_kb in 1u64..(1 << 40)) {
        let f = Fake::new(mem_kb, "0::/a\n");
        f.put("cgroup.controllers", b"memory\n");
        f.put("a/memory.max", max.to_string().as_bytes());
        f.put("a/memory.high", high.to_string().as_bytes());
        let l = f.read().unwrap();
        let (budget, _) = l.budget().unwrap();
        prop_assert_eq!(budget, max.min(high).min(mem_kb * 1024));
        let c = CapacityPolicy::default().capacity(&l);
        prop_assert!(c.bytes.is_multiple_of(4096) && c.bytes >= 4096);
        prop_assert!(c.bytes <= budget.max(4096));
    }
}

/// The real system: reading succeeds and physical memory is found.
#[test]
fn this_machine() {
    let l = MemoryLimits::from_system().unwrap();
    assert!(l.physical.is_some_and(|p| p > 0));
    let c = CapacityPolicy::default().capacity(&l);
    println!("limits {l:?}\ncapacity {c}");
    assert!(Path::new("/proc/meminfo").exists());
}
