//! The plain-data tier: values copied as bytes, and decoded straight from the receive buffer.
//!
//! A plain-data type is one that implements [`bytemuck::Pod`]: `Copy`, `#[repr(C)]` (or
//! `transparent`), no padding bytes, no pointers, and every bit pattern valid. Its encoding
//! is its memory: **the fields at their `repr(C)` offsets, each little-endian** — which is
//! the same thing on a little-endian machine, so encoding is one copy and decoding one
//! unaligned read, with no parsing. `bool` and `char` are not `Pod` (not every byte is valid).
//!
//! Endianness is fixed to little-endian by definition, not inherited from the machine:
//! Volley refuses to compile for big-endian targets (see the `compile_error!` below) rather
//! than send bytes a little-endian peer would misread. All mainstream targets (x86-64,
//! aarch64, riscv64, wasm32) are little-endian.
//!
//! Declaring a type: `volley::wire!(pod: T)`. Built in: `Vec<T>` and [`PodVec<T>`] for any
//! plain-data `T` (the elements back to back, no length prefix: the payload length gives
//! the count), so `Vec<u8>` is raw bytes and `Vec<f32>` a little-endian `f32` array.
//!
//! [`PodVec<T>`] is the zero-copy form: it keeps the received payload and reads the elements
//! in place when the payload's address is aligned for `T`.

#[cfg(target_endian = "big")]
compile_error!(
    "Volley defines its plain-data encoding as little-endian and does not support big-endian targets"
);

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use bytemuck::Pod;
use bytes::{BufMut, Bytes, BytesMut};

use super::{CodecError, Tier, Wire};

pub use bytemuck::bytes_of;

/// Appends the bytes of a plain-data value.
#[inline]
pub fn encode<T: Pod>(v: &T, out: &mut BytesMut) {
    out.put_slice(bytemuck::bytes_of(v));
}

/// Reads a plain-data value from exactly `size_of::<T>()` bytes at any alignment.
#[inline]
pub fn decode<T: Pod>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() != size_of::<T>() {
        return Err(CodecError::of::<T>(
            "pod",
            format!("expected {} bytes, got {}", size_of::<T>(), bytes.len()),
        ));
    }
    Ok(bytemuck::pod_read_unaligned(bytes))
}

/// Appends the bytes of a slice of plain-data values, back to back.
#[inline]
pub fn encode_slice<T: Pod>(v: &[T], out: &mut BytesMut) {
    out.put_slice(bytemuck::cast_slice(v));
}

/// Copies a payload into a new `Vec<T>`, at any alignment: one allocation, one copy.
pub fn decode_vec<T: Pod>(bytes: &[u8]) -> Result<Vec<T>, CodecError> {
    let n = element_count::<T>(bytes.len())?;
    let mut v = Vec::<T>::with_capacity(n);
    // SAFETY: the destination has capacity for `n` elements = `bytes.len()` bytes and cannot
    // overlap a fresh allocation; `T: Pod` makes any bytes a valid `T`, so the first `n`
    // elements are initialized after the copy. (Safe alternatives either require the source
    // to be aligned or zero the vector first, which is a second pass over large payloads.)
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len());
        v.set_len(n);
    }
    Ok(v)
}

/// How many `T`s `len` bytes hold, or an error if it is not a whole number.
#[inline]
fn element_count<T>(len: usize) -> Result<usize, CodecError> {
    const { assert!(size_of::<T>() > 0, "zero-sized types have no plain-data sequence encoding") };
    if !len.is_multiple_of(size_of::<T>()) {
        return Err(CodecError::of::<T>(
            "pod",
            format!("{len} bytes is not a whole number of {}-byte elements", size_of::<T>()),
        ));
    }
    Ok(len / size_of::<T>())
}

/// `Vec<T>` of plain data: the elements' bytes back to back. Decoding copies once; use
/// [`PodVec<T>`] to read them in place.
impl<T: Pod + Send + Sync> Wire for Vec<T> {
    const TIER: Tier = Tier::Pod;
    const FORMAT: &'static str = "array";
    #[inline]
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        encode_slice(self, out);
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        decode_vec(&bytes)
    }
}

/// A read-only array of plain-data values that usually lives in the bytes it arrived in.
///
/// Decoding keeps a reference to the received payload (no copy) when the payload's address
/// is aligned for `T`, and copies once into an owned, aligned buffer when it is not. Either
/// way it dereferences to `&[T]`. Volley's wire format never pads, so the payload's address
/// inside the receive buffer depends on the header and names before it; for `T` with
/// alignment 1 (bytes, `[u8; N]` arrays) it is always zero-copy, for wider `T` it is when the
/// offset happens to fit.
///
/// Built from a `Vec<T>` it takes over the vector's allocation (no copy), and sending it
/// hands that allocation to the socket writer without copying when it is large.
///
/// ```
/// use volley::codec::PodVec;
/// use volley::Wire;
///
/// let v: PodVec<u32> = vec![1, 2, 3].into();
/// let mut buf = volley::bytes::BytesMut::new();
/// v.encode(&mut buf).unwrap();
/// assert_eq!(&buf[..], &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]); // little-endian, no prefix
/// let back = PodVec::<u32>::decode(buf.freeze()).unwrap();
/// assert_eq!(&*back, &[1, 2, 3]);
/// assert_eq!(back.iter().sum::<u32>(), 6);
/// ```
pub struct PodVec<T> {
    /// Invariant: `bytes.len()` is a multiple of `size_of::<T>()`, and unless it is empty,
    /// `bytes.as_ptr()` is aligned for `T`.
    bytes: Bytes,
    // `fn() -> T`: a PodVec owns no `T` (only bytes), so it is Send + Sync whatever T is.
    _t: PhantomData<fn() -> T>,
}

