//! Every codec tier: round trips (empty, typical, 8 MiB, at an unaligned address), corrupt
//! and truncated payloads (typed errors, never panics), and pod and json types through a real
//! tcp server and client.

use std::fmt::Debug;
use std::panic::AssertUnwindSafe;

use serde::{Deserialize, Serialize};
use volley::bytes::{BufMut, Bytes, BytesMut};
use volley::codec::Tier;
use volley::{ByteString, Client, Code, CodecError, Method, PodVec, Server, Wire};

// ---- types, one per tier ------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Quad {
    a: i32,
    b: i32,
    c: i32,
    d: i32,
}
volley::wire!(pod: Quad);

/// A pod type with an 8-byte field, so alignment matters.
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Sample {
    at_ns: u64,
    value: f64,
    sensor: u32,
    flags: u32,
}
volley::wire!(pod: Sample);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
enum Kind {
    #[default]
    Plain,
    Ranked(u32),
    Linked {
        to: u64,
        weight: i16,
    },
}

/// The same document shape in every serde tier (`TIER` only makes the types distinct, since a
/// type has one encoding).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, bitcode::Encode, bitcode::Decode)]
struct Doc<const TIER: u8> {
    id: u64,
    title: String,
    tags: Vec<String>,
    scores: Vec<f32>,
    body: Vec<u8>,
    parent: Option<u64>,
    kind: Kind,
}
type SerdeDoc = Doc<0>;
type DeriveDoc = Doc<1>;
type JsonDoc = Doc<2>;
type MsgpackDoc = Doc<3>;
volley::wire!(SerdeDoc);
volley::wire!(bitcode: DeriveDoc);
volley::wire!(json: JsonDoc);
volley::wire!(msgpack: MsgpackDoc);

/// The custom tier: a hand-written encoding (u32 term, then the postings as LE u32s).
#[derive(Clone, Debug, Default, PartialEq)]
struct Postings {
    term: u32,
    docs: Vec<u32>,
}

impl Wire for Postings {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.put_u32_le(self.term);
        volley::codec::pod::encode_slice(&self.docs, out);
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        let (term, docs) = bytes.split_first_chunk::<4>().ok_or_else(|| CodecError("no term".into()))?;
        Ok(Postings { term: u32::from_le_bytes(*term), docs: volley::codec::pod::decode_vec(docs)? })
    }
}

fn doc<const T: u8>(size: usize) -> Doc<T> {
    if size == 0 {
        return Doc::default();
    }
    Doc {
        id: 0xDEAD_BEEF_0000_0001,
        title: "é".repeat(size / 2),
        tags: (0..size / 1024 + 2).map(|i| format!("tag-{i}")).collect(),
        scores: (0..size / 256 + 3).map(|i| i as f32 * 0.5 - 1.0).collect(),
        body: (0..size / 4 + 5).map(|i| (i % 251) as u8).collect(),
        parent: Some(size as u64),
        kind: Kind::Linked { to: 9, weight: -3 },
    }
}

const LARGE: usize = 8 << 20;

// ---- helpers ------------------------------------------------------------------------------

fn encode<T: Wire>(v: &T) -> Bytes {
    let mut b = BytesMut::new();
    v.encode(&mut b).unwrap();
    if let Some(shared) = v.as_bytes() {
        assert_eq!(shared, b, "as_bytes must equal the encoding");
    }
    b.freeze()
}

/// The payload's bytes starting `skew` bytes past a 16-byte-aligned address, as a payload
/// sits at an arbitrary offset in a receive buffer.
fn at_offset(payload: &[u8], skew: usize) -> Bytes {
    let mut raw = BytesMut::zeroed(payload.len() + 32);
    let start = raw.as_ptr().align_offset(16) + skew;
    raw[start..start + payload.len()].copy_from_slice(payload);
    raw.freeze().slice(start..start + payload.len())
}

/// Encodes, then decodes at an aligned address and at odd ones; all must give `v` back.
fn round_trip<T: Wire + PartialEq + Debug>(v: &T) {
    let bytes = encode(v);
    for skew in [0, 1, 3, 7] {
        let back = T::decode(at_offset(&bytes, skew))
            .unwrap_or_else(|e| panic!("{} at offset {skew}: {e}", std::any::type_name::<T>()));
        assert!(back == *v, "{} at offset {skew}: came back changed", std::any::type_name::<T>());
    }
}

