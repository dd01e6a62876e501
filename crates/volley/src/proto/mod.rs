//! The wire protocol, sans-IO: plain functions and state machines over byte buffers.
//!
//! Nothing in here touches a socket, a clock or a runtime, so every rule of the format can be
//! tested exhaustively (split a frame at every byte, feed many frames at once, fuzz it) and the
//! same code serves every byte-carrying transport. `docs/PROTOCOL.md` is the normative
//! description; this module is its implementation.
//!
//! - [`preamble`]: the 8 bytes each side sends first (magic + version).
//! - [`limits`]: the bounds a peer may not cross (frame size, messages per bundle).
//! - [`message`]: message kinds, error codes and the decoded [`Message`] value.
//! - [`encode`]: appending messages and frames to a send buffer.
//! - [`decoder`]: the incremental frame decoder for a receive buffer.
//! - [`batch`]: the items of batch requests and replies.

pub mod batch;
pub mod code;
pub mod decoder;
pub mod encode;
pub mod extensions;
pub mod limits;
pub mod message;
pub mod preamble;

pub use batch::{BatchItems, ItemResult};
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use code::Code;
pub use decoder::{Decoder, decode_frame};
pub use encode::FrameBuilder;
pub use extensions::{Extensions, TraceParent};
pub use limits::Limits;
#[cfg(feature = "internals")]
pub use message::Kind;
pub use message::{Message, Names};
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use preamble::{PREAMBLE, PREAMBLE_LEN, SERVER_PREAMBLE, VERSION};

/// A violation of the wire protocol by the peer. Any of these closes the connection it happened
/// on (and only that connection): after a framing error the byte stream cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad preamble magic {0:02x?} (not a Volley peer?)")]
    BadMagic([u8; 4]),
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    UnsupportedVersion(u8),
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    #[error("frame carries more than {max} messages")]
    TooManyMessages { max: usize },
    #[error("batch message carries more than {max} items")]
    TooManyItems { max: usize },
    #[error("empty frame (a frame carries at least one message)")]
    EmptyFrame,
    #[error("unknown message kind {0:#04x}")]
    UnknownKind(u8),
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    /// A shared-memory connection's ring holds positions that cannot be (`shm://`).
    #[error("corrupt shared-memory ring: {0}")]
    Ring(&'static str),
}
