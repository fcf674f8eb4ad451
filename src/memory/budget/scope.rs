//! Where a shared budget applies and how full it is: the [`Scope`] (the
//! cgroup whose memory limit binds this process, or the machine when no
//! cgroup limits it) and its [`Usage`] now.
//!
//! Owns the choice of the registry key and the reading of a scope's usage:
//! cgroup v1 `memory.usage_in_bytes`, `memory.limit_in_bytes` and
//! `memory.stat`; cgroup v2 `memory.current`, `memory.max`, `memory.high`
//! and `memory.stat`; `/proc/meminfo`'s `MemTotal` and `MemAvailable` for
//! the machine. Invariants: processes limited by the same cgroup get the
//! same key (the cgroup that holds the binding limit, not each one's own
//! leaf); an absent file is "not known", a present file that does not
//! parse is a [`LimitsError`] naming it, never a panic; the reclaimable
//! part of a cgroup's usage is its file-backed LRU pages (the kernel drops
//! those before it kills), never more than the usage.

use crate::memory::cgroup::{self, CgroupDir};
use crate::memory::error::LimitsError;
use std::path::{Path, PathBuf};

/// Which kind of limit a [`Scope`] follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScopeKind {
    /// A cgroup v1 memory controller directory
    /// (`/sys/fs/cgroup/memory/...`) with a `memory.limit_in_bytes`.
    CgroupV1,
    /// A cgroup v2 directory with a `memory.max` or `memory.high`.
    CgroupV2,
    /// No cgroup limits the process: the machine's memory.
    Machine,
}

/// The set of processes that share one budget, and where its usage is
/// read.
///
/// ```
/// use kxarray::memory::{Scope, ScopeKind};
/// use std::fs;
///
/// // A process in /ctr/app of a cgroup v2 tree whose /ctr is limited to 1 GiB.
/// let tmp = tempfile::tempdir().unwrap();
/// let (proc_root, cg) = (tmp.path().join("proc"), tmp.path().join("cgroup"));
/// fs::create_dir_all(proc_root.join("self")).unwrap();
/// fs::write(proc_root.join("self/cgroup"), "0::/ctr/app\n").unwrap();
/// fs::create_dir_all(cg.join("ctr/app")).unwrap();
/// fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
/// fs::write(cg.join("ctr/memory.max"), "1073741824\n").unwrap();
/// fs::write(cg.join("ctr/memory.current"), "104857600\n").unwrap();
/// fs::write(cg.join("ctr/memory.stat"), "anon 62914560\nactive_file 20971520\ninactive_file 20971520\n").unwrap();
///
/// let scope = Scope::locate(&proc_root, &cg).unwrap();
/// assert_eq!((scope.kind, scope.key.as_str()), (ScopeKind::CgroupV2, "cgroup-v2:/ctr"));
/// let u = scope.usage().unwrap();
/// assert_eq!((u.limit, u.usage, u.reclaimable), (1 << 30, 100 << 20, 40 << 20));
/// assert_eq!(u.unreclaimable(), 60 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The registry key: `cgroup-v1:/path`, `cgroup-v2:/path` (the cgroup
    /// holding the binding limit, relative to its hierarchy's mount) or
    /// `machine`.
    pub key: String,
    /// What kind of limit it follows.
    pub kind: ScopeKind,
    /// The cgroup directory (`None` for the machine).
    pub dir: Option<PathBuf>,
    /// Where `meminfo` is read (`proc_root/meminfo`).
    meminfo: PathBuf,
}

/// A scope's memory now, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The limit: the cgroup's (the lower of `memory.max` and
    /// `memory.high` on v2), or physical memory; never above physical
    /// memory when that is known.
    pub limit: u64,
    /// Memory charged now (cgroup usage, or `MemTotal - MemAvailable`).
    pub usage: u64,
    /// The part of `usage` the kernel reclaims before it kills: file pages
    /// on its LRU lists (`active_file + inactive_file`, hierarchical on
    /// v1); zero for the machine, whose `MemAvailable` already counts them.
    pub reclaimable: u64,
}

