//! The file controls SQLite sends a handle (`xFileControl`): the ones the
//! VFS answers (`LOCKSTATE`, `LAST_ERRNO`, `VFSNAME`, `PRAGMA` with
//! `kx_stats` and `kx_settings`, `CHUNK_SIZE`, `SIZE_HINT`, `MMAP_SIZE`,
//! `POWERSAFE_OVERWRITE`, `PERSIST_WAL`, `HAS_MOVED`, `EXTERNAL_READER`,
//! the checkpoint's `CKPT_START` and `CKPT_DONE`, `SYNC`), each as the
//! unix VFS answers it; any other is `SQLITE_NOTFOUND`, SQLite's.
//!
//! Invariant: an opcode's argument is used only as the type SQLite
//! documents for it.

use super::{handle, io_code, sync_point, Handle, PAGE};
use crate::io::file::guard;
use crate::sqlite::ffi::*;
use crate::sqlite::process::api;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

/// Whether `SQLITE_FCNTL_SIZE_HINT` with `want` is a checkpoint's final
/// size to grow a buffered database to, so that its pages are written
/// through inside the file (`x_write`): only from a length of whole 4 KiB
/// pages to another, so that no page a reader filled under the old length
/// straddles it (the same reasoning as `walsize`'s).
fn checkpoint_grows(h: &Handle, want: i64) -> bool {
    h.inode.is_db
        && !h.inode.direct
        && h.inode.checkpointing.load(Ordering::Relaxed)
        && !crate::sqlite::process::write_back_only()
        && want > 0
        && want % PAGE == 0
        && h.inode.file.len().is_multiple_of(PAGE as u64)
}

/// `SQLITE_FCNTL_PRAGMA`: `kx_stats` and `kx_settings`; anything else is
/// SQLite's (`SQLITE_NOTFOUND`).
///
/// # Safety
/// - `args` is the `char*[3]` SQLite passes with this opcode.
unsafe fn pragma(h: &mut Handle, args: *mut *mut c_char) -> c_int {
    debug_assert!(!args.is_null());
    // SAFETY: per the caller, slot 1 exists ...
    let slot = unsafe { args.add(1) };
    // SAFETY: ... and holds the pragma's name ...
    let zname = unsafe { *slot };
    // SAFETY: ... NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(zname) }.to_string_lossy();
    // SAFETY: per the caller, `args` is SQLite's char*[3] (noted for the hold).
    unsafe { h.note_locking_mode(&name, args) };
    h.note_bulk(&name);
    let text = match name.to_ascii_lowercase().as_str() {
        "kx_stats" => {
            h.book_fetches();
            crate::io::stats::stats_text(&h.cache)
        }
        "kx_settings" => crate::io::stats::settings_text(
            &h.cache,
            &crate::io::stats::InForce {
                direct: h.inode.direct,
                fetch: h.settings.fetch,
                pressure: h.settings.pressure,
                prefetch: h.children.is_some(),
                mmap_size: h.mmap_limit,
                block_size: if h.inode.is_db { 4096 } else { 512 },
                exclusive: h.inode.exclusive,
            },
        ),
        _ => return SQLITE_NOTFOUND,
    };
    let p = api().malloc_str(&text);
    if p.is_null() {
        return SQLITE_NOMEM;
    }
    // SAFETY: slot 0 is where SQLite takes the result (it frees it with
    // sqlite3_free; `p` came from sqlite3_malloc).
    unsafe { *args = p };
    SQLITE_OK
}

/// The argument of a file control, as the type its opcode documents.
///
/// # Safety
/// - `arg` points to a valid, writable `T` for the duration of the call
///   (SQLite's documented argument type for the opcode).
unsafe fn arg_mut<'a, T>(arg: *mut c_void) -> &'a mut T {
    debug_assert!(!arg.is_null());
    // SAFETY: per the caller.
    unsafe { &mut *arg.cast::<T>() }
}

/// `SQLITE_FCNTL_POWERSAFE_OVERWRITE` and `PERSIST_WAL`: a negative value
/// asks for the flag, another sets it.
fn get_or_set(v: &mut c_int, flag: &mut bool) {
    if *v < 0 {
        *v = c_int::from(*flag);
    } else {
        *flag = *v != 0;
    }
}

