//! Tier wrappers: choose a tier for a type you cannot declare `wire!` on.
//!
//! Rust's orphan rule lets `volley::wire!` only name types of your own crate, so
//! `HashMap<String, u32>` or `Vec<MyEvent>` cannot be declared directly. Wrapping picks the
//! tier at the use site instead, still at compile time:
//!
//! ```
//! use std::collections::HashMap;
//! use volley::Method;
//! use volley::codec::{Bitcode, Json};
//!
//! const COUNTS: Method<Json<Vec<String>>, Bitcode<HashMap<String, u32>>> =
//!     Method::new("words", "count");
//! ```
//!
//! Each wrapper encodes exactly as the matching `wire!` form does for the inner type.

use std::ops::{Deref, DerefMut};

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CodecError, Tier, Wire, fast, general};

macro_rules! wrapper {
    ($(#[$doc:meta])* $name:ident, $tier:expr, $format:literal, [$($bound:tt)+], $encode:expr, $decode:path) => {
        wrapper!($(#[$doc])* $name, $tier, $format, [$($bound)+], $encode, $decode, || None);
    };
    ($(#[$doc:meta])* $name:ident, $tier:expr, $format:literal, [$($bound:tt)+], $encode:expr, $decode:path, $fingerprint:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name<T>(pub T);

        impl<T> $name<T> {
            /// The wrapped value.
            pub fn into_inner(self) -> T {
                self.0
            }
        }

        impl<T> Deref for $name<T> {
            type Target = T;
            fn deref(&self) -> &T {
                &self.0
            }
        }

        impl<T> DerefMut for $name<T> {
            fn deref_mut(&mut self) -> &mut T {
                &mut self.0
            }
        }

        impl<T> From<T> for $name<T> {
            fn from(v: T) -> Self {
                $name(v)
            }
        }

        impl<T: $($bound)+ + Send + Sync + 'static> Wire for $name<T> {
            const TIER: Tier = $tier;
            const FORMAT: &'static str = $format;
            fn fingerprint() -> Option<u64> {
                let fingerprint = $fingerprint;
                fingerprint()
            }
            #[inline]
            fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
                let encode = $encode;
                encode(&self.0, out)
            }
            #[inline]
            fn decode(bytes: Bytes) -> Result<Self, CodecError> {
                $decode(&bytes).map($name)
            }
        }
    };
}

wrapper!(
    /// `T` in the fast tier, bitcode serde mode: as `volley::wire!(T)`.
    BitcodeSerde,
    Tier::Fast,
    "bitcode-serde",
    [Serialize + DeserializeOwned],
    fast::serde_encode,
    fast::serde_decode,
    super::fingerprint::of_serde::<T>
);
wrapper!(
    /// `T` in the fast tier, bitcode's derive: as `volley::wire!(bitcode: T)`.
    Bitcode,
    Tier::Fast,
    "bitcode",
    [bitcode::Encode + bitcode::DecodeOwned],
    |v: &T, out: &mut BytesMut| {
        fast::encode(v, out);
        Ok(())
    },
    fast::decode
);
wrapper!(
    /// `T` in the general tier, JSON: as `volley::wire!(json: T)`.
    Json, Tier::General, "json", [Serialize + DeserializeOwned], general::json_encode, general::json_decode
);
wrapper!(
    /// `T` in the general tier, MessagePack: as `volley::wire!(msgpack: T)`.
    MsgPack, Tier::General, "msgpack", [Serialize + DeserializeOwned], general::msgpack_encode, general::msgpack_decode
);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn round_trip<W: Wire + PartialEq + std::fmt::Debug>(v: W) -> Bytes {
        let mut b = BytesMut::new();
        v.encode(&mut b).unwrap();
        let bytes = b.freeze();
        assert_eq!(W::decode(bytes.clone()).unwrap(), v);
        bytes
    }

    #[test]
    fn wrappers_encode_like_their_declarations() {
        let m: HashMap<String, u32> = [("a".to_string(), 1)].into();
        assert_eq!(&round_trip(Json(m.clone()))[..], br#"{"a":1}"#);
        assert_eq!(round_trip(MsgPack(m.clone()))[0], 0x81);
        round_trip(Bitcode(m.clone()));
        round_trip(BitcodeSerde(m));
        assert!(Json::<u32>::decode(Bytes::from_static(b"1 2")).is_err());
    }
}
