//! A small VFS shim that splits each main database into chunk files of
//! [`CHUNK`] bytes (`name`, `name001`, `name002`...), as SQLite's multiplex
//! shim (`test_multiplex.c`) does, over another VFS: every lock, every file
//! control (`SQLITE_FCNTL_SYNC` included), the sector size, the device
//! characteristics and the WAL index go to chunk 0 only; `xSync` reaches
//! every open chunk; reads and writes go to the chunk their offset falls
//! in. Journals, WALs and temporary files are one chunk. Registered as
//! `split-<base>`.

use rusqlite::ffi;
use std::alloc::Layout;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::Mutex;

/// The chunk size (a multiple of every page size).
pub(crate) const CHUNK: i64 = 1 << 20;

/// The file object: SQLite's base, then the shim's state (written in place
/// by `x_open`, dropped by `x_close`).
#[repr(C)]
struct SplitFile {
    base: ffi::sqlite3_file,
    below: *mut ffi::sqlite3_vfs,
    /// The name SQLite passed (chunk 0 is opened by it, URI parameters
    /// and all).
    name0: *const c_char,
    /// Chunk `i`'s name for `i >= 1`: the name, three digits, and NULs
    /// enough that `sqlite3_uri_parameter` finds no parameter after it.
    names: Vec<Vec<u8>>,
    flags: c_int,
    chunked: bool,
    /// The open chunks (null: not open).
    chunks: Vec<*mut ffi::sqlite3_file>,
}

fn below(f: &SplitFile) -> &ffi::sqlite3_vfs {
    // SAFETY: the VFS below is registered for the life of the process.
    unsafe { &*f.below }
}

fn chunk_name(f: &mut SplitFile, i: usize) -> *const c_char {
    if i == 0 {
        return f.name0;
    }
    while f.names.len() < i {
        // SAFETY: `name0` is SQLite's NUL-terminated name.
        let mut n = unsafe { CStr::from_ptr(f.name0) }.to_bytes().to_vec();
        n.extend_from_slice(format!("{:03}", f.names.len() + 1).as_bytes());
        n.extend_from_slice(&[0, 0, 0, 0]);
        f.names.push(n);
    }
    f.names[i - 1].as_ptr().cast()
}

fn os_file_layout(v: &ffi::sqlite3_vfs) -> Layout {
    Layout::from_size_align(v.szOsFile.max(8) as usize, 16).unwrap()
}

/// Chunk `i`, opened if needed; with `create` false, null when the chunk
/// file does not exist (`Err` for an open's failure).
fn chunk(f: &mut SplitFile, i: usize, create: bool) -> Result<*mut ffi::sqlite3_file, c_int> {
    if f.chunks.len() <= i {
        f.chunks.resize(i + 1, null_mut());
    }
    if !f.chunks[i].is_null() {
        return Ok(f.chunks[i]);
    }
    let name = chunk_name(f, i);
    let v = below(f);
    if i > 0 && !create {
        let mut exists = 0;
        // SAFETY: the VFS's own method, a NUL-terminated name.
        let rc =
            unsafe { v.xAccess.unwrap()(f.below, name, ffi::SQLITE_ACCESS_EXISTS, &mut exists) };
        if rc != 0 || exists == 0 {
            return Ok(null_mut());
        }
    }
    let layout = os_file_layout(v);
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<ffi::sqlite3_file>();
    assert!(!p.is_null());
    let flags = if i == 0 {
        f.flags
    } else {
        f.flags | ffi::SQLITE_OPEN_CREATE
    };
    let mut out = 0;
    // SAFETY: `p` has szOsFile bytes; the name lives as long as the chunk.
    let rc = unsafe { v.xOpen.unwrap()(f.below, name, p, flags, &mut out) };
    // SAFETY: xOpen filled `p` in (pMethods null on failure).
    if rc != 0 || unsafe { (*p).pMethods }.is_null() {
        // SAFETY: allocated above with `layout`.
        unsafe { std::alloc::dealloc(p.cast(), layout) };
        return Err(if rc != 0 { rc } else { ffi::SQLITE_CANTOPEN });
    }
    f.chunks[i] = p;
    Ok(p)
}

/// The shim's state behind `file`.
///
/// # Safety
/// `file` is a file `x_open` opened and `x_close` has not closed.
unsafe fn state<'a>(file: *mut ffi::sqlite3_file) -> &'a mut SplitFile {
    // SAFETY: per the caller.
    unsafe { &mut *file.cast::<SplitFile>() }
}

fn methods(c: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: an open chunk (its object lives while it is open) ...
    let m = unsafe { (*c).pMethods };
    // SAFETY: ... and its methods with it.
    unsafe { &*m }
}

