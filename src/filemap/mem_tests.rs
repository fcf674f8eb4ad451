//! `filemap::mem`'s unit tests (a file of their own: they read the
//! module's private state).

use super::*;

std::thread_local! {
    /// Called by `FolioMem::read` between loading the bytes' pointer and
    /// copying (a test's window into the race).
    static BEFORE_COPY: core::cell::RefCell<Option<Box<dyn FnMut()>>> =
        const { core::cell::RefCell::new(None) };
}

pub(super) fn before_copy() {
    BEFORE_COPY.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f()
        }
    });
}

/// A reader stopped between loading the buffer's pointer and copying
/// while another thread drops the buffer and drives every reclamation
/// there is (crossbeam collections and light limbo attempts): the copy
/// still reads live memory (Miri reports a use after free otherwise)
/// and the version check throws it away. Once with a crossbeam guard,
/// once under a light pin.
#[test]
fn a_stopped_reader_keeps_a_dropped_buffer_alive() {
    for light in [false, true] {
        let m = std::sync::Arc::new(filled(4096, 9));
        let (at_copy_tx, at_copy_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let reader = {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut once = Some((at_copy_tx, go_rx));
                BEFORE_COPY.with(|h| {
                    *h.borrow_mut() = Some(Box::new(move || {
                        if let Some((tx, rx)) = once.take() {
                            tx.send(()).unwrap();
                            rx.recv().unwrap();
                        }
                    }))
                });
                let mut out = [0u8; 64];
                let kept = if light {
                    crate::lightpin::read(|lp| m.read(0, &mut out, lp)).unwrap()
                } else {
                    m.read(0, &mut out, &crate::pin())
                };
                BEFORE_COPY.with(|h| *h.borrow_mut() = None);
                kept
            })
        };
        at_copy_rx.recv().unwrap();
        m.lock().release();
        for _ in 0..if cfg!(miri) { 8 } else { 64 } {
            crate::pin().flush();
            crate::lightpin::reclaim();
        }
        go_tx.send(()).unwrap();
        assert!(!reader.join().unwrap(), "a copy across a release is kept");
    }
}

/// A pin released on one thread while a writer on another, synchronized
/// with it by nothing (a relaxed flag), writes in place: the writer's
/// decision must acquire the release, or Miri reports the pinner's last
/// reads racing the writer's stores (it does with `Relaxed` loads).
#[test]
fn a_released_pin_happens_before_an_in_place_write() {
    use core::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let mut in_place = 0;
    for _ in 0..if cfg!(miri) { 12 } else { 32 } {
        let m = std::sync::Arc::new(filled(256, 5));
        let pin = m.pin(&crate::pin()).unwrap();
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let reader = std::thread::spawn(move || {
            let sum: u32 = pin.bytes().iter().map(|&b| u32::from(b)).sum();
            drop(pin);
            d.store(true, Relaxed);
            sum
        });
        while !done.load(Relaxed) {
            std::thread::yield_now();
        }
        let mut w = m.lock();
        let mut e = w.edit().unwrap();
        in_place += usize::from(matches!(e.how, How::InPlace { .. }));
        e.fill(0, 256, 7);
        drop(e);
        assert_eq!(reader.join().unwrap(), 5 * 256);
    }
    assert!(in_place > 0, "the pin was never released before the write");
}

fn filled(len: usize, byte: u8) -> FolioMem {
    let m = FolioMem::new(len);
    m.lock()
        .install_zeroed(|b| {
            b.fill(byte);
            Ok::<(), ()>(())
        })
        .unwrap();
    m
}

#[test]
fn optimistic_read_and_in_place_write() {
    let m = filled(8192, 1);
    let g = crate::pin();
    let mut out = [0u8; 16];
    assert!(m.read(4090, &mut out, &g));
    assert_eq!(out, [1; 16]);
    assert!(!m.read(8190, &mut out, &g), "past the end");
    m.lock().edit().unwrap().write(4096, &[9; 4]);
    assert!(m.read(4090, &mut out, &g));
    assert_eq!(&out[..6], &[1; 6]);
    assert_eq!(&out[6..10], &[9; 4]);
}

