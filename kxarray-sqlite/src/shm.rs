//! The WAL index in process memory: [`Shm`] (the regions and the eight
//! lock slots of one database, shared by its handles) and [`ShmHandle`]
//! (one handle's view: the locks it holds).
//!
//! No `-shm` file is made: the other processes that could share one are
//! kept out by the database's OFD lock (see `inode`). After a crash
//! the index is gone with the process, and the next opener (this VFS with
//! zeroed regions, or the unix VFS with a fresh `-shm`) rebuilds it from
//! the WAL, as SQLite does after any crash.
//!
//! Invariants:
//! - a region, once allocated, keeps its address and size until the
//!   `Shm` is dropped (when the last handle unmaps), so pointers SQLite
//!   holds stay valid while it may use them; all regions have one size;
//! - lock slot `i` is 0 (free), `n > 0` (held shared by `n` handles) or
//!   -1 (held exclusive by one handle); a handle's masks say which slots
//!   it holds, and an exclusive lock is granted only on free slots.

use crate::ffi::{
    SQLITE_BUSY, SQLITE_IOERR_SHMMAP, SQLITE_OK, SQLITE_SHM_EXCLUSIVE, SQLITE_SHM_LOCK,
    SQLITE_SHM_NLOCK, SQLITE_SHM_SHARED, SQLITE_SHM_UNLOCK,
};
use std::alloc::Layout;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

/// Alignment of a region (SQLite reads 32-bit and 64-bit words in them).
const REGION_ALIGN: usize = 4096;

struct Regions {
    size: usize,
    list: Vec<NonNull<u8>>,
}

/// The WAL index of one database.
pub(crate) struct Shm {
    regions: Mutex<Regions>,
    slots: Mutex<[i32; SQLITE_SHM_NLOCK as usize]>,
}

// SAFETY: the raw region pointers are only allocated, handed to SQLite and
// freed (on drop) by this type, under its mutex; their bytes are accessed
// by SQLite alone, which synchronizes with the shm locks and barriers.
unsafe impl Send for Shm {}
// SAFETY: as above; every field is behind a mutex.
unsafe impl Sync for Shm {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shm {
    pub(crate) fn new() -> Shm {
        Shm {
            regions: Mutex::new(Regions {
                size: 0,
                list: Vec::new(),
            }),
            slots: Mutex::new([0; SQLITE_SHM_NLOCK as usize]),
        }
    }

    /// Region `index` of `size` bytes (`xShmMap`): its address, null when it
    /// does not exist and `extend` is false, or an error code (a size
    /// different from the first region's, or out of memory).
    pub(crate) fn map(
        &self,
        index: usize,
        size: usize,
        extend: bool,
    ) -> Result<*mut c_void, c_int> {
        let mut r = lock(&self.regions);
        if r.list.is_empty() {
            r.size = size;
        }
        if size != r.size || size == 0 {
            return Err(SQLITE_IOERR_SHMMAP);
        }
        if index >= r.list.len() {
            if !extend {
                return Ok(std::ptr::null_mut());
            }
            let layout =
                Layout::from_size_align(size, REGION_ALIGN).map_err(|_| SQLITE_IOERR_SHMMAP)?;
            while r.list.len() <= index {
                // SAFETY: `layout` has a non-zero size (checked above).
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                let Some(p) = NonNull::new(p) else {
                    return Err(SQLITE_IOERR_SHMMAP);
                };
                r.list.push(p);
            }
        }
        Ok(r.list[index].as_ptr().cast())
    }

    /// Regions allocated now.
    #[cfg(test)]
    pub(crate) fn regions(&self) -> usize {
        lock(&self.regions).list.len()
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let r = lock(&self.regions);
        if let Ok(layout) = Layout::from_size_align(r.size, REGION_ALIGN) {
            for p in &r.list {
                // SAFETY: every region was allocated with this layout (all
                // regions have `r.size` bytes) and is freed once, here.
                unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
            }
        }
    }
}

/// One handle's attachment to a [`Shm`].
pub(crate) struct ShmHandle {
    pub(crate) shm: Arc<Shm>,
    shared: u8,
    exclusive: u8,
}

impl ShmHandle {
    pub(crate) fn new(shm: Arc<Shm>) -> ShmHandle {
        ShmHandle {
            shm,
            shared: 0,
            exclusive: 0,
        }
    }

