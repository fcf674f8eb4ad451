//! An NBD client written for the tests (fixed newstyle, `NBD_OPT_GO`,
//! optional structured replies, pipelined requests) and a helper that
//! runs a server in-process on an ephemeral port or a temporary Unix
//! socket.
#![allow(dead_code)]

pub mod process;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::thread::JoinHandle;

use kxarray::backend::Backend;
use kxarray_nbd::proto::*;
use kxarray_nbd::{workers_for, Config, Export, ListenAddr, Listener, Server, Socket};

/// A server running on its own thread.
pub struct Running {
    pub server: Server,
    pub addr: ListenAddr,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

impl Running {
    /// Stop accepting, wait for every connection, flush.
    pub fn stop(mut self) {
        self.server.handle().shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap();
        self.server.finish().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.server.handle().shutdown();
            let _ = t.join();
        }
    }
}

/// Where to listen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Unix,
}

/// A server with the workers the binary would choose for `backend`
/// ([`workers_for`]: one per connection for the RAM disks, a pool for
/// files).
pub fn start(backend: Arc<dyn Backend>, name: &str, transport: Transport) -> Running {
    start_with_workers(backend, name, transport, None)
}

/// A server with `workers` threads per connection (`None`: as [`start`]).
pub fn start_with_workers(
    backend: Arc<dyn Backend>,
    name: &str,
    transport: Transport,
    workers: Option<usize>,
) -> Running {
    let export = Export::new(name, backend)
        .unwrap()
        .with_description("test disk");
    let workers = workers.unwrap_or_else(|| workers_for(&export));
    start_config(export, Config::new(workers), transport)
}

/// A server for `export` with `config`.
pub fn start_config(export: Export, config: Config, transport: Transport) -> Running {
    let server = Server::new(export, config).unwrap();
    let (listener, dir) = match transport {
        Transport::Tcp => (Listener::tcp("127.0.0.1:0").unwrap(), None),
        Transport::Unix => {
            let dir = tempfile::tempdir().unwrap();
            (
                Listener::unix(dir.path().join("nbd.sock")).unwrap(),
                Some(dir),
            )
        }
    };
    let addr = listener.local_addr().unwrap();
    let s = server.clone();
    let thread = std::thread::spawn(move || s.serve(vec![listener]));
    Running {
        server,
        addr,
        thread: Some(thread),
        _dir: dir,
    }
}

// ---- Raw handshake steps ----------------------------------------------------

/// Connect and read the greeting; returns the socket and handshake flags.
pub fn greet(addr: &ListenAddr) -> (Socket, u16) {
    let mut s = addr.connect().unwrap();
    let mut g = [0u8; GREETING_LEN];
    s.read_exact(&mut g).unwrap();
    let g = Greeting::decode(&g).unwrap();
    (s, g.handshake_flags)
}

