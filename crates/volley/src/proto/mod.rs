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
mod error;
pub mod extensions;
pub mod limits;
pub mod message;
pub mod preamble;

pub use batch::{BatchItems, ItemResult};
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use code::Code;
pub use decoder::{Decoder, decode_frame};
pub use encode::FrameBuilder;
pub use error::ProtocolError;
pub use extensions::{Extensions, Fingerprints, TraceParent};
pub use limits::Limits;
#[cfg(feature = "internals")]
pub use message::Kind;
pub use message::{Message, Names};
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use preamble::{PREAMBLE, PREAMBLE_LEN, SERVER_PREAMBLE, VERSION};