#[test]
fn a_pin_keeps_its_bytes_and_never_blocks_the_writer() {
    let m = filled(4096, 7);
    let g = crate::pin();
    let pin = m.pin(&g).expect("no writer");
    {
        let mut w = m.lock();
        assert!(w.is_pinned());
        let mut e = w.edit().unwrap();
        e.write(0, &[8; 100]);
    }
    assert!(pin.bytes().iter().all(|&b| b == 7), "pinned bytes kept");
    let mut out = [0u8; 100];
    assert!(m.read(0, &mut out, &g));
    assert_eq!(out, [8; 100], "readers see the new bytes");
    let again = m.pin(&g).unwrap();
    assert_eq!(&again.bytes()[..100], &[8; 100]);
    drop(pin);
    assert!(m.lock().is_pinned(), "the second pin still holds it");
    drop(again);
    assert!(!m.lock().is_pinned());
}

/// A borrow under a guard keeps its bytes through an in-place-looking
/// write (the writer copies while the borrow count is raised) and
/// through the buffer's replacement and every reclamation driven: Miri
/// reports a use after free if the guard did not keep it.
#[test]
fn a_borrow_keeps_its_bytes_and_never_blocks_the_writer() {
    let m = filled(4096, 7);
    let g = crate::pin();
    let b = m.borrow(&g).expect("no writer");
    m.lock().edit().unwrap().write(0, &[8; 100]);
    assert!(b.bytes().iter().all(|&x| x == 7), "borrowed bytes kept");
    let mut out = [0u8; 100];
    assert!(m.read(0, &mut out, &g));
    assert_eq!(out, [8; 100], "readers see the new bytes");
    m.lock().release();
    for _ in 0..8 {
        crate::pin().flush();
    }
    assert!(b.bytes().iter().all(|&x| x == 7), "still readable");
    drop(b);
    assert!(!m.lock().is_pinned());
}

#[test]
fn release_leaves_pins_readable() {
    let m = filled(4096, 3);
    let g = crate::pin();
    let pin = m.pin(&g).unwrap();
    m.lock().release();
    let mut out = [0u8; 1];
    assert!(!m.read(0, &mut out, &g), "no buffer");
    assert!(m.pin(&g).is_none());
    assert!(pin.bytes().iter().all(|&b| b == 3));
}

#[test]
fn failed_install_changes_nothing() {
    let m = filled(64, 5);
    let r = m.lock().install_zeroed(|b| {
        b.fill(6);
        Err("backend error")
    });
    assert!(matches!(r, Err(InstallError::Fill("backend error"))));
    assert!(m.lock().bytes().iter().all(|&b| b == 5));
}

/// Writers rewrite the whole buffer with one byte value; optimistic
/// readers and pinners on other threads never keep a torn copy.
#[test]
fn concurrent_readers_never_keep_a_torn_copy() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let m = std::sync::Arc::new(filled(4096, 0));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut v = 0u8;
            while !stop.load(Ordering::Relaxed) {
                v = v.wrapping_add(1);
                m.lock().edit().unwrap().fill(0, 4096, v);
                // Leave readers a window now and then (a seqlock's
                // readers starve under a writer that never pauses; the
                // page cache's readers then take the lock instead).
                if v.is_multiple_of(4) {
                    std::thread::yield_now();
                }
            }
        })
    };
    let (mut kept, mut pinned) = (0, 0);
    let mut out = vec![0u8; 4096];
    for i in 0..if cfg!(miri) { 50 } else { 20_000 } {
        let g = crate::pin();
        if i % 2 == 0 {
            if m.read(0, &mut out, &g) {
                assert!(out.iter().all(|&b| b == out[0]), "torn copy kept");
                kept += 1;
            }
        } else if let Some(p) = m.pin(&g) {
            let first = p.bytes()[0];
            std::thread::yield_now();
            assert!(p.bytes().iter().all(|&b| b == first), "pinned bytes moved");
            pinned += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    if !cfg!(miri) {
        assert!(kept > 0 && pinned > 0, "kept {kept}, pinned {pinned}");
    }
}
