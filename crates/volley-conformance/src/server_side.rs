//! The server side of the suite: the `echo_server` cases played against a server under test.
//!
//! Each case gets a connection of its own: the runner sends the client preamble and the case's
//! bytes, half-closes (a server answers what it read, then closes: PROTOCOL.md §9.6.1), reads
//! everything until the server closes, and compares the messages with the case's answers
//! and the GoAway (or none) it expects.

use std::time::Duration;

use bytes::BytesMut;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use volley::proto::{Decoder, Limits, PREAMBLE};

use crate::json::{decode_all, str_of, to_json, unhex};
use crate::{Report, stream, wire};

/// Plays every `echo_server` case against the server at `addr`, giving each `per_case` to
/// end (a server that neither answers nor closes fails the case, not the run).
pub async fn play(addr: &str, per_case: Duration) -> Report {
    let mut report = Report::default();
    for case in wire()["echo_server"].as_array().into_iter().flatten() {
        let result = match tokio::time::timeout(per_case, play_one(addr, case)).await {
            Ok(r) => r,
            Err(_) => Err(format!("the server did not answer and close within {per_case:?}")),
        };
        report.cases.push((str_of(case, "name").to_string(), result));
    }
    report
}

async fn play_one(addr: &str, case: &Value) -> Result<(), String> {
    let mut stream = stream::connect(addr).await?;
    let io = |e: std::io::Error| format!("i/o: {e}");
    stream.write_all(&PREAMBLE).await.map_err(io)?;
    stream.write_all(&unhex(str_of(case, "send"))).await.map_err(io)?;
    stream.shutdown().await.map_err(io)?;
    let mut received = Vec::new();
    stream.read_to_end(&mut received).await.map_err(io)?;
    let mut buf = BytesMut::from(&received[..]);
    let mut decoder = Decoder::new(Limits::default());
    decoder.take_preamble(&mut buf).map_err(|e| format!("the server's preamble: {e}"))?;
    if decoder.expects_preamble() {
        return Err(format!("the server sent {} bytes, less than a preamble", received.len()));
    }
    let mut messages: Vec<Value> = decode_all(&buf)?.iter().map(to_json).collect();
    if let Some(then) = case["then"].as_object() {
        let last = messages.pop().ok_or("no GoAway before the close")?;
        if (&last["kind"], &last["code"]) != (&json!("goaway"), &then["goaway"]) {
            return Err(format!("expected a GoAway with code {} last, got {last}", then["goaway"]));
        }
    }
    if Value::Array(messages.clone()) != case["answers"] {
        return Err(format!("expected {}, got {}", case["answers"], Value::Array(messages)));
    }
    Ok(())
}
