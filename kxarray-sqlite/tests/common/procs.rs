//! Other processes for the multi-process tests: the stock shell driven
//! statement by statement, and this test binary run again as a child with
//! a role named in the environment. Both speak in lines: a child's lines
//! for the test start with `@@`.

use rusqlite::{Connection, OpenFlags};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The environment variable that names a child's role and arguments.
pub(crate) const CHILD_ENV: &str = "KXARRAY_MP_CHILD";

/// How long any one exchange with another process may take before the test
/// fails (not a timed assertion: a hang guard; the exchanges take
/// milliseconds).
pub(crate) const HANG: Duration = Duration::from_secs(60);

/// A running process whose standard output and error arrive, merged and in
/// order, as lines; killed when dropped.
#[derive(Debug)]
pub(crate) struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every line received so far (for failure messages).
    pub(crate) seen: Vec<String>,
}

impl Proc {
    /// Spawn `cmd` with piped stdin and stdout + stderr merged into one pipe.
    pub(crate) fn spawn(mut cmd: Command) -> Proc {
        let (reader, writer) = std::io::pipe().unwrap();
        let writer2 = writer.try_clone().unwrap();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::from(writer))
            .stderr(Stdio::from(writer2));
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        // the writers went to the child; drop the command's copies so the
        // reader sees EOF when the child exits
        drop(cmd);
        let stdin = child.stdin.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Write `text` to its standard input.
    pub(crate) fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Close its standard input (end of script).
    pub(crate) fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next line, or None at end of output; panics after [`HANG`].
    pub(crate) fn next_line(&mut self) -> Option<String> {
        match self.lines.recv_timeout(HANG) {
            Ok(l) => {
                self.seen.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no line for {HANG:?}; so far: {:?}", self.seen)
            }
        }
    }

    /// Lines up to (not including) the first that equals `marker`.
    pub(crate) fn until(&mut self, marker: &str) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            match self.next_line() {
                Some(l) if l == marker => return out,
                Some(l) => out.push(l),
                None => panic!("exited before {marker:?}; output: {:?}", self.seen),
            }
        }
    }

    /// The first line starting with `@@`, without the prefix.
    pub(crate) fn at_line(&mut self) -> String {
        loop {
            match self.next_line() {
                Some(l) => {
                    if let Some((_, r)) = l.split_once("@@") {
                        return r.to_string();
                    }
                }
                None => panic!("exited without an @@ line; output: {:?}", self.seen),
            }
        }
    }

    /// Wait for it to exit (after [`HANG`]: kill it and panic); the rest of
    /// its output and whether it succeeded.
    pub(crate) fn wait(mut self) -> (bool, Vec<String>) {
        self.close_stdin();
        let mut rest = Vec::new();
        while let Some(l) = self.next_line() {
            rest.push(l);
        }
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st.success(), rest);
            }
            if t0.elapsed() > HANG {
                let _ = self.child.kill();
                panic!("did not exit; output: {:?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL it and reap it.
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The stock `sqlite3` shell (default VFS unless told otherwise), fed one
/// batch of statements at a time.
#[derive(Debug)]
pub(crate) struct Shell {
    proc: Proc,
    n: u64,
}

impl Shell {
    /// `sqlite3 -batch <args>`, with `env`.
    pub(crate) fn spawn(args: &[&str], env: &[(&str, &str)]) -> Shell {
        let mut cmd = Command::new("sqlite3");
        cmd.arg("-batch").args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Shell {
            proc: Proc::spawn(cmd),
            n: 0,
        }
    }

    /// The shell on `db` through the unix VFS, busy timeout `timeout_ms`.
    pub(crate) fn unix(db: &Path, timeout_ms: u32) -> Shell {
        let mut s = Shell::spawn(&[db.to_str().unwrap()], &[]);
        s.ok(&format!(".timeout {timeout_ms}"));
        s
    }

    /// The shell with the kxarray extension loaded, on `uri`.
    pub(crate) fn kxarray(uri: &str, timeout_ms: u32) -> Shell {
        let mut s = Shell::spawn(&[], &[]);
        s.ok(&format!(
            ".load {}\n.open '{uri}'\n.timeout {timeout_ms}",
            super::load_arg()
        ));
        s
    }

    /// Run `sql` (statements or dot-commands); every line it printed
    /// (results and error messages, in order).
    pub(crate) fn run(&mut self, sql: &str) -> Vec<String> {
        self.n += 1;
        let marker = format!("@@END {}", self.n);
        self.proc.send(&format!("{sql}\n.print {marker}\n"));
        self.proc.until(&marker)
    }

    /// Run `sql`; its output, which must hold no error message.
    pub(crate) fn ok(&mut self, sql: &str) -> Vec<String> {
        let out = self.run(sql);
        assert!(
            !out.iter().any(|l| is_error(l)),
            "the shell failed on {sql:?}: {out:?}"
        );
        out
    }

    /// Run `sql`, which must print one line; that line.
    pub(crate) fn one(&mut self, sql: &str) -> String {
        let out = self.run(sql);
        assert_eq!(out.len(), 1, "{sql:?}: {out:?}");
        assert!(!is_error(&out[0]), "{sql:?}: {out:?}");
        out[0].clone()
    }

    /// End the shell; whether it exited well.
    pub(crate) fn quit(mut self) -> bool {
        self.proc.send(".quit\n");
        self.proc.wait().0
    }
}

/// Whether a shell line is an error message.
pub(crate) fn is_error(l: &str) -> bool {
    l.starts_with("Error") || l.starts_with("Runtime error") || l.starts_with("Parse error")
}

/// This test binary again, running its ignored test `entry` (which calls
/// the file's child dispatcher) as `role` with `args`.
pub(crate) fn child(entry: &str, role: &str, args: &[(&str, String)]) -> Proc {
    child_as(entry, role, args, None)
}

/// [`child`], run as user and group `uid` when given (the caller is root).
pub(crate) fn child_as(entry: &str, role: &str, args: &[(&str, String)], uid: Option<u32>) -> Proc {
    child_with(entry, role, args, uid, &[])
}

/// [`child_as`] with `env` set in the child's environment.
pub(crate) fn child_with(
    entry: &str,
    role: &str,
    args: &[(&str, String)],
    uid: Option<u32>,
    env: &[(&str, &str)],
) -> Proc {
    let exe = std::env::current_exe().unwrap();
    let mut spec = role.to_string();
    for (k, v) in args {
        assert!(!v.contains('\u{1}'));
        spec.push('\u{1}');
        spec.push_str(k);
        spec.push('=');
        spec.push_str(v);
    }
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, spec)
    .env_remove("RUST_TEST_THREADS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(id) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(id).gid(id);
    }
    Proc::spawn(cmd)
}

/// In a child: its role and arguments, if this process is one.
pub(crate) fn child_spec() -> Option<(String, HashMap<String, String>)> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    let mut it = spec.split('\u{1}');
    let role = it.next()?.to_string();
    let args = it
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some((role, args))
}

