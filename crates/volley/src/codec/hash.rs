//! A stable hash of a value's encoded form, for key-hash routing.
//!
//! `stable_hash(k)` is **xxh3-64 with seed 0** (XXH3_64bits from xxHash ≥ 0.8, whose output
//! is frozen) of the key's *canonical bytes*:
//!
//! - raw bytes (`[u8]`, `Vec<u8>`, `Bytes`) and strings (`str`, `String`, `ByteString`, as
//!   UTF-8): the bytes themselves;
//! - integers (`u8`…`u128`, `i8`…`i128`, `usize`/`isize` as 64-bit): fixed-width
//!   little-endian; `bool`: one byte, 0 or 1; `()`: no bytes;
//! - plain-data values (`volley::wire!(pod: T)`) and arrays of them (`Vec<T>`, `[T]`,
//!   `PodVec<T>`): their plain-data encoding (little-endian, see [`pod`](super::pod));
//! - tuples `(A, B, …)` of up to 6 keys: for each element in order, its canonical length as
//!   a u32 little-endian, then its canonical bytes (the prefix makes `("ab", "c")` and
//!   `("a", "bc")` different keys).
//!
//! For every type except tuples, the canonical bytes are exactly the type's [`Wire`](super::Wire)
//! payload, so the hash is the hash of what travels, and a peer in any language can compute it
//! from the payload bytes with any XXH3 implementation.
//!
//! Why xxh3-64: it is a published algorithm with implementations in every major language,
//! its output is frozen (test vectors in the xxHash repository), it passes SMHasher, and it
//! hashes short keys in a few nanoseconds and long ones at memory speed. FNV-1a would be
//! simpler to write down but processes one byte per multiply and mixes the low bits poorly,
//! which matters when routing takes the hash modulo a small number of shards.
//!
//! Only types whose encoding Volley itself defines implement [`StableHash`]. Fast-tier (bitcode)
//! types do not: bitcode's format may change between its releases, and a routing hash that
//! changes with a dependency update would send keys to the wrong shard. General-tier (JSON,
//! MessagePack) types do not either: the same value has more than one valid encoding (field
//! order, number formats). Floating-point numbers are left out on purpose: `0.0 == -0.0` but
//! their bytes differ, and NaN is not equal to itself, so they make poor keys. Hand-written
//! impls are possible for a custom type whose encoding you define and never change.
//!
//! Test vectors: docs/PROTOCOL.md §15.

use std::cell::RefCell;

use bytes::Bytes;
use bytestring::ByteString;

pub use xxhash_rust::xxh3::xxh3_64;

use super::pod::PodVec;

/// A key with a stable hash: the same value gives the same hash in every process, on every
/// machine and in every Volley release. See the [module documentation](self) for the exact
/// definition.
///
/// ```
/// use volley::codec::{StableHash, stable_hash};
///
/// assert_eq!(stable_hash("izenesoft"), 0x0ca1_23a0_da7e_99dc);
/// assert_eq!(stable_hash(&42u64), 42u64.stable_hash());
/// let shard = stable_hash(&("user", 7u32)) % 16; // route a composite key
/// # let _ = shard;
/// ```
pub trait StableHash {
    /// Appends this key's canonical bytes to `out`.
    fn write_key(&self, out: &mut Vec<u8>);

    /// xxh3-64 (seed 0) of the canonical bytes.
    fn stable_hash(&self) -> u64 {
        thread_local! {
            static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        KEY.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                self.write_key(&mut buf);
                let h = xxh3_64(&buf);
                if buf.capacity() > 64 * 1024 {
                    *buf = Vec::new(); // do not keep one huge key's buffer forever
                }
                h
            }
            Err(_) => {
                let mut buf = Vec::new();
                self.write_key(&mut buf);
                xxh3_64(&buf)
            }
        })
    }
}

/// The stable hash of a key: `key.stable_hash()`.
#[inline]
pub fn stable_hash<K: StableHash + ?Sized>(key: &K) -> u64 {
    key.stable_hash()
}

