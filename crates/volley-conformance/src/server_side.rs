//! The server side of the suite: the `echo_server` cases played against a server under test.
//!
//! Each case gets a connection of its own: the runner reads the server's preamble (so it sends
//! request extensions only to a server that announced `EXTENSIONS`, PROTOCOL.md §4.4), sends
//! the client preamble (or the case's own, for the cases about a bad one) and the case's bytes,
//! half-closes (a server answers what it read, then closes: §9.6.1), reads everything until
//! the server closes, and compares the messages with the case's answers and the GoAway (or
//! none) it expects. Error and GoAway texts are informative (§6.4, §4.3, §10): only codes are
//! compared.
//!
//! Then the stream cases of [`server_streams`](crate::server_streams), against a server that
//! announced `STREAMS`.
//!
//! Last, when the runner has a way to make the server stop ([`Stop`]), one more case: a
//! graceful stop with a connection open must end it with `GoAway(ShuttingDown)` (§9.6.2).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::BytesMut;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use volley::proto::extensions::FEATURE_EXTENSIONS;
use volley::proto::{Code, Decoder, FrameBuilder, Limits, PREAMBLE, PREAMBLE_LEN};

use crate::json::{decode_all, str_of, to_json, unhex};
use crate::stream::BoxStream;
use crate::{Report, stream, wire};

/// Makes the server under test shut down gracefully (a command that signals it, say), for the
/// case that checks its `GoAway(ShuttingDown)`; it may return before the server has stopped.
pub type Stop = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send>;

/// The name of the case played with a [`Stop`].
pub const GRACEFUL_STOP: &str = "a graceful stop sends GoAway(ShuttingDown) on an open connection";

/// Plays every `echo_server` case against the server at `addr`, giving each `per_case` to
/// end (a server that neither answers nor closes fails the case, not the run). Without a way
/// to stop the server, the graceful-stop case is listed as not played.
pub async fn play(addr: &str, per_case: Duration) -> Report {
    play_and_stop(addr, per_case, None).await
}

/// [`play`], then, with `stop`, the graceful-stop case (which leaves the server stopped).
pub async fn play_and_stop(addr: &str, per_case: Duration, stop: Option<Stop>) -> Report {
    let mut report = Report::default();
    for case in wire()["echo_server"].as_array().into_iter().flatten() {
        let name = str_of(case, "name").to_string();
        match tokio::time::timeout(per_case, play_one(addr, case)).await {
            Ok(Ok(Played::Checked)) => report.cases.push((name, Ok(()))),
            Ok(Ok(Played::NotApplicable(why))) => report.not_played.push((name, why)),
            Ok(Err(e)) => report.cases.push((name, Err(e))),
            Err(_) => report
                .cases
                .push((name, Err(format!("the server did not answer and close within {per_case:?}")))),
        }
    }
    crate::server_streams::play(addr, per_case, &mut report).await;
    match stop {
        Some(stop) => {
            let result = match tokio::time::timeout(per_case, graceful_stop(addr, stop)).await {
                Ok(r) => r,
                Err(_) => Err(format!("the server did not go away and close within {per_case:?}")),
            };
            report.cases.push((GRACEFUL_STOP.to_string(), result));
        }
        None => report.not_played.push((
            GRACEFUL_STOP.to_string(),
            "the runner has no way to stop the server (volley conformance server --stop-command CMD)".into(),
        )),
    }
    report
}

enum Played {
    Checked,
    /// The case needs an optional feature the server did not announce.
    NotApplicable(String),
}

/// Connects and reads the server's preamble; returns the stream and its features byte.
async fn open(addr: &str) -> Result<(BoxStream, u8), String> {
    let mut stream = stream::connect(addr).await?;
    let mut preamble = [0u8; PREAMBLE_LEN];
    stream.read_exact(&mut preamble).await.map_err(|e| format!("reading the server's preamble: {e}"))?;
    let mut decoder = Decoder::new(Limits::default());
    decoder
        .take_preamble(&mut BytesMut::from(&preamble[..]))
        .map_err(|e| format!("the server's preamble: {e}"))?;
    Ok((stream, decoder.peer_features()))
}

/// The bytes a case sends after the preamble: `send` (hex), or `send_frame_of`: one frame of
/// `count` copies of `message` (a case about a frame too large to write out in hex).
fn bytes_to_send(case: &Value) -> Vec<u8> {
    if let Some(repeat) = case.get("send_frame_of") {
        let message = unhex(str_of(repeat, "message"));
        let count = repeat["count"].as_u64().expect("send_frame_of.count") as usize;
        let body = message.repeat(count);
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        return frame;
    }
    unhex(str_of(case, "send"))
}