    /// `xShmLock(offset, n, flags)`: `SQLITE_OK`, `SQLITE_BUSY`, or
    /// `SQLITE_MISUSE`-like refusal as `SQLITE_IOERR_SHMMAP` for a range
    /// outside the eight slots.
    pub(crate) fn lock(&mut self, offset: c_int, n: c_int, flags: c_int) -> c_int {
        if offset < 0 || n < 1 || offset + n > SQLITE_SHM_NLOCK {
            return SQLITE_IOERR_SHMMAP;
        }
        let (from, to) = (offset as usize, (offset + n) as usize);
        let mask: u8 = (((1u16 << n) - 1) << offset) as u8;
        let mut slots = lock(&self.shm.slots);
        if flags & SQLITE_SHM_UNLOCK != 0 {
            if flags & SQLITE_SHM_SHARED != 0 {
                for (i, s) in slots.iter_mut().enumerate().take(to).skip(from) {
                    if self.shared & (1 << i) != 0 {
                        *s -= 1;
                    }
                }
                self.shared &= !mask;
            } else {
                for (i, s) in slots.iter_mut().enumerate().take(to).skip(from) {
                    if self.exclusive & (1 << i) != 0 {
                        *s = 0;
                    }
                }
                self.exclusive &= !mask;
            }
            return SQLITE_OK;
        }
        debug_assert!(flags & SQLITE_SHM_LOCK != 0);
        if flags & SQLITE_SHM_SHARED != 0 {
            // n == 1 for shared locks
            if self.shared & mask == mask {
                return SQLITE_OK;
            }
            if slots[from] < 0 {
                return SQLITE_BUSY;
            }
            slots[from] += 1;
            self.shared |= mask;
            return SQLITE_OK;
        }
        debug_assert!(flags & SQLITE_SHM_EXCLUSIVE != 0);
        for i in from..to {
            let mine = self.exclusive & (1 << i) != 0;
            if slots[i] != 0 && !mine {
                return SQLITE_BUSY;
            }
        }
        for s in &mut slots[from..to] {
            *s = -1;
        }
        self.exclusive |= mask;
        SQLITE_OK
    }
}

impl Drop for ShmHandle {
    fn drop(&mut self) {
        // Release whatever the handle still holds.
        let mut slots = lock(&self.shm.slots);
        for (i, s) in slots.iter_mut().enumerate() {
            if self.exclusive & (1 << i) != 0 {
                *s = 0;
            } else if self.shared & (1 << i) != 0 {
                *s -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_stable_and_zeroed() {
        let s = Shm::new();
        assert_eq!(s.map(0, 32768, false), Ok(std::ptr::null_mut()));
        let a = s.map(0, 32768, true).unwrap();
        let c = s.map(2, 32768, true).unwrap();
        assert_eq!(s.regions(), 3);
        assert_eq!(s.map(0, 32768, false).unwrap(), a);
        assert_eq!(s.map(2, 32768, false).unwrap(), c);
        // SAFETY: region 2 has 32768 bytes, zeroed.
        assert!(unsafe { std::slice::from_raw_parts(c.cast::<u8>(), 32768) }
            .iter()
            .all(|&b| b == 0));
        assert_eq!(s.map(1, 4096, true), Err(SQLITE_IOERR_SHMMAP));
    }

    #[test]
    fn lock_slots() {
        let shm = Arc::new(Shm::new());
        let mut a = ShmHandle::new(Arc::clone(&shm));
        let mut b = ShmHandle::new(Arc::clone(&shm));
        let l = SQLITE_SHM_LOCK;
        let u = SQLITE_SHM_UNLOCK;
        let (sh, ex) = (SQLITE_SHM_SHARED, SQLITE_SHM_EXCLUSIVE);
        assert_eq!(a.lock(3, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(3, 1, l | sh), SQLITE_OK);
        assert_eq!(b.lock(3, 1, l | ex), SQLITE_BUSY);
        assert_eq!(a.lock(3, 1, u | sh), SQLITE_OK);
        assert_eq!(b.lock(0, 1, l | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 1, l | sh), SQLITE_BUSY);
        assert_eq!(a.lock(0, 8, l | ex), SQLITE_BUSY);
        drop(b); // releases slot 0 (exclusive) and 3 (shared)
        assert_eq!(a.lock(0, 8, l | ex), SQLITE_OK);
        assert_eq!(a.lock(0, 8, u | ex), SQLITE_OK);
        assert_eq!(*lock(&shm.slots), [0; 8]);
        assert_eq!(a.lock(7, 2, l | ex), SQLITE_IOERR_SHMMAP);
    }
}
