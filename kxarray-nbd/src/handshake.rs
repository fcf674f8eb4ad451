//! The server side of the fixed-newstyle handshake (option haggling).
//!
//! Owns the decisions on every option: `NBD_OPT_EXPORT_NAME`, `_ABORT`,
//! `_LIST`, `_INFO`, `_GO` and `_STRUCTURED_REPLY` are served; every other
//! option gets `NBD_REP_ERR_UNSUP`. Invariants: the server never reads
//! more than an option header declares; option data above
//! [`MAX_OPTION_DATA`] is skipped in bounded pieces and refused with
//! `NBD_REP_ERR_TOO_BIG`; a malformed message (bad magic, unknown client
//! flags, an unknown export name after `NBD_OPT_EXPORT_NAME`) ends this
//! connection only, by returning an error.

use std::io::{self, Read, Write};

use tracing::{debug, info};

use crate::export::Export;
use crate::proto::{
    encode_option_reply, option_name, ExportNameReply, Greeting, Info, InfoRequest, OptionHeader,
    ServerEntry, MAX_PAYLOAD, NBD_FLAG_C_FIXED_NEWSTYLE, NBD_FLAG_C_NO_ZEROES,
    NBD_FLAG_FIXED_NEWSTYLE, NBD_FLAG_NO_ZEROES, NBD_INFO_DESCRIPTION, NBD_INFO_NAME,
    NBD_OPT_ABORT, NBD_OPT_EXPORT_NAME, NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST,
    NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, NBD_REP_ERR_INVALID, NBD_REP_ERR_SHUTDOWN,
    NBD_REP_ERR_TOO_BIG, NBD_REP_ERR_UNKNOWN, NBD_REP_ERR_UNSUP, NBD_REP_INFO, NBD_REP_SERVER,
    OPTION_HEADER_LEN,
};

/// The largest option data the server reads (64 KiB: the longest valid
/// option is an export name of at most 4 KiB plus the info requests).
pub const MAX_OPTION_DATA: u32 = 64 * 1024;

/// What the client and server agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Enter the transmission phase.
    Transmission {
        /// Structured replies were negotiated.
        structured: bool,
    },
    /// The client aborted (`NBD_OPT_ABORT`) or left; close the connection.
    Closed,
}

/// The state options change.
#[derive(Debug, Default)]
struct State {
    fixed: bool,
    no_zeroes: bool,
    structured: bool,
}

/// Run the handshake on `stream` for `export`. `shutting_down` says
/// whether to refuse options with `NBD_REP_ERR_SHUTDOWN`.
///
/// # Errors
/// I/O errors of the stream, and [`io::ErrorKind::InvalidData`] for a
/// malformed handshake; either way the caller closes the connection.
pub fn negotiate<S: Read + Write>(
    mut stream: S,
    export: &Export,
    shutting_down: impl Fn() -> bool,
) -> io::Result<Outcome> {
    let greeting = Greeting {
        handshake_flags: NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES,
    };
    stream.write_all(&greeting.encode())?;
    let mut flags = [0u8; 4];
    stream.read_exact(&mut flags)?;
    let flags = u32::from_be_bytes(flags);
    if flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
        return Err(invalid(format!("unknown client flags {flags:#x}")));
    }
    let mut state = State {
        fixed: flags & NBD_FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: flags & NBD_FLAG_C_NO_ZEROES != 0,
        structured: false,
    };

    loop {
        let mut header = [0u8; OPTION_HEADER_LEN];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Outcome::Closed),
            Err(e) => return Err(e),
        }
        let header = OptionHeader::decode(&header).map_err(|e| invalid(e.to_string()))?;
        let option = header.option;
        debug!(
            option = option_name(option),
            length = header.length,
            "option"
        );
        if !state.fixed && option != NBD_OPT_EXPORT_NAME {
            return Err(invalid(format!(
                "{} from a client that did not ask for fixed newstyle",
                option_name(option)
            )));
        }
        if header.length > MAX_OPTION_DATA {
            // Skip the data without holding it, then refuse.
            let skipped = io::copy(
                &mut (&mut stream).take(u64::from(header.length)),
                &mut io::sink(),
            )?;
            if skipped != u64::from(header.length) {
                return Ok(Outcome::Closed);
            }
            if option == NBD_OPT_EXPORT_NAME {
                return Err(invalid("NBD_OPT_EXPORT_NAME with an oversized name".into()));
            }
            reply(
                &mut stream,
                option,
                NBD_REP_ERR_TOO_BIG,
                b"option data too large",
            )?;
            continue;
        }
        // At most 64 KiB, so the cast is lossless.
        let mut data = vec![0u8; header.length as usize];
        stream.read_exact(&mut data)?;

        if shutting_down() && option != NBD_OPT_ABORT {
            if option == NBD_OPT_EXPORT_NAME {
                return Ok(Outcome::Closed);
            }
            reply(
                &mut stream,
                option,
                NBD_REP_ERR_SHUTDOWN,
                b"server shutting down",
            )?;
            continue;
        }

        match option {
            NBD_OPT_EXPORT_NAME => {
                if !export.matches(&data) {
                    return Err(invalid(format!(
                        "NBD_OPT_EXPORT_NAME for unknown export {:?}",
                        String::from_utf8_lossy(&data)
                    )));
                }
                let r = ExportNameReply {
                    size: export.size(),
                    transmission_flags: export.transmission_flags(),
                };
                stream.write_all(&r.encode(state.no_zeroes))?;
                info!(
                    structured = state.structured,
                    "export chosen by NBD_OPT_EXPORT_NAME"
                );
                return Ok(Outcome::Transmission {
                    structured: state.structured,
                });
            }
            NBD_OPT_ABORT => {
                // The client may already be gone; the ACK is best effort.
                let _ = reply(&mut stream, option, NBD_REP_ACK, &[]);
                return Ok(Outcome::Closed);
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    reply(
                        &mut stream,
                        option,
                        NBD_REP_ERR_INVALID,
                        b"NBD_OPT_LIST takes no data",
                    )?;
                    continue;
                }
                let entry = ServerEntry {
                    name: export.name.as_bytes().to_vec(),
                    details: export.description.as_bytes().to_vec(),
                };
                reply(&mut stream, option, NBD_REP_SERVER, &entry.encode())?;
                reply(&mut stream, option, NBD_REP_ACK, &[])?;
            }
            NBD_OPT_INFO | NBD_OPT_GO => {
                if info_or_go(&mut stream, option, &data, export)? && option == NBD_OPT_GO {
                    info!(structured = state.structured, "export chosen by NBD_OPT_GO");
                    return Ok(Outcome::Transmission {
                        structured: state.structured,
                    });
                }
            }
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    reply(&mut stream, option, NBD_REP_ERR_INVALID, b"takes no data")?;
                } else if state.structured {
                    reply(
                        &mut stream,
                        option,
                        NBD_REP_ERR_INVALID,
                        b"already negotiated",
                    )?;
                } else {
                    state.structured = true;
                    reply(&mut stream, option, NBD_REP_ACK, &[])?;
                }
            }
            _ => {
                reply(
                    &mut stream,
                    option,
                    NBD_REP_ERR_UNSUP,
                    b"option not supported",
                )?;
            }
        }
    }
}

/// Answer `NBD_OPT_INFO`/`NBD_OPT_GO`; `true` when it ended with `ACK`.
fn info_or_go<S: Write>(
    stream: &mut S,
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

fn reply<S: Write>(stream: &mut S, option: u32, reply_type: u32, data: &[u8]) -> io::Result<()> {
    stream.write_all(&encode_option_reply(option, reply_type, data))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}
