//! An item whose `Drop` locks an `XArray` must not deadlock: the pin that
//! `XArray::lock` takes (and that may run deferred item destructors) comes
//! before the mutex. Before the fix the destructors ran with the lock held,
//! and a destructor locking the same array hung.

use kxarray::{Entry, XArray};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

static LOG: OnceLock<XArray<Box<u64>>> = OnceLock::new();

struct Logs(u64);

impl Drop for Logs {
    fn drop(&mut self) {
        // locks LOG, the array the dropping thread keeps locking below
        LOG.get()
            .unwrap()
            .store(self.0 % 64, Entry::Value(self.0))
            .unwrap();
    }
}

#[test]
fn an_item_drop_that_locks_an_array_does_not_deadlock() {
    LOG.get_or_init(XArray::new);
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let items: Arc<XArray<Box<Logs>>> = Arc::new(XArray::new());
        for i in 0..20_000u64 {
            // replacing defers the old item's drop to a later pin
            items.store(i % 8, Entry::Item(Box::new(Logs(i)))).unwrap();
            // hand this thread's deferred drops to the global queue, where
            // the collection inside a later pin finds them
            kxarray::pin().flush();
            let lock = LOG.get().unwrap().lock();
            drop(lock);
        }
        tx.send(()).unwrap();
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => worker.join().unwrap(),
        Err(_) => panic!("deadlock: an item's Drop ran under XArray::lock"),
    }
}
