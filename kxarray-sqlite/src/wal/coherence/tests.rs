//! The WAL checks against checkpoints by a stand-in for another process,
//! and a drop's wait for a read in flight.

use super::*;
use kxarray::aio::{Completion, IoBufMut};
use kxarray::backend::{Backend, ReadBuf};
use kxarray::pagecache::{Advice, CacheConfig, PageCache};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// "The other process" of the WAL tests: a unix-VFS connection (the
/// kxarray VFS registered for the test's own), no automatic
/// checkpoint, a table `t(x)` holding 0, the WAL checkpointed empty.
fn other_process(db: &std::path::Path) -> rusqlite::Connection {
    crate::register(crate::Api::linked::<()>(), false).unwrap();
    let other = rusqlite::Connection::open(db).unwrap();
    other
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t(x); INSERT INTO t VALUES(0);
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    other
}

/// A file in memory whose batched reads (readahead's fills) copy the
/// bytes at once and then, while `hold` is set, wait before they
/// complete: a read in flight that fetched the bytes from before a
/// change another process makes meanwhile.
#[derive(Debug, Default)]
struct HeldReads {
    bytes: Mutex<Vec<u8>>,
    hold: Mutex<bool>,
    released: Condvar,
    copied: Mutex<Option<mpsc::Sender<()>>>,
}

impl HeldReads {
    fn copy(&self, buf: &mut [u8], offset: u64) -> usize {
        let b = self.bytes.lock().unwrap();
        let at = (offset as usize).min(b.len());
        let n = buf.len().min(b.len() - at);
        buf[..n].copy_from_slice(&b[at..at + n]);
        n
    }
}

impl Backend for HeldReads {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        Ok(self.copy(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let mut b = self.bytes.lock().unwrap();
        let end = offset as usize + buf.len();
        if b.len() < end {
            b.resize(end, 0);
        }
        b[offset as usize..end].copy_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
    fn read_many(&self, reqs: Vec<(u64, ReadBuf)>) -> Vec<Completion<ReadBuf>> {
        let done: Vec<_> = reqs
            .into_iter()
            .map(|(at, mut buf)| (self.copy(buf.as_mut_slice(), at), buf))
            .collect();
        if let Some(tx) = self.copied.lock().unwrap().take() {
            let _ = tx.send(());
        }
        let mut hold = self.hold.lock().unwrap();
        while *hold {
            hold = self.released.wait(hold).unwrap();
        }
        done.into_iter()
            .map(|(n, buf)| Completion::ready(Ok(n), buf))
            .collect()
    }
}

thread_local! {
    /// What another process does right after this thread's next read
    /// lock was checked (run once).
    static AFTER_READ_CHECK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        std::cell::RefCell::new(None);
}

/// The stale page, the second way: this process checkpoints,
/// and another process's checkpoint starts the moment this one lets go
/// of the checkpoint lock and copies the frames committed since. The
/// record of what this process's own checkpoint copied (pages written
/// through its cache, not dropped) was taken after the release, so it
/// took the other checkpoint's frames for its own and never dropped
/// their pages. Before the fix the last read returned the old row.
#[test]
fn a_checkpoint_right_after_this_process_s_own_is_seen() {
    use rusqlite::{Connection, OpenFlags};
    use std::cell::Cell;
    use std::rc::Rc;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("own.db");
    let other = Rc::new(other_process(&db));
    // a reader of the other process, whose mark keeps this process's
    // checkpoint from copying the last commit (and the WAL from
    // restarting)
    let reader = Rc::new(Connection::open(&db).unwrap());
    let kx = Connection::open_with_flags(
        format!("file:{}?vfs=kxarray", db.display()),
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    kx.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    let x = |c: &Connection| c.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0));
    assert_eq!(x(&kx).unwrap(), 0); // the table's page, cached from the file
    other.execute("UPDATE t SET x = 1", []).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(x(&reader).unwrap(), 1); // its mark: the commit of 1
    other.execute("UPDATE t SET x = 2", []).unwrap();
    let copied = Rc::new(Cell::new((-1, -1)));
    let (o, r, c) = (Rc::clone(&other), Rc::clone(&reader), Rc::clone(&copied));
    crate::wal::shm::AFTER_UNLOCK.with(|h| {
        *h.borrow_mut() = Some((
            WAL_CKPT_LOCK,
            Box::new(move || {
                r.execute_batch("COMMIT").unwrap();
                let n = o
                    .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                        Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
                    })
                    .unwrap();
                c.set(n);
            }),
        ));
    });
    // this process copies the commit of 1 (written through its cache)
    let (log, mine) = kx
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        })
        .unwrap();
    assert!(
        0 < mine && mine < log,
        "this process's checkpoint copied {mine} of {log}"
    );
    let (log2, theirs) = copied.get();
    assert!(
        theirs == log2 && theirs > mine,
        "the other checkpoint copied {theirs} of {log2} frames"
    );
    assert_eq!(
        x(&kx).unwrap(),
        2,
        "a read after the other process's checkpoint"
    );
}

