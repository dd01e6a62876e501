//! Deliberately wrong peers: each must fail the runner's case for its fault, and only that
//! case. The server is a small echo server written from PROTOCOL.md (not the volley server: a
//! second implementation, with texts of its own, which the runner must not compare); without a
//! fault it passes every case, the graceful stop included.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use volley::proto::extensions::FEATURE_EXTENSIONS;
use volley::proto::preamble::FEATURE_STREAMS;
use volley::proto::{
    Code, Decoder, Extensions, FrameBuilder, Limits, Message, PREAMBLE, PREAMBLE_LEN, decode_frame,
};
use volley::{Client, Method};
use volley_conformance::client_side::{CONTROL, ClientSide};
use volley_conformance::client_streams::{self, NO_STREAMS_CASE};
use volley_conformance::server_side::{self, GRACEFUL_STOP, Stop};
use volley_conformance::server_streams::{self, CANCEL_CASE, CREDIT_CASE, EMPTY_CASE, SHAPE_CASE};
use volley_conformance::{Report, driver, wire};

// Generous: a shared 2-core machine can stall a task for seconds.
const PER_CASE: Duration = Duration::from_secs(60);

/// What the echo server gets wrong (all false: nothing).
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Reads the client's 8 preamble bytes without checking them.
    unchecked_preamble: bool,
    /// Takes frames of any number of messages.
    no_message_limit: bool,
    /// Takes names that are not UTF-8 (it answers them as unknown services).
    unchecked_names: bool,
    /// Closes on a graceful stop without GoAway(ShuttingDown).
    silent_stop: bool,
    /// Announces no EXTENSIONS, and (rightly) refuses a request that carries some.
    no_extensions: bool,
    /// Refuses a client preamble whose bytes 5–7 (features, reserved) are not 0.
    strict_preamble_bytes: bool,
    /// Waits for the body of a frame of any length.
    no_frame_limit: bool,
    /// Refuses requests with reserved flag bits set.
    strict_flags: bool,
    /// Announces no STREAMS (and takes no stream message).
    no_streams: bool,
    /// Sends a stream's items whether or not it holds credit for them.
    ignores_credit: bool,
    /// Keeps a stream going after its Cancel.
    ignores_cancel: bool,
    /// Sends one item before the end of a stream of none (an off-by-one).
    empty_sends_an_item: bool,
    /// Takes a StreamOpen of a single-call method (and ends it at once).
    streams_any_method: bool,
}

/// An open `echo`/`repeat` stream: items still to send, their body, the credit held.
struct Repeat {
    left: u32,
    body: Bytes,
    credit: u64,
}

type Streams = std::collections::HashMap<u64, Repeat>;

/// Starts the echo server; returns its address and the switch that stops it gracefully.
async fn echo_server(faults: Faults) -> (String, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(connection(stream, faults, stopped.clone()));
        }
    });
    (addr, stop)
}

async fn connection(mut s: TcpStream, faults: Faults, mut stopped: watch::Receiver<bool>) {
    let mut preamble = PREAMBLE;
    preamble[5] = if faults.no_extensions { 0 } else { FEATURE_EXTENSIONS };
    if !faults.no_streams {
        preamble[5] |= FEATURE_STREAMS;
    }
    let mut streams = Streams::new();
    if s.write_all(&preamble).await.is_err() {
        return;
    }
    let max = if faults.no_message_limit { usize::MAX } else { Limits::DEFAULT_MAX_MESSAGES_PER_FRAME };
    let frame = if faults.no_frame_limit { u32::MAX as usize } else { Limits::DEFAULT_MAX_FRAME_LEN };
    let limits = Limits::default().max_messages_per_frame(max).max_frame_len(frame);
    let mut decoder =
        if faults.unchecked_preamble { Decoder::after_preamble(limits) } else { Decoder::new(limits) };
    let mut skip = if faults.unchecked_preamble { PREAMBLE_LEN } else { 0 };
    let mut buf = BytesMut::new();
    loop {
        let n = skip.min(buf.len());
        buf.advance(n);
        skip -= n;
        let mut fb = FrameBuilder::new(Limits::default());
        let verdict = serve_buffered(&mut decoder, &mut buf, &limits, faults, &mut fb, &mut streams);
        pump(&mut streams, faults, &mut fb);
        let mut out = Vec::new();
        fb.take_into(&mut out);
        if s.write_all(&out.concat()).await.is_err() {
            return;
        }
        if let Err(reason) = verdict {
            return leave(s, Code::Protocol, &reason).await;
        }
        tokio::select! {
            read = s.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = s.shutdown().await;
                    return;
                }
                Ok(_) => {}
            },
            _ = stopped.changed() => {
                if faults.silent_stop {
                    let _ = s.shutdown().await;
                    return;
                }
                return leave(s, Code::ShuttingDown, "bye").await;
            }
        }
    }
}

