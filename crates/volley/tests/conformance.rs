//! The language-neutral conformance vectors of `tests/conformance/` (their README says what
//! each file holds), checked against the Rust implementation. The Python package checks the
//! same files (`clients/python/tests/test_conformance.py`), so the two cannot drift apart:
//! frames decode to the listed messages and the listed messages encode to exactly those bytes;
//! malformed frames and preambles fail with the listed reason; the reference server reacts
//! to each exchange as listed; keys hash and route on the ring as listed.

use std::path::PathBuf;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use volley::proto::{
    Code, Decoder, Extensions, FrameBuilder, ItemResult, Limits, Message, PREAMBLE, TraceParent, decode_frame,
};
use volley::registry::{HashRing, key_hash};
use volley::{Method, Server};

fn vectors(file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex string {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(b: &Bytes) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

/// A decoded message in the vectors' JSON form.
fn to_json(m: &Message) -> Value {
    let addressed = |kind: &str, id: &u64, flags: &u8, service: &Bytes, method: &Bytes, ext: &Extensions| {
        let mut v =
            json!({"kind": kind, "flags": flags, "id": id, "service": text(service), "method": text(method)});
        if let Some(d) = ext.deadline_micros {
            v["deadline_micros"] = json!(d);
        }
        if let Some(t) = ext.trace_parent {
            let mut b = vec![0u8];
            b.extend_from_slice(&t.trace_id);
            b.extend_from_slice(&t.parent_id);
            b.push(t.flags);
            v["traceparent"] = json!(hex(&b));
        }
        v
    };
    match m {
        Message::Request { id, flags, service, method, ext, payload } => {
            let mut v = addressed("request", id, flags, service, method, ext);
            v["payload"] = json!(hex(payload));
            v
        }
        Message::BatchRequest { id, flags, service, method, ext, items } => {
            let mut v = addressed("batch_request", id, flags, service, method, ext);
            v["items"] = items.requests().map(|p| json!(hex(&p))).collect();
            v
        }
        Message::Reply { id, payload } => json!({"kind": "reply", "id": id, "payload": hex(payload)}),
        Message::Error { id, code, message } => {
            json!({"kind": "error", "id": id, "code": code.to_u16(), "message": text(message)})
        }
        Message::BatchReply { id, items } => {
            let items: Vec<Value> = items
                .replies()
                .map(|r| match r {
                    ItemResult::Ok(p) => json!({"ok": hex(&p)}),
                    ItemResult::Err { code, message } => {
                        json!({"code": code.to_u16(), "message": text(&message)})
                    }
                })
                .collect();
            json!({"kind": "batch_reply", "id": id, "items": items})
        }
        Message::Cancel { id } => json!({"kind": "cancel", "id": id}),
        Message::Ping { token } => json!({"kind": "ping", "token": token}),
        Message::Pong { token } => json!({"kind": "pong", "token": token}),
        Message::GoAway { code, message } => {
            json!({"kind": "goaway", "code": code.to_u16(), "message": text(message)})
        }
        Message::Auth { token } => json!({"kind": "auth", "token": hex(token)}),
    }
}

fn u64_of(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} of {v}"))
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("{field} of {v}"))
}

fn ext_of(v: &Value) -> Extensions {
    Extensions {
        deadline_micros: v.get("deadline_micros").map(|d| d.as_u64().unwrap() as u32),
        trace_parent: v
            .get("traceparent")
            .map(|t| TraceParent::from_bytes(&unhex(t.as_str().unwrap())).unwrap()),
    }
}