impl Usage {
    /// The memory the kernel cannot take back without a kill:
    /// `usage - reclaimable`.
    pub fn unreclaimable(&self) -> u64 {
        self.usage.saturating_sub(self.reclaimable)
    }
}

impl Scope {
    /// The scope of this process: [`locate`](Self::locate) on `/proc` and
    /// `/sys/fs/cgroup`.
    ///
    /// # Errors
    /// As [`locate`](Self::locate).
    pub fn from_system() -> Result<Scope, LimitsError> {
        Scope::locate(Path::new("/proc"), Path::new("/sys/fs/cgroup"))
    }

    /// The scope of the process described by `proc_root/self/cgroup`: the
    /// cgroup (its own or an ancestor) with the tightest memory limit, in
    /// the v1 memory hierarchy if `/proc/self/cgroup` names one, else in
    /// the v2 hierarchy; the machine if no cgroup is limited.
    ///
    /// # Errors
    /// A [`LimitsError`] naming a file that exists but does not parse.
    pub fn locate(proc_root: &Path, cgroup_root: &Path) -> Result<Scope, LimitsError> {
        let dirs = cgroup::locate(proc_root, cgroup_root)?;
        let meminfo = proc_root.join("meminfo");
        let found = if let Some(dir) = &dirs.v1_memory {
            binding(dir, &["memory.limit_in_bytes"], cgroup::parse_v1_limit)?
                .map(|(depth, path)| (ScopeKind::CgroupV1, depth, path, dir))
        } else if let Some(dir) = &dirs.v2 {
            binding(dir, &["memory.max", "memory.high"], cgroup::parse_v2_limit)?
                .map(|(depth, path)| (ScopeKind::CgroupV2, depth, path, dir))
        } else {
            None
        };
        Ok(match found {
            Some((kind, depth, path, dir)) => {
                let prefix = if kind == ScopeKind::CgroupV1 {
                    "cgroup-v1:/"
                } else {
                    "cgroup-v2:/"
                };
                Scope {
                    key: format!("{prefix}{}", dir.components[..depth].join("/")),
                    kind,
                    dir: Some(path),
                    meminfo,
                }
            }
            None => Scope {
                key: "machine".into(),
                kind: ScopeKind::Machine,
                dir: None,
                meminfo,
            },
        })
    }

    /// The scope's limit, usage and reclaimable part now.
    ///
    /// # Errors
    /// A [`LimitsError`] naming a file that cannot be read or does not
    /// parse; the usage file absent (a removed cgroup) is an error too.
    pub fn usage(&self) -> Result<Usage, LimitsError> {
        let mem = read_meminfo(&self.meminfo)?;
        let physical = mem.map(|(total, _)| total);
        let Some(dir) = &self.dir else {
            let (total, available) = mem.ok_or_else(|| absent(&self.meminfo))?;
            return Ok(Usage {
                limit: total,
                usage: total.saturating_sub(available),
                reclaimable: 0,
            });
        };
        let (usage_file, limits, parse, prefix): (_, &[&str], fn(&[u8]) -> _, _) = match self.kind {
            ScopeKind::CgroupV1 => (
                "memory.usage_in_bytes",
                &["memory.limit_in_bytes"],
                cgroup::parse_v1_limit,
                "total_",
            ),
            _ => (
                "memory.current",
                &["memory.max", "memory.high"],
                cgroup::parse_v2_limit,
                "",
            ),
        };
        let usage = read_number(&dir.join(usage_file))?;
        let mut limit = physical.unwrap_or(u64::MAX);
        for name in limits {
            let path = dir.join(name);
            if let Some(bytes) = cgroup::read_small(&path)? {
                match parse(&bytes) {
                    Some(Some(v)) => limit = limit.min(v),
                    Some(None) => {}
                    None => return Err(LimitsError::parse(path, &bytes, LIMIT)),
                }
            }
        }
        let stat_path = dir.join("memory.stat");
        let reclaimable = match cgroup::read_small(&stat_path)? {
            None => 0,
            Some(bytes) => {
                let text = std::str::from_utf8(&bytes)
                    .map_err(|_| LimitsError::parse(stat_path.clone(), &bytes, STAT))?;
                let field = |name: &str| -> Result<u64, LimitsError> {
                    let full = format!("{prefix}{name}");
                    stat_field(text, &full)
                        .or_else(|| stat_field(text, name))
                        .transpose()
                        .map(|v| v.unwrap_or(0))
                        .map_err(|()| LimitsError::parse(stat_path.clone(), &bytes, STAT))
                };
                field("active_file")?.saturating_add(field("inactive_file")?)
            }
        };
        Ok(Usage {
            limit,
            usage,
            reclaimable: reclaimable.min(usage),
        })
    }
}

