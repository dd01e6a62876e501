//! The server side's stream cases (PROTOCOL.md §9.9), played only against a server whose
//! preamble announced `STREAMS` and that serves the server stream `echo`/`repeat` (a server
//! may take streams without serving that method: the cases are then listed as not played).
//!
//! `echo`/`repeat` (shape 1): the request is a count (4 bytes, little-endian) and a body; the
//! items are `count` copies of the body, then `StreamEnd`. [`serve_repeat`] adds it to a Rust
//! server.
//!
//! Unlike the `echo_server` cases, these keep the connection open while they play (a server
//! ends a half-closed client's streams, §9.9 *Closing*) and read message by message. What a
//! correct server must not send (an item beyond the credit, an item after a `Cancel`) is
//! checked up to the answer of a call sent after the step: a server reads a connection's
//! messages in order, so by then it has read the step, and a server that ignores credit or a
//! cancel sends the items it has at once.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use volley::proto::message::shape;
use volley::proto::preamble::FEATURE_STREAMS;
use volley::proto::{
    Code, Decoder, Extensions, FrameBuilder, Limits, Message, PREAMBLE, PREAMBLE_LEN, decode_frame,
};
use volley::{ServerBuilder, Status, StreamMethod};

use crate::Report;
use crate::stream::{self, BoxStream};

/// The server stream the cases open.
pub const REPEAT: StreamMethod<Bytes, Bytes> = StreamMethod::new("echo", "repeat");

/// Adds `echo`/`repeat` to `builder`.
pub fn serve_repeat(builder: ServerBuilder) -> ServerBuilder {
    builder.handle_stream(&REPEAT, |req: Bytes| async move {
        let Some((count, _)) = req.split_first_chunk::<4>() else {
            return Err(Status::new(Code::BadRequest, "expected a 4-byte count, then the body"));
        };
        let (count, body) = (u32::from_le_bytes(*count), req.slice(4..));
        Ok(futures_util::stream::repeat(body).take(count as usize).map(Ok))
    })
}

/// The request of `echo`/`repeat`: `count` copies of `body`.
pub fn repeat_request(count: u32, body: &[u8]) -> Vec<u8> {
    let mut r = count.to_le_bytes().to_vec();
    r.extend_from_slice(body);
    r
}

pub const CREDIT_CASE: &str =
    "a server stream sends no item beyond its credit, the rest as credit comes, then StreamEnd";
pub const EMPTY_CASE: &str = "an empty server stream ends with StreamEnd";
pub const CANCEL_CASE: &str = "a cancelled server stream sends no item after the Cancel";
pub const SHAPE_CASE: &str = "a StreamOpen of a single-call method is answered Error(BadRequest)";

/// The stream cases, in the order played.
pub const CASES: [&str; 4] = [CREDIT_CASE, EMPTY_CASE, CANCEL_CASE, SHAPE_CASE];

/// Plays the stream cases against the server at `addr` into `report`, each within `per_case`.
pub async fn play(addr: &str, per_case: Duration, report: &mut Report) {
    for name in CASES {
        let case = async {
            let mut c = match Conn::open(addr).await? {
                Some(c) => c,
                None => {
                    return Ok(Played::NotApplicable("the server did not announce STREAMS (§4.4)".into()));
                }
            };
            match name {
                CREDIT_CASE => credit(&mut c).await,
                EMPTY_CASE => empty(&mut c).await,
                CANCEL_CASE => cancel(&mut c).await,
                _ => wrong_shape(&mut c).await,
            }
        };
        let name = name.to_string();
        match tokio::time::timeout(per_case, case).await {
            Ok(Ok(Played::Checked)) => report.cases.push((name, Ok(()))),
            Ok(Ok(Played::NotApplicable(why))) => report.not_played.push((name, why)),
            Ok(Err(e)) => report.cases.push((name, Err(e))),
            Err(_) => report.cases.push((name, Err(format!("the case did not end within {per_case:?}")))),
        }
    }
}

enum Played {
    Checked,
    NotApplicable(String),
}

/// A connection to the server under test, read message by message.
struct Conn {
    stream: BoxStream,
    decoder: Decoder,
    buf: BytesMut,
    ready: std::collections::VecDeque<Message>,
    /// The next id for a call.
    next_call: u64,
}