/// Answers every whole frame buffered; `Err` with why on a protocol error.
fn serve_buffered(
    decoder: &mut Decoder,
    buf: &mut BytesMut,
    limits: &Limits,
    faults: Faults,
    fb: &mut FrameBuilder,
    streams: &mut Streams,
) -> Result<(), String> {
    if decoder.expects_preamble() {
        if faults.strict_preamble_bytes && buf.len() >= PREAMBLE_LEN && buf[5..8] != [0, 0, 0] {
            return Err("unexpected preamble bytes".into());
        }
        decoder.take_preamble(buf).map_err(|e| e.to_string())?;
        if decoder.expects_preamble() {
            return Ok(());
        }
    }
    while let Some(body) = decoder.next_frame(buf).map_err(|e| e.to_string())? {
        let mut messages = Vec::new();
        if let Err(e) = decode_frame(&body, limits, &mut messages) {
            if faults.unchecked_names && e.to_string().contains("UTF-8") && body[0] == 0x01 {
                let id = u64::from_le_bytes(body[2..10].try_into().unwrap());
                fb.error(id, Code::UnknownService, "who?");
                continue;
            }
            return Err(e.to_string());
        }
        for m in messages {
            answer(m, faults, fb, streams)?;
        }
    }
    Ok(())
}

fn answer(m: Message, faults: Faults, fb: &mut FrameBuilder, streams: &mut Streams) -> Result<(), String> {
    let put = |p: &[u8], b: &mut BytesMut| {
        b.extend_from_slice(p);
        Ok::<(), std::convert::Infallible>(())
    };
    match m {
        Message::Request { flags, .. } | Message::BatchRequest { flags, .. }
            if faults.no_extensions && flags & 0x02 != 0 =>
        {
            return Err("extensions were not announced".into());
        }
        Message::Request { flags, .. } | Message::BatchRequest { flags, .. }
            if faults.strict_flags && flags & 0xfc != 0 =>
        {
            return Err("flags this server does not know".into());
        }
        Message::Request { id, names, payload, .. } => match unknown(names.service(), names.method()) {
            None => fb.reply(id, |b| put(&payload, b)).unwrap(),
            Some((code, text)) => fb.error(id, code, text),
        },
        Message::BatchRequest { id, names, items, .. } => match unknown(names.service(), names.method()) {
            None => fb
                .batch_reply(id, |out| {
                    for item in items.requests() {
                        out.ok(|b| put(&item, b));
                    }
                })
                .unwrap(),
            Some((code, text)) => fb.error(id, code, text),
        },
        Message::Ping { token } => fb.pong(token),
        Message::StreamOpen { .. } | Message::StreamCredit { .. } if faults.no_streams => {
            return Err("streams were not announced".into());
        }
        Message::StreamOpen { id, shape, credit, names, payload, .. } => {
            match (names.service(), names.method(), shape) {
                ("echo", "repeat", 1) if payload.len() >= 4 => {
                    let left = u32::from_le_bytes(payload[..4].try_into().unwrap());
                    let body = payload.slice(4..);
                    if left == 0 && faults.empty_sends_an_item {
                        fb.stream_item(id, |b| put(&body, b)).unwrap();
                    }
                    streams.insert(id, Repeat { left, body, credit: credit.into() });
                }
                ("echo", "repeat", _) => {
                    fb.error(id, Code::BadRequest, "repeat is a server stream of a count and a body")
                }
                ("echo", "echo", _) if faults.streams_any_method => fb.stream_end(id),
                ("echo", "echo", _) => fb.error(id, Code::BadRequest, "echo is a single call"),
                (service, method, _) => {
                    let (code, text) =
                        unknown(service, method).unwrap_or((Code::UnknownMethod, "no such stream"));
                    fb.error(id, code, text)
                }
            }
        }
        Message::StreamCredit { id, credit } => {
            if let Some(r) = streams.get_mut(&id) {
                r.credit += u64::from(credit);
            }
        }
        Message::Cancel { id } if !faults.ignores_cancel => {
            streams.remove(&id);
        }
        Message::Reply { .. } | Message::Error { .. } | Message::BatchReply { .. } => {
            return Err("replies go the other way".into());
        }
        _ => {}
    }
    Ok(())
}

