//! How request and reply values become bytes: the [`Wire`] trait and its tiers.
//!
//! Values passed over `inproc://` are never encoded; over unix and tcp each request and reply
//! is encoded by its type's [`Wire`] implementation. Which encoding a type uses is decided
//! **once, by its declaration**, at compile time: every type has exactly one `Wire` impl, so the
//! hot path is a direct (inlinable) call with no runtime switch on the type. There are four
//! tiers, fastest first (the MF report's custom > memcpy > febird > boost, the design this
//! follows):
//!
//! | Tier ([`Tier`]) | Declared with | Encoding | Use it for |
//! |---|---|---|---|
//! | custom | a hand-written `impl Wire for T` | whatever you write | hot types with a known shape |
//! | plain data (pod) | `volley::wire!(pod: T)` (`T: bytemuck::Pod`); `Vec<T>`, [`PodVec<T>`] built in | the value's bytes, little-endian | numbers, fixed-layout structs, arrays of them |
//! | fast | `volley::wire!(T)` (serde), `volley::wire!(bitcode: T)` (bitcode's own derive) | [bitcode](https://docs.rs/bitcode) | everything else, by default |
//! | general | `volley::wire!(json: T)`, `volley::wire!(msgpack: T)` | JSON, MessagePack (self-describing) | debugging, calls typed at a command line, other languages |
//!
//! ```
//! use serde::{Deserialize, Serialize};
//!
//! // Plain data: copied as bytes, decoded with one unaligned read (no parsing).
//! #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
//! #[repr(C)]
//! struct Point { x: f32, y: f32, id: u32 }
//! volley::wire!(pod: Point);
//!
//! // Fast: any serde type, bitcode (the default tier).
//! #[derive(Serialize, Deserialize)]
//! struct Query { terms: Vec<String>, k: u32 }
//! volley::wire!(Query);
//!
//! // Fast, bitcode's own derive (faster than its serde mode, see docs/BENCHMARKS.md).
//! #[derive(bitcode::Encode, bitcode::Decode)]
//! struct Hits { ids: Vec<u64>, scores: Vec<f32> }
//! volley::wire!(bitcode: Hits);
//!
//! // General: self-describing, readable by any language.
//! #[derive(Serialize, Deserialize)]
//! struct Config { name: String, replicas: u16 }
//! volley::wire!(json: Config);
//!
//! #[derive(Serialize, Deserialize)]
//! struct Status { healthy: bool }
//! volley::wire!(msgpack: Status);
//!
//! use volley::Wire;
//! assert_eq!(<Point as Wire>::TIER, volley::codec::Tier::Pod);
//! assert_eq!(<Config as Wire>::TIER, volley::codec::Tier::General);
//! ```
//!
//! For types you cannot declare `wire!` on (Rust's orphan rule: `HashMap<String, u32>`,
//! `Vec<T>` of a serde type), the wrappers [`BitcodeSerde<T>`], [`Bitcode<T>`], [`Json<T>`] and
//! [`MsgPack<T>`] choose the tier where the method is declared:
//! `Method<Json<HashMap<String, u32>>, Bitcode<Vec<Hit>>>`.
//!
//! Built in, no declaration needed:
//!
//! - raw bytes ([`Bytes`], `Vec<u8>`) and strings (`String`, zero-copy [`ByteString`]) travel as
//!   themselves; large `Bytes`, `ByteString` and `PodVec` payloads are written to the socket
//!   without being copied;
//! - numbers as fixed-width little-endian, `bool` as one byte, `()` as nothing;
//! - `Vec<T>` and [`PodVec<T>`] of any plain-data `T` as the elements' bytes back to back.
//!
//! **Zero-copy decoding.** A received payload is a slice of the connection's receive buffer.
//! [`Bytes`], [`ByteString`] (validated UTF-8) and [`PodVec<T>`] keep a reference to that
//! buffer instead of copying; `PodVec<T>` copies once when the payload is not aligned for `T`
//! (the wire format never pads, so for `align_of::<T>() > 1` that is a matter of luck, see
//! [`PodVec`]).
//!
//! **Custom tier.** Implement [`Wire`] by hand; the building blocks of the other tiers are
//! public ([`pod`], [`fast`], [`general`]):
//!
//! ```
//! use volley::bytes::{BufMut, Bytes, BytesMut};
//! use volley::{CodecError, Wire};
//!
//! /// A term id and a posting list, encoded as u32 id + the list as little-endian u32s.
//! struct Postings { term: u32, docs: Vec<u32> }
//!
//! impl Wire for Postings {
//!     fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
//!         out.put_u32_le(self.term);
//!         volley::codec::pod::encode_slice(&self.docs, out);
//!         Ok(())
//!     }
//!     fn decode(bytes: Bytes) -> Result<Self, CodecError> {
//!         let (term, docs) = bytes.split_first_chunk::<4>().ok_or_else(|| CodecError("short".into()))?;
//!         Ok(Postings { term: u32::from_le_bytes(*term), docs: volley::codec::pod::decode_vec(docs)? })
//!     }
//! }
//! # let mut b = BytesMut::new();
//! # Postings { term: 7, docs: vec![1, 2] }.encode(&mut b).unwrap();
//! # assert_eq!(Postings::decode(b.freeze()).unwrap().docs, [1, 2]);
//! ```
//!
//! **Stable hash.** [`StableHash`] hashes a key's encoded form with xxh3-64, for key-hash
//! routing. Only types whose encoding Volley itself defines implement it (not the fast or
//! general tiers); the algorithm and test vectors are in docs/PROTOCOL.md §15.

