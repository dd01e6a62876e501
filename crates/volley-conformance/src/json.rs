//! Messages in the cases' JSON form (tests/conformance/README.md lists the fields of each
//! kind) and back, and the hex strings the cases write bytes as.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use volley::proto::{
    Code, Decoder, Extensions, FrameBuilder, ItemResult, Limits, Message, Names, TraceParent, decode_frame,
};

/// The bytes of a lower-case hex string of the cases.
///
/// # Panics
/// On a string that is not hex: the cases are data of this repository, checked by its tests.
pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex string {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// The bytes of a hex string from outside (stdin, say), or why it is not one.
pub fn unhex_checked(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{s:?} is not a string of hex digit pairs"));
    }
    Ok(unhex(s))
}

/// Lower-case hex, the cases' form of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(b: &Bytes) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

/// A decoded message in the cases' JSON form.
pub fn to_json(m: &Message) -> Value {
    let addressed = |kind: &str, id: &u64, flags: &u8, names: &Names, ext: &Extensions| {
        let (service, method) = (names.service(), names.method());
        let mut v = json!({"kind": kind, "flags": flags, "id": id, "service": service, "method": method});
        if let Some(d) = ext.deadline_micros {
            v["deadline_micros"] = json!(d);
        }
        if let Some(t) = ext.trace_parent.as_deref() {
            let mut b = vec![0u8];
            b.extend_from_slice(&t.trace_id);
            b.extend_from_slice(&t.parent_id);
            b.push(t.flags);
            v["traceparent"] = json!(hex(&b));
        }
        v
    };
    match m {
        Message::Request { id, flags, names, ext, payload } => {
            let mut v = addressed("request", id, flags, names, ext);
            v["payload"] = json!(hex(payload));
            v
        }
        Message::BatchRequest { id, flags, names, ext, items } => {
            let mut v = addressed("batch_request", id, flags, names, ext);
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
        Message::StreamOpen { id, flags, shape, credit, names, ext, payload } => {
            let mut v = addressed("stream_open", id, flags, names, ext);
            v["shape"] = json!(shape);
            v["credit"] = json!(credit);
            v["payload"] = json!(hex(payload));
            v
        }
        Message::StreamItem { id, payload } => {
            json!({"kind": "stream_item", "id": id, "payload": hex(payload)})
        }
        Message::StreamEnd { id } => json!({"kind": "stream_end", "id": id}),
        Message::StreamCredit { id, credit } => json!({"kind": "stream_credit", "id": id, "credit": credit}),
    }
}

pub fn u64_of(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} of {v}"))
}

pub fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("{field} of {v}"))
}

fn ext_of(v: &Value) -> Extensions {
    Extensions {
        deadline_micros: v.get("deadline_micros").map(|d| d.as_u64().unwrap() as u32),
        trace_parent: v
            .get("traceparent")
            .map(|t| Box::new(TraceParent::from_bytes(&unhex(t.as_str().unwrap())).unwrap())),
        ..Extensions::NONE
    }
}

/// Appends the message `v` describes to `fb`, with the builder call for its kind.
///
/// # Panics
/// On a value that is no message of the cases' form.
pub fn build(fb: &mut FrameBuilder, v: &Value) {
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
        "stream_open" => {
            let flags = (u64_of(v, "flags") as u8) & !0x02;
            let names = (str_of(v, "service"), str_of(v, "method"));
            let open = (u64_of(v, "shape") as u8, u64_of(v, "credit") as u32);
            fb.stream_open(u64_of(v, "id"), flags, &ext_of(v), names, open, |b| {
                put(&unhex(str_of(v, "payload")), b)
            })
            .unwrap()
        }
        "stream_item" => fb.stream_item(u64_of(v, "id"), |b| put(&unhex(str_of(v, "payload")), b)).unwrap(),
        "stream_end" => fb.stream_end(u64_of(v, "id")),
        "stream_credit" => fb.stream_credit(u64_of(v, "id"), u64_of(v, "credit") as u32),
        other => panic!("unknown kind {other}"),
    }
}

/// The messages of every whole frame in `bytes` (no preamble), or the first protocol error;
/// bytes after the last whole frame are an error too.
pub fn decode_all(bytes: &[u8]) -> Result<Vec<Message>, String> {
    let mut buf = BytesMut::from(bytes);
    let mut decoder = Decoder::after_preamble(Limits::default());
    let mut out = Vec::new();
    while let Some(body) = decoder.next_frame(&mut buf).map_err(|e| e.to_string())? {
        decode_frame(&body, &Limits::default(), &mut out).map_err(|e| e.to_string())?;
    }
    if !buf.is_empty() {
        return Err(format!("{} bytes after the last whole frame", buf.len()));
    }
    Ok(out)
}