/// Where byte `off` lies: (chunk, offset in it, bytes left in the chunk).
fn place(f: &SplitFile, off: i64) -> (usize, i64, i64) {
    if f.chunked {
        ((off / CHUNK) as usize, off % CHUNK, CHUNK - off % CHUNK)
    } else {
        (0, off, i64::MAX)
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file once.
    let f = unsafe { state(file) };
    let layout = os_file_layout(below(f));
    let mut rc = 0;
    for &c in &f.chunks {
        if !c.is_null() {
            // SAFETY: an open chunk, closed once.
            let r = unsafe { methods(c).xClose.unwrap()(c) };
            if rc == 0 {
                rc = r;
            }
            // SAFETY: allocated by `chunk` with this layout.
            unsafe { std::alloc::dealloc(c.cast(), layout) };
        }
    }
    // SAFETY: written whole by x_open; dropped once.
    unsafe { std::ptr::drop_in_place(f) };
    rc
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    // SAFETY: a file of this shim.
    let f = unsafe { state(file) };
    let (mut done, amt) = (0i64, i64::from(amt));
    while done < amt {
        let (i, o, room) = place(f, off + done);
        let n = (amt - done).min(room);
        // SAFETY: inside SQLite's buffer of `amt` bytes.
        let at = unsafe { buf.cast::<u8>().add(done as usize) };
        let c = match chunk(f, i, false) {
            Ok(c) if !c.is_null() => c,
            Ok(_) => {
                // SAFETY: the rest of SQLite's buffer.
                unsafe { at.write_bytes(0, (amt - done) as usize) };
                return ffi::SQLITE_IOERR_SHORT_READ;
            }
            Err(rc) => return rc,
        };
        // SAFETY: the chunk's own method, `n` bytes of the buffer.
        let rc = unsafe { methods(c).xRead.unwrap()(c, at.cast(), n as c_int, o) };
        if rc != 0 {
            if rc == ffi::SQLITE_IOERR_SHORT_READ {
                // SAFETY: past this piece (the chunk zeroed its own part).
                let rest = unsafe { at.add(n as usize) };
                // SAFETY: to the end of SQLite's buffer.
                unsafe { rest.write_bytes(0, (amt - done - n) as usize) };
            }
            return rc;
        }
        done += n;
    }
    0
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    // SAFETY: a file of this shim.
    let f = unsafe { state(file) };
    let (mut done, amt) = (0i64, i64::from(amt));
    while done < amt {
        let (i, o, room) = place(f, off + done);
        let n = (amt - done).min(room);
        let c = match chunk(f, i, true) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        // SAFETY: inside SQLite's buffer of `amt` bytes.
        let at = unsafe { buf.cast::<u8>().add(done as usize) };
        // SAFETY: the chunk's own method.
        let rc = unsafe { methods(c).xWrite.unwrap()(c, at.cast(), n as c_int, o) };
        if rc != 0 {
            return rc;
        }
        done += n;
    }
    0
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: a file of this shim.
    let f = unsafe { state(file) };
    let (k, r, _) = place(f, size);
    let mut i = 0;
    loop {
        let c = match chunk(f, i, false) {
            Ok(c) => c,
            Err(rc) => return rc,
        };
        if c.is_null() && i > k {
            return 0;
        }
        if !c.is_null() && i >= k {
            let to = if i == k { r } else { 0 };
            // SAFETY: the chunk's own method.
            let rc = unsafe { methods(c).xTruncate.unwrap()(c, to) };
            if rc != 0 {
                return rc;
            }
        }
        i += 1;
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: a file of this shim.
    let f = unsafe { state(file) };
    for &c in &f.chunks {
        if !c.is_null() {
            // SAFETY: the chunk's own method.
            let rc = unsafe { methods(c).xSync.unwrap()(c, flags) };
            if rc != 0 {
                return rc;
            }
        }
    }
    0
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, out: *mut i64) -> c_int {
    // SAFETY: a file of this shim.
    let f = unsafe { state(file) };
    let mut total = 0;
    for i in 0.. {
        let c = match chunk(f, i, false) {
            Ok(c) if c.is_null() => break,
            Ok(c) => c,
            Err(rc) => return rc,
        };
        let mut n = 0;
        // SAFETY: the chunk's own method.
        let rc = unsafe { methods(c).xFileSize.unwrap()(c, &mut n) };
        if rc != 0 {
            return rc;
        }
        if n > 0 {
            total = i as i64 * CHUNK + n;
        }
        if !f.chunked {
            break;
        }
    }
    // SAFETY: SQLite passes a writable i64.
    unsafe { *out = total };
    0
}

/// Chunk 0 (open while the file is).
fn first(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: a file of this shim; chunk 0 was opened by x_open.
    unsafe { state(file) }.chunks[0]
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, l: c_int) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xLock.unwrap()(c, l) }
}
unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, l: c_int) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xUnlock.unwrap()(c, l) }
}
unsafe extern "C" fn x_check_reserved(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xCheckReservedLock.unwrap()(c, out) }
}
unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xFileControl.unwrap()(c, op, arg) }
}
unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xSectorSize.unwrap()(c) }
}
unsafe extern "C" fn x_device(file: *mut ffi::sqlite3_file) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xDeviceCharacteristics.unwrap()(c) }
}
unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    r: c_int,
    sz: c_int,
    ext: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xShmMap.unwrap()(c, r, sz, ext, out) }
}
unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    o: c_int,
    n: c_int,
    fl: c_int,
) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xShmLock.unwrap()(c, o, n, fl) }
}
unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xShmBarrier.unwrap()(c) }
}
unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, d: c_int) -> c_int {
    let c = first(file);
    // SAFETY: chunk 0's own method.
    unsafe { methods(c).xShmUnmap.unwrap()(c, d) }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

fn below_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: the shim's VFS object, whose app data is the VFS below.
    unsafe { (*vfs).pAppData.cast() }
}