/// Run (once) what the test put in [`AFTER_READ_CHECK`].
pub(super) fn after_read_check() {
    if let Some(f) = AFTER_READ_CHECK.with(|h| h.borrow_mut().take()) {
        f();
    }
}

/// The stale page, the bank test's: another process's
/// checkpoint ends after this process's read lock was checked (which
/// saw nothing copied) and before SQLite loads `nBackfill`, so SQLite
/// reads the copied page from the database file, where the cache
/// still holds its old bytes. The checkpoint runs in the window
/// exactly (a unix-VFS connection of this process, from a hook after
/// the check). Before the fix the read returned the old row.
#[test]
fn a_checkpoint_between_the_read_lock_and_the_first_read_is_seen() {
    use rusqlite::{Connection, OpenFlags};
    use std::cell::Cell;
    use std::rc::Rc;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("window.db");
    let other = Rc::new(other_process(&db));
    let kx = Connection::open_with_flags(
        format!("file:{}?vfs=kxarray", db.display()),
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    let x = |c: &Connection| c.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0));
    assert_eq!(x(&kx).unwrap(), 0); // the table's page, cached from the file
    other.execute("UPDATE t SET x = 1", []).unwrap(); // in the WAL only
    let copied = Rc::new(Cell::new((-1, -1)));
    let (o, c) = (Rc::clone(&other), Rc::clone(&copied));
    AFTER_READ_CHECK.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            let r = o
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                    Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
                })
                .unwrap();
            c.set(r);
        }))
    });
    let seen = x(&kx).unwrap();
    let (log, done) = copied.get();
    assert!(
        log > 0 && done == log,
        "the checkpoint in the window copied {done} of {log} frames"
    );
    assert_eq!(seen, 1, "a read after another process's checkpoint");
}

/// The stale page: a readahead folio of 16 pages whose read was
/// in flight while another process's checkpoint wrote one of its pages
/// and this process dropped that page. The drop must wait for the read
/// and take the folio, else the old bytes land after it and are served.
/// Before the fix the drop passed the folio over (not readable yet, so
/// seen as one page, and a folio only partly inside a dropped range
/// stays).
#[test]
fn a_drop_takes_a_folio_whose_read_is_in_flight() {
    const PAGE: usize = 4096;
    let mem = Arc::new(HeldReads::default());
    mem.bytes.lock().unwrap().resize(16 * PAGE, 1);
    let cache = PageCache::new(CacheConfig::default().max_folio_order(4).flusher(false));
    let file = cache.open(Arc::clone(&mem)).unwrap();
    *mem.hold.lock().unwrap() = true;
    let (copied_tx, copied) = mpsc::channel();
    *mem.copied.lock().unwrap() = Some(copied_tx);
    std::thread::scope(|s| {
        // readahead of the 16 pages: it copies the old bytes, then waits
        let fill = s.spawn(|| file.advise(0, 16 * PAGE as u64, Advice::WillNeed));
        copied.recv().unwrap();
        // another process's checkpoint writes database page 3 (cache page 2)
        mem.write_at(&[2; PAGE], 2 * PAGE as u64).unwrap();
        // ... and this process drops it, while the read is in flight
        let (done_tx, done) = mpsc::channel();
        let file = &file;
        let drop = s.spawn(move || {
            let r = drop_pages(file, &mut vec![3], PAGE as u64);
            let _ = done_tx.send(());
            r
        });
        // A drop that waits for the read blocks here until it is let
        // go; one that does not is done. Either way the read lands now.
        let _ = done.recv_timeout(Duration::from_millis(300));
        *mem.hold.lock().unwrap() = false;
        mem.released.notify_all();
        fill.join().unwrap().unwrap();
        drop.join().unwrap().unwrap();
    });
    let mut b = [0u8; PAGE];
    file.read_at(&mut b, 2 * PAGE as u64).unwrap();
    assert!(
        b.iter().all(|&x| x == 2),
        "page 3 after the drop holds {} (the bytes from before the checkpoint)",
        b[0]
    );
    let mut other = [0u8; PAGE];
    file.read_at(&mut other, 5 * PAGE as u64).unwrap();
    assert!(other.iter().all(|&x| x == 1));
}