use bytes::{BufMut, Bytes, BytesMut};

pub mod fast;
pub mod fingerprint;
pub mod general;
pub mod hash;
pub mod pod;
#[doc(hidden)]
pub mod schema;
mod wrap;

pub use bytestring::ByteString;
pub use hash::{StableHash, stable_hash};
pub use pod::PodVec;
pub use wrap::{Bitcode, BitcodeSerde, Json, MsgPack};

/// A value that can travel in a request or reply.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Volley wire type, so it cannot be a request or a reply",
    label = "not a wire type",
    note = "declare its codec tier with `volley::wire!({Self})` (serde, encoded with bitcode), or \
            `wire!(bitcode: …)`, `wire!(pod: …)`, `wire!(json: …)`, `wire!(msgpack: …)`, \
            `wire!(proto: …)`; or wrap \
            it (`volley::codec::Json<…>`)"
)]
pub trait Wire: Sized + Send + Sync + 'static {
    /// The tier this type's encoding belongs to (for tools and reports; it changes nothing at
    /// run time). Hand-written impls are [`Tier::Custom`] unless they say otherwise.
    const TIER: Tier = Tier::Custom;
    /// How the bytes are laid out, finer than the tier: what a tool needs to turn a value
    /// typed as JSON into a payload (reflection, `volley call`). One of the formats listed in
    /// docs/PROTOCOL.md (*Reflection*): `utf-8`, `bytes`, `unit`, `bool`, a number type
    /// (`u32`, `f64`, …), `array` (plain-data elements back to back), `pod`, `bitcode`,
    /// `bitcode-serde`, `json`, `msgpack`, `protobuf`, or `custom` (the default for hand-written
    /// impls).
    const FORMAT: &'static str = "custom";
    /// A JSON Schema of the type, where its tier has one and the crate can derive it: types
    /// declared with `wire!(json: …)`, `wire!(msgpack: …)` or `wire!(…)` that also derive
    /// `schemars::JsonSchema`, with the feature `schema` on. `None` otherwise.
    fn schema() -> Option<serde_json::Value> {
        None
    }
    /// The fingerprint of the type's shape, for the fast tier, whose bytes do not show when
    /// two builds disagree on a type (docs/PROTOCOL.md, *Schema fingerprints*): types declared
    /// with `wire!(…)` (serde), and `wire!(bitcode: …)` when they also derive serde's
    /// `Deserialize` ([`fingerprint`]). `None` for the other tiers, whose decoding catches a
    /// mismatch itself, and for types whose shape cannot be traced.
    fn fingerprint() -> Option<u64> {
        None
    }
    /// For protobuf types (`wire!(proto: …)`): the message's full name and, when declared
    /// with one, the descriptor set of its `.proto` files. `None` for every other type.
    fn protobuf() -> Option<general::Protobuf> {
        None
    }
    /// Appends the encoded value to `out`.
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError>;
    /// Decodes a value from exactly the bytes of one payload.
    fn decode(bytes: Bytes) -> Result<Self, CodecError>;
    /// The encoded form as shared bytes, when the value already is bytes. Lets large payloads
    /// reach the socket without a copy.
    fn as_bytes(&self) -> Option<Bytes> {
        None
    }
}

