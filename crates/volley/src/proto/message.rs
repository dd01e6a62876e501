//! Message kinds, error codes, and the decoded [`Message`] value.
//!
//! Every message starts with a one-byte [`Kind`]; the rest of its layout depends on the kind
//! (see `docs/PROTOCOL.md`). Integers are little-endian. Payloads and strings in a decoded
//! message are [`Bytes`] slices of the received frame: decoding copies nothing.

use bytes::Bytes;

/// The kind byte that opens every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Request = 0x01,
    Reply = 0x02,
    Error = 0x03,
    Cancel = 0x04,
    Ping = 0x05,
    Pong = 0x06,
    GoAway = 0x07,
    BatchRequest = 0x08,
    BatchReply = 0x09,
    Auth = 0x0a,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            0x01 => Kind::Request,
            0x02 => Kind::Reply,
            0x03 => Kind::Error,
            0x04 => Kind::Cancel,
            0x05 => Kind::Ping,
            0x06 => Kind::Pong,
            0x07 => Kind::GoAway,
            0x08 => Kind::BatchRequest,
            0x09 => Kind::BatchReply,
            0x0a => Kind::Auth,
            _ => return None,
        })
    }
}

/// Typed error codes carried by error replies and go-away messages.
///
/// Unknown codes from a newer peer are kept as [`Code::Other`] rather than rejected, so an old
/// client still reports the failure to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// No service by that name on this server.
    UnknownService,
    /// The service exists but has no such method.
    UnknownMethod,
    /// The request payload could not be decoded as the method's request type.
    BadRequest,
    /// The handler returned an error.
    Application,
    /// The handler panicked; the server lives on.
    Panicked,
    /// The server is over its bound of queued work and refused the request at once.
    Overloaded,
    /// The server is shutting down and takes no new work.
    ShuttingDown,
    /// The caller cancelled the request.
    Cancelled,
    /// The request's deadline passed before it was served.
    DeadlineExceeded,
    /// A failure inside the framework (for example, a reply that could not be encoded).
    Internal,
    /// The peer is not authenticated for this.
    Unauthenticated,
    /// The peer broke the wire protocol (go-away only).
    Protocol,
    /// A message exceeded a size limit.
    TooLarge,
    /// A code this implementation does not know.
    Other(u16),
}

impl Code {
    pub fn to_u16(self) -> u16 {
        match self {
            Code::UnknownService => 1,
            Code::UnknownMethod => 2,
            Code::BadRequest => 3,
            Code::Application => 4,
            Code::Panicked => 5,
            Code::Overloaded => 6,
            Code::ShuttingDown => 7,
            Code::Cancelled => 8,
            Code::DeadlineExceeded => 9,
            Code::Internal => 10,
            Code::Unauthenticated => 11,
            Code::Protocol => 12,
            Code::TooLarge => 13,
            Code::Other(c) => c,
        }
    }

    pub fn from_u16(c: u16) -> Code {
        match c {
            1 => Code::UnknownService,
            2 => Code::UnknownMethod,
            3 => Code::BadRequest,
            4 => Code::Application,
            5 => Code::Panicked,
            6 => Code::Overloaded,
            7 => Code::ShuttingDown,
            8 => Code::Cancelled,
            9 => Code::DeadlineExceeded,
            10 => Code::Internal,
            11 => Code::Unauthenticated,
            12 => Code::Protocol,
            13 => Code::TooLarge,
            other => Code::Other(other),
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Code::Other(c) => write!(f, "code {c}"),
            named => write!(f, "{named:?}"),
        }
    }
}

/// One decoded message. String fields are validated UTF-8 (the decoder checks them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Request {
        id: u64,
        flags: u8,
        service: Bytes,
        method: Bytes,
        ext: super::Extensions,
        payload: Bytes,
    },
    Reply {
        id: u64,
        payload: Bytes,
    },
    Error {
        id: u64,
        code: Code,
        message: Bytes,
    },
    Cancel {
        id: u64,
    },
    Ping {
        token: u64,
    },
    Pong {
        token: u64,
    },
    GoAway {
        code: Code,
        message: Bytes,
    },
    /// A chunk of requests for one method, answered by one [`Message::BatchReply`].
    BatchRequest {
        id: u64,
        flags: u8,
        service: Bytes,
        method: Bytes,
        ext: super::Extensions,
        items: super::batch::BatchItems,
    },
    /// One result per item of a [`Message::BatchRequest`], in item order.
    BatchReply {
        id: u64,
        items: super::batch::BatchItems,
    },
    /// A client's credential: the first message of a connection to a server that requires
    /// one (`docs/PROTOCOL.md` §6.11).
    Auth {
        token: Bytes,
    },
}

/// Longest token an [`Message::Auth`] may carry (its length travels in a `u16`).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Request flag bit: the caller marked the call idempotent (safe to retry elsewhere).
pub const FLAG_IDEMPOTENT: u8 = 0x01;

/// Longest service or method name (its length travels in one byte).
pub const MAX_NAME_LEN: usize = 255;

/// Lossless view of a validated UTF-8 field.
pub fn as_str(b: &Bytes) -> &str {
    // The decoder validated these bytes; a failure here would be a bug, and "" is a safe answer.
    std::str::from_utf8(b).unwrap_or("")
}
