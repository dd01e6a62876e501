//! The client side of the suite: the runner listens and plays the server's side of the
//! `client` cases against a client under test.
//!
//! A client cannot be told from outside what to call, so the client under test runs a small
//! *driver* (this crate's [`driver`](crate::driver) for Rust, `python -m volley.conformance`
//! for Python) that uses the client itself to ask the runner. On one connection it calls
//! `conformance`/`next` (raw bytes), which answers the next case's call as JSON (empty when
//! none is left); it makes that call with a fresh client (so a fresh connection); the runner
//! checks the request it receives and answers as the case says (replies, errors, a GoAway, a
//! close or bad bytes); the driver then reports how the call ended with
//! `conformance`/`report`, and the runner compares that with the case's `outcome`.
//! tests/conformance/README.md has the case format and the driver's JSON.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use volley::proto::{Code, Decoder, FrameBuilder, Limits, Message, decode_frame};

use crate::client_streams;
use crate::json::{build, str_of, to_json, unhex};
use crate::stream::{BoxStream, Listener};
use crate::{Report, wire};

/// The service name of the driver's calls to the runner.
pub const CONTROL: &str = "conformance";

// The runner announces no features (PREAMBLE), so a client must send it no extensions.
use volley::proto::PREAMBLE;

/// Where the cases stand, shared by the runner's connections.
#[derive(Default)]
struct State {
    cases: Vec<Value>,
    next: usize,
    /// The case handed out last, and whether its call arrived.
    current: Option<(usize, bool)>,
    /// Whether the client answered the current case's Ping (a case with `after_pong`).
    ponged: bool,
    results: Vec<Option<Result<(), String>>>,
    /// A stream case's own check of what the client sent (client_streams), once played.
    checks: Vec<Option<Result<(), String>>>,
}

/// A bound runner, waiting for a driver.
pub struct ClientSide {
    listener: Listener,
}

impl ClientSide {
    /// Listens at `addr` (`tcp://HOST:PORT`, port 0 for any, or `unix:///PATH`).
    pub async fn bind(addr: &str) -> Result<ClientSide, String> {
        Ok(ClientSide { listener: Listener::bind(addr).await? })
    }

    /// The address a driver connects to.
    pub fn address(&self) -> String {
        self.listener.address()
    }

