//! The fast tier: bitcode, the default for structured types.
//!
//! Two entry points, two different byte formats (both sides of a method must agree):
//!
//! - serde mode ([`serde_encode`], [`serde_decode`]; `volley::wire!(T)`): works for any
//!   `Serialize + DeserializeOwned` type, so it is the default.
//! - bitcode's own derive ([`encode`], [`decode`]; `volley::wire!(bitcode: T)`): needs
//!   `#[derive(bitcode::Encode, bitcode::Decode)]` on the type, and is faster — the derive
//!   knows the layout at compile time, and a per-thread [`bitcode::Buffer`] keeps its scratch
//!   allocations across calls (serde mode allocates afresh each time). Figures in
//!   docs/BENCHMARKS.md.
//!
//! bitcode's format is not self-describing and may change between its major releases, which
//! is why fast-tier types have no [`StableHash`](super::StableHash).

use std::cell::RefCell;

use bytes::{BufMut, BytesMut};

use super::CodecError;

/// A per-thread bitcode buffer is dropped after encoding or decoding a value this large, so a
/// thread that once handled a big message does not keep its scratch memory forever.
const KEEP_BUFFER_MAX: usize = 256 * 1024;

thread_local! {
    static BUFFER: RefCell<bitcode::Buffer> = RefCell::new(bitcode::Buffer::new());
}

/// Runs `f` with this thread's bitcode buffer (or a fresh one if it is in use further up the
/// stack, which only a user's own `Encode` impl calling back into Volley could cause).
#[inline]
fn with_buffer<R>(f: impl FnOnce(&mut bitcode::Buffer) -> (R, usize)) -> R {
    BUFFER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let (r, size) = f(&mut buf);
            if size > KEEP_BUFFER_MAX {
                *buf = bitcode::Buffer::new();
            }
            r
        }
        Err(_) => f(&mut bitcode::Buffer::new()).0,
    })
}

/// Encodes with bitcode's derive (`volley::wire!(bitcode: T)`).
#[inline]
pub fn encode<T: bitcode::Encode + ?Sized>(v: &T, out: &mut BytesMut) {
    with_buffer(|buf| {
        let bytes = buf.encode(v);
        out.put_slice(bytes);
        ((), bytes.len())
    })
}

/// Decodes a value encoded by [`encode`]; the payload must be exactly one value.
#[inline]
pub fn decode<T: bitcode::DecodeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    with_buffer(|buf| (buf.decode(bytes), bytes.len())).map_err(|e| CodecError::of::<T>("bitcode", e))
}

/// Encodes a serde value with bitcode's serde mode (`volley::wire!(T)`).
#[inline]
pub fn serde_encode<T: serde::Serialize + ?Sized>(v: &T, out: &mut BytesMut) -> Result<(), CodecError> {
    let bytes = bitcode::serialize(v).map_err(|e| CodecError::of::<T>("bitcode serde", e))?;
    out.put_slice(&bytes);
    Ok(())
}

/// Decodes a value encoded by [`serde_encode`]; the payload must be exactly one value.
#[inline]
pub fn serde_decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    bitcode::deserialize(bytes).map_err(|e| CodecError::of::<T>("bitcode serde", e))
}
