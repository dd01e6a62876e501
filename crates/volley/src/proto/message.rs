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
    StreamOpen = 0x10,
    StreamItem = 0x11,
    StreamEnd = 0x12,
    StreamCredit = 0x13,
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
            0x10 => Kind::StreamOpen,
            0x11 => Kind::StreamItem,
            0x12 => Kind::StreamEnd,
            0x13 => Kind::StreamCredit,
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
        names: Names,
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
        names: Names,
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
    /// Opens a stream (`docs/PROTOCOL.md` §6.12): `credit` items the server may send before
    /// more credit; for a server stream the payload is the request.
    StreamOpen {
        id: u64,
        flags: u8,
        shape: u8,
        credit: u32,
        names: Names,
        ext: super::Extensions,
        payload: Bytes,
    },
    /// One item of an open stream, either way (§6.13).
    StreamItem {
        id: u64,
        payload: Bytes,
    },
    /// The sender sends no more items on the stream (§6.14).
    StreamEnd {
        id: u64,
    },
    /// The sender takes `credit` more items on the stream (§6.15).
    StreamCredit {
        id: u64,
        credit: u32,
    },
}

/// Stream shapes (the `shape` byte of a [`Message::StreamOpen`]).
pub mod shape {
    /// One request, items from the server.
    pub const SERVER: u8 = 1;
    /// Items from the client, one reply.
    pub const CLIENT: u8 = 2;
    /// Items both ways.
    pub const BOTH: u8 = 3;
}

/// The service and method names of a request, kept as they lie on the wire: one slice of the
/// frame holding the service name, the method name's length byte and the method name.
///
/// One reference to the frame instead of two, and one comparison to tell whether two requests
/// are for the same method. It also keeps [`Message`] within 128 bytes, which the compiler
/// moves inline: at 152 bytes every move of a message (decoded into a batch, drained from it)
/// was a call to `memcpy` (scripts/callcost.py).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Names {
    wire: Bytes,
    service_len: u8,
}

impl Names {
    /// Names for a request. Panics if a name is longer than 255 bytes (the wire gives each
    /// a one-byte length).
    #[cfg(any(test, feature = "internals"))]
    pub fn new(service: &str, method: &str) -> Names {
        let service_len = u8::try_from(service.len()).expect("a service name is at most 255 bytes");
        let method_len = u8::try_from(method.len()).expect("a method name is at most 255 bytes");
        let mut wire = Vec::with_capacity(service.len() + 1 + method.len());
        wire.extend_from_slice(service.as_bytes());
        wire.push(method_len);
        wire.extend_from_slice(method.as_bytes());
        Names { wire: Bytes::from(wire), service_len }
    }

    /// Names from a slice of a frame laid out as on the wire, both names already checked to
    /// be UTF-8.
    pub(crate) fn from_wire(wire: Bytes, service_len: u8) -> Names {
        debug_assert!(wire.len() > service_len as usize);
        Names { wire, service_len }
    }

    pub fn service(&self) -> &str {
        as_str_of(&self.wire[..self.service_len as usize])
    }

    pub fn method(&self) -> &str {
        as_str_of(&self.wire[self.service_len as usize + 1..])
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.service(), self.method())
    }
}

fn as_str_of(b: &[u8]) -> &str {
    // The decoder validated these bytes; a failure here would be a bug, and "" is a safe answer.
    std::str::from_utf8(b).unwrap_or("")
}

/// Longest token an [`Message::Auth`] may carry (its length travels in a `u16`).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Request flag bit: the caller marked the call idempotent (safe to retry elsewhere).
pub const FLAG_IDEMPOTENT: u8 = 0x01;

/// Longest service or method name (its length travels in one byte).
pub const MAX_NAME_LEN: usize = 255;

/// Lossless view of a validated UTF-8 field.
pub fn as_str(b: &Bytes) -> &str {
    as_str_of(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_where_the_service_ends() {
        let n = Names::new("ab", "c");
        assert_eq!((n.service(), n.method()), ("ab", "c"));
        // The same bytes split elsewhere are other names: the method's length byte tells them apart.
        assert_ne!(n, Names::new("a", "bc"));
        assert_eq!(n, Names::new("ab", "c"));
        assert_eq!((Names::new("", "").service(), Names::new("", "").method()), ("", ""));
        assert_eq!(format!("{n:?}"), "ab/c");
    }

    #[test]
    fn names_decoded_from_a_frame_equal_names_made_from_text() {
        use crate::proto::{Decoder, Extensions, FrameBuilder, Limits, decode_frame};
        let mut fb = FrameBuilder::new(Limits::default());
        fb.request_bytes(7, 0, &Extensions::NONE, ("svc", "méthode"), Bytes::new()).unwrap();
        let mut segments = Vec::new();
        fb.take_into(&mut segments);
        let mut buf = bytes::BytesMut::from(&segments.concat()[..]);
        let body = Decoder::after_preamble(Limits::default()).next_frame(&mut buf).unwrap().unwrap();
        let mut out = Vec::new();
        decode_frame(&body, &Limits::default(), &mut out).unwrap();
        let Message::Request { names, .. } = &out[0] else { panic!("{out:?}") };
        assert_eq!(*names, Names::new("svc", "méthode"));
    }

    #[test]
    fn a_message_is_moved_inline() {
        // Above 128 bytes the compiler moves a message with a call to memcpy (see `Names`).
        assert!(std::mem::size_of::<Message>() <= 128, "{} bytes", std::mem::size_of::<Message>());
    }
}
