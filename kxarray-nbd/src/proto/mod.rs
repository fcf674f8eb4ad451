//! The NBD wire protocol: every constant and every message layout the
//! server speaks, in one place, with no I/O.
//!
//! Facts from the protocol specification (NetworkBlockDevice/nbd
//! `doc/proto.md`); constant names are the spec's, so each can be checked
//! against it with a text search. All integers are big-endian.
//!
//! Owns:
//! - the constants: magics, handshake and client flags, option codes,
//!   option reply types, `NBD_INFO_*` types, transmission flags, command
//!   types and flags, structured reply flags and types, error values;
//! - encoders and decoders for the fixed-newstyle handshake (greeting,
//!   client flags, option request header, option reply, the
//!   `NBD_OPT_EXPORT_NAME` reply, `NBD_OPT_INFO`/`NBD_OPT_GO` data,
//!   `NBD_REP_SERVER` and `NBD_REP_INFO` payloads) and for the
//!   transmission phase (the 28-byte request header, the 16-byte simple
//!   reply, the 20-byte structured reply chunk header and the payloads of
//!   the `OFFSET_DATA`, `OFFSET_HOLE` and `ERROR` chunks).
//!
//! Invariants: every `encode` followed by the matching `decode` gives the
//! value back; every decoder checks lengths and magics and returns a
//! [`ProtoError`] instead of panicking on any input.

use std::fmt;

mod consts;
#[cfg(test)]
mod tests;

pub use consts::*;

// ---- Sizes --------------------------------------------------------------------------

/// Bytes of the server greeting (`NBDMAGIC`, `IHAVEOPT`, handshake flags).
pub const GREETING_LEN: usize = 18;
/// Bytes of an option request header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;
/// Bytes of an option reply header (magic, option, type, length).
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Bytes of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Bytes of a simple reply.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Zero bytes after the `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES`.
pub const EXPORT_NAME_ZEROES: usize = 124;
/// The payload length any server must accept (2^25 = 32 MiB, the spec's
/// "SHOULD NOT be considered a denial of service").
pub const MAX_PAYLOAD: u32 = 1 << 25;

/// A message that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the layout needs.
    Truncated {
        /// Bytes the layout needs.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// A magic number other than the expected one.
    BadMagic {
        /// The expected magic.
        expected: u64,
        /// The magic found.
        found: u64,
    },
    /// A length field inconsistent with the data around it.
    BadLength(&'static str),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { need, got } => {
                write!(f, "message truncated: need {need} bytes, got {got}")
            }
            Self::BadMagic { expected, found } => {
                write!(f, "bad magic {found:#x} (expected {expected:#x})")
            }
            Self::BadLength(what) => write!(f, "inconsistent length: {what}"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// Big-endian reader over a byte slice that reports truncation.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8], need: usize) -> Result<Self, ProtoError> {
        if buf.len() < need {
            return Err(ProtoError::Truncated {
                need,
                got: buf.len(),
            });
        }
        Ok(Self { buf, at: 0 })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.at + n;
        let got = self.buf.get(self.at..end).ok_or(ProtoError::Truncated {
            need: end,
            got: self.buf.len(),
        })?;
        self.at = end;
        Ok(got)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn rest(&mut self) -> &'a [u8] {
        let r = &self.buf[self.at..];
        self.at = self.buf.len();
        r
    }
}

fn magic64(expected: u64, found: u64) -> Result<(), ProtoError> {
    if expected == found {
        Ok(())
    } else {
        Err(ProtoError::BadMagic { expected, found })
    }
}

// ---- Handshake messages ----------------------------------------------------------------

/// The server's first message: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    /// `NBD_FLAG_FIXED_NEWSTYLE` | `NBD_FLAG_NO_ZEROES` as offered.
    pub handshake_flags: u16,
}

