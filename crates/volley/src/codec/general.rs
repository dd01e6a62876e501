//! The general tier: self-describing formats any language can read.
//!
//! - JSON ([`json_encode`], [`json_decode`]; `volley::wire!(json: T)`): serde_json, compact
//!   (no whitespace), UTF-8. For debugging (payloads are readable in a capture), requests
//!   typed at a command line, and clients that have a JSON library and nothing else.
//! - MessagePack ([`msgpack_encode`], [`msgpack_decode`]; `volley::wire!(msgpack: T)`):
//!   rmp-serde with structs written as maps keyed by field name (not as arrays), so that a
//!   peer in another language needs no schema and field order does not matter. Smaller and
//!   faster than JSON, still self-describing.
//!
//! Both are much slower than the fast tier (see docs/BENCHMARKS.md): use them where being
//! readable matters more than speed. Decoding rejects bytes after the value, so a payload is
//! exactly one value as in every tier.

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::CodecError;

/// Encodes as compact JSON, written straight into the send buffer.
pub fn json_encode<T: Serialize + ?Sized>(v: &T, out: &mut BytesMut) -> Result<(), CodecError> {
    serde_json::to_writer(out.writer(), v).map_err(|e| CodecError::of::<T>("json", e))
}

/// Decodes one JSON value (surrounding whitespace allowed, nothing else).
pub fn json_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    serde_json::from_slice(bytes).map_err(|e| CodecError::of::<T>("json", e))
}

/// Encodes as MessagePack, structs as maps, written straight into the send buffer.
pub fn msgpack_encode<T: Serialize + ?Sized>(v: &T, out: &mut BytesMut) -> Result<(), CodecError> {
    rmp_serde::encode::write_named(&mut out.writer(), v).map_err(|e| CodecError::of::<T>("msgpack", e))
}

/// Decodes one MessagePack value; bytes left over after it are an error.
pub fn msgpack_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    // Read through `&mut &[u8]` so the slice shows what is left (rmp_serde::from_slice does
    // not check for trailing bytes).
    let mut rest = bytes;
    let v = T::deserialize(&mut rmp_serde::Deserializer::new(&mut rest))
        .map_err(|e| CodecError::of::<T>("msgpack", e))?;
    if !rest.is_empty() {
        return Err(CodecError::of::<T>("msgpack", format!("{} bytes after the value", rest.len())));
    }
    Ok(v)
}

/// Encodes a protobuf message (`volley::wire!(proto: T)`, feature `proto`).
#[cfg(feature = "proto")]
pub fn proto_encode<T: prost::Message>(v: &T, out: &mut BytesMut) -> Result<(), CodecError> {
    // BytesMut grows as needed: encoding into it cannot run out of room.
    v.encode(out).map_err(|e| CodecError::of::<T>("protobuf", e))
}

/// What reflection says of a protobuf type ([`Wire::protobuf`](crate::Wire::protobuf)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protobuf {
    /// The message's full name, when the type implements `prost::Name`.
    pub message: Option<String>,
    /// The descriptor set of its `.proto` files, when it was declared with one.
    pub descriptor_set: Option<&'static [u8]>,
}

/// Picks the message name of a type that implements `prost::Name` in `wire!(proto: T)`: found
/// on `&Probe<T>` without autoref.
pub trait ViaName {
    fn volley_proto_name(&self) -> Option<String>;
}

/// Taken otherwise: found on `&&Probe<T>`, one autoref later.
pub trait NoName {
    fn volley_proto_name(&self) -> Option<String> {
        None
    }
}

impl<T: ?Sized> NoName for &super::schema::Probe<T> {}

#[cfg(feature = "proto")]
impl<T: prost::Name> ViaName for super::schema::Probe<T> {
    fn volley_proto_name(&self) -> Option<String> {
        Some(T::full_name())
    }
}

/// Standard base64 (RFC 4648, with padding), for bytes in JSON.
pub(crate) fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes one protobuf message from the whole payload (protobuf has no end marker: the
/// payload's length delimits it, as in every tier).
#[cfg(feature = "proto")]
pub fn proto_decode<T: prost::Message + Default>(bytes: bytes::Bytes) -> Result<T, CodecError> {
    T::decode(bytes).map_err(|e| CodecError::of::<T>("protobuf", e))
}
