//! The process's table of open inodes, one per file (`(st_dev, st_ino)`):
//! what opens share, what a journal or WAL finds its database by, and what
//! the process writes back at `exit`. Owns the table and its lock.
//! Invariants: an inode is in the table while a handle of it is open
//! (counted in `opens`, changed under the table's lock only); a child
//! after `fork` forgets its parent's entries before its first use.

use super::{lock, Inode, Key, WritePolicy};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The process table, locked. In a child process after `fork` the
/// parent's entries are forgotten first (leaked: their descriptors share
/// the parent's open file descriptions and OFD locks, which the child must
/// neither use nor release; their caches may hold the parent's unwritten
/// pages).
fn table() -> MutexGuard<'static, HashMap<Key, Arc<Inode>>> {
    this_process(lock(table_cell()))
}

type Table = Mutex<HashMap<Key, Arc<Inode>>>;

fn table_cell() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        // SAFETY: `at_exit` is a plain function that never unwinds.
        unsafe { libc::atexit(at_exit) };
        Mutex::new(HashMap::new())
    })
}

/// At the process's `exit` (a return from `main`, `exit(3)`: not a
/// signal), write back every database's deferred writes, as the kernel's
/// page cache keeps what a unix-VFS process wrote when it exits. (A kill
/// loses them, and the journal or WAL SQLite relies on until its sync
/// point still holds them: see `file`.) The table is skipped when another
/// thread holds it. (Registered with `atexit` from the library itself:
/// glibc runs it at `dlclose` too, and the loadable extension asks to stay
/// loaded anyway.)
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Ok(t) = table_cell().try_lock() else {
            return;
        };
        let t = this_process(t);
        for inode in t.values() {
            if inode.policy == WritePolicy::AtSyncPoint
                && !crate::sqlite::process::write_back_only()
            {
                let _ = inode.file.write_back(0..u64::MAX);
            }
            inode.abandon_change();
        }
        // (The process stays a member of the shared cache to its end:
        // another thread, the budget's, may hold a frame's lock at this
        // moment, which only a recovery of this member can take back.)
    });
}

/// The table of this process: a child's after `fork` forgets its parent's
/// (see [`table`]).
fn this_process(
    mut t: MutexGuard<'static, HashMap<Key, Arc<Inode>>>,
) -> MutexGuard<'static, HashMap<Key, Arc<Inode>>> {
    // the fork generation: one load, where `getpid` is a system call
    static GEN: AtomicU64 = AtomicU64::new(0);
    let gen = kxarray::fork::generation();
    if GEN.swap(gen, Ordering::Relaxed) != gen {
        std::mem::forget(std::mem::take(&mut *t));
    }
    t
}

/// The inode of `key` if the process has it open (one more open counted),
/// else the one `make` builds (inserted with one open). `make` runs under
/// the table's lock, so two opens of one new file build one inode.
///
/// # Errors
/// `make`'s error.
pub(crate) fn open_or_insert<E>(
    key: Key,
    make: impl FnOnce() -> Result<Inode, E>,
) -> Result<Arc<Inode>, E> {
    let mut t = table();
    if let Some(i) = t.get(&key) {
        i.opens.fetch_add(1, Ordering::Relaxed);
        return Ok(Arc::clone(i));
    }
    let inode = Arc::new(make()?);
    inode.opens.store(1, Ordering::Relaxed);
    t.insert(key, Arc::clone(&inode));
    Ok(inode)
}

/// Count one handle of `inode` closed; the last one writes the file back,
/// releases the OFD lock and takes the inode out of the table, all under
/// the table's lock, so an open of the same file in the meantime either
/// shares this inode or finds no lock of the process's own in its way.
pub(crate) fn close(key: Option<Key>, inode: Arc<Inode>) {
    let Some(key) = key else { return };
    let mut t = table();
    if inode.opens.fetch_sub(1, Ordering::Relaxed) == 1 {
        inode.shut();
        if t.get(&key).is_some_and(|i| Arc::ptr_eq(i, &inode)) {
            t.remove(&key);
        }
        // The last reference, normally: its descriptors close here, under
        // the lock, too.
        drop(inode);
    }
}

/// The inode of `key` if the process has it open (no open counted: for a
/// journal or WAL to reach its database).
pub(crate) fn find(key: Key) -> Option<Arc<Inode>> {
    table().get(&key).cloned()
}

/// The one database the process has open by the name `name` (the name of
/// its first open, which SQLite makes the names of its journal and WAL
/// from): `None` when there is none, or several (a file replaced under
/// its name, opened again).
pub(crate) fn db_named(name: &[u8]) -> Option<Arc<Inode>> {
    use std::os::unix::ffi::OsStrExt;
    let t = table();
    let mut found = t
        .values()
        .filter(|i| i.is_db && i.path.as_os_str().as_bytes() == name);
    let one = found.next()?;
    found.next().is_none().then(|| Arc::clone(one))
}

/// Files the process has open through the VFS (for tests and stats).
pub fn open_files() -> usize {
    table().len()
}

/// Of them, the databases whose pages are in the shared cache.
pub(crate) fn shared_files() -> usize {
    table()
        .values()
        .filter(|i| i.file.shared_file().is_some())
        .count()
}