impl Conn {
    /// Connects and exchanges preambles; `None` if the server did not announce `STREAMS`.
    async fn open(addr: &str) -> Result<Option<Conn>, String> {
        let mut stream = stream::connect(addr).await?;
        let mut preamble = [0u8; PREAMBLE_LEN];
        stream.read_exact(&mut preamble).await.map_err(|e| format!("reading the server's preamble: {e}"))?;
        let mut decoder = Decoder::new(Limits::default());
        decoder
            .take_preamble(&mut BytesMut::from(&preamble[..]))
            .map_err(|e| format!("the server's preamble: {e}"))?;
        if decoder.peer_features() & FEATURE_STREAMS == 0 {
            return Ok(None);
        }
        stream.write_all(&PREAMBLE).await.map_err(|e| format!("i/o: {e}"))?;
        let ready = Default::default();
        Ok(Some(Conn { stream, decoder, buf: BytesMut::new(), ready, next_call: 100 }))
    }

    async fn send(&mut self, build: impl FnOnce(&mut FrameBuilder)) -> Result<(), String> {
        let mut fb = FrameBuilder::new(Limits::default());
        build(&mut fb);
        let mut out = Vec::new();
        fb.take_into(&mut out);
        self.stream.write_all(&out.concat()).await.map_err(|e| format!("i/o: {e}"))
    }

    /// The next message from the server.
    async fn recv(&mut self) -> Result<Message, String> {
        loop {
            if let Some(m) = self.ready.pop_front() {
                match m {
                    Message::GoAway { .. } => return Err(format!("the server went away: {}", describe(&m))),
                    // Every Ping is answered (§6.1): a server may ping a client whose stream
                    // it holds back, to learn whether it is still there.
                    Message::Ping { token } => self.send(|fb| fb.pong(token)).await?,
                    m => return Ok(m),
                }
                continue;
            }
            while let Some(body) = self.decoder.next_frame(&mut self.buf).map_err(|e| e.to_string())? {
                let mut messages = Vec::new();
                decode_frame(&body, &Limits::default(), &mut messages).map_err(|e| e.to_string())?;
                self.ready.extend(messages);
            }
            if !self.ready.is_empty() {
                continue;
            }
            let n = self.stream.read_buf(&mut self.buf).await.map_err(|e| format!("i/o: {e}"))?;
            if n == 0 {
                return Err("the server closed the connection".into());
            }
        }
    }

    /// Opens `echo`/`repeat` as stream `id` with `credit`, for `count` copies of `body`.
    async fn open_repeat(&mut self, id: u64, credit: u32, count: u32, body: &[u8]) -> Result<(), String> {
        let req = repeat_request(count, body);
        self.send(|fb| {
            fb.stream_open(
                id,
                0,
                &Extensions::NONE,
                (REPEAT.service(), REPEAT.name()),
                (shape::SERVER, credit),
                |b| {
                    b.extend_from_slice(&req);
                    Ok::<(), std::convert::Infallible>(())
                },
            )
            .expect("a small open");
        })
        .await
    }

    /// Sends an `echo`/`echo` call and reads up to its reply: the messages of stream `id`
    /// that came before it (the call's id is the connection's next).
    async fn round_trip(
        &mut self,
        id: u64,
        first: impl FnOnce(&mut FrameBuilder),
    ) -> Result<Vec<Message>, String> {
        let call = self.next_call;
        self.next_call += 1;
        self.send(|fb| {
            first(fb);
            fb.request(call, 0, &Extensions::NONE, ("echo", "echo"), |b| {
                b.extend_from_slice(b"sync");
                Ok::<(), std::convert::Infallible>(())
            })
            .expect("a small request");
        })
        .await?;
        let mut of_stream = Vec::new();
        loop {
            match self.recv().await? {
                Message::Reply { id: r, .. } | Message::Error { id: r, .. } if r == call => {
                    return Ok(of_stream);
                }
                m if stream_id(&m) == Some(id) => of_stream.push(m),
                _ => {}
            }
        }
    }

    /// The messages of stream `id` up to and including its end (`StreamEnd` or `Error`).
    async fn until_end(&mut self, id: u64) -> Result<Vec<Message>, String> {
        let mut got = Vec::new();
        loop {
            let m = self.recv().await?;
            if stream_id(&m) != Some(id) {
                continue;
            }
            let end = matches!(m, Message::StreamEnd { .. } | Message::Error { .. });
            got.push(m);
            if end {
                return Ok(got);
            }
        }
    }