async fn play_one(addr: &str, case: &Value) -> Result<Played, String> {
    let (mut stream, features) = open(addr).await?;
    if case["needs"] == "extensions" && features & FEATURE_EXTENSIONS == 0 {
        return Ok(Played::NotApplicable(
            "the server did not announce EXTENSIONS, so the runner may not send it a request extension (§4.4)"
                .into(),
        ));
    }
    let io = |e: std::io::Error| format!("i/o: {e}");
    let preamble = case.get("preamble").and_then(Value::as_str).map(unhex).unwrap_or(PREAMBLE.to_vec());
    stream.write_all(&preamble).await.map_err(io)?;
    stream.write_all(&bytes_to_send(case)).await.map_err(io)?;
    stream.shutdown().await.map_err(io)?;
    let mut received = Vec::new();
    stream.read_to_end(&mut received).await.map_err(io)?;
    let mut messages: Vec<Value> = decode_all(&received)?.iter().map(to_json).collect();
    if let Some(then) = case["then"].as_object() {
        let last = messages.pop().ok_or("no GoAway before the close")?;
        if (&last["kind"], &last["code"]) != (&json!("goaway"), &then["goaway"]) {
            return Err(format!("expected a GoAway with code {} last, got {last}", then["goaway"]));
        }
    }
    let (want, got) = (without_texts(&case["answers"]), without_texts(&Value::Array(messages)));
    if want != got {
        return Err(format!("expected {want}, got {got}"));
    }
    Ok(Played::Checked)
}

/// `messages` without the texts of errors, batch items and GoAways, which the protocol leaves
/// to each implementation (§6.4): the runner compares kinds, ids, codes and payloads.
fn without_texts(messages: &Value) -> Value {
    let mut out = messages.clone();
    for m in out.as_array_mut().into_iter().flatten() {
        if let Some(m) = m.as_object_mut() {
            m.remove("message");
            if let Some(items) = m.get_mut("items").and_then(Value::as_array_mut) {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    item.remove("message");
                }
            }
        }
    }
    out
}

/// A connection with a call answered, then a graceful stop: every message after the reply
/// must be a `GoAway(ShuttingDown)` (the last), and the server must close.
async fn graceful_stop(addr: &str, stop: Stop) -> Result<(), String> {
    let (mut stream, _) = open(addr).await?;
    let io = |e: std::io::Error| format!("i/o: {e}");
    let mut fb = FrameBuilder::new(Limits::default());
    let put = |b: &mut BytesMut| {
        b.extend_from_slice(b"hi");
        Ok::<(), std::convert::Infallible>(())
    };
    fb.request(1, 0, &volley::proto::Extensions::NONE, ("echo", "echo"), put).expect("a small request");
    let mut request = Vec::new();
    fb.take_into(&mut request);
    stream.write_all(&PREAMBLE).await.map_err(io)?;
    stream.write_all(&request.concat()).await.map_err(io)?;
    // Wait for the reply, so the connection is surely open and served when the stop comes.
    let mut received = Vec::new();
    loop {
        if let Ok(messages) = decode_all(&received)
            && !messages.is_empty()
        {
            break;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.map_err(io)?;
        if n == 0 {
            return Err("the server closed before answering the call".into());
        }
        received.extend_from_slice(&chunk[..n]);
    }
    stop().await.map_err(|e| format!("stopping the server: {e}"))?;
    stream.read_to_end(&mut received).await.map_err(io)?;
    let messages: Vec<Value> = decode_all(&received)?.iter().map(to_json).collect();
    match messages.as_slice() {
        [reply, .., last] if reply["kind"] == "reply" && reply["id"] == 1 => {
            let shutting_down = json!(Code::ShuttingDown.to_u16());
            if last["kind"] != "goaway" || last["code"] != shutting_down {
                return Err(format!("expected GoAway(ShuttingDown) before the close, got {last}"));
            }
            Ok(())
        }
        [reply] if reply["kind"] == "reply" => Err("the server closed without a GoAway".into()),
        _ => Err(format!(
            "expected the reply to call 1, then GoAway(ShuttingDown), got {}",
            Value::from(messages)
        )),
    }
}