const LIMIT: &str = "\"max\" or a decimal number of bytes";
const STAT: &str = "lines `name value`";

/// The tightest limit among `names` in `dir` and its ancestors: its depth
/// below the mount and its directory; `None` if no file there limits.
fn binding(
    dir: &CgroupDir,
    names: &[&str],
    parse: fn(&[u8]) -> Option<Option<u64>>,
) -> Result<Option<(usize, PathBuf)>, LimitsError> {
    let mut best: Option<(u64, usize)> = None;
    for depth in (0..=dir.components.len()).rev() {
        let at = dir.ancestor(depth);
        for name in names {
            let file = at.join(name);
            let Some(bytes) = cgroup::read_small(&file)? else {
                continue;
            };
            match parse(&bytes) {
                None => return Err(LimitsError::parse(file, &bytes, LIMIT)),
                Some(None) => {}
                Some(Some(v)) => {
                    if best.is_none_or(|(b, _)| v < b) {
                        best = Some((v, depth));
                    }
                }
            }
        }
    }
    Ok(best.map(|(_, depth)| (depth, dir.ancestor(depth))))
}

/// The value of `name` in a `memory.stat` text: `None` if absent,
/// `Some(Err(()))` if present but not a number.
fn stat_field(text: &str, name: &str) -> Option<Result<u64, ()>> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(name)).then(|| it.next().and_then(cgroup::decimal).ok_or(()))
    })
}

fn absent(path: &Path) -> LimitsError {
    LimitsError::Io {
        path: path.to_path_buf(),
        source: std::io::ErrorKind::NotFound.into(),
    }
}

/// A file holding one decimal number (absent is an error).
fn read_number(path: &Path) -> Result<u64, LimitsError> {
    let bytes = cgroup::read_small(path)?.ok_or_else(|| absent(path))?;
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(|t| cgroup::decimal(t.trim()))
        .ok_or_else(|| LimitsError::parse(path.to_path_buf(), &bytes, "a decimal number of bytes"))
}

/// `MemTotal` and `MemAvailable` (`MemFree` on kernels without it) in
/// bytes; `None` if the file is absent.
fn read_meminfo(path: &Path) -> Result<Option<(u64, u64)>, LimitsError> {
    let Some(bytes) = cgroup::read_small(path)? else {
        return Ok(None);
    };
    let bad = || LimitsError::parse(path.to_path_buf(), &bytes, "lines `MemTotal: <n> kB`");
    let text = std::str::from_utf8(&bytes).map_err(|_| bad())?;
    let kb = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)).map(|rest| {
            rest.trim()
                .strip_suffix("kB")
                .and_then(|n| cgroup::decimal(n.trim()))
                .and_then(|n| n.checked_mul(1024))
        })
    };
    let total = kb("MemTotal:").flatten().ok_or_else(bad)?;
    let available = match kb("MemAvailable:").or_else(|| kb("MemFree:")) {
        Some(Some(v)) => v,
        Some(None) => return Err(bad()),
        None => total,
    };
    Ok(Some((total, available.min(total))))
}