impl<T: Pod> PodVec<T> {
    /// An empty array.
    pub const fn new() -> Self {
        PodVec { bytes: Bytes::new(), _t: PhantomData }
    }

    /// The elements.
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        if self.bytes.is_empty() {
            // `Bytes::new()` has no particular alignment; an empty slice needs none.
            return &[];
        }
        bytemuck::cast_slice(&self.bytes)
    }

    /// The encoded form (the elements' bytes), shared, not copied.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The encoded form, shared, not copied.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }
}

impl<T: Pod + Send> PodVec<T> {
    /// The array encoded in `bytes`: borrowed if aligned for `T`, else copied once.
    pub fn from_bytes(bytes: Bytes) -> Result<Self, CodecError> {
        element_count::<T>(bytes.len())?;
        if bytes.is_empty() || bytes.as_ptr().cast::<T>().is_aligned() {
            Ok(PodVec { bytes, _t: PhantomData })
        } else {
            Ok(decode_vec::<T>(&bytes)?.into())
        }
    }
}

impl<T: Pod> Default for PodVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for PodVec<T> {
    /// Cheap: shares the bytes.
    fn clone(&self) -> Self {
        PodVec { bytes: self.bytes.clone(), _t: PhantomData }
    }
}

impl<T: Pod> Deref for PodVec<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Pod> AsRef<[T]> for PodVec<T> {
    fn as_ref(&self) -> &[T] {
        self.as_slice()
    }
}

/// Owns the vector whose allocation a [`PodVec`] borrows.
struct VecOwner<T>(Vec<T>);

impl<T: Pod> AsRef<[u8]> for VecOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl<T: Pod + Send> From<Vec<T>> for PodVec<T> {
    /// Takes over the vector's allocation (it is already aligned for `T`): no copy.
    fn from(v: Vec<T>) -> Self {
        if v.is_empty() {
            return PodVec::new();
        }
        PodVec { bytes: Bytes::from_owner(VecOwner(v)), _t: PhantomData }
    }
}

impl<T: Pod + Send> From<&[T]> for PodVec<T> {
    fn from(v: &[T]) -> Self {
        v.to_vec().into()
    }
}

impl<T: Pod + Send> FromIterator<T> for PodVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<T>>().into()
    }
}

impl<'a, T: Pod> IntoIterator for &'a PodVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl<T: Pod + fmt::Debug> fmt::Debug for PodVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl<T: Pod + PartialEq> PartialEq for PodVec<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Pod + Eq> Eq for PodVec<T> {}

impl<T: Pod + PartialEq> PartialEq<[T]> for PodVec<T> {
    fn eq(&self, other: &[T]) -> bool {
        self.as_slice() == other
    }
}

impl<T: Pod + PartialEq> PartialEq<Vec<T>> for PodVec<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.as_slice() == &other[..]
    }
}

impl<T: Pod + Send + Sync> Wire for PodVec<T> {
    const TIER: Tier = Tier::Pod;
    const FORMAT: &'static str = "array";
    #[inline]
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_slice(&self.bytes);
        Ok(())
    }
    #[inline]
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        PodVec::from_bytes(bytes)
    }
    fn as_bytes(&self) -> Option<Bytes> {
        Some(self.bytes.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes at an address aligned for u64, or one byte past it.
    fn bytes_at(src: &[u8], aligned: bool) -> Bytes {
        let mut raw = BytesMut::zeroed(src.len() + 16);
        let skew = raw.as_ptr().align_offset(8) + usize::from(!aligned);
        raw[skew..skew + src.len()].copy_from_slice(src);
        raw.freeze().slice(skew..skew + src.len())
    }

    #[test]
    fn pod_vec_borrows_aligned_payloads_and_copies_unaligned_ones() {
        let src: Vec<u8> = (1..=8u64).flat_map(|x| x.to_le_bytes()).collect();
        let aligned = bytes_at(&src, true);
        let v = PodVec::<u64>::decode(aligned.clone()).unwrap();
        assert_eq!(v.as_ptr().cast::<u8>(), aligned.as_ptr(), "aligned payload must not be copied");
        assert_eq!(&*v, &[1, 2, 3, 4, 5, 6, 7, 8]);

        let unaligned = bytes_at(&src, false);
        assert!(!unaligned.as_ptr().cast::<u64>().is_aligned());
        let v = PodVec::<u64>::decode(unaligned.clone()).unwrap();
        assert_ne!(v.as_ptr().cast::<u8>(), unaligned.as_ptr());
        assert!(v.as_ptr().is_aligned());
        assert_eq!(&*v, &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn vec_of_pod_decodes_at_any_alignment() {
        let src: Vec<u8> = [-1i32, 0, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        for aligned in [true, false] {
            assert_eq!(Vec::<i32>::decode(bytes_at(&src, aligned)).unwrap(), [-1, 0, 7]);
        }
    }

    #[test]
    fn from_vec_takes_the_allocation() {
        let v = vec![1.5f64, -2.0];
        let p = v.as_ptr();
        let pv = PodVec::from(v);
        assert_eq!(pv.as_ptr(), p);
        assert_eq!(pv, vec![1.5, -2.0]);
        assert_eq!(pv.as_bytes().len(), 16);
    }

    #[test]
    fn partial_elements_are_rejected() {
        assert!(PodVec::<u32>::decode(Bytes::from_static(&[1, 2, 3, 4, 5])).is_err());
        assert!(Vec::<u16>::decode(Bytes::from_static(&[1])).is_err());
        assert!(decode::<u64>(&[0; 7]).is_err());
        assert!(decode::<u64>(&[0; 9]).is_err());
    }
}