/// The codec tiers, fastest first. See the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Tier {
    /// A hand-written [`Wire`] impl (also: strings, `bool`, `()`).
    Custom,
    /// Plain data copied as bytes, little-endian (also: raw bytes and numbers).
    Pod,
    /// bitcode, through serde or bitcode's own derive.
    Fast,
    /// A format other languages read: JSON, MessagePack, or protobuf (feature `proto`).
    General,
}

impl Tier {
    /// The lowercase name used in reports: `custom`, `pod`, `fast`, `general`.
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Custom => "custom",
            Tier::Pod => "pod",
            Tier::Fast => "fast",
            Tier::General => "general",
        }
    }
}

/// A value that could not be encoded or decoded. Every tier reports corrupt, truncated or
/// oversized input with this error; decoding never panics on bad input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

impl CodecError {
    /// An error decoding or encoding `T` with `codec`: keeps the type and the codec in the
    /// message, which is all a caller sees of a bad payload.
    pub(crate) fn of<T: ?Sized>(codec: &str, what: impl std::fmt::Display) -> CodecError {
        CodecError(format!("{} ({codec}): {what}", std::any::type_name::<T>()))
    }
}

impl Wire for Bytes {
    const TIER: Tier = Tier::Pod;
    const FORMAT: &'static str = "bytes";
    #[inline]
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(self);
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        Ok(bytes)
    }
    #[inline]
    fn as_bytes(&self) -> Option<Bytes> {
        Some(self.clone())
    }
}

impl Wire for String {
    const FORMAT: &'static str = "utf-8";
    #[inline]
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(self.as_bytes());
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        // Validate before copying: a bad payload costs no allocation.
        match std::str::from_utf8(&bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(CodecError::of::<String>("utf-8", e)),
        }
    }
}

/// A string borrowed from the receive buffer: decoding validates the UTF-8 and keeps a
/// reference to the payload's bytes instead of copying them.
impl Wire for ByteString {
    const FORMAT: &'static str = "utf-8";
    #[inline]
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(self.as_bytes());
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        ByteString::try_from(bytes).map_err(|e| CodecError::of::<ByteString>("utf-8", e))
    }
    #[inline]
    fn as_bytes(&self) -> Option<Bytes> {
        Some(self.as_bytes().clone())
    }
}

impl Wire for () {
    const FORMAT: &'static str = "unit";
    #[inline]
    fn encode(&self, _: &mut BytesMut) -> Result<(), CodecError> {
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err(CodecError(format!("expected an empty payload, got {} bytes", bytes.len())))
        }
    }
}

macro_rules! wire_number {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const TIER: Tier = Tier::Pod;
            const FORMAT: &'static str = stringify!($t);
            #[inline]
            fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
                out.put_slice(&self.to_le_bytes());
                Ok(())
            }
            fn decode(bytes: Bytes) -> Result<Self, CodecError> {
                let a = <[u8; size_of::<$t>()]>::try_from(&bytes[..]).map_err(|_| {
                    CodecError(format!(
                        "expected {} bytes for {}, got {}",
                        size_of::<$t>(), stringify!($t), bytes.len()
                    ))
                })?;
                Ok(<$t>::from_le_bytes(a))
            }
        }
    )*};
}
wire_number!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

