//! Decoder checks shared by the cargo-fuzz targets (`fuzz/`) and the regression test that
//! replays every saved input (`tests/fuzz_regressions.rs`). Not part of the public API.
//!
//! Each function feeds arbitrary bytes to one decoder and checks what must hold for *any*
//! input: it returns a value or a typed error, never panics, and (for the frame decoder) the
//! outcome does not depend on how the bytes were split into reads. A violated property panics,
//! which is what the fuzzer reports as a crash.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::codec::{CodecError, PodVec, Wire};
use crate::proto::{Decoder, Limits, Message, PREAMBLE_LEN, ProtocolError, decode_frame, preamble};

/// What decoding a whole byte stream produced: the messages of every complete frame, then
/// the error that ended it (if any).
#[derive(Debug, PartialEq)]
struct Outcome {
    messages: Vec<Message>,
    error: Option<ProtocolError>,
}

/// Small limits, so the fuzzer reaches every limit check with short inputs.
fn small_limits() -> Limits {
    Limits { max_frame_len: 4096, max_messages_per_frame: 64, max_batch_items: 64 }
}

/// Feeds `stream` to a decoder in chunks whose sizes come from `splits` (cycled; 0 means one
/// byte), the way a reader would get them from a socket.
fn decode_stream(stream: &[u8], splits: &[u8], limits: Limits, preamble: bool) -> Outcome {
    let mut decoder = if preamble { Decoder::new(limits) } else { Decoder::after_preamble(limits) };
    let mut buf = BytesMut::new();
    let mut messages = Vec::new();
    let mut fed = 0;
    let mut i = 0;
    loop {
        loop {
            // `missing` must never panic and must be 0 exactly when a frame (or error) is ready.
            let missing = decoder.missing(&buf);
            match decoder.next_frame(&mut buf) {
                Ok(Some(body)) => {
                    if let Err(e) = decode_frame(&body, &limits, &mut messages) {
                        return Outcome { messages, error: Some(e) };
                    }
                }
                Ok(None) => {
                    assert!(missing > 0, "decoder wants 0 more bytes but returned no frame");
                    break;
                }
                Err(e) => return Outcome { messages, error: Some(e) },
            }
        }
        if fed == stream.len() {
            return Outcome { messages, error: None };
        }
        let step = if splits.is_empty() { stream.len() } else { (splits[i % splits.len()] as usize).max(1) };
        i += 1;
        let end = (fed + step).min(stream.len());
        buf.extend_from_slice(&stream[fed..end]);
        fed = end;
    }
}

/// The frame decoder on arbitrary bytes. The first byte gives the number of split-point bytes
/// that follow; the rest is the stream. Checks that the stream decodes the same whether it
/// arrives whole, byte by byte, or in the given chunks, with the default and with small limits.
pub fn frame_decoder(data: &[u8]) {
    let (splits, stream) = match data.split_first() {
        Some((&n, rest)) => rest.split_at((n as usize % 16).min(rest.len())),
        None => return,
    };
    for limits in [Limits::default(), small_limits()] {
        for preamble in [false, true] {
            let whole = decode_stream(stream, &[], limits, preamble);
            // Byte by byte once (the costliest split); the input's own split points for all.
            if preamble && limits == small_limits() {
                let bytewise = decode_stream(stream, &[1], limits, preamble);
                assert_eq!(whole, bytewise, "byte-by-byte decoding differs from whole decoding");
            }
            if !splits.is_empty() {
                let split = decode_stream(stream, splits, limits, preamble);
                assert_eq!(whole, split, "decoding at split points {splits:?} differs");
            }
        }
    }
    // A frame body on its own (what `decode_frame` sees): all or nothing.
    let body = Bytes::copy_from_slice(stream);
    let mut out = vec![Message::Cancel { id: 7 }];
    match decode_frame(&body, &small_limits(), &mut out) {
        Ok(()) => assert!(out.len() > 1 || stream.is_empty()),
        Err(_) => assert_eq!(out, vec![Message::Cancel { id: 7 }], "a failed frame appended messages"),
    }
}

/// The preamble check and the handshake a server performs: preamble, then (optionally) an
/// auth message as the first frame.
pub fn preamble(data: &[u8]) {
    if data.len() >= PREAMBLE_LEN {
        let mut p = [0u8; PREAMBLE_LEN];
        p.copy_from_slice(&data[..PREAMBLE_LEN]);
        let r = preamble::check(&p);
        assert_eq!(r.is_ok(), p[..5] == preamble::PREAMBLE[..5], "preamble verdict {r:?} for {p:?}");
    }
    let out = decode_stream(data, &[3], Limits::default(), true);
    if let Some(Message::Auth { token }) = out.messages.first() {
        assert!(token.len() <= crate::proto::message::MAX_TOKEN_LEN);
    }
}

/// Plain-data types the pod tier decodes.
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct FuzzPoint {
    pub y: f64,
    pub x: f32,
    pub id: u32,
}
crate::wire!(pod: FuzzPoint);

/// The pod tier on arbitrary bytes: a value decodes only from exactly its size; vectors only
/// from a multiple of the element size; a decoded value encodes back to the same bytes.
pub fn codec_pod(data: &[u8]) {
    let b = Bytes::copy_from_slice(data);
    check_pod_roundtrip::<FuzzPoint>(&b);
    check_pod_roundtrip::<u64>(&b);
    check_pod_roundtrip::<Vec<u32>>(&b);
    check_pod_roundtrip::<Vec<FuzzPoint>>(&b);
    check_pod_roundtrip::<PodVec<u64>>(&b);
    // Unaligned: the same bytes one further into a buffer.
    if data.len() > 1 {
        check_pod_roundtrip::<PodVec<u64>>(&b.slice(1..));
        check_pod_roundtrip::<PodVec<FuzzPoint>>(&b.slice(1..));
    }
    let _ = <bool as Wire>::decode(b.clone());
    let _ = <String as Wire>::decode(b.clone());
    let _ = <crate::ByteString as Wire>::decode(b);
}