impl Greeting {
    /// The 18 bytes on the wire.
    pub fn encode(&self) -> [u8; GREETING_LEN] {
        let mut b = [0u8; GREETING_LEN];
        b[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[16..].copy_from_slice(&self.handshake_flags.to_be_bytes());
        b
    }

    /// Decode the 18 bytes of a greeting.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadMagic`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, GREETING_LEN)?;
        magic64(NBDMAGIC, c.u64()?)?;
        magic64(IHAVEOPT, c.u64()?)?;
        Ok(Self {
            handshake_flags: c.u16()?,
        })
    }
}

/// The header of an option request; `length` bytes of data follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The `NBD_OPT_*` code.
    pub option: u32,
    /// Bytes of option data that follow.
    pub length: u32,
}

impl OptionHeader {
    /// The 16 bytes on the wire.
    pub fn encode(&self) -> [u8; OPTION_HEADER_LEN] {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode the 16-byte header.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadMagic`] (not `IHAVEOPT`).
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, OPTION_HEADER_LEN)?;
        magic64(IHAVEOPT, c.u64()?)?;
        Ok(Self {
            option: c.u32()?,
            length: c.u32()?,
        })
    }
}

/// The header of a fixed-newstyle option reply; `length` bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option this replies to.
    pub option: u32,
    /// `NBD_REP_*`.
    pub reply_type: u32,
    /// Bytes of reply data that follow.
    pub length: u32,
}

impl OptionReplyHeader {
    /// The 20 bytes on the wire.
    pub fn encode(&self) -> [u8; OPTION_REPLY_HEADER_LEN] {
        let mut b = [0u8; OPTION_REPLY_HEADER_LEN];
        b[..8].copy_from_slice(&NBD_REP_MAGIC.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.reply_type.to_be_bytes());
        b[16..].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode the 20-byte header.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadMagic`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, OPTION_REPLY_HEADER_LEN)?;
        magic64(NBD_REP_MAGIC, c.u64()?)?;
        Ok(Self {
            option: c.u32()?,
            reply_type: c.u32()?,
            length: c.u32()?,
        })
    }
}

/// A whole option reply: header fields and data, encoded in one buffer.
///
/// # Panics
/// When `data` is longer than `u32::MAX` bytes.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let length = u32::try_from(data.len()).expect("option reply data fits in u32");
    let mut v = OptionReplyHeader {
        option,
        reply_type,
        length,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(data);
    v
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124
/// zero bytes unless the client negotiated `NBD_FLAG_C_NO_ZEROES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportNameReply {
    /// Export size in bytes.
    pub size: u64,
    /// `NBD_FLAG_*` transmission flags.
    pub transmission_flags: u16,
}

impl ExportNameReply {
    /// The 10 or 134 bytes on the wire.
    pub fn encode(&self, no_zeroes: bool) -> Vec<u8> {
        let mut v = Vec::with_capacity(10 + EXPORT_NAME_ZEROES);
        v.extend_from_slice(&self.size.to_be_bytes());
        v.extend_from_slice(&self.transmission_flags.to_be_bytes());
        if !no_zeroes {
            v.resize(10 + EXPORT_NAME_ZEROES, 0);
        }
        v
    }

    /// Decode the first 10 bytes (the zeros, if any, are the caller's to skip).
    ///
    /// # Errors
    /// [`ProtoError::Truncated`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, 10)?;
        Ok(Self {
            size: c.u64()?,
            transmission_flags: c.u16()?,
        })
    }
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`: an export name and the
/// `NBD_INFO_*` types the client asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name bytes (empty: the default export).
    pub name: Vec<u8>,
    /// Requested `NBD_INFO_*` types.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// The option data on the wire.
    ///
    /// # Panics
    /// When the name is longer than `u32::MAX` bytes or there are more than
    /// `u16::MAX` requests.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(6 + self.name.len() + 2 * self.requests.len());
        v.extend_from_slice(
            &u32::try_from(self.name.len())
                .expect("name fits u32")
                .to_be_bytes(),
        );
        v.extend_from_slice(&self.name);
        v.extend_from_slice(
            &u16::try_from(self.requests.len())
                .expect("count fits u16")
                .to_be_bytes(),
        );
        for r in &self.requests {
            v.extend_from_slice(&r.to_be_bytes());
        }
        v
    }

    /// Decode option data; the name length and request count must account
    /// for every byte exactly.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadLength`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, 6)?;
        let name_len = c.u32()? as usize;
        if name_len > buf.len() - 6 {
            return Err(ProtoError::BadLength(
                "export name longer than the option data - 6",
            ));
        }
        let name = c.take(name_len)?.to_vec();
        let n = c.u16()? as usize;
        if c.buf.len() - c.at != 2 * n {
            return Err(ProtoError::BadLength(
                "information request count does not match the option data",
            ));
        }
        let requests = (0..n).map(|_| c.u16()).collect::<Result<_, _>>()?;
        Ok(Self { name, requests })
    }
}

