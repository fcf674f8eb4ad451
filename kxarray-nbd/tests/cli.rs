//! The command line as a user meets it: values that cannot be meant are
//! refused before anything starts (`--size 0`, `--cache-size 0`), a
//! `--unix` path naming a regular file is refused as such (never "address
//! already in use", never replaced), and the log written to a file or a
//! pipe carries no ANSI colours.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run the server with `args`; a server still running after 10 s (it
/// served what it should have refused) is killed, and its output is
/// returned with a failed status all the same.
fn run(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("err");
    let mut child = Command::new(common::process::binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run the server");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: Vec::new(),
        stderr: std::fs::read(&log).unwrap(),
    }
}

#[test]
fn sizes_that_cannot_be_meant_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let sock = sock.to_str().unwrap();
    for (args, says) in [
        (vec!["--size", "0", "--unix", sock], "0 bytes"),
        (
            vec![
                "--backend",
                "cached",
                "--file",
                "f",
                "--cache-size",
                "0",
                "--unix",
                sock,
            ],
            "less than one page",
        ),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was served: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains('\x1b'), "colours in a pipe: {err:?}");
    }
    assert!(!dir.path().join("s.sock").exists());
}

#[test]
fn a_unix_path_naming_a_regular_file_is_refused_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("precious.txt");
    std::fs::write(&file, b"keep me").unwrap();
    let out = run(&["--unix", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("is a regular file, not a socket"), "{err}");
    assert!(!err.contains("in use"), "{err}");
    // A log to a pipe has no colours.
    assert!(!err.contains('\x1b'), "colours in a pipe: {err:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

/// Every flag `--help` lists is in the README's flag table.
#[test]
fn the_readme_lists_every_flag() {
    let help = Command::new(common::process::binary())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table = readme
        .split("## Flags")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("a Flags section");
    let flags: Vec<&str> = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .collect();
    assert!(flags.len() > 10, "{help}");
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|f| !["--help", "--version"].contains(f))
        .filter(|f| !table.contains(&format!("`{f}")))
        .collect();
    assert!(
        missing.is_empty(),
        "flags the README's table lacks: {missing:?}"
    );
}
