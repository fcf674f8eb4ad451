//! The server side of the fixed-newstyle handshake (option haggling),
//! run in steps between which the connection holds no thread, under one
//! deadline for the whole handshake.
//!
//! Owns the decisions on every option: `NBD_OPT_EXPORT_NAME`, `_ABORT`,
//! `_LIST`, `_INFO`, `_GO`, `_STRUCTURED_REPLY` and (with TLS configured)
//! `_STARTTLS` are served; every other option gets `NBD_REP_ERR_UNSUP`.
//! With TLS required, every option but `NBD_OPT_STARTTLS` and
//! `NBD_OPT_ABORT` gets `NBD_REP_ERR_TLS_REQD` until TLS is up, and
//! `NBD_OPT_EXPORT_NAME` closes the connection (the protocol's FORCEDTLS).
//!
//! Invariants: [`advance`] returns [`Step::Park`] only between messages
//! with nothing waiting to be read (not on the socket, not decrypted in
//! the TLS session), so the event loop's readiness wakes it for the next
//! one; every read and write inside a step is bounded by the time left
//! before [`State`]'s deadline; the server never reads more than an
//! option header declares, and option data above [`MAX_OPTION_DATA`] is
//! skipped in bounded pieces and refused with `NBD_REP_ERR_TOO_BIG`; a
//! malformed message ends this connection only, by returning an error.

use std::fmt;
use std::io::{self, Read, Write};
use std::time::Instant;

use rustls::ServerConnection;
use tracing::{debug, info};

use crate::export::Export;
use crate::proto::{
    encode_option_reply, option_name, ExportNameReply, Greeting, Info, InfoRequest, OptionHeader,
    ServerEntry, MAX_PAYLOAD, NBD_FLAG_C_FIXED_NEWSTYLE, NBD_FLAG_C_NO_ZEROES,
    NBD_FLAG_FIXED_NEWSTYLE, NBD_FLAG_NO_ZEROES, NBD_INFO_DESCRIPTION, NBD_INFO_NAME,
    NBD_OPT_ABORT, NBD_OPT_EXPORT_NAME, NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST, NBD_OPT_STARTTLS,
    NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, NBD_REP_ERR_INVALID, NBD_REP_ERR_SHUTDOWN,
    NBD_REP_ERR_TLS_REQD, NBD_REP_ERR_TOO_BIG, NBD_REP_ERR_UNKNOWN, NBD_REP_ERR_UNSUP,
    NBD_REP_INFO, NBD_REP_SERVER, OPTION_HEADER_LEN,
};
use crate::socket::Socket;
use crate::tls::Tls;
use crate::transmission::Session;

/// The largest option data the server reads (64 KiB: the longest valid
/// option is an export name of at most 4 KiB plus the info requests).
pub const MAX_OPTION_DATA: u32 = 64 * 1024;

/// The server's first message, sent as soon as a connection is accepted.
pub fn greeting() -> [u8; crate::proto::GREETING_LEN] {
    Greeting {
        handshake_flags: NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES,
    }
    .encode()
}

/// A handshake in progress: what the client asked for so far.
#[derive(Debug)]
pub struct State {
    deadline: Instant,
    /// The client's flags have been read.
    flags_read: bool,
    fixed: bool,
    no_zeroes: bool,
    structured: bool,
    tls: Option<Box<ServerConnection>>,
}

impl State {
    /// A handshake whose greeting was sent, to finish before `deadline`.
    pub fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            flags_read: false,
            fixed: false,
            no_zeroes: false,
            structured: false,
            tls: None,
        }
    }

    /// When the handshake must be over.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// What the server offers and whether it is stopping.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The export.
    pub export: &'a Export,
    /// TLS, when offered or required.
    pub tls: Option<&'a Tls>,
    /// Whether the server is shutting down (options are then refused with
    /// `NBD_REP_ERR_SHUTDOWN`).
    pub shutting_down: bool,
}

/// Where a handshake step stopped.
#[derive(Debug)]
pub enum Step {
    /// Between messages, nothing waiting: wait for the socket to be
    /// readable.
    Park,
    /// The client chose the export: enter the transmission phase.
    Transmission(Session),
    /// The client aborted (`NBD_OPT_ABORT`) or left; close the connection.
    Closed,
}

