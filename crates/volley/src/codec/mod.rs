//! How request and reply values become bytes: the [`Wire`] trait.
//!
//! Values passed over `inproc://` are never encoded; over unix and tcp each request and reply
//! is encoded by its type's [`Wire`] implementation. Built in:
//!
//! - raw bytes ([`Bytes`], `Vec<u8>`) and strings travel as themselves, and large `Bytes`
//!   payloads are written to the socket without being copied;
//! - numbers, `bool` and `()` as fixed-width little-endian;
//! - any serde type, by one line: [`wire!`](crate::wire) — encoded with bitcode, the fastest
//!   general binary format for serde types today.

use bytes::{BufMut, Bytes, BytesMut};

/// A value that can travel in a request or reply.
pub trait Wire: Sized + Send + Sync + 'static {
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

/// A value that could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

impl Wire for Bytes {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(self);
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        Ok(bytes)
    }
    fn as_bytes(&self) -> Option<Bytes> {
        Some(self.clone())
    }
}

impl Wire for Vec<u8> {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(self);
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        Ok(bytes.to_vec())
    }
}

impl Wire for String {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(self.as_bytes());
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        String::from_utf8(bytes.to_vec()).map_err(|_| CodecError("string is not UTF-8".into()))
    }
}

impl Wire for () {
    fn encode(&self, _: &mut BytesMut) -> Result<(), CodecError> {
        Ok(())
    }
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
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_u8(*self as u8);
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        match &bytes[..] {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => Err(CodecError("invalid bool".into())),
        }
    }
}

/// Encodes a serde value with bitcode. Used by [`wire!`](crate::wire); public so hand-written
/// [`Wire`] impls can build on it.
pub fn bitcode_encode<T: serde::Serialize>(v: &T, out: &mut BytesMut) -> Result<(), CodecError> {
    let bytes = bitcode::serialize(v).map_err(|e| CodecError(e.to_string()))?;
    out.put_slice(&bytes);
    Ok(())
}

/// Decodes a serde value encoded by [`bitcode_encode`].
pub fn bitcode_decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    bitcode::deserialize(bytes).map_err(|e| CodecError(e.to_string()))
}

/// Makes serde types usable as requests and replies, encoded with bitcode:
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Query { terms: Vec<String>, k: u32 }
/// volley::wire!(Query);
/// ```
#[macro_export]
macro_rules! wire {
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::Wire for $t {
            fn encode(&self, out: &mut $crate::bytes::BytesMut) -> ::std::result::Result<(), $crate::CodecError> {
                $crate::codec::bitcode_encode(self, out)
            }
            fn decode(bytes: $crate::bytes::Bytes) -> ::std::result::Result<Self, $crate::CodecError> {
                $crate::codec::bitcode_decode(&bytes)
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
        assert!(u32::decode(Bytes::from_static(&[1, 2])).is_err());
        assert!(bool::decode(Bytes::from_static(&[2])).is_err());
        assert!(<()>::decode(Bytes::from_static(&[0])).is_err());
        assert!(Doc::decode(Bytes::from_static(&[0xff; 3])).is_err());
    }
}