/// Connect, read the greeting, send client flags.
pub fn open(addr: &ListenAddr, client_flags: u32) -> Socket {
    let (mut s, flags) = greet(addr);
    assert_eq!(flags, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
    s.write_all(&client_flags.to_be_bytes()).unwrap();
    s
}

pub fn send_option(s: &mut Socket, option: u32, data: &[u8]) {
    let h = OptionHeader {
        option,
        length: data.len() as u32,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(data).unwrap();
}

pub fn read_option_reply(s: &mut Socket) -> (OptionReplyHeader, Vec<u8>) {
    let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = OptionReplyHeader::decode(&h).unwrap();
    let mut data = vec![0u8; h.length as usize];
    s.read_exact(&mut data).unwrap();
    (h, data)
}

/// Send `NBD_OPT_GO`/`INFO` and collect the replies up to the final one.
pub fn info_or_go(s: &mut Socket, option: u32, name: &[u8], requests: &[u16]) -> (Vec<Info>, u32) {
    let req = InfoRequest {
        name: name.to_vec(),
        requests: requests.to_vec(),
    };
    send_option(s, option, &req.encode());
    let mut infos = Vec::new();
    loop {
        let (h, data) = read_option_reply(s);
        assert_eq!(h.option, option);
        if h.reply_type == NBD_REP_INFO {
            infos.push(Info::decode(&data).unwrap());
        } else {
            return (infos, h.reply_type);
        }
    }
}

/// Whether the server has closed `s` (reads end of stream or reset).
pub fn is_closed(s: &mut Socket) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

// ---- The transmission client -----------------------------------------------

/// A negotiated connection.
pub struct Client {
    pub socket: Socket,
    pub structured: bool,
    pub size: u64,
    pub flags: u16,
    next: u64,
    /// Cookie -> (command, offset, length) of requests in flight.
    pending: HashMap<u64, (u16, u64, u32)>,
}

/// A reply: data for a successful read, or the error value.
pub type Outcome = Result<Vec<u8>, u32>;

impl Client {
    pub fn connect(addr: &ListenAddr, structured: bool) -> Client {
        let mut s = open(addr, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
        if structured {
            send_option(&mut s, NBD_OPT_STRUCTURED_REPLY, &[]);
            let (h, _) = read_option_reply(&mut s);
            assert_eq!(h.reply_type, NBD_REP_ACK);
        }
        let (infos, last) = info_or_go(&mut s, NBD_OPT_GO, b"", &[NBD_INFO_BLOCK_SIZE]);
        assert_eq!(last, NBD_REP_ACK);
        let (size, flags) = infos
            .iter()
            .find_map(|i| match i {
                Info::Export {
                    size,
                    transmission_flags,
                } => Some((*size, *transmission_flags)),
                _ => None,
            })
            .expect("NBD_INFO_EXPORT before ACK");
        Client {
            socket: s,
            structured,
            size,
            flags,
            next: 1,
            pending: HashMap::new(),
        }
    }

    /// Send a request (and a write's payload) without waiting.
    pub fn send(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next;
        self.next += 1;
        let r = Request {
            flags,
            command,
            cookie,
            offset,
            length,
        };
        let mut msg = r.encode().to_vec();
        msg.extend_from_slice(payload);
        self.socket.write_all(&msg).unwrap();
        self.pending.insert(cookie, (command, offset, length));
        cookie
    }

    /// Receive one reply (any request's); checks it is well formed.
    pub fn recv(&mut self) -> (u64, Outcome) {
        let mut magic = [0u8; 4];
        self.socket.read_exact(&mut magic).unwrap();
        let magic = u32::from_be_bytes(magic);
        if magic == NBD_SIMPLE_REPLY_MAGIC {
            let mut rest = [0u8; SIMPLE_REPLY_LEN];
            rest[..4].copy_from_slice(&magic.to_be_bytes());
            self.socket.read_exact(&mut rest[4..]).unwrap();
            let r = SimpleReply::decode(&rest).unwrap();
            let (command, _, length) = self
                .pending
                .remove(&r.cookie)
                .expect("reply to a pending cookie");
            if r.error != 0 {
                return (r.cookie, Err(r.error));
            }
            assert!(
                !(self.structured && command == NBD_CMD_READ),
                "simple reply to a structured READ"
            );
            let mut data = vec![];
            if command == NBD_CMD_READ {
                data = vec![0u8; length as usize];
                self.socket.read_exact(&mut data).unwrap();
            }
            return (r.cookie, Ok(data));
        }
        assert_eq!(magic, NBD_STRUCTURED_REPLY_MAGIC, "unknown reply magic");
        assert!(self.structured, "structured reply without negotiation");
        // Chunks until DONE: a long READ comes in several OFFSET_DATA
        // chunks, each placed at its offset; an error chunk fails it.
        let mut magic = magic;
        let mut data: Option<Vec<u8>> = None;
        let mut covered = 0usize;
        let mut error = None;
        loop {
            assert_eq!(magic, NBD_STRUCTURED_REPLY_MAGIC, "unknown chunk magic");
            let mut head = [0u8; CHUNK_HEADER_LEN];
            head[..4].copy_from_slice(&magic.to_be_bytes());
            self.socket.read_exact(&mut head[4..]).unwrap();
            let h = ChunkHeader::decode(&head).unwrap();
            let mut payload = vec![0u8; h.length as usize];
            self.socket.read_exact(&mut payload).unwrap();
            let &(_, offset, length) = self
                .pending
                .get(&h.cookie)
                .expect("reply to a pending cookie");
            match h.chunk_type {
                NBD_REPLY_TYPE_NONE => assert!(h.length == 0),
                NBD_REPLY_TYPE_OFFSET_DATA => {
                    let at = u64::from_be_bytes(payload[..8].try_into().unwrap());
                    let start = (at - offset) as usize;
                    let piece = &payload[8..];
                    assert!(
                        start + piece.len() <= length as usize,
                        "chunk past the request"
                    );
                    let d = data.get_or_insert_with(|| vec![0u8; length as usize]);
                    d[start..start + piece.len()].copy_from_slice(piece);
                    covered += piece.len();
                }
                NBD_REPLY_TYPE_ERROR => error = Some(ErrorChunk::decode(&payload).unwrap().error),
                t => panic!("unexpected chunk type {t}"),
            }
            if h.flags & NBD_REPLY_FLAG_DONE != 0 {
                self.pending.remove(&h.cookie);
                let out = match (error, data) {
                    (Some(e), _) => Err(e),
                    (None, Some(d)) => {
                        assert_eq!(covered, d.len(), "READ reply with holes");
                        Ok(d)
                    }
                    (None, None) => Ok(vec![]),
                };
                return (h.cookie, out);
            }
            let mut m = [0u8; 4];
            self.socket.read_exact(&mut m).unwrap();
            magic = u32::from_be_bytes(m);
        }
    }

    fn call(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Outcome {
        let c = self.send(command, flags, offset, length, payload);
        let (got, out) = self.recv();
        assert_eq!(got, c);
        out
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Outcome {
        self.call(NBD_CMD_READ, 0, offset, length, &[])
    }
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Outcome {
        self.call(NBD_CMD_WRITE, 0, offset, data.len() as u32, data)
    }
    pub fn write_fua(&mut self, offset: u64, data: &[u8]) -> Outcome {
        self.call(
            NBD_CMD_WRITE,
            NBD_CMD_FLAG_FUA,
            offset,
            data.len() as u32,
            data,
        )
    }
    pub fn trim(&mut self, offset: u64, length: u32) -> Outcome {
        self.call(NBD_CMD_TRIM, 0, offset, length, &[])
    }
    pub fn write_zeroes(&mut self, offset: u64, length: u32, flags: u16) -> Outcome {
        self.call(NBD_CMD_WRITE_ZEROES, flags, offset, length, &[])
    }
    pub fn flush(&mut self) -> Outcome {
        self.call(NBD_CMD_FLUSH, 0, 0, 0, &[])
    }
    pub fn call_raw(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Outcome {
        self.call(command, flags, offset, length, payload)
    }

    /// Send `NBD_CMD_DISC` and check the server closes.
    pub fn disconnect(mut self) {
        let r = Request {
            flags: 0,
            command: NBD_CMD_DISC,
            cookie: 0,
            offset: 0,
            length: 0,
        };
        self.socket.write_all(&r.encode()).unwrap();
        assert!(is_closed(&mut self.socket));
    }
}

pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::fill(&mut v[..]);
    v
}