/// Why a handshake ended the connection.
#[derive(Debug)]
pub enum HandshakeError {
    /// The handshake deadline passed.
    Deadline,
    /// The socket failed.
    Io(io::Error),
    /// The client broke the protocol.
    Protocol(String),
    /// The TLS handshake failed.
    Tls(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deadline => write!(f, "handshake deadline passed"),
            Self::Io(e) => write!(f, "{e}"),
            Self::Protocol(m) => write!(f, "protocol violation: {m}"),
            Self::Tls(m) => write!(f, "TLS handshake failed: {m}"),
        }
    }
}

impl std::error::Error for HandshakeError {}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::TimedOut {
            Self::Deadline
        } else {
            Self::Io(e)
        }
    }
}

/// The socket with every read and write bounded by the time left before a
/// deadline (a timed-out operation fails with `TimedOut`).
struct Deadlined<'a> {
    socket: &'a Socket,
    deadline: Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> io::Result<std::time::Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake deadline",
            ));
        }
        Ok(left)
    }
}

fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "handshake deadline")
    } else {
        e
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.socket.set_read_timeout(Some(self.left()?))?;
        (&*self.socket).read(buf).map_err(timed_out)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.socket.set_write_timeout(Some(self.left()?))?;
        (&*self.socket).write(buf).map_err(timed_out)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Read and write, in clear or through TLS.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// What an option asks of the step loop.
enum Action {
    Continue,
    StartTls,
    Transmission,
    Closed,
}

/// Whether the next message may be read without waiting for the client.
fn pending(socket: &Socket, state: &mut State) -> bool {
    let plaintext = state.tls.as_mut().is_some_and(|s| {
        s.process_new_packets()
            .is_ok_and(|st| st.plaintext_bytes_to_read() > 0)
    });
    plaintext || socket.readable_now()
}

/// Run the handshake on `socket` from `state` until it needs to wait for
/// the client ([`Step::Park`]), reaches the transmission phase, or ends.
///
/// # Errors
/// [`HandshakeError`]: the deadline passed, the socket failed, the client
/// broke the protocol or the TLS handshake failed; the caller closes the
/// connection.
pub fn advance(
    socket: &Socket,
    state: &mut State,
    ctx: Context<'_>,
) -> Result<Step, HandshakeError> {
    loop {
        if Instant::now() >= state.deadline {
            return Err(HandshakeError::Deadline);
        }
        if !pending(socket, state) {
            return Ok(Step::Park);
        }
        let mut io = Deadlined {
            socket,
            deadline: state.deadline,
        };
        if !state.flags_read {
            let mut flags = [0u8; 4];
            io.read_exact(&mut flags)?;
            let flags = u32::from_be_bytes(flags);
            if flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
                return Err(HandshakeError::Protocol(format!(
                    "unknown client flags {flags:#x}"
                )));
            }
            state.flags_read = true;
            state.fixed = flags & NBD_FLAG_C_FIXED_NEWSTYLE != 0;
            state.no_zeroes = flags & NBD_FLAG_C_NO_ZEROES != 0;
            continue;
        }
        let flags = state_flags(state);
        let action = match state.tls.as_mut() {
            Some(tls) => {
                let mut s = rustls::Stream::new(&mut **tls, &mut io);
                one_option(&mut s, flags, ctx)
            }
            None => one_option(&mut io, flags, ctx),
        };
        match action {
            Ok((Action::Continue, structured)) => state.structured = structured,
            Ok((Action::StartTls, _)) => {
                let Some(tls) = ctx.tls else {
                    return Err(HandshakeError::Protocol("STARTTLS without TLS".into()));
                };
                let mut session = Box::new(tls.session()?);
                while session.is_handshaking() {
                    session.complete_io(&mut io).map_err(|e| match e.kind() {
                        io::ErrorKind::TimedOut => HandshakeError::Deadline,
                        _ => HandshakeError::Tls(e.to_string()),
                    })?;
                }
                debug!(
                    version = ?session.protocol_version(),
                    "TLS session established"
                );
                // Options haggled in clear could have been tampered with.
                state.structured = false;
                state.tls = Some(session);
            }
            Ok((Action::Transmission, structured)) => {
                return Ok(Step::Transmission(Session {
                    structured,
                    tls: state.tls.take(),
                    leftover: Vec::new(),
                }));
            }
            Ok((Action::Closed, _)) => return Ok(Step::Closed),
            Err(e) => return Err(e),
        }
    }
}

