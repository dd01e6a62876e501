//! The values the codec cases encode: table 2's plain-data struct, the hand-written (custom
//! tier) encodings of the two maps, and the spread of integers every container is filled with.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use volley::bytes::{Bytes, BytesMut};
use volley::{CodecError, Wire};

/// Table 2's POD: `struct { int a; int b; int c; int d; }`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    bytemuck::Pod,
    bytemuck::Zeroable,
    Serialize,
    Deserialize,
    bitcode::Encode,
    bitcode::Decode,
)]
#[repr(C)]
pub struct Quad {
    pub a: i32,
    pub b: i32,
    pub c: i32,
    pub d: i32,
}

/// The custom tier for `map<string, int>`: u32 LE key length, key bytes, i32 LE value, per
/// entry (what the MF report's "memory" column did for maps).
#[derive(Debug, PartialEq)]
pub struct StrIntMap(pub HashMap<String, i32>);

impl Wire for StrIntMap {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        // Size the whole encoding first and fill it in place: one capacity check instead of
        // three per entry.
        let size: usize = self.0.keys().map(|k| 8 + k.len()).sum();
        let start = out.len();
        out.resize(start + size, 0);
        let mut at = &mut out[start..];
        for (k, v) in &self.0 {
            let (len, rest) = at.split_at_mut(4);
            len.copy_from_slice(&(k.len() as u32).to_le_bytes());
            let (key, rest) = rest.split_at_mut(k.len());
            key.copy_from_slice(k.as_bytes());
            let (value, rest) = rest.split_at_mut(4);
            value.copy_from_slice(&v.to_le_bytes());
            at = rest;
        }
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        let bad = || CodecError("truncated map entry".into());
        let mut map = HashMap::with_capacity(bytes.len() / 16);
        let mut rest = &bytes[..];
        while let Some((len, after)) = rest.split_first_chunk::<4>() {
            let len = u32::from_le_bytes(*len) as usize;
            if after.len() < len + 4 {
                return Err(bad());
            }
            let (key, after) = after.split_at(len);
            let (value, after) = after.split_at(4);
            let key = std::str::from_utf8(key).map_err(|e| CodecError(e.to_string()))?;
            map.insert(key.to_owned(), i32::from_le_bytes(value.try_into().unwrap()));
            rest = after;
        }
        if !rest.is_empty() {
            return Err(bad());
        }
        Ok(StrIntMap(map))
    }
}

/// The custom tier for `map<int, int>`: the entries as (i32, i32) little-endian pairs.
#[derive(Debug, PartialEq)]
pub struct IntIntMap(pub HashMap<i32, i32>);

impl Wire for IntIntMap {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        let start = out.len();
        out.resize(start + self.0.len() * 8, 0);
        for (pair, (k, v)) in out[start..].chunks_exact_mut(8).zip(&self.0) {
            pair[..4].copy_from_slice(&k.to_le_bytes());
            pair[4..].copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        let pairs = volley::codec::pod::decode_vec::<[i32; 2]>(&bytes)?;
        Ok(IntIntMap(pairs.into_iter().map(|[k, v]| (k, v)).collect()))
    }
}

/// Values spread over 0..1,000,000: neither tiny (which flatters varint formats) nor
/// full-width.
pub fn value(i: usize) -> i32 {
    (i as u64 * 2_654_435_761 % 1_000_000) as i32
}

/// The protobuf tier's messages for the same cases (`wire!(proto: …)`): the string as a
/// one-field message, the containers as a repeated or map field.
pub mod pb {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Text {
        #[prost(string, tag = "1")]
        pub s: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Ints {
        #[prost(int32, repeated, tag = "1")]
        pub v: Vec<i32>,
    }
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Quad {
        #[prost(int32, tag = "1")]
        pub a: i32,
        #[prost(int32, tag = "2")]
        pub b: i32,
        #[prost(int32, tag = "3")]
        pub c: i32,
        #[prost(int32, tag = "4")]
        pub d: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Quads {
        #[prost(message, repeated, tag = "1")]
        pub v: Vec<Quad>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StrInt {
        #[prost(map = "string, int32", tag = "1")]
        pub m: HashMap<String, i32>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct IntInt {
        #[prost(map = "int32, int32", tag = "1")]
        pub m: HashMap<i32, i32>,
    }
    volley::wire!(proto: Text, Ints, Quads, StrInt, IntInt);
}