unsafe extern "C" fn v_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    let f = file.cast::<SplitFile>();
    let state = SplitFile {
        base: ffi::sqlite3_file {
            pMethods: std::ptr::null(),
        },
        below: below_vfs(vfs),
        name0: name,
        names: Vec::new(),
        flags,
        chunked: !name.is_null() && flags & ffi::SQLITE_OPEN_MAIN_DB != 0,
        chunks: Vec::new(),
    };
    // SAFETY: SQLite passes szOsFile (a SplitFile) uninitialized bytes.
    unsafe { f.write(state) };
    // SAFETY: just written.
    let s = unsafe { &mut *f };
    let c = match chunk(s, 0, true) {
        Ok(c) => c,
        Err(rc) => {
            // SAFETY: written above; SQLite will not call xClose.
            unsafe { std::ptr::drop_in_place(f) };
            return rc;
        }
    };
    if !out.is_null() {
        // SAFETY: SQLite passes a writable int.
        unsafe { *out = flags };
    }
    let _ = c;
    s.base.pMethods = &METHODS;
    0
}

unsafe extern "C" fn v_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync: c_int,
) -> c_int {
    let b = below_vfs(vfs);
    // SAFETY: the VFS below, registered for the life of the process.
    let bv = unsafe { &*b };
    let (del, access) = (bv.xDelete.unwrap(), bv.xAccess.unwrap());
    // SAFETY: its own method.
    let rc = unsafe { del(b, name, sync) };
    // SAFETY: a NUL-terminated name.
    let base = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
    for i in 1.. {
        let n = CString::new([&base[..], format!("{i:03}").as_bytes()].concat()).unwrap();
        let mut exists = 0;
        // SAFETY: the VFS below's own methods.
        unsafe { access(b, n.as_ptr(), ffi::SQLITE_ACCESS_EXISTS, &mut exists) };
        if exists == 0 {
            break;
        }
        // SAFETY: as above.
        unsafe { del(b, n.as_ptr(), sync) };
    }
    rc
}

macro_rules! forward {
    ($name:ident, $field:ident, ($($a:ident: $t:ty),*) -> $r:ty) => {
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs, $($a: $t),*) -> $r {
            let b = below_vfs(vfs);
            // SAFETY: the VFS below, registered for the life of the process.
            let f = unsafe { (*b).$field }.unwrap();
            // SAFETY: its own method, with SQLite's arguments.
            unsafe { f(b, $($a),*) }
        }
    };
}
forward!(v_access, xAccess, (n: *const c_char, fl: c_int, out: *mut c_int) -> c_int);
forward!(v_full, xFullPathname, (n: *const c_char, sz: c_int, out: *mut c_char) -> c_int);
forward!(v_random, xRandomness, (n: c_int, out: *mut c_char) -> c_int);
forward!(v_sleep, xSleep, (us: c_int) -> c_int);
forward!(v_time, xCurrentTime, (out: *mut f64) -> c_int);
forward!(v_error, xGetLastError, (n: c_int, out: *mut c_char) -> c_int);
forward!(v_time64, xCurrentTimeInt64, (out: *mut i64) -> c_int);

/// Register `split-<below>` over the registered VFS `below` (once).
pub(crate) fn register(below: &str) -> String {
    static DONE: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let name = format!("split-{below}");
    let mut done = DONE.lock().unwrap();
    if done.contains(&name) {
        return name;
    }
    let cb = CString::new(below).unwrap();
    // SAFETY: a NUL-terminated name.
    let b = unsafe { ffi::sqlite3_vfs_find(cb.as_ptr()) };
    assert!(!b.is_null(), "no VFS {below}");
    // SAFETY: a registered VFS.
    let bv = unsafe { &*b };
    let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
        iVersion: 2,
        szOsFile: std::mem::size_of::<SplitFile>() as c_int,
        mxPathname: bv.mxPathname,
        pNext: null_mut(),
        zName: CString::new(name.clone()).unwrap().into_raw(),
        pAppData: b.cast(),
        xOpen: Some(v_open),
        xDelete: Some(v_delete),
        xAccess: Some(v_access),
        xFullPathname: Some(v_full),
        xDlOpen: None,
        xDlError: None,
        xDlSym: None,
        xDlClose: None,
        xRandomness: Some(v_random),
        xSleep: Some(v_sleep),
        xCurrentTime: Some(v_time),
        xGetLastError: Some(v_error),
        xCurrentTimeInt64: Some(v_time64),
        xSetSystemCall: None,
        xGetSystemCall: None,
        xNextSystemCall: None,
    }));
    // SAFETY: the object is leaked: it lives for ever.
    assert_eq!(unsafe { ffi::sqlite3_vfs_register(vfs, 0) }, 0);
    done.push(name.clone());
    name
}