/// The flags one option's handling needs.
#[derive(Debug, Clone, Copy)]
struct Flags {
    fixed: bool,
    no_zeroes: bool,
    structured: bool,
    tls_up: bool,
}

fn state_flags(state: &State) -> Flags {
    Flags {
        fixed: state.fixed,
        no_zeroes: state.no_zeroes,
        structured: state.structured,
        tls_up: state.tls.is_some(),
    }
}

/// Read and answer one option; returns what to do next and whether
/// structured replies are now negotiated.
fn one_option(
    stream: &mut dyn Stream,
    f: Flags,
    ctx: Context<'_>,
) -> Result<(Action, bool), HandshakeError> {
    let mut header = [0u8; OPTION_HEADER_LEN];
    match stream.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok((Action::Closed, false)),
        Err(e) => return Err(e.into()),
    }
    let header =
        OptionHeader::decode(&header).map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    let option = header.option;
    debug!(
        option = option_name(option),
        length = header.length,
        "option"
    );
    if !f.fixed && option != NBD_OPT_EXPORT_NAME {
        return Err(HandshakeError::Protocol(format!(
            "{} from a client that did not ask for fixed newstyle",
            option_name(option)
        )));
    }
    let keep = |a: Action| Ok((a, f.structured));
    if header.length > MAX_OPTION_DATA {
        // Skip the data without holding it, then refuse.
        let skipped = io::copy(
            &mut (&mut *stream).take(u64::from(header.length)),
            &mut io::sink(),
        )?;
        if skipped != u64::from(header.length) {
            return keep(Action::Closed);
        }
        if option == NBD_OPT_EXPORT_NAME {
            return Err(HandshakeError::Protocol(
                "NBD_OPT_EXPORT_NAME with an oversized name".into(),
            ));
        }
        reply(
            stream,
            option,
            NBD_REP_ERR_TOO_BIG,
            b"option data too large",
        )?;
        return keep(Action::Continue);
    }
    // At most 64 KiB, so the cast is lossless.
    let mut data = vec![0u8; header.length as usize];
    stream.read_exact(&mut data)?;

    if ctx.shutting_down && option != NBD_OPT_ABORT {
        if option == NBD_OPT_EXPORT_NAME {
            return keep(Action::Closed);
        }
        reply(
            stream,
            option,
            NBD_REP_ERR_SHUTDOWN,
            b"server shutting down",
        )?;
        return keep(Action::Continue);
    }

    let tls_required = ctx.tls.is_some_and(Tls::required) && !f.tls_up;
    if tls_required && option != NBD_OPT_STARTTLS && option != NBD_OPT_ABORT {
        if option == NBD_OPT_EXPORT_NAME {
            info!("NBD_OPT_EXPORT_NAME before TLS while TLS is required; closing");
            return keep(Action::Closed);
        }
        reply(stream, option, NBD_REP_ERR_TLS_REQD, b"TLS is required")?;
        return keep(Action::Continue);
    }

    match option {
        NBD_OPT_EXPORT_NAME => {
            if !ctx.export.matches(&data) {
                return Err(HandshakeError::Protocol(format!(
                    "NBD_OPT_EXPORT_NAME for unknown export {:?}",
                    String::from_utf8_lossy(&data)
                )));
            }
            let r = ExportNameReply {
                size: ctx.export.size(),
                transmission_flags: ctx.export.transmission_flags(),
            };
            stream.write_all(&r.encode(f.no_zeroes))?;
            stream.flush()?;
            info!(
                structured = f.structured,
                tls = f.tls_up,
                "export chosen by NBD_OPT_EXPORT_NAME"
            );
            keep(Action::Transmission)
        }
        NBD_OPT_ABORT => {
            // The client may already be gone; the ACK is best effort.
            let _ = reply(stream, option, NBD_REP_ACK, &[]);
            keep(Action::Closed)
        }
        NBD_OPT_STARTTLS => {
            if ctx.tls.is_none() {
                reply(stream, option, NBD_REP_ERR_UNSUP, b"TLS not configured")?;
            } else if f.tls_up {
                reply(stream, option, NBD_REP_ERR_INVALID, b"TLS already started")?;
            } else if !data.is_empty() {
                reply(stream, option, NBD_REP_ERR_INVALID, b"takes no data")?;
            } else {
                reply(stream, option, NBD_REP_ACK, &[])?;
                return keep(Action::StartTls);
            }
            keep(Action::Continue)
        }
        NBD_OPT_LIST => {
            if !data.is_empty() {
                reply(
                    stream,
                    option,
                    NBD_REP_ERR_INVALID,
                    b"NBD_OPT_LIST takes no data",
                )?;
                return keep(Action::Continue);
            }
            let entry = ServerEntry {
                name: ctx.export.name.as_bytes().to_vec(),
                details: ctx.export.description.as_bytes().to_vec(),
            };
            reply(stream, option, NBD_REP_SERVER, &entry.encode())?;
            reply(stream, option, NBD_REP_ACK, &[])?;
            keep(Action::Continue)
        }
        NBD_OPT_INFO | NBD_OPT_GO => {
            if info_or_go(stream, option, &data, ctx.export)? && option == NBD_OPT_GO {
                info!(
                    structured = f.structured,
                    tls = f.tls_up,
                    "export chosen by NBD_OPT_GO"
                );
                return keep(Action::Transmission);
            }
            keep(Action::Continue)
        }
        NBD_OPT_STRUCTURED_REPLY => {
            if !data.is_empty() {
                reply(stream, option, NBD_REP_ERR_INVALID, b"takes no data")?;
            } else if f.structured {
                reply(stream, option, NBD_REP_ERR_INVALID, b"already negotiated")?;
            } else {
                reply(stream, option, NBD_REP_ACK, &[])?;
                return Ok((Action::Continue, true));
            }
            keep(Action::Continue)
        }
        _ => {
            reply(stream, option, NBD_REP_ERR_UNSUP, b"option not supported")?;
            keep(Action::Continue)
        }
    }
}