/// Decodes, turning a panic into a test failure that names the input.
fn decode_no_panic<T: Wire>(payload: &[u8], what: &str) -> Result<T, CodecError> {
    let bytes = Bytes::copy_from_slice(payload);
    std::panic::catch_unwind(AssertUnwindSafe(|| T::decode(bytes))).unwrap_or_else(|_| {
        panic!("{} panicked decoding {what} ({} bytes)", std::any::type_name::<T>(), payload.len())
    })
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Truncations, bit flips, a trailing byte and random garbage. `whole` says which truncated
/// lengths are themselves valid encodings (for types whose payload is a sequence of fixed-size
/// elements); every other truncation must be an error.
fn corrupt_inputs_are_typed_errors<T: Wire>(sample: &T, whole: impl Fn(usize) -> bool) {
    let name = std::any::type_name::<T>();
    let bytes = encode(sample);
    assert!(decode_no_panic::<T>(&bytes, "the sample").is_ok(), "{name}: the sample must decode");
    for len in 0..bytes.len() {
        let r = decode_no_panic::<T>(&bytes[..len], "a truncation");
        if !whole(len) {
            assert!(r.is_err(), "{name}: truncation to {len} of {} bytes decoded", bytes.len());
        }
    }
    let mut extended = bytes.to_vec();
    extended.push(0x5A);
    if !whole(extended.len()) {
        assert!(decode_no_panic::<T>(&extended, "trailing byte").is_err(), "{name}: trailing byte accepted");
    }
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let _ = decode_no_panic::<T>(&flipped, &format!("bit {bit} flipped"));
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..3000 {
        let len = (rng.next() % 96) as usize;
        let garbage: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = decode_no_panic::<T>(&garbage, &format!("garbage #{i}"));
        // Garbage spliced into a valid payload reaches deeper into the decoder.
        let mut spliced = bytes.to_vec();
        let at = (rng.next() as usize) % spliced.len().max(1);
        for (j, g) in garbage.iter().take(8).enumerate() {
            if let Some(b) = spliced.get_mut(at + j) {
                *b = *g;
            }
        }
        let _ = decode_no_panic::<T>(&spliced, &format!("spliced #{i}"));
    }
}

fn never(_: usize) -> bool {
    false
}

// ---- round trips --------------------------------------------------------------------------

#[test]
fn tiers_are_declared_at_compile_time() {
    assert_eq!(<Postings as Wire>::TIER, Tier::Custom);
    assert_eq!(<Quad as Wire>::TIER, Tier::Pod);
    assert_eq!(<Vec<Quad> as Wire>::TIER, Tier::Pod);
    assert_eq!(<PodVec<u64> as Wire>::TIER, Tier::Pod);
    assert_eq!(<SerdeDoc as Wire>::TIER, Tier::Fast);
    assert_eq!(<DeriveDoc as Wire>::TIER, Tier::Fast);
    assert_eq!(<JsonDoc as Wire>::TIER, Tier::General);
    assert_eq!(<MsgpackDoc as Wire>::TIER, Tier::General);
}

#[test]
fn custom_tier_round_trips() {
    round_trip(&Postings::default());
    round_trip(&Postings { term: 7, docs: vec![1, 5, 9] });
    round_trip(&Postings { term: u32::MAX, docs: (0..(LARGE / 4) as u32).collect() });
    round_trip(&String::new());
    round_trip(&"izenesoft".to_string());
    round_trip(&ByteString::new());
    round_trip(&ByteString::from("héllo".repeat(LARGE / 6)));
}

#[test]
fn pod_tier_round_trips() {
    round_trip(&Quad::default());
    round_trip(&Quad { a: -1, b: i32::MIN, c: i32::MAX, d: 42 });
    round_trip(&Sample { at_ns: u64::MAX, value: -0.5, sensor: 3, flags: 0x8000_0001 });
    round_trip(&Vec::<Quad>::new());
    round_trip(&(0..1000).map(|i| Quad { a: i, b: -i, c: i * 3, d: 7 }).collect::<Vec<_>>());
    round_trip(&(0..LARGE / 16).map(|i| Quad { a: i as i32, b: 1, c: 2, d: 3 }).collect::<Vec<_>>());
    round_trip(&PodVec::<u64>::new());
    round_trip(&PodVec::from((0..LARGE as u64 / 8).collect::<Vec<u64>>()));
    round_trip(&PodVec::from(vec![Sample { at_ns: 1, value: 2.0, sensor: 3, flags: 4 }; 100]));
    round_trip(&Vec::<u8>::new());
    round_trip(&vec![0xA5u8; LARGE]);
    round_trip(&Bytes::from(vec![1u8; LARGE]));
    round_trip(&Vec::<f64>::new());
    round_trip(&vec![f64::MIN_POSITIVE, -0.0, 1e300]);
}

#[test]
fn pod_encoding_is_little_endian_and_unpadded() {
    let q = Quad { a: 1, b: -2, c: 0x0102_0304, d: 0 };
    assert_eq!(
        &encode(&q)[..],
        &[1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 4, 3, 2, 1, 0, 0, 0, 0],
        "fields at repr(C) offsets, each little-endian"
    );
    assert_eq!(&encode(&vec![q, q])[..16], &encode(&q)[..], "arrays are elements back to back");
    assert_eq!(encode(&vec![1u16, 2]), Bytes::from_static(&[1, 0, 2, 0]));
}

#[test]
fn fast_tier_round_trips() {
    round_trip(&SerdeDoc::default());
    round_trip(&doc::<0>(300));
    round_trip(&doc::<0>(LARGE));
    round_trip(&DeriveDoc::default());
    round_trip(&doc::<1>(300));
    round_trip(&doc::<1>(LARGE));
}

#[test]
fn general_tier_round_trips() {
    round_trip(&JsonDoc::default());
    round_trip(&doc::<2>(300));
    round_trip(&doc::<2>(LARGE));
    round_trip(&MsgpackDoc::default());
    round_trip(&doc::<3>(300));
    round_trip(&doc::<3>(LARGE));
}

#[test]
fn general_tier_is_self_describing() {
    let d = Doc::<2> { id: 1, title: "t".into(), ..Default::default() };
    let json = String::from_utf8(encode(&d).to_vec()).unwrap();
    assert!(json.starts_with(r#"{"id":1,"title":"t","#), "{json}");
    // MessagePack writes structs as maps keyed by field name: any msgpack reader sees names.
    let m = Doc::<3> { id: 1, ..Default::default() };
    let bytes = encode(&m);
    assert_eq!(bytes[0], 0x87, "fixmap of 7 fields");
    assert_eq!(&bytes[1..4], b"\xa2id");
}

// ---- corrupt and truncated payloads ------------------------------------------------------

#[test]
fn corrupt_payloads_are_typed_errors_in_the_custom_tier() {
    corrupt_inputs_are_typed_errors(&Postings { term: 9, docs: vec![1, 2, 3, 4, 5] }, |n| {
        n >= 4 && n % 4 == 0
    });
    corrupt_inputs_are_typed_errors(&"héllo wörld".to_string(), |n| !matches!(n, 2 | 9));
    corrupt_inputs_are_typed_errors(&ByteString::from("héllo wörld"), |n| !matches!(n, 2 | 9));
    corrupt_inputs_are_typed_errors(&true, never);
}

#[test]
fn corrupt_payloads_are_typed_errors_in_the_pod_tier() {
    corrupt_inputs_are_typed_errors(&Quad { a: 1, b: 2, c: 3, d: 4 }, never);
    corrupt_inputs_are_typed_errors(&Sample { at_ns: 5, value: 1.5, sensor: 2, flags: 1 }, never);
    let quads: Vec<Quad> = (0..6).map(|i| Quad { a: i, b: i, c: i, d: i }).collect();
    corrupt_inputs_are_typed_errors(&quads, |n| n % 16 == 0);
    corrupt_inputs_are_typed_errors(&PodVec::from(vec![1u64, 2, 3, 4]), |n| n % 8 == 0);
    corrupt_inputs_are_typed_errors(&7u64, never);
}

#[test]
fn corrupt_payloads_are_typed_errors_in_the_fast_tier() {
    corrupt_inputs_are_typed_errors(&doc::<0>(40), never);
    corrupt_inputs_are_typed_errors(&doc::<1>(40), never);
}

#[test]
fn corrupt_payloads_are_typed_errors_in_the_general_tier() {
    corrupt_inputs_are_typed_errors(&doc::<2>(40), never);
    corrupt_inputs_are_typed_errors(&doc::<3>(40), never);
}

#[test]
fn truncated_large_payloads_are_typed_errors_in_every_tier() {
    fn cut<T: Wire>(v: &T) {
        let bytes = encode(v);
        // Odd cuts, so the sequence types are cut mid-element.
        for cut in [1, 3, (bytes.len() / 2) | 1] {
            assert!(
                decode_no_panic::<T>(&bytes[..bytes.len() - cut], "a large truncation").is_err(),
                "{} cut by {cut}",
                std::any::type_name::<T>()
            );
        }
    }
    cut(&Postings { term: 1, docs: vec![7; LARGE / 4] });
    cut(&vec![Quad { a: 1, b: 2, c: 3, d: 4 }; LARGE / 16 + 1]);
    cut(&PodVec::from(vec![Sample::default(); LARGE / 24 + 1]));
    cut(&doc::<0>(LARGE));
    cut(&doc::<1>(LARGE));
    cut(&doc::<2>(LARGE));
    cut(&doc::<3>(LARGE));
}

// ---- end to end over tcp ------------------------------------------------------------------

const ROTATE: Method<Quad, Quad> = Method::new("codec", "rotate");
const SUM: Method<PodVec<Sample>, f64> = Method::new("codec", "sum");
const RENAME: Method<JsonDoc, JsonDoc> = Method::new("codec", "rename");
const SHOUT: Method<ByteString, ByteString> = Method::new("codec", "shout");
/// The same method names with raw bytes, to send payloads the typed side would never make.
const RENAME_RAW: Method<Bytes, Bytes> = Method::new("codec", "rename");
const ROTATE_RAW: Method<Bytes, Bytes> = Method::new("codec", "rotate");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_and_json_types_round_trip_over_tcp() {
    let server = Server::builder()
        .handle(&ROTATE, |q: Quad| async move { Ok(Quad { a: q.b, b: q.c, c: q.d, d: q.a }) })
        .handle(&SUM, |s: PodVec<Sample>| async move { Ok(s.iter().map(|x| x.value).sum()) })
        .handle(&RENAME, |mut d: JsonDoc| async move {
            d.title = format!("{}!", d.title);
            Ok(d)
        })
        .handle(&SHOUT, |s: ByteString| async move { Ok(ByteString::from(s.to_uppercase())) })
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();

    let q = client.call(&ROTATE, Quad { a: 1, b: 2, c: 3, d: 4 }).await.unwrap();
    assert_eq!(q, Quad { a: 2, b: 3, c: 4, d: 1 });

    for n in [0usize, 1, 1000, (1 << 20) / 24] {
        let samples: Vec<Sample> =
            (0..n).map(|i| Sample { at_ns: i as u64, value: i as f64, sensor: 1, flags: 0 }).collect();
        let sum = client.call(&SUM, PodVec::from(samples)).await.unwrap();
        assert_eq!(sum, (0..n).map(|i| i as f64).sum::<f64>(), "{n} samples");
    }

    let d = client.call(&RENAME, doc::<2>(5000)).await.unwrap();
    assert_eq!(d.title, format!("{}!", doc::<2>(5000).title));
    assert_eq!(d.body, doc::<2>(5000).body);

    assert_eq!(&*client.call(&SHOUT, ByteString::from("zéro copie")).await.unwrap(), "ZÉRO COPIE");

    // Bad payloads reach the handler's decoder, which answers BadRequest; the connection lives.
    let e = client.call(&RENAME_RAW, Bytes::from_static(b"{\"id\": 1, \"title\"")).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::BadRequest), "{e}");
    let e = client.call(&ROTATE_RAW, Bytes::from_static(&[1, 2, 3])).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::BadRequest), "{e}");
    assert_eq!(client.call(&ROTATE, Quad::default()).await.unwrap(), Quad::default());

    drop(client);
    server.shutdown().await;
}