/// Sends the items each stream has credit for (all it has, for a server that ignores credit,
/// a hundred more at a time), and the end of those that sent their last.
fn pump(streams: &mut Streams, faults: Faults, fb: &mut FrameBuilder) {
    streams.retain(|&id, r| {
        let mut room = if faults.ignores_credit { r.credit + 100 } else { r.credit };
        while r.left > 0 && room > 0 {
            fb.stream_item(id, |b| {
                b.extend_from_slice(&r.body);
                Ok::<(), std::convert::Infallible>(())
            })
            .unwrap();
            r.left -= 1;
            room -= 1;
            r.credit = r.credit.saturating_sub(1);
        }
        if r.left == 0 {
            fb.stream_end(id);
        }
        r.left > 0
    });
}

fn unknown(service: &str, method: &str) -> Option<(Code, &'static str)> {
    match (service, method) {
        ("echo", "echo") => None,
        ("echo", _) => Some((Code::UnknownMethod, "no such method here")),
        _ => Some((Code::UnknownService, "no such service here")),
    }
}

async fn leave(mut s: TcpStream, code: Code, reason: &str) {
    let mut fb = FrameBuilder::new(Limits::default());
    fb.go_away(code, reason);
    let mut out = Vec::new();
    fb.take_into(&mut out);
    let _ = s.write_all(&out.concat()).await;
    let _ = s.shutdown().await;
    // Read what the client still sends, so that closing cannot reset the connection before it
    // has read the GoAway.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

fn stopper(stop: watch::Sender<bool>) -> Stop {
    Box::new(move || Box::pin(async move { stop.send(true).map_err(|_| "the server is gone".to_string()) }))
}

async fn play(faults: Faults) -> Report {
    let (addr, stop) = echo_server(faults).await;
    server_side::play_and_stop(&addr, PER_CASE, Some(stopper(stop))).await
}

fn failures(report: &Report) -> Vec<&str> {
    report.cases.iter().filter(|(_, r)| r.is_err()).map(|(n, _)| n.as_str()).collect()
}

#[tokio::test]
async fn a_correct_echo_server_with_its_own_texts_passes_every_server_case() {
    let report = play(Faults::default()).await;
    assert!(report.passed() && report.not_played.is_empty(), "{}", report.render());
    assert_eq!(
        report.cases.len(),
        wire()["echo_server"].as_array().unwrap().len() + server_streams::CASES.len() + 1
    );
}

#[tokio::test]
async fn a_server_that_does_not_check_the_client_preamble_fails_those_cases() {
    let report = play(Faults { unchecked_preamble: true, ..Faults::default() }).await;
    assert_eq!(
        failures(&report),
        ["a client preamble with a bad magic", "a client preamble of version 2"],
        "{}",
        report.render()
    );
}

#[tokio::test]
async fn a_server_that_takes_frames_of_any_size_fails_the_message_limit_case() {
    let report = play(Faults { no_message_limit: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), ["a frame of 4,097 messages"], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_takes_names_that_are_not_utf8_fails_those_cases() {
    let report = play(Faults { unchecked_names: true, ..Faults::default() }).await;
    assert_eq!(
        failures(&report),
        ["a request whose service name is not UTF-8", "a request whose method name is not UTF-8"],
        "{}",
        report.render()
    );
}

#[tokio::test]
async fn a_server_that_stops_without_goaway_fails_the_graceful_stop_case() {
    let report = play(Faults { silent_stop: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), [GRACEFUL_STOP], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_refuses_unknown_feature_bits_fails_that_case() {
    let report = play(Faults { strict_preamble_bytes: true, ..Faults::default() }).await;
    assert_eq!(
        failures(&report),
        ["a client preamble with feature bits this server does not know"],
        "{}",
        report.render()
    );
}

#[tokio::test]
async fn a_server_that_waits_for_any_frame_length_fails_the_length_prefix_case() {
    let report = play(Faults { no_frame_limit: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), ["a length prefix over 16 MiB, without its body"], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_refuses_reserved_flag_bits_fails_that_case() {
    let report = play(Faults { strict_flags: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), ["a request with reserved flag bits set"], "{}", report.render());
}

#[tokio::test]
async fn a_server_without_extensions_is_sent_none_and_passes() {
    let report = play(Faults { no_extensions: true, ..Faults::default() }).await;
    assert!(report.passed(), "{}", report.render());
    let not_played: Vec<&str> = report.not_played.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(not_played, ["a request with a deadline extension"], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_ignores_stream_credit_fails_the_credit_and_cancel_cases() {
    let report = play(Faults { ignores_credit: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), [CREDIT_CASE, CANCEL_CASE], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_ignores_a_cancel_fails_the_cancel_case() {
    let report = play(Faults { ignores_cancel: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), [CANCEL_CASE], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_sends_an_item_on_an_empty_stream_fails_the_empty_case() {
    let report = play(Faults { empty_sends_an_item: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), [EMPTY_CASE], "{}", report.render());
}

#[tokio::test]
async fn a_server_that_opens_a_stream_of_a_single_call_method_fails_the_shape_case() {
    let report = play(Faults { streams_any_method: true, ..Faults::default() }).await;
    assert_eq!(failures(&report), [SHAPE_CASE], "{}", report.render());
}

/// Streams are optional: a server that does not announce them is sent none, and passes.
#[tokio::test]
async fn a_server_without_streams_is_sent_none_and_passes() {
    let report = play(Faults { no_streams: true, ..Faults::default() }).await;
    assert!(report.passed(), "{}", report.render());
    let not_played: Vec<&str> = report.not_played.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(not_played, server_streams::CASES, "{}", report.render());
}

#[tokio::test]
async fn the_runner_stops_the_rust_server_and_sees_its_goaway() {
    let server = server_streams::serve_repeat(volley::Server::builder().handle_fn(&ECHO, Ok)).build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let stop: Stop = Box::new(move || {
        Box::pin(async move {
            server.shutdown().await;
            Ok(())
        })
    });
    let report = server_side::play_and_stop(&addr, PER_CASE, Some(stop)).await;
    assert!(report.passed() && report.not_played.is_empty(), "{}", report.render());
}

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");
const NEXT: Method<Bytes, Bytes> = Method::new(CONTROL, "next");
const REPORT: Method<Bytes, Bytes> = Method::new(CONTROL, "report");
const PONG_CASE: &str = "a ping from the server is answered with a pong";
const BAD_TEXT_CASE: &str = "an error whose message is not UTF-8";

/// A client that neither answers the server's Ping nor checks what it reads: for those two
/// cases it calls over a raw socket, reads (without ponging, without decoding) until the
/// runner has nothing more to send it for a while, and reports a timeout; every other case it
/// plays with the Rust client.
#[tokio::test]
async fn a_client_that_never_answers_a_ping_or_takes_bad_text_fails_those_cases() {
    let runner = ClientSide::bind("tcp://127.0.0.1:0").await.unwrap();
    let addr = runner.address();
    let serve = tokio::spawn(runner.serve(PER_CASE * 4));
    let control = Client::connect(&addr).await.unwrap();
    loop {
        let case = control.call(&NEXT, Bytes::new()).await.unwrap();
        if case.is_empty() {
            break;
        }
        let call: serde_json::Value = serde_json::from_slice(&case).unwrap();
        let outcome = if call["name"] == PONG_CASE || call["name"] == BAD_TEXT_CASE {
            deaf_call(&addr).await
        } else {
            driver::play(&addr, &call, PER_CASE).await
        };
        let _ = control.call(&REPORT, Bytes::from(outcome.to_string())).await;
    }
    let report = serve.await.unwrap();
    assert_eq!(failures(&report), [PONG_CASE, BAD_TEXT_CASE], "{}", report.render());
    let (_, reason) = report.cases.iter().find(|(n, _)| n == PONG_CASE).unwrap();
    assert!(reason.as_ref().unwrap_err().contains("did not answer the server's Ping"), "{reason:?}");
}

async fn deaf_call(addr: &str) -> serde_json::Value {
    let mut s = TcpStream::connect(addr.strip_prefix("tcp://").unwrap()).await.unwrap();
    let mut fb = FrameBuilder::new(Limits::default());
    fb.request(1, 0, &Extensions::NONE, ("echo", "echo"), |b| {
        b.extend_from_slice(b"hi");
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    let mut out = Vec::new();
    fb.take_into(&mut out);
    s.write_all(&PREAMBLE).await.unwrap();
    s.write_all(&out.concat()).await.unwrap();
    let mut sink = [0u8; 4096];
    // The runner's preamble and Ping arrive; the reply never does, as no Pong goes back.
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), s.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
    serde_json::json!({"timeout": "no reply (the Ping was never answered)"})
}

/// A client that breaks a stream rule in four cases, each its own way, and plays every other
/// case with the Rust client: it opens a stream although the server did not announce
/// `STREAMS`; sends a client stream's items without waiting for credit; stops reading a stream
/// without a `Cancel`; lets a stream's deadline pass without a `Cancel`. It reports the
/// expected outcome each time, so only the runner's own checks can catch it.
#[tokio::test]
async fn a_client_that_breaks_the_stream_rules_fails_those_cases() {
    let broken = [
        NO_STREAMS_CASE,
        client_streams::UPLOAD_CASE,
        client_streams::CANCEL_CASE,
        client_streams::DEADLINE_CASE,
    ];
    let runner = ClientSide::bind("tcp://127.0.0.1:0").await.unwrap();
    let addr = runner.address();
    let serve = tokio::spawn(runner.serve(PER_CASE * 4));
    let control = Client::connect(&addr).await.unwrap();
    let cases = client_streams::cases();
    loop {
        let case = control.call(&NEXT, Bytes::new()).await.unwrap();
        if case.is_empty() {
            break;
        }
        let call: serde_json::Value = serde_json::from_slice(&case).unwrap();
        let outcome = match broken.iter().find(|n| call["name"] == **n) {
            Some(name) => {
                rule_breaking_stream(&addr, name).await;
                cases.iter().find(|c| c["name"] == *name).unwrap()["outcome"].clone()
            }
            None => driver::play(&addr, &call, PER_CASE).await,
        };
        let _ = control.call(&REPORT, Bytes::from(outcome.to_string())).await;
    }
    let report = serve.await.unwrap();
    let mut failed = failures(&report);
    failed.sort();
    let mut want = broken.to_vec();
    want.sort();
    assert_eq!(failed, want, "{}", report.render());
}

/// One case's stream over a raw socket, breaking the rule the case checks.
async fn rule_breaking_stream(addr: &str, case: &str) {
    let mut s = TcpStream::connect(addr.strip_prefix("tcp://").unwrap()).await.unwrap();
    let mut theirs = [0u8; PREAMBLE_LEN];
    s.read_exact(&mut theirs).await.unwrap();
    s.write_all(&PREAMBLE).await.unwrap();
    let upload = case == client_streams::UPLOAD_CASE;
    let mut fb = FrameBuilder::new(Limits::default());
    let (shape, method, payload) = if upload { (2, "gather", &b""[..]) } else { (1, "repeat", &b"go"[..]) };
    fb.stream_open(1, 0, &Extensions::NONE, ("echo", method), (shape, 16), |b| {
        b.extend_from_slice(payload);
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    if upload {
        // All three items at once, before any credit came.
        for i in 0..3 {
            fb.stream_item(1, |b| {
                b.extend_from_slice(format!("i{i}").as_bytes());
                Ok::<(), std::convert::Infallible>(())
            })
            .unwrap();
        }
        fb.stream_end(1);
    }
    let mut out = Vec::new();
    fb.take_into(&mut out);
    s.write_all(&out.concat()).await.unwrap();
    // Read what comes for a while (no Cancel, no Pong), then close.
    let mut sink = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(700), s.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}