/// Answer `NBD_OPT_INFO`/`NBD_OPT_GO`; `true` when it ended with `ACK`.
fn info_or_go(
    stream: &mut dyn Stream,
    option: u32,
    data: &[u8],
    export: &Export,
) -> io::Result<bool> {
    let request = match InfoRequest::decode(data) {
        Ok(r) => r,
        Err(e) => {
            reply(
                stream,
                option,
                NBD_REP_ERR_INVALID,
                e.to_string().as_bytes(),
            )?;
            return Ok(false);
        }
    };
    if !export.matches(&request.name) {
        reply(stream, option, NBD_REP_ERR_UNKNOWN, b"no such export")?;
        return Ok(false);
    }
    let mut infos = vec![
        Info::Export {
            size: export.size(),
            transmission_flags: export.transmission_flags(),
        },
        // Sent unasked: the defaults (min 1, preferred 4096) plus the
        // 32 MiB payload cap the transmission phase enforces.
        Info::BlockSize {
            min: 1,
            preferred: 4096,
            max: MAX_PAYLOAD,
        },
    ];
    if request.requests.contains(&NBD_INFO_NAME) {
        infos.push(Info::Name(export.name.as_bytes().to_vec()));
    }
    if request.requests.contains(&NBD_INFO_DESCRIPTION) && !export.description.is_empty() {
        infos.push(Info::Description(export.description.as_bytes().to_vec()));
    }
    for i in infos {
        reply(stream, option, NBD_REP_INFO, &i.encode())?;
    }
    reply(stream, option, NBD_REP_ACK, &[])?;
    Ok(true)
}

fn reply(stream: &mut dyn Stream, option: u32, reply_type: u32, data: &[u8]) -> io::Result<()> {
    stream.write_all(&encode_option_reply(option, reply_type, data))?;
    // A TLS stream encrypts on write and sends on flush.
    stream.flush()
}
