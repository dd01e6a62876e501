//! Message kinds and the decoded [`Message`] value.
//!
//! Every message starts with a one-byte [`Kind`]; the rest of its layout depends on the kind
//! (see `docs/PROTOCOL.md`). Integers are little-endian. Payloads and strings in a decoded
//! message are [`Bytes`] slices of the received frame: decoding copies nothing.

use bytes::Bytes;

use super::code::Code;

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