/// The data of an `NBD_REP_SERVER` reply to `NBD_OPT_LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    /// Export name.
    pub name: Vec<u8>,
    /// Free-form text after the name (a description).
    pub details: Vec<u8>,
}

impl ServerEntry {
    /// The reply data on the wire.
    ///
    /// # Panics
    /// When the name is longer than `u32::MAX` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = u32::try_from(self.name.len())
            .expect("name fits u32")
            .to_be_bytes()
            .to_vec();
        v.extend_from_slice(&self.name);
        v.extend_from_slice(&self.details);
        v
    }

    /// Decode reply data.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadLength`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, 4)?;
        let n = c.u32()? as usize;
        if n > buf.len() - 4 {
            return Err(ProtoError::BadLength(
                "export name longer than the reply data - 4",
            ));
        }
        let name = c.take(n)?.to_vec();
        Ok(Self {
            name,
            details: c.rest().to_vec(),
        })
    }
}

/// One `NBD_REP_INFO` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags.
        transmission_flags: u16,
    },
    /// `NBD_INFO_NAME`: canonical name.
    Name(Vec<u8>),
    /// `NBD_INFO_DESCRIPTION`: description for humans.
    Description(Vec<u8>),
    /// `NBD_INFO_BLOCK_SIZE`: size constraints.
    BlockSize {
        /// Minimum block size.
        min: u32,
        /// Preferred block size.
        preferred: u32,
        /// Maximum payload size.
        max: u32,
    },
    /// A type this layer does not know, kept raw.
    Unknown {
        /// The `NBD_INFO_*` type.
        info_type: u16,
        /// The bytes after the type.
        data: Vec<u8>,
    },
}

impl Info {
    /// The reply data on the wire (type, then payload).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(14);
        match self {
            Self::Export {
                size,
                transmission_flags,
            } => {
                v.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
                v.extend_from_slice(&size.to_be_bytes());
                v.extend_from_slice(&transmission_flags.to_be_bytes());
            }
            Self::Name(n) => {
                v.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
                v.extend_from_slice(n);
            }
            Self::Description(d) => {
                v.extend_from_slice(&NBD_INFO_DESCRIPTION.to_be_bytes());
                v.extend_from_slice(d);
            }
            Self::BlockSize {
                min,
                preferred,
                max,
            } => {
                v.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
                v.extend_from_slice(&min.to_be_bytes());
                v.extend_from_slice(&preferred.to_be_bytes());
                v.extend_from_slice(&max.to_be_bytes());
            }
            Self::Unknown { info_type, data } => {
                v.extend_from_slice(&info_type.to_be_bytes());
                v.extend_from_slice(data);
            }
        }
        v
    }

    /// Decode reply data; the fixed-size types must have their exact length
    /// (12 for `EXPORT`, 14 for `BLOCK_SIZE`).
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadLength`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, 2)?;
        let info_type = c.u16()?;
        let exact = |n: usize| {
            if buf.len() == n {
                Ok(())
            } else {
                Err(ProtoError::BadLength("NBD_REP_INFO length for its type"))
            }
        };
        Ok(match info_type {
            NBD_INFO_EXPORT => {
                exact(12)?;
                Self::Export {
                    size: c.u64()?,
                    transmission_flags: c.u16()?,
                }
            }
            NBD_INFO_NAME => Self::Name(c.rest().to_vec()),
            NBD_INFO_DESCRIPTION => Self::Description(c.rest().to_vec()),
            NBD_INFO_BLOCK_SIZE => {
                exact(14)?;
                Self::BlockSize {
                    min: c.u32()?,
                    preferred: c.u32()?,
                    max: c.u32()?,
                }
            }
            other => Self::Unknown {
                info_type: other,
                data: c.rest().to_vec(),
            },
        })
    }
}

// ---- Transmission messages --------------------------------------------------------------

/// A transmission request header (a `WRITE`'s payload follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// `NBD_CMD_*`.
    pub command: u16,
    /// Opaque value echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

impl Request {
    /// The 28 bytes on the wire.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode the 28-byte header.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadMagic`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, REQUEST_LEN)?;
        magic64(u64::from(NBD_REQUEST_MAGIC), u64::from(c.u32()?))?;
        Ok(Self {
            flags: c.u16()?,
            command: c.u16()?,
            cookie: c.u64()?,
            offset: c.u64()?,
            length: c.u32()?,
        })
    }
}

