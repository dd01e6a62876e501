//! What a peer can do wrong on the wire.

/// A violation of the wire protocol by the peer. Any of these closes the connection it happened
/// on (and only that connection): after a framing error the byte stream cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("bad preamble magic {0:02x?} (not a Volley peer?)")]
    BadMagic([u8; 4]),
    /// The text names the version this side speaks; a test in `preamble.rs` keeps the two in step.
    #[error("unsupported protocol version {0} (this side speaks 1)")]
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