impl Wire for bool {
    const FORMAT: &'static str = "bool";
    #[inline]
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_u8(*self as u8);
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        match &bytes[..] {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => Err(CodecError("invalid bool".into())),
        }
    }
}

/// Declares the codec tier of one or more types, in one line:
///
/// | Form | Tier | Requires |
/// |---|---|---|
/// | `volley::wire!(T)` | fast: bitcode, serde mode (the default) | `T: Serialize + DeserializeOwned` |
/// | `volley::wire!(bitcode: T)` | fast: bitcode's own derive | `T: bitcode::Encode + bitcode::DecodeOwned` |
/// | `volley::wire!(pod: T)` | plain data: the value's bytes, little-endian; also [`StableHash`] | `T: bytemuck::Pod` |
/// | `volley::wire!(json: T)` | general: JSON (serde_json) | `T: Serialize + DeserializeOwned` |
/// | `volley::wire!(msgpack: T)` | general: MessagePack, structs as maps (rmp-serde) | `T: Serialize + DeserializeOwned` |
/// | `volley::wire!(proto: T)` | general: protobuf (prost; feature `proto`) | `T: prost::Message + Default` |
/// | `volley::wire!(proto(SET): T)` | as above; reflection also hands out `SET`, the descriptor set (`&'static [u8]`) of `T`'s `.proto` files | as above |
///
/// Both sides of a method must declare the same tier for a type: the bytes differ between
/// tiers (and between bitcode's serde mode and its derive), and nothing on the wire says which
/// one was used. Several types may share one declaration: `volley::wire!(json: A, B)`.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Query { terms: Vec<String>, k: u32 }
/// volley::wire!(Query);
///
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Quad { a: i32, b: i32, c: i32, d: i32 }
/// volley::wire!(pod: Quad);
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Health { ok: bool, detail: String }
/// volley::wire!(json: Health);
/// ```
#[macro_export]
macro_rules! wire {
    (pod: $($t:ty),+ $(,)?) => {$(
        impl $crate::Wire for $t {
            const TIER: $crate::codec::Tier = $crate::codec::Tier::Pod;
            const FORMAT: &'static str = "pod";
            #[inline]
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::pod::encode(self, out);
                ::std::result::Result::Ok(())
            }
            #[inline]
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::pod::decode(&bytes)
            }
        }
        impl $crate::codec::StableHash for $t {
            fn write_key(&self, out: &mut ::std::vec::Vec<u8>) {
                out.extend_from_slice($crate::codec::pod::bytes_of(self));
            }
            fn stable_hash(&self) -> u64 {
                $crate::codec::hash::xxh3_64($crate::codec::pod::bytes_of(self))
            }
        }
    )+};
    (bitcode: $($t:ty),+ $(,)?) => {$(
        impl $crate::Wire for $t {
            const TIER: $crate::codec::Tier = $crate::codec::Tier::Fast;
            const FORMAT: &'static str = "bitcode";
            fn fingerprint() -> ::std::option::Option<u64> {
                #[allow(unused_imports)]
                use $crate::codec::fingerprint::{NoSerde as _, ViaSerde as _};
                (&$crate::codec::schema::Probe::<$t>::new()).volley_fingerprint()
            }
            #[inline]
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::fast::encode(self, out);
                ::std::result::Result::Ok(())
            }
            #[inline]
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::fast::decode(&bytes)
            }
        }
    )+};
    (json: $($t:ty),+ $(,)?) => {$(
        impl $crate::Wire for $t {
            const TIER: $crate::codec::Tier = $crate::codec::Tier::General;
            const FORMAT: &'static str = "json";
            fn schema() -> ::std::option::Option<$crate::codec::schema::Value> {
                #[allow(unused_imports)]
                use $crate::codec::schema::{NoSchema as _, ViaSchema as _};
                (&$crate::codec::schema::Probe::<$t>::new()).volley_schema()
            }
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::general::json_encode(self, out)
            }
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::general::json_decode(&bytes)
            }
        }
    )+};
    (proto: $($t:ty),+ $(,)?) => {
        $crate::wire!(@proto [::std::option::Option::None] $($t),+);
    };
    (proto($descriptor_set:expr): $($t:ty),+ $(,)?) => {
        $crate::wire!(@proto [::std::option::Option::Some($descriptor_set)] $($t),+);
    };
    (@proto [$descriptor_set:expr] $($t:ty),+) => {$(
        impl $crate::Wire for $t {
            const TIER: $crate::codec::Tier = $crate::codec::Tier::General;
            const FORMAT: &'static str = "protobuf";
            fn protobuf() -> ::std::option::Option<$crate::codec::general::Protobuf> {
                #[allow(unused_imports)]
                use $crate::codec::general::{NoName as _, ViaName as _};
                ::std::option::Option::Some($crate::codec::general::Protobuf {
                    message: (&$crate::codec::schema::Probe::<$t>::new()).volley_proto_name(),
                    descriptor_set: $descriptor_set,
                })
            }
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::general::proto_encode(self, out)
            }
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::general::proto_decode(bytes)
            }
        }
    )+};
    (msgpack: $($t:ty),+ $(,)?) => {$(
        impl $crate::Wire for $t {
            const TIER: $crate::codec::Tier = $crate::codec::Tier::General;
            const FORMAT: &'static str = "msgpack";
            fn schema() -> ::std::option::Option<$crate::codec::schema::Value> {
                #[allow(unused_imports)]
                use $crate::codec::schema::{NoSchema as _, ViaSchema as _};
                (&$crate::codec::schema::Probe::<$t>::new()).volley_schema()
            }
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::general::msgpack_encode(self, out)
            }
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::general::msgpack_decode(&bytes)
            }
        }
    )+};
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::Wire for $t {
            const TIER: $crate::codec::Tier = $crate::codec::Tier::Fast;
            const FORMAT: &'static str = "bitcode-serde";
            fn schema() -> ::std::option::Option<$crate::codec::schema::Value> {
                #[allow(unused_imports)]
                use $crate::codec::schema::{NoSchema as _, ViaSchema as _};
                (&$crate::codec::schema::Probe::<$t>::new()).volley_schema()
            }
            fn fingerprint() -> ::std::option::Option<u64> {
                $crate::codec::fingerprint::of_serde::<$t>()
            }
            #[inline]
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::fast::serde_encode(self, out)
            }
            #[inline]
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::fast::serde_decode(&bytes)
            }
        }
    )+};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Wire + PartialEq + std::fmt::Debug>(v: T) {
        let mut b = BytesMut::new();
        v.encode(&mut b).unwrap();
        assert_eq!(T::decode(b.freeze()).unwrap(), v);
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Doc {
        id: u64,
        text: String,
    }
    crate::wire!(Doc);

    #[test]
    fn builtin_and_serde_types_round_trip() {
        round_trip(Bytes::from_static(b"abc"));
        round_trip(vec![1u8, 2, 3]);
        round_trip(String::from("héllo"));
        round_trip(ByteString::from("héllo"));
        round_trip(());
        round_trip(-5i32);
        round_trip(u64::MAX);
        round_trip(1.5f64);
        round_trip(true);
        round_trip(Doc { id: 7, text: "seven".into() });
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        assert!(String::decode(Bytes::from_static(&[0xff, 0xfe])).is_err());
        assert!(ByteString::decode(Bytes::from_static(&[b'a', 0xc3])).is_err());
        assert!(u32::decode(Bytes::from_static(&[1, 2])).is_err());
        assert!(bool::decode(Bytes::from_static(&[2])).is_err());
        assert!(<()>::decode(Bytes::from_static(&[0])).is_err());
        assert!(Doc::decode(Bytes::from_static(&[0xff; 3])).is_err());
    }

    #[test]
    fn byte_string_borrows_the_payload() {
        let payload = Bytes::from_static("zero-copy é".as_bytes());
        let s = ByteString::decode(payload.clone()).unwrap();
        assert_eq!(s.as_ptr(), payload.as_ptr());
        assert_eq!(&*s, "zero-copy é");
    }
}