/// A simple reply (a successful `READ`'s data follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// `NBD_E*` or 0.
    pub error: u32,
    /// The request's cookie.
    pub cookie: u64,
}

impl SimpleReply {
    /// The 16 bytes on the wire.
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_LEN] {
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        self.encode_into(&mut b);
        b
    }

    /// Write the 16 bytes into the front of `out`.
    ///
    /// # Panics
    /// When `out` is shorter than 16 bytes.
    pub fn encode_into(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
    }

    /// Decode the 16 bytes.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadMagic`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, SIMPLE_REPLY_LEN)?;
        magic64(u64::from(NBD_SIMPLE_REPLY_MAGIC), u64::from(c.u32()?))?;
        Ok(Self {
            error: c.u32()?,
            cookie: c.u64()?,
        })
    }
}

/// A structured reply chunk header; `length` bytes of payload follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `NBD_REPLY_FLAG_*`.
    pub flags: u16,
    /// `NBD_REPLY_TYPE_*`.
    pub chunk_type: u16,
    /// The request's cookie.
    pub cookie: u64,
    /// Payload bytes that follow.
    pub length: u32,
}

impl ChunkHeader {
    /// The 20 bytes on the wire.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        self.encode_into(&mut b);
        b
    }

    /// Write the 20 bytes into the front of `out`.
    ///
    /// # Panics
    /// When `out` is shorter than 20 bytes.
    pub fn encode_into(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.chunk_type.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..20].copy_from_slice(&self.length.to_be_bytes());
    }

    /// Decode the 20 bytes.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadMagic`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, CHUNK_HEADER_LEN)?;
        magic64(u64::from(NBD_STRUCTURED_REPLY_MAGIC), u64::from(c.u32()?))?;
        Ok(Self {
            flags: c.u16()?,
            chunk_type: c.u16()?,
            cookie: c.u64()?,
            length: c.u32()?,
        })
    }
}

/// Bytes in front of the data of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk:
/// the chunk header and the 64-bit offset.
pub const OFFSET_DATA_PREFIX_LEN: usize = CHUNK_HEADER_LEN + 8;

/// Write the header and offset of a final `OFFSET_DATA` chunk carrying
/// `data_len` bytes into the front of `out` (the data goes right after).
///
/// # Panics
/// When `out` is shorter than [`OFFSET_DATA_PREFIX_LEN`] or `data_len + 8`
/// overflows `u32`.
pub fn encode_offset_data_prefix(
    out: &mut [u8],
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) {
    let length = data_len
        .checked_add(8)
        .expect("OFFSET_DATA length fits u32");
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    ChunkHeader {
        flags,
        chunk_type: NBD_REPLY_TYPE_OFFSET_DATA,
        cookie,
        length,
    }
    .encode_into(out);
    out[CHUNK_HEADER_LEN..OFFSET_DATA_PREFIX_LEN].copy_from_slice(&offset.to_be_bytes());
}