pub(super) unsafe extern "C" fn x_file_control(
    file: *mut sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls methods on a file it opened (see `handle`).
        let h = unsafe { handle(file) };
        match op {
            SQLITE_FCNTL_LOCKSTATE => {
                // SAFETY: SQLite passes an int* with this opcode.
                *unsafe { arg_mut::<c_int>(arg) } = h.level;
                SQLITE_OK
            }
            SQLITE_FCNTL_LAST_ERRNO => {
                // The errno of the handle's last failed operation, as the
                // unix VFS's `lastErrno` (0: none).
                // SAFETY: SQLite passes an int* with this opcode.
                *unsafe { arg_mut::<c_int>(arg) } = h.last_errno.get();
                SQLITE_OK
            }
            SQLITE_FCNTL_EXTERNAL_READER => {
                // Whether another process holds a WAL read lock on the
                // handle's `-shm` (`unixFcntlExternalReader`).
                let r = h
                    .shm
                    .as_ref()
                    .map_or(Ok(false), |s| s.shm.external_reader());
                // SAFETY: SQLite passes an int* with this opcode.
                let out = unsafe { arg_mut::<c_int>(arg) };
                *out = 0;
                match r {
                    Ok(yes) => {
                        *out = c_int::from(yes);
                        SQLITE_OK
                    }
                    Err(e) => io_code(h, "checking the readers of", &e, SQLITE_IOERR_LOCK),
                }
            }
            SQLITE_FCNTL_VFSNAME => {
                let p = api().malloc_str(crate::VFS_NAME);
                // SAFETY: SQLite passes a char** with this opcode.
                *unsafe { arg_mut::<*mut c_char>(arg) } = p;
                if p.is_null() {
                    SQLITE_NOMEM
                } else {
                    SQLITE_OK
                }
            }
            // SAFETY: SQLite passes a char*[3] with this opcode.
            SQLITE_FCNTL_PRAGMA => unsafe { pragma(h, arg.cast()) },
            SQLITE_FCNTL_CHUNK_SIZE => {
                // SAFETY: SQLite passes an int* with this opcode.
                h.chunk = i64::from((*unsafe { arg_mut::<c_int>(arg) }).max(0));
                SQLITE_OK
            }
            SQLITE_FCNTL_SIZE_HINT => {
                // As the unix VFS: with a chunk size, grow the file to the
                // hint rounded up to whole chunks (zeros); without one, a
                // hint changes nothing.
                // SAFETY: SQLite passes an sqlite3_int64* with this opcode.
                let want = *unsafe { arg_mut::<i64>(arg) };
                let size = if h.chunk > 0 && want > 0 {
                    (want + h.chunk - 1) / h.chunk * h.chunk
                } else if checkpoint_grows(h, want) {
                    // A checkpoint's final size: grown now, its pages are
                    // written through inside the file (see `x_write`).
                    want
                } else {
                    0
                };
                if size as u64 > h.inode.file.len() && !h.readonly {
                    if let Err(e) = h.inode.note_change() {
                        return io_code(h, "extend", &e, SQLITE_IOERR_TRUNCATE);
                    }
                    if let Err(e) = h.inode.file.set_len(size as u64) {
                        return io_code(h, "extend", &e, SQLITE_IOERR_TRUNCATE);
                    }
                }
                SQLITE_OK
            }
            SQLITE_FCNTL_MMAP_SIZE => {
                // SAFETY: SQLite passes an sqlite3_int64* with this opcode.
                let p = unsafe { arg_mut::<i64>(arg) };
                let new = *p;
                *p = h.mmap_limit;
                // As the unix VFS: the limit stays while SQLite holds a
                // fetched page (`nFetchOut`).
                if new >= 0 && !h.fetches.any_lent() {
                    h.mmap_limit = new;
                    if new == 0 {
                        h.fetches.forget_all();
                    }
                }
                SQLITE_OK
            }
            SQLITE_FCNTL_POWERSAFE_OVERWRITE => {
                // SAFETY: SQLite passes an int* with this opcode.
                get_or_set(unsafe { arg_mut::<c_int>(arg) }, &mut h.psow);
                SQLITE_OK
            }
            SQLITE_FCNTL_PERSIST_WAL => {
                // SAFETY: SQLite passes an int* with this opcode.
                get_or_set(unsafe { arg_mut::<c_int>(arg) }, &mut h.persist_wal);
                SQLITE_OK
            }
            SQLITE_FCNTL_HAS_MOVED => {
                let moved = match h.key {
                    None => false,
                    Some(key) => std::fs::metadata(&h.inode.path)
                        .map(|m| {
                            use std::os::unix::fs::MetadataExt;
                            (m.dev(), m.ino()) != key
                        })
                        .unwrap_or(true),
                };
                // SAFETY: SQLite passes an int* with this opcode.
                *unsafe { arg_mut::<c_int>(arg) } = c_int::from(moved);
                SQLITE_OK
            }
            SQLITE_FCNTL_CKPT_START => {
                h.inode.checkpointing.store(true, Ordering::Relaxed);
                SQLITE_OK
            }
            SQLITE_FCNTL_CKPT_DONE => {
                h.inode.checkpointing.store(false, Ordering::Relaxed);
                // (the writer mark stays until the checkpoint lock's
                // release: `nBackfill` moves after this, `Inode::shm_lock`)
                sync_point(h)
            }
            SQLITE_FCNTL_SYNC => sync_point(h),
            _ => SQLITE_NOTFOUND,
        }
    })
}