fn check_pod_roundtrip<T: Wire>(b: &Bytes) {
    if let Ok(v) = T::decode(b.clone()) {
        let mut out = BytesMut::new();
        v.encode(&mut out).expect("a decoded value encodes");
        assert_eq!(&out[..], &b[..], "{} does not encode back to its bytes", std::any::type_name::<T>());
    }
}

/// A serde type with the shapes decoders find hard: strings, nested options and vectors,
/// enums, maps, floats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FuzzDoc {
    pub name: String,
    pub terms: Vec<String>,
    pub ids: Vec<u64>,
    pub score: Option<f64>,
    pub kind: FuzzKind,
    pub meta: std::collections::BTreeMap<String, i32>,
    pub blob: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FuzzKind {
    Empty,
    Term(String),
    Range { from: i64, to: i64 },
    Nested(Vec<FuzzKind>),
}

/// The same shape with bitcode's own derive.
#[derive(Debug, Clone, PartialEq, bitcode::Encode, bitcode::Decode)]
pub struct FuzzHits {
    pub ids: Vec<u64>,
    pub scores: Vec<f32>,
    pub names: Vec<String>,
    pub next: Option<(u32, String)>,
}

/// The fast tier (bitcode, serde and derive) on arbitrary bytes, and the registry's messages
/// (JSON, and the relay's hand-written encoding): a typed error or a value, never a panic.
pub fn codec_fast(data: &[u8]) {
    let _ = crate::codec::fast::serde_decode::<FuzzDoc>(data);
    let _ = crate::codec::fast::decode::<FuzzHits>(data);
    let b = Bytes::copy_from_slice(data);
    use crate::discovery::wire as w;
    let _ = <w::RegisterRequest as Wire>::decode(b.clone());
    let _ = <w::Resolved as Wire>::decode(b.clone());
    let _ = <w::Listing as Wire>::decode(b.clone());
    let _ = <w::WatchRequest as Wire>::decode(b.clone());
    let _ = <w::RelayRequest as Wire>::decode(b.clone());
    let _ = <w::RelayReply as Wire>::decode(b);
}

/// The general tier (JSON and MessagePack) on arbitrary bytes.
pub fn codec_general(data: &[u8]) {
    let _: Result<FuzzDoc, CodecError> = crate::codec::general::json_decode(data);
    let _: Result<serde_json::Value, CodecError> = crate::codec::general::json_decode(data);
    let _: Result<FuzzDoc, CodecError> = crate::codec::general::msgpack_decode(data);
    let _: Result<Vec<(String, Option<u32>)>, CodecError> = crate::codec::general::msgpack_decode(data);
}

/// The shared-memory ring against a hostile peer. The input is a script of 10-byte steps
/// (an operation byte, a size byte, a 64-bit value): the peer stores anything in the control
/// words and the data area; this side reads and writes through the ring. Every index read
/// from the mapping must be validated: a read takes at most what it asked for and what the
/// ring holds, or fails with a typed ring error appending nothing; a write never exceeds the
/// room, which never exceeds the capacity; nothing panics or touches memory past the ring.
#[cfg(target_os = "linux")]
pub fn shm_ring(data: &[u8]) {
    use std::io::IoSlice;
    use std::sync::atomic::Ordering;

    use crate::transport::shm::ring::{self, RingAt, RingReader, RingWriter};
    use crate::transport::shm::sys::Region;

    const CAP: usize = 4096;
    let region = Region::anonymous(64 + 256 + CAP).expect("an anonymous mapping");
    let at = RingAt { control: 64, data: 320, cap: CAP };
    let (mut reader, mut writer) = (RingReader::new(at), RingWriter::new(at));
    let mut out = BytesMut::new();
    for step in data.chunks_exact(10) {
        let size = step[1] as usize * 32;
        let value = u64::from_le_bytes(step[2..10].try_into().expect("8 bytes"));
        match step[0] % 6 {
            0 => region.u64_at(64 + ring::WRITE_POS).store(value, Ordering::Relaxed),
            1 => region.u64_at(64 + ring::READ_POS).store(value, Ordering::Relaxed),
            2 => region.u32_at(64 + ring::WRITER_WAITING).store(value as u32, Ordering::Relaxed),
            3 => {
                let garbage = vec![step[1]; size / 2];
                region.copy_in(320 + value as usize % (CAP - garbage.len()), &garbage);
            }
            4 => {
                let before = out.len();
                match reader.read(&region, &mut out, size) {
                    Ok(r) => assert!(r.n <= size && r.n <= CAP && out.len() == before + r.n, "read {r:?}"),
                    Err(ProtocolError::Ring(_)) => assert_eq!(out.len(), before, "a refused read appended"),
                    Err(e) => panic!("a ring read failed with {e:?}"),
                }
            }
            _ => match writer.room(&region) {
                Ok(room) => {
                    assert!(room <= CAP, "room {room}");
                    let bytes = vec![step[1]; size];
                    let n = writer.write(&region, &[IoSlice::new(&bytes)], room).n;
                    assert!(n <= room && n <= size, "wrote {n} of {size} into {room}");
                }
                Err(e) => assert!(matches!(e, ProtocolError::Ring(_)), "{e:?}"),
            },
        }
        out.clear();
    }
}