    /// Serves drivers until one has asked past the last case, or `timeout` passed; cases no
    /// driver reported fail.
    pub async fn serve(self, timeout: Duration) -> Report {
        let mut cases: Vec<Value> = wire()["client"].as_array().cloned().unwrap_or_default();
        cases.extend(client_streams::cases());
        let (results, checks) = (vec![None; cases.len()], vec![None; cases.len()]);
        let state = Arc::new(Mutex::new(State { cases, results, checks, ..State::default() }));
        let done = Arc::new(Notify::new());
        let accept = async {
            while let Ok(stream) = self.listener.accept().await {
                let (state, done) = (state.clone(), done.clone());
                tokio::spawn(async move {
                    // A connection that breaks the protocol ends; the case it was playing fails
                    // through its driver's report, so the error itself needs no other home.
                    let _ = connection(stream, &state, &done).await;
                });
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = done.notified() => {}
            _ = tokio::time::sleep(timeout) => {}
        }
        // A stream case's script may still be reading the client's last messages (its Cancel,
        // its close) after the driver reported: wait for the scripts of the reported cases.
        let waiting = |s: &State| {
            (0..s.cases.len())
                .any(|i| s.results[i].is_some() && stream_case(&s.cases[i]) && s.checks[i].is_none())
        };
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while waiting(&state.lock().expect("state")) && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let state = state.lock().expect("state");
        let cases = state.cases.iter().enumerate().map(|(i, case)| {
            let reported =
                state.results[i].clone().unwrap_or_else(|| Err(format!("no report within {timeout:?}")));
            let result = match (&state.checks[i], stream_case(case)) {
                (_, false) => reported,
                (Some(Err(e)), true) => Err(e.clone()),
                (Some(Ok(())), true) => reported,
                (None, true) => reported.and(Err("the runner's side of the case did not end".into())),
            };
            (str_of(case, "name").to_string(), result)
        });
        Report { cases: cases.collect(), ..Report::default() }
    }
}

fn stream_case(case: &Value) -> bool {
    case["stream_case"] == true
}

/// One connection: control calls and case calls, until the peer closes or a case closes it;
/// a stream case's connection is played by its script.
async fn connection(mut stream: BoxStream, state: &Mutex<State>, done: &Notify) -> Result<(), String> {
    let streaming = {
        let mut state = state.lock().expect("state");
        match state.current {
            Some((i, _)) if stream_case(&state.cases[i]) => {
                state.current = Some((i, true));
                Some((i, str_of(&state.cases[i], "name").to_string()))
            }
            _ => None,
        }
    };
    if let Some((i, name)) = streaming {
        let checked = tokio::time::timeout(Duration::from_secs(60), client_streams::play(&name, stream))
            .await
            .unwrap_or_else(|_| Err("the case's connection did not end within 60 s".into()));
        state.lock().expect("state").checks[i] = Some(checked);
        return Ok(());
    }
    let io = |e: std::io::Error| e.to_string();
    stream.write_all(&PREAMBLE).await.map_err(io)?;
    let (limits, mut buf) = (Limits::default(), BytesMut::new());
    let mut decoder = Decoder::new(limits);
    // A case's Ping waiting for its Pong, and the answers that follow it.
    let mut awaiting_pong: Option<(u64, Vec<u8>)> = None;
    loop {
        while let Some(body) = decoder.next_frame(&mut buf).map_err(|e| e.to_string())? {
            let mut messages = Vec::new();
            decode_frame(&body, &limits, &mut messages).map_err(|e| e.to_string())?;
            for m in &messages {
                if let (Message::Pong { token }, Some((want, _))) = (m, &awaiting_pong)
                    && token == want
                {
                    state.lock().expect("state").ponged = true;
                    let (_, after) = awaiting_pong.take().expect("awaited");
                    stream.write_all(&after).await.map_err(io)?;
                    continue;
                }
                let answer = answer(m, state, done);
                stream.write_all(&answer.bytes).await.map_err(io)?;
                if answer.after_pong.is_some() {
                    awaiting_pong = answer.after_pong;
                }
                if answer.close {
                    return stream.shutdown().await.map_err(io);
                }
            }
        }
        if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
            return Ok(());
        }
    }
}

/// The bytes that answer one message, and whether the connection closes after them.
struct Answer {
    bytes: Vec<u8>,
    close: bool,
    /// A Ping's token, and the bytes to send once the client has answered it with a Pong.
    after_pong: Option<(u64, Vec<u8>)>,
}

fn answer(m: &Message, state: &Mutex<State>, done: &Notify) -> Answer {
    let mut fb = FrameBuilder::new(Limits::default());
    let (mut before, mut raw, mut close, mut after_pong) = (Vec::new(), Vec::new(), false, None);
    match m {
        Message::Ping { token } => fb.pong(*token),
        Message::Request { id, names, payload, .. } if names.service() == CONTROL => {
            let mut state = state.lock().expect("state");
            let result = match names.method().as_bytes() {
                b"next" => Ok(next(&mut state, done)),
                b"report" => report(&mut state, payload),
                _ => Err((Code::UnknownMethod, "the runner has the methods next and report".to_string())),
            };
            match result {
                Ok(reply) => fb.reply_bytes(*id, reply).expect("a small reply"),
                Err((code, message)) => fb.error(*id, code, &message),
            }
        }
        Message::Request { id, .. } | Message::BatchRequest { id, .. } => {
            let mut state = state.lock().expect("state");
            match play_case(&mut state, m, *id, &mut fb) {
                Ok(case) => {
                    let bytes =
                        |field| case.get(field).and_then(Value::as_str).map(unhex).unwrap_or_default();
                    (before, raw) = (bytes("before"), bytes("raw"));
                    close = case["then"] == "close";
                    if let Some(after) = case.get("after_pong") {
                        let mut later = FrameBuilder::new(Limits::default());
                        for answer in after["answers"].as_array().into_iter().flatten() {
                            build(&mut later, &with_id(answer, *id));
                        }
                        let mut segments = Vec::new();
                        later.take_into(&mut segments);
                        after_pong =
                            Some((after["token"].as_u64().expect("after_pong.token"), segments.concat()));
                    }
                }
                Err(e) => fb.error(*id, Code::BadRequest, &e),
            }
        }
        _ => {}
    }
    let mut segments = Vec::new();
    fb.take_into(&mut segments);
    let bytes = [before, segments.concat(), raw].concat();
    Answer { bytes, close, after_pong }
}

