//! kxarray's `log` records reach the server's `tracing` subscriber (issue
//! 36, point 8): the I/O engine's line, made at startup for a file
//! backend, comes out formatted by the subscriber with its target
//! (`kxarray::aio`), not printed raw by the library.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn the_engine_line_reaches_the_tracing_subscriber() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kxarray-nbd"))
        .args([
            "--backend",
            "cached",
            "--size",
            "1M",
            "--listen",
            "127.0.0.1:0",
            "--file",
        ])
        .arg(file.path())
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    // Until the server listens (a hang guard, far above what it needs).
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) {
        let listening = line.contains("listening");
        lines.push(line);
        if listening {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let engine: Vec<&String> = lines.iter().filter(|l| l.contains("I/O engine")).collect();
    assert_eq!(engine.len(), 1, "{lines:#?}");
    assert!(
        engine[0].contains("INFO") && engine[0].contains("kxarray::aio"),
        "not through the subscriber: {}",
        engine[0]
    );
}
