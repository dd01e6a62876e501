//! The language-neutral cases of `tests/conformance/` checked against the Rust implementation
//! directly: frames decode to the listed messages and the listed messages encode to exactly
//! those bytes; malformed frames and preambles fail with the listed reason; keys hash and
//! route on the ring as listed. (tests/runners.rs plays the socket cases.) The Python package
//! checks the same files, so the two cannot drift apart.

use bytes::BytesMut;
use serde_json::Value;
use volley::balance::{HashRing, key_hash};
use volley::proto::{Decoder, FrameBuilder, Limits};
use volley_conformance::json::{build, decode_all, hex, str_of, to_json, u64_of, unhex};
use volley_conformance::{routing, wire};

#[test]
fn frames_decode_to_their_messages_and_messages_encode_to_their_frames() {
    let cases = wire();
    let cases = cases["decode"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let name = str_of(case, "name");
        let bytes = unhex(str_of(case, "frame"));
        let decoded: Vec<Value> =
            decode_all(&bytes).unwrap_or_else(|e| panic!("{name}: {e}")).iter().map(to_json).collect();
        assert_eq!(&Value::Array(decoded), &case["messages"], "{name}: decoded");

        let mut fb = FrameBuilder::new(Limits::default());
        for m in case["messages"].as_array().unwrap() {
            build(&mut fb, m);
        }
        let mut segments = Vec::new();
        fb.take_into(&mut segments);
        assert_eq!(hex(&segments.concat()), str_of(case, "frame"), "{name}: encoded");
    }
}

#[test]
fn malformed_frames_fail_with_their_reason() {
    let cases = wire();
    for case in cases["reject"].as_array().unwrap() {
        let name = str_of(case, "name");
        let err = decode_all(&unhex(str_of(case, "frame"))).expect_err(name);
        assert!(err.starts_with(str_of(case, "error")), "{name}: {err}");
    }
}

#[test]
fn preambles_give_their_features_or_their_error() {
    let cases = wire();
    for case in cases["preambles"].as_array().unwrap() {
        let name = str_of(case, "name");
        let mut buf = BytesMut::from(&unhex(str_of(case, "bytes"))[..]);
        let mut decoder = Decoder::new(Limits::default());
        match (decoder.next_frame(&mut buf), case.get("error")) {
            (Ok(None), None) => {
                assert_eq!(u64::from(decoder.peer_features()), u64_of(case, "features"), "{name}")
            }
            (Err(e), Some(want)) => assert!(e.to_string().starts_with(want.as_str().unwrap()), "{name}: {e}"),
            (got, _) => panic!("{name}: {got:?}"),
        }
    }
}

#[test]
fn keys_hash_and_route_on_the_ring_as_listed() {
    let v = routing();
    for case in v["stable_hash"].as_array().unwrap() {
        let got = format!("{:016x}", key_hash(&unhex(str_of(case, "canonical"))));
        assert_eq!(got, str_of(case, "hash"), "{case}");
    }
    let nodes: Vec<(String, u32)> = v["ring"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n[0].as_str().unwrap().to_string(), n[1].as_u64().unwrap() as u32))
        .collect();
    let ring = HashRing::new(nodes.iter().map(|(a, w)| (a.as_str(), *w)));
    for pick in v["ring"]["picks"].as_array().unwrap() {
        let h = key_hash(&unhex(str_of(pick, "key")));
        assert_eq!(format!("{h:016x}"), str_of(pick, "hash"));
        let node = ring.node(h).unwrap();
        assert_eq!(node as u64, u64_of(pick, "node"), "{pick}");
        assert_eq!(
            ring.node_skipping(h, |i| i == node).unwrap() as u64,
            u64_of(pick, "node_without_it"),
            "{pick}"
        );
    }
}