/// The payload of an `NBD_REPLY_TYPE_OFFSET_HOLE` chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetHole {
    /// Where the zeros start.
    pub offset: u64,
    /// How many bytes of zeros.
    pub size: u32,
}

impl OffsetHole {
    /// The 12 payload bytes.
    pub fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&self.offset.to_be_bytes());
        b[8..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Decode the payload (exactly 12 bytes).
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadLength`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, 12)?;
        if buf.len() != 12 {
            return Err(ProtoError::BadLength("OFFSET_HOLE payload is 12 bytes"));
        }
        Ok(Self {
            offset: c.u64()?,
            size: c.u32()?,
        })
    }
}

/// The payload of an `NBD_REPLY_TYPE_ERROR` chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorChunk {
    /// `NBD_E*` (nonzero).
    pub error: u32,
    /// Message for humans (at most 4096 bytes).
    pub message: Vec<u8>,
}

impl ErrorChunk {
    /// The payload bytes (the message is cut at 4096 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let msg = &self.message[..self.message.len().min(4096)];
        let mut v = Vec::with_capacity(6 + msg.len());
        v.extend_from_slice(&self.error.to_be_bytes());
        // At most 4096, so the cast is lossless.
        v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    /// Decode the payload; the message length must fit in it.
    ///
    /// # Errors
    /// [`ProtoError::Truncated`] or [`ProtoError::BadLength`].
    pub fn decode(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut c = Cursor::new(buf, 6)?;
        let error = c.u32()?;
        let n = c.u16()? as usize;
        if n > buf.len() - 6 {
            return Err(ProtoError::BadLength(
                "error message longer than the chunk payload - 6",
            ));
        }
        Ok(Self {
            error,
            message: c.take(n)?.to_vec(),
        })
    }
}

/// A whole final `NBD_REPLY_TYPE_ERROR` chunk (header and payload).
pub fn encode_error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let payload = ErrorChunk {
        error,
        message: message.as_bytes().to_vec(),
    }
    .encode();
    // The payload is at most 6 + 4096 bytes, so the cast is lossless.
    let header = ChunkHeader {
        flags: NBD_REPLY_FLAG_DONE,
        chunk_type: NBD_REPLY_TYPE_ERROR,
        cookie,
        length: payload.len() as u32,
    };
    let mut v = header.encode().to_vec();
    v.extend_from_slice(&payload);
    v
}

/// The name of an `NBD_OPT_*` code, for logs.
pub fn option_name(option: u32) -> &'static str {
    match option {
        NBD_OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        NBD_OPT_ABORT => "NBD_OPT_ABORT",
        NBD_OPT_LIST => "NBD_OPT_LIST",
        NBD_OPT_PEEK_EXPORT => "NBD_OPT_PEEK_EXPORT",
        NBD_OPT_STARTTLS => "NBD_OPT_STARTTLS",
        NBD_OPT_INFO => "NBD_OPT_INFO",
        NBD_OPT_GO => "NBD_OPT_GO",
        NBD_OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        NBD_OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        NBD_OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        NBD_OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

/// The name of an `NBD_CMD_*` code, for logs.
pub fn command_name(command: u16) -> &'static str {
    match command {
        NBD_CMD_READ => "NBD_CMD_READ",
        NBD_CMD_WRITE => "NBD_CMD_WRITE",
        NBD_CMD_DISC => "NBD_CMD_DISC",
        NBD_CMD_FLUSH => "NBD_CMD_FLUSH",
        NBD_CMD_TRIM => "NBD_CMD_TRIM",
        NBD_CMD_CACHE => "NBD_CMD_CACHE",
        NBD_CMD_WRITE_ZEROES => "NBD_CMD_WRITE_ZEROES",
        NBD_CMD_BLOCK_STATUS => "NBD_CMD_BLOCK_STATUS",
        NBD_CMD_RESIZE => "NBD_CMD_RESIZE",
        _ => "unknown command",
    }
}