// Fake cgroup trees in real directories: not under Miri's isolation.
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::fs;

    fn tree(cgroup: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let (p, c) = (tmp.path().join("proc"), tmp.path().join("cg"));
        fs::create_dir_all(p.join("self")).unwrap();
        fs::write(p.join("self/cgroup"), cgroup).unwrap();
        fs::write(
            p.join("meminfo"),
            "MemTotal: 8388608 kB\nMemFree: 1 kB\nMemAvailable: 6291456 kB\n",
        )
        .unwrap();
        (tmp, p, c)
    }

    /// cgroup v1: the limited ancestor is the key; `total_` fields count.
    #[test]
    fn v1_scope_is_the_limited_ancestor() {
        let (_t, p, c) = tree("4:memory:/svc/worker1\n0::/\n");
        let w = c.join("memory/svc/worker1");
        fs::create_dir_all(&w).unwrap();
        fs::write(
            c.join("memory/memory.limit_in_bytes"),
            "9223372036854771712",
        )
        .unwrap();
        fs::write(c.join("memory/svc/memory.limit_in_bytes"), "536870912\n").unwrap();
        fs::write(w.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        fs::write(c.join("memory/svc/memory.usage_in_bytes"), "314572800\n").unwrap();
        fs::write(
            c.join("memory/svc/memory.stat"),
            "cache 1\ninactive_file 5\ntotal_inactive_file 52428800\ntotal_active_file 52428800\n",
        )
        .unwrap();
        let s = Scope::locate(&p, &c).unwrap();
        assert_eq!(s.key, "cgroup-v1:/svc");
        assert_eq!(s.dir.as_deref(), Some(c.join("memory/svc").as_path()));
        let u = s.usage().unwrap();
        assert_eq!(
            (u.limit, u.usage, u.reclaimable),
            (512 << 20, 300 << 20, 100 << 20)
        );
        // a sibling worker shares the key
        let (_t2, p2, _) = tree("4:memory:/svc/worker2\n");
        fs::create_dir_all(c.join("memory/svc/worker2")).unwrap();
        assert_eq!(Scope::locate(&p2, &c).unwrap().key, "cgroup-v1:/svc");
    }

    /// No limit anywhere: the machine, from meminfo.
    #[test]
    fn machine_scope() {
        let (_t, p, c) = tree("0::/\n");
        fs::create_dir_all(&c).unwrap();
        fs::write(c.join("cgroup.controllers"), "memory").unwrap();
        fs::write(c.join("memory.max"), "max").unwrap();
        let s = Scope::locate(&p, &c).unwrap();
        assert_eq!((s.kind, s.key.as_str()), (ScopeKind::Machine, "machine"));
        let u = s.usage().unwrap();
        assert_eq!((u.limit, u.usage, u.reclaimable), (8 << 30, 2 << 30, 0));
    }

    /// v2: `memory.high` below `memory.max` is the limit; garbage is an
    /// error naming the file; a removed cgroup is an error.
    #[test]
    fn v2_high_and_garbage() {
        let (_t, p, c) = tree("0::/a\n");
        fs::create_dir_all(c.join("a")).unwrap();
        fs::write(c.join("cgroup.controllers"), "memory").unwrap();
        fs::write(c.join("a/memory.max"), "2147483648").unwrap();
        fs::write(c.join("a/memory.high"), "1073741824").unwrap();
        fs::write(c.join("a/memory.current"), "10").unwrap();
        let s = Scope::locate(&p, &c).unwrap();
        assert_eq!(s.usage().unwrap().limit, 1 << 30);
        fs::write(c.join("a/memory.stat"), "active_file lots\n").unwrap();
        let e = s.usage().unwrap_err();
        assert!(e.to_string().contains("memory.stat"), "{e}");
        fs::write(c.join("a/memory.stat"), "active_file 99\n").unwrap();
        assert_eq!(s.usage().unwrap().reclaimable, 10); // never above usage
        fs::remove_file(c.join("a/memory.current")).unwrap();
        assert!(s.usage().is_err());
        fs::write(c.join("a/memory.high"), "\u{0}\u{ff}").unwrap();
        assert!(Scope::locate(&p, &c).is_err());
    }
}