    /// Reads `n` items of stream `id` with payload `body`; fails on anything else of it.
    async fn items(&mut self, id: u64, n: usize, body: &[u8]) -> Result<(), String> {
        for i in 0..n {
            loop {
                let m = self.recv().await?;
                match m {
                    Message::StreamItem { id: s, payload } if s == id => {
                        if payload != body {
                            return Err(format!("item {i} is {payload:?}, expected {body:?}"));
                        }
                        break;
                    }
                    m if stream_id(&m) == Some(id) => {
                        return Err(format!("expected item {i}, got {}", describe(&m)));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// The stream a message from the server belongs to (an `Error` may be a call's or a stream's).
fn stream_id(m: &Message) -> Option<u64> {
    match m {
        Message::StreamItem { id, .. } | Message::StreamEnd { id } | Message::Error { id, .. } => Some(*id),
        _ => None,
    }
}

fn describe(m: &Message) -> String {
    crate::json::to_json(m).to_string()
}

/// An open answered `UnknownService`/`UnknownMethod`: the server takes streams but does not
/// serve the method the cases need.
fn not_served(m: &[Message]) -> Option<Played> {
    match m.first() {
        Some(Message::Error { code, .. }) if matches!(*code, Code::UnknownService | Code::UnknownMethod) => {
            Some(Played::NotApplicable("the server does not serve the stream echo/repeat".into()))
        }
        _ => None,
    }
}

async fn credit(c: &mut Conn) -> Result<Played, String> {
    c.open_repeat(1, 2, 5, b"ab").await?;
    let first = c.round_trip(1, |_| {}).await?;
    if let Some(p) = not_served(&first) {
        return Ok(p);
    }
    // The two items the credit allows may still be on their way; a third may not come.
    let items = first.iter().filter(|m| matches!(m, Message::StreamItem { .. })).count();
    if items > 2 || first.iter().any(|m| !matches!(m, Message::StreamItem { .. })) {
        return Err(format!(
            "with credit 2 the server sent {}",
            first.iter().map(describe).collect::<Vec<_>>().join(", ")
        ));
    }
    c.items(1, 2 - items, b"ab").await?;
    let more = c.round_trip(1, |_| {}).await?;
    if !more.is_empty() {
        return Err(format!("an item beyond the credit of 2: {}", describe(&more[0])));
    }
    // One more than the items left: a server may need credit to poll its producer and so
    // learn that it has ended (the reference server does), and the spec leaves that open.
    c.send(|fb| fb.stream_credit(1, 4)).await?;
    let rest = c.until_end(1).await?;
    let want = ["item", "item", "item", "end"];
    let got: Vec<&str> = rest
        .iter()
        .map(|m| match m {
            Message::StreamItem { payload, .. } if payload == &b"ab"[..] => "item",
            Message::StreamEnd { .. } => "end",
            _ => "other",
        })
        .collect();
    if got != want {
        return Err(format!(
            "after credit 4, expected the 3 items left, then StreamEnd, got {}",
            rest.iter().map(describe).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(Played::Checked)
}

async fn empty(c: &mut Conn) -> Result<Played, String> {
    c.open_repeat(1, 4, 0, b"x").await?;
    let got = c.until_end(1).await?;
    if let Some(p) = not_served(&got) {
        return Ok(p);
    }
    match got.as_slice() {
        [Message::StreamEnd { .. }] => Ok(Played::Checked),
        _ => Err(format!(
            "expected StreamEnd alone, got {}",
            got.iter().map(describe).collect::<Vec<_>>().join(", ")
        )),
    }
}

async fn cancel(c: &mut Conn) -> Result<Played, String> {
    c.open_repeat(1, 3, 1_000_000, b"c").await?;
    let first = c.round_trip(1, |_| {}).await?;
    if let Some(p) = not_served(&first) {
        return Ok(p);
    }
    let early = first.iter().filter(|m| matches!(m, Message::StreamItem { .. })).count();
    if early > 3 {
        return Err(format!("with credit 3 the server sent {early} items"));
    }
    c.items(1, 3 - early, b"c").await?;
    // Cancel, then credit that a server which forgot the stream ignores (§9.9, *Unknown ids*).
    let after = c
        .round_trip(1, |fb| {
            fb.cancel(1);
            fb.stream_credit(1, 100);
        })
        .await?;
    let later = c.round_trip(1, |_| {}).await?;
    // It MAY answer Error(Cancelled); no item may come.
    if let Some(item) = after.iter().chain(&later).find(|m| matches!(m, Message::StreamItem { .. })) {
        return Err(format!("an item after the Cancel: {}", describe(item)));
    }
    Ok(Played::Checked)
}

async fn wrong_shape(c: &mut Conn) -> Result<Played, String> {
    c.send(|fb| {
        fb.stream_open(1, 0, &Extensions::NONE, ("echo", "echo"), (shape::SERVER, 4), |b| {
            b.extend_from_slice(b"hi");
            Ok::<(), std::convert::Infallible>(())
        })
        .expect("a small open");
    })
    .await?;
    let got = c.until_end(1).await?;
    match got.as_slice() {
        [Message::Error { code: Code::BadRequest, .. }] => Ok(Played::Checked),
        _ => Err(format!(
            "expected Error(BadRequest), got {}",
            got.iter().map(describe).collect::<Vec<_>>().join(", ")
        )),
    }
}