/// Appends the message `v` describes to `fb`, with the builder call for its kind.
fn build(fb: &mut FrameBuilder, v: &Value) {
    let code = |v: &Value| Code::from_u16(u64_of(v, "code") as u16);
    let put = |p: &[u8], b: &mut BytesMut| {
        b.put_slice(p);
        Ok::<(), std::convert::Infallible>(())
    };
    match str_of(v, "kind") {
        kind @ ("request" | "batch_request") => {
            // The flag 0x02 (extensions) is the builder's to set: it follows from `ext`.
            let flags = (u64_of(v, "flags") as u8) & !0x02;
            let names = (str_of(v, "service"), str_of(v, "method"));
            let (id, ext) = (u64_of(v, "id"), ext_of(v));
            if kind == "request" {
                fb.request(id, flags, &ext, names, |b| put(&unhex(str_of(v, "payload")), b)).unwrap();
            } else {
                let items: Vec<Vec<u8>> =
                    v["items"].as_array().unwrap().iter().map(|i| unhex(i.as_str().unwrap())).collect();
                fb.batch_request(id, flags, &ext, names, &items, |p, b| put(p, b)).unwrap();
            }
        }
        "reply" => fb.reply(u64_of(v, "id"), |b| put(&unhex(str_of(v, "payload")), b)).unwrap(),
        "error" => fb.error(u64_of(v, "id"), code(v), str_of(v, "message")),
        "batch_reply" => fb
            .batch_reply(u64_of(v, "id"), |out| {
                for item in v["items"].as_array().unwrap() {
                    match item.get("ok") {
                        Some(p) => out.ok(|b| put(&unhex(p.as_str().unwrap()), b)),
                        None => out.err(code(item), str_of(item, "message")),
                    }
                }
            })
            .unwrap(),
        "cancel" => fb.cancel(u64_of(v, "id")),
        "ping" => fb.ping(u64_of(v, "token")),
        "pong" => fb.pong(u64_of(v, "token")),
        "goaway" => fb.go_away(code(v), str_of(v, "message")),
        "auth" => fb.auth(&unhex(str_of(v, "token"))),
        other => panic!("unknown kind {other}"),
    }
}

/// The messages of every frame in `bytes` (no preamble), or the first protocol error.
fn decode_all(bytes: &[u8]) -> Result<Vec<Message>, String> {
    let mut buf = BytesMut::from(bytes);
    let mut decoder = Decoder::after_preamble(Limits::default());
    let mut out = Vec::new();
    while let Some(body) = decoder.next_frame(&mut buf).map_err(|e| e.to_string())? {
        decode_frame(&body, &Limits::default(), &mut out).map_err(|e| e.to_string())?;
    }
    assert!(buf.is_empty(), "{} bytes after the last whole frame", buf.len());
    Ok(out)
}

#[test]
fn frames_decode_to_their_messages_and_messages_encode_to_their_frames() {
    let cases = vectors("wire.json");
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
    let cases = vectors("wire.json");
    for case in cases["reject"].as_array().unwrap() {
        let name = str_of(case, "name");
        let err = decode_all(&unhex(str_of(case, "frame"))).expect_err(name);
        assert!(err.starts_with(str_of(case, "error")), "{name}: {err}");
    }
}

#[test]
fn preambles_give_their_features_or_their_error() {
    let cases = vectors("wire.json");
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
    let v = vectors("routing.json");
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

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

#[tokio::test]
async fn the_reference_server_reacts_to_each_exchange_as_listed() {
    let server = Server::builder().handle_fn(&ECHO, Ok).build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let addr = bound.trim_start_matches("tcp://").to_string();
    let cases = vectors("wire.json");
    for case in cases["echo_server"].as_array().unwrap() {
        let name = str_of(case, "name");
        // Send, half-close (the server answers what it read, then closes: §9.6.1), read all.
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(&PREAMBLE).await.unwrap();
        stream.write_all(&unhex(str_of(case, "send"))).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut received = Vec::new();
        stream.read_to_end(&mut received).await.unwrap();
        let mut buf = BytesMut::from(&received[..]);
        let mut decoder = Decoder::new(Limits::default());
        decoder.take_preamble(&mut buf).unwrap_or_else(|e| panic!("{name}: the server's preamble: {e}"));
        assert!(!decoder.expects_preamble(), "{name}: no preamble from the server");
        let mut messages: Vec<Value> =
            decode_all(&buf).unwrap_or_else(|e| panic!("{name}: {e}")).iter().map(to_json).collect();
        match &case["then"] {
            Value::String(open) if open == "open" => {}
            then => {
                let last = messages.pop().unwrap_or_else(|| panic!("{name}: no go-away"));
                assert_eq!((&last["kind"], &last["code"]), (&json!("goaway"), &then["goaway"]), "{name}");
            }
        }
        assert_eq!(&Value::Array(messages), &case["answers"], "{name}");
    }
    server.shutdown().await;
}