/// The next case's call for the driver (empty when none is left: the run is over).
fn next(state: &mut State, done: &Notify) -> Bytes {
    if let Some((i, _)) = state.current.take() {
        state.results[i].get_or_insert(Err("the driver asked for the next case without reporting".into()));
    }
    let Some(case) = state.cases.get(state.next) else {
        done.notify_one();
        return Bytes::new();
    };
    state.current = Some((state.next, false));
    state.ponged = false;
    state.next += 1;
    let mut call = case["call"].clone();
    call["name"] = case["name"].clone();
    Bytes::from(call.to_string())
}

/// Compares the driver's report with the current case's outcome.
fn report(state: &mut State, payload: &Bytes) -> Result<Bytes, (Code, String)> {
    let got: Value = serde_json::from_slice(payload)
        .map_err(|e| (Code::BadRequest, format!("a report is a JSON object: {e}")))?;
    let Some((i, called)) = state.current.take() else {
        return Err((Code::BadRequest, "a report with no case handed out".into()));
    };
    let want = &state.cases[i]["outcome"];
    let matches =
        if stream_case(&state.cases[i]) { client_streams::outcome_matches } else { outcome_matches };
    let result = if !called {
        Err(format!("reported {got} without making the call"))
    } else if state.cases[i].get("after_pong").is_some() && !state.ponged {
        Err(format!("the client did not answer the server's Ping with a Pong (§9.5); it reported {got}"))
    } else if matches(want, &got) {
        Ok(())
    } else {
        Err(format!("expected the outcome {want}, the driver reported {got}"))
    };
    state.results[i] = Some(result.clone());
    result.map(|()| Bytes::new()).map_err(|e| (Code::Application, e))
}

/// Whether a reported outcome is the expected one: `failed` matches any failure (its text is
/// the client's own), `items` item by item, the rest exactly.
fn outcome_matches(want: &Value, got: &Value) -> bool {
    if want.get("failed").is_some() {
        return got.get("failed").is_some();
    }
    match (want.get("items"), got.get("items")) {
        (Some(Value::Array(w)), Some(Value::Array(g))) => {
            w.len() == g.len() && w.iter().zip(g).all(|(w, g)| outcome_matches(w, g))
        }
        _ => want == got,
    }
}

/// Checks a case's call against the current case and appends the case's answers (with the
/// call's id where they say `"call"`); returns the case.
fn play_case<'a>(
    state: &'a mut State,
    m: &Message,
    id: u64,
    fb: &mut FrameBuilder,
) -> Result<&'a Value, String> {
    let (i, called) = state.current.as_mut().ok_or("a call before the driver asked for a case")?;
    *called = true;
    let case = &state.cases[*i];
    let got = to_json(m);
    let flags = got["flags"].as_u64().unwrap_or(0);
    if flags & 0x02 != 0 {
        return Err("request extensions sent to a server that did not announce them (§4.4)".into());
    }
    if flags & 0xfc != 0 {
        return Err(format!("reserved request flag bits set (flags {flags:#04x}; §6.2.1: sent as 0)"));
    }
    let want = &case["call"];
    let kind = if want.get("items").is_some() { "batch_request" } else { "request" };
    let fields = ["service", "method", "payload", "items"];
    let same =
        got["kind"] == kind && fields.iter().all(|f| want.get(f).is_none() || want.get(f) == got.get(f));
    if !same {
        return Err(format!("expected the call {want}, got {got}"));
    }
    for answer in case["answers"].as_array().into_iter().flatten() {
        build(fb, &with_id(answer, id));
    }
    Ok(case)
}

/// An answer of a case, with the call's id where it says `"call"`.
fn with_id(answer: &Value, id: u64) -> Value {
    let mut answer = answer.clone();
    if answer["id"] == "call" {
        answer["id"] = json!(id);
    }
    answer
}