/// Types whose canonical bytes are a byte slice they already hold: hashed in place.
macro_rules! hash_as_bytes {
    ($($t:ty => |$s:ident| $bytes:expr),* $(,)?) => {$(
        impl StableHash for $t {
            #[inline]
            fn write_key(&self, out: &mut Vec<u8>) {
                let $s = self;
                out.extend_from_slice($bytes);
            }
            #[inline]
            fn stable_hash(&self) -> u64 {
                let $s = self;
                xxh3_64($bytes)
            }
        }
    )*};
}

hash_as_bytes! {
    str => |s| s.as_bytes(),
    String => |s| s.as_bytes(),
    ByteString => |s| s.as_bytes(),
    Bytes => |s| s,
    bool => |s| &[*s as u8],
    () => |_s| &[],
}

macro_rules! hash_int {
    ($($t:ty),*) => {$(
        impl StableHash for $t {
            #[inline]
            fn write_key(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn stable_hash(&self) -> u64 {
                xxh3_64(&self.to_le_bytes())
            }
        }
    )*};
}
hash_int!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

/// `usize` and `isize` hash as 64-bit integers, so 32- and 64-bit machines agree.
impl StableHash for usize {
    fn write_key(&self, out: &mut Vec<u8>) {
        (*self as u64).write_key(out)
    }
    fn stable_hash(&self) -> u64 {
        (*self as u64).stable_hash()
    }
}

impl StableHash for isize {
    fn write_key(&self, out: &mut Vec<u8>) {
        (*self as i64).write_key(out)
    }
    fn stable_hash(&self) -> u64 {
        (*self as i64).stable_hash()
    }
}

impl<T: bytemuck::Pod> StableHash for [T] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(bytemuck::cast_slice(self));
    }
    fn stable_hash(&self) -> u64 {
        xxh3_64(bytemuck::cast_slice(self))
    }
}

impl<T: bytemuck::Pod> StableHash for Vec<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        self[..].write_key(out)
    }
    fn stable_hash(&self) -> u64 {
        self[..].stable_hash()
    }
}

impl<T: bytemuck::Pod> StableHash for PodVec<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn stable_hash(&self) -> u64 {
        xxh3_64(self.as_bytes())
    }
}

impl<K: StableHash + ?Sized> StableHash for &K {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
    fn stable_hash(&self) -> u64 {
        (**self).stable_hash()
    }
}

/// One tuple element: u32 little-endian length, then the element's canonical bytes.
fn write_element<K: StableHash + ?Sized>(k: &K, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    k.write_key(out);
    let len = u32::try_from(out.len() - at - 4).expect("a key element longer than 4 GiB");
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

macro_rules! hash_tuple {
    ($(($($n:tt $t:ident),+)),* $(,)?) => {$(
        impl<$($t: StableHash),+> StableHash for ($($t,)+) {
            fn write_key(&self, out: &mut Vec<u8>) {
                $(write_element(&self.$n, out);)+
            }
        }
    )*};
}
hash_tuple! {
    (0 A),
    (0 A, 1 B),
    (0 A, 1 B, 2 C),
    (0 A, 1 B, 2 C, 3 D),
    (0 A, 1 B, 2 C, 3 D, 4 E),
    (0 A, 1 B, 2 C, 3 D, 4 E, 5 F),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_hashes_agree_with_their_canonical_bytes() {
        fn via_bytes<K: StableHash + ?Sized>(k: &K) -> u64 {
            let mut v = Vec::new();
            k.write_key(&mut v);
            xxh3_64(&v)
        }
        assert_eq!("abc".stable_hash(), via_bytes("abc"));
        assert_eq!(7u32.stable_hash(), via_bytes(&7u32));
        assert_eq!(vec![1u16, 2].stable_hash(), via_bytes(&vec![1u16, 2]));
        assert_eq!(7usize.stable_hash(), 7u64.stable_hash());
        assert_eq!(Bytes::from_static(b"abc").stable_hash(), "abc".stable_hash());
        assert_eq!(vec![1u8, 2].stable_hash(), Bytes::from_static(&[1, 2]).stable_hash());
    }

    #[test]
    fn tuple_elements_are_length_prefixed() {
        assert_ne!(("ab", "c").stable_hash(), ("a", "bc").stable_hash());
        let mut v = Vec::new();
        ("ab", 1u8).write_key(&mut v);
        assert_eq!(v, [2, 0, 0, 0, b'a', b'b', 1, 0, 0, 0, 1]);
    }
}