/// In a child: one line for the parent, flushed at once.
pub(crate) fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{msg}").unwrap();
    out.flush().unwrap();
}

/// In a child: the next line from the parent (None at end of input).
pub(crate) fn hear() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(s.trim_end().to_string()),
    }
}

/// Open `db` through `vfs` ("kxarray" or "unix") with URI parameters
/// `params` ("mode=ro&readonly_shm=1"...), read-write-create unless the
/// parameters say `mode=ro`.
pub(crate) fn open_vfs(db: &Path, vfs: &str, params: &str) -> rusqlite::Result<Connection> {
    if vfs == "kxarray" {
        super::setup();
    }
    let mut uri = format!("file:{}?vfs={vfs}", db.display());
    if !params.is_empty() {
        uri.push('&');
        uri.push_str(params);
    }
    let flags = if params.contains("mode=ro") {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI
    };
    Connection::open_with_flags(uri, flags)
}

/// Whether an error is SQLite's "busy" or "locked" (to retry).
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// `name-wal`, `name-shm`, `name-journal` beside `db`.
pub(crate) fn sidecar(db: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

/// The fields of a `-shm` file's first WAL-index header that do not depend
/// on the history of the process that wrote it (iVersion, isInit,
/// bigEndCksum, szPage, mxFrame, nPage, aFrameCksum, aSalt) and
/// `nBackfill`; None if the file is shorter than the header.
pub(crate) fn shm_header(shm: &Path) -> Option<[u32; 10]> {
    let b = std::fs::read(shm).ok()?;
    if b.len() < 136 {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
    let u16_at = |o: usize| u32::from(u16::from_ne_bytes(b[o..o + 2].try_into().unwrap()));
    Some([
        u32_at(0),                               // iVersion
        u32::from(b[12]),                        // isInit
        u32::from(b[13]),                        // bigEndCksum
        u16_at(14),                              // szPage
        u32_at(16),                              // mxFrame
        u32_at(20),                              // nPage
        u32_at(24) ^ u32_at(28).rotate_left(16), // aFrameCksum
        u32_at(32),                              // aSalt[0]
        u32_at(36),                              // aSalt[1]
        u32_at(96),                              // nBackfill
    ])
}
