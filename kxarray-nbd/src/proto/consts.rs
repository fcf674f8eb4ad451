//! The protocol's named constants, with the spec's names: magics,
//! handshake and client flags, transmission flags, option codes, option
//! reply types, `NBD_INFO_*` types, command types and flags, structured
//! reply flags and types, and error values. Sizes of the fixed messages are
//! beside their encoders in the parent module.

// ---- Magics -------------------------------------------------------------

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic in the greeting and in every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every fixed-newstyle option reply.
pub const NBD_REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request (`NBD_REQUEST_MAGIC`).
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply (`NBD_SIMPLE_REPLY_MAGIC`).
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk (`NBD_STRUCTURED_REPLY_MAGIC`).
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- Handshake and client flags ------------------------------------------

/// Handshake flag: the server speaks fixed newstyle.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server omits the 124 zero bytes if the client agrees.
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes after the `NBD_OPT_EXPORT_NAME` reply.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- Transmission flags ---------------------------------------------------

/// Transmission flag: always set.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: the medium is rotational.
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` is supported.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: `NBD_CMD_FLAG_DF` is supported.
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: a flush on one connection covers writes completed on
/// every connection to the export.
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_RESIZE` is supported (experimental).
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
/// Transmission flag: `NBD_CMD_CACHE` is supported.
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` is supported.
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
/// Transmission flag: block status requests carry a payload (experimental).
pub const NBD_FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// ---- Options ----------------------------------------------------------------

/// Option: choose an export and enter transmission (no error reply possible).
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// Option: abort the negotiation.
pub const NBD_OPT_ABORT: u32 = 2;
/// Option: list the exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Option: withdrawn `PEEK_EXPORT` extension.
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
/// Option: upgrade to TLS.
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Option: describe an export without entering transmission.
pub const NBD_OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Option: use structured replies in transmission.
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts.
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
/// Option: use 64-bit extended headers.
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// ---- Option reply types -------------------------------------------------------

/// Option reply: accepted, no more data follows for this option.
pub const NBD_REP_ACK: u32 = 1;
/// Option reply: one export of an `NBD_OPT_LIST`.
pub const NBD_REP_SERVER: u32 = 2;
/// Option reply: one piece of information about an export.
pub const NBD_REP_INFO: u32 = 3;
/// Option reply: one metadata context.
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit set in every error reply type.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// Option error: the option is not supported.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR + 1;
/// Option error: forbidden by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR + 2;
/// Option error: syntactically or semantically invalid.
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR + 3;
/// Option error: not supported on this platform.
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR + 4;
/// Option error: TLS is required first.
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR + 5;
/// Option error: the export does not exist.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR + 6;
/// Option error: the server is shutting down.
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR + 7;
/// Option error: the client must request block sizes.
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR + 8;
/// Option error: the request or the reply is too large.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR + 9;
/// Option error: extended headers are required.
pub const NBD_REP_ERR_EXT_HEADER_REQD: u32 = NBD_REP_FLAG_ERROR + 10;

// ---- NBD_INFO types -------------------------------------------------------------

/// Info: export size and transmission flags (mandatory before `NBD_REP_ACK`).
pub const NBD_INFO_EXPORT: u16 = 0;
/// Info: canonical export name.
pub const NBD_INFO_NAME: u16 = 1;
/// Info: human-readable description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Info: minimum, preferred and maximum block (payload) sizes.
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---- Commands and command flags -------------------------------------------------

/// Command: read.
pub const NBD_CMD_READ: u16 = 0;
/// Command: write (the payload follows the header).
pub const NBD_CMD_WRITE: u16 = 1;
/// Command: disconnect (no reply).
pub const NBD_CMD_DISC: u16 = 2;
/// Command: flush completed writes to stable storage.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Command: discard (hint).
pub const NBD_CMD_TRIM: u16 = 4;
/// Command: prefetch into a cache.
pub const NBD_CMD_CACHE: u16 = 5;
/// Command: write zeros without a payload.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
/// Command: query block status.
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
/// Command: resize the export (experimental).
pub const NBD_CMD_RESIZE: u16 = 8;

/// Command flag: force unit access (reply only once the data is durable).
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: `NBD_CMD_WRITE_ZEROES` must allocate, not punch a hole.
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: do not fragment the structured read reply.
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag: block status for one extent only.
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag: fail write-zeroes quickly unless it is fast.
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Command flag: the request carries a payload length (extended headers).
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// ---- Structured replies ----------------------------------------------------------

/// Structured reply flag: the last chunk of this reply.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
/// Chunk type: no payload, only ends the reply (must carry `DONE`).
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
/// Chunk type: data at an offset.
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type: a run of zeros at an offset.
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Chunk type: block status extents.
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Chunk type: block status extents with 64-bit lengths.
pub const NBD_REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
/// Bit set in every error chunk type.
pub const NBD_REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
/// Chunk type: the request failed.
pub const NBD_REPLY_TYPE_ERROR: u16 = NBD_REPLY_TYPE_FLAG_ERROR + 1;
/// Chunk type: the request failed at an offset.
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = NBD_REPLY_TYPE_FLAG_ERROR + 2;

// ---- Error values ------------------------------------------------------------------

/// Error: operation not permitted.
pub const NBD_EPERM: u32 = 1;
/// Error: input/output error.
pub const NBD_EIO: u32 = 5;
/// Error: cannot allocate memory.
pub const NBD_ENOMEM: u32 = 12;
/// Error: invalid argument.
pub const NBD_EINVAL: u32 = 22;
/// Error: no space left on device.
pub const NBD_ENOSPC: u32 = 28;
/// Error: value too large.
pub const NBD_EOVERFLOW: u32 = 75;
/// Error: operation not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Error: the server is shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;
