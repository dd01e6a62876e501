//! The client side's stream cases (PROTOCOL.md §9.9): what a client must do on a stream, played
//! by the runner as the server against a client under test through its driver
//! ([`client_side`](crate::client_side) says how a driver and the runner talk).
//!
//! Unlike the `client` cases of wire.json, whose answers are fixed bytes, these talk: the
//! runner reads the client's open, credit, items and `Cancel` as they come and answers them.
//! Each case is a call for the driver (JSON, handed out by `next` like any case), the outcome
//! the driver must report, and a script that plays the server's side on the case's connection
//! and checks what the client sent. A case passes when both hold.
//!
//! The call of a stream case has `stream`: `"server"` (shape 1: open with `payload`, read
//! the items), `"client"` (shape 2: send the items of `send`, then the end; one reply) or
//! `"both"` (shape 3: send `send` while reading the items), and optionally `window` (the
//! credit the client grants, in items), `take` (read that many items, then stop reading: the
//! stream is dropped), `timeout_ms` (a deadline over the whole stream) and `then_call` (after
//! the stream, a single call `{service, method, payload}` on the same client). The driver
//! reports, for shapes 1 and 3, `{"items": [{"ok": hex}, ...], "end": E}` with `E` one of
//! `"ok"` (the server's `StreamEnd`), `{"code": n}`, `{"timeout": text}`, `{"failed": text}`
//! or `"dropped"` (after `take`); for shape 2 the one result as for a call; and with
//! `then_call` also `"then"`: that call's result.
//!
//! What the spec leaves free is not asked: how much credit a client grants and when (only that
//! a reader that reads on grants more), whether it sends the deadline to the server, the
//! credit field of a client stream's open. Where a check is that the client does *not* send
//! something (an item beyond its credit), the runner waits a short quiet time: a slow machine
//! can only make it miss a violation, never find one that is not there.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use volley::proto::message::shape;
use volley::proto::preamble::{FEATURE_STREAMS, preamble};
use volley::proto::{Code, Decoder, FrameBuilder, Limits, Message, PREAMBLE, decode_frame};

use crate::json::hex;
use crate::stream::BoxStream;

/// How long the runner listens for an item a correct client does not send.
const QUIET: Duration = Duration::from_millis(150);

pub const NO_STREAMS_CASE: &str = "a client opens no stream toward a server that did not announce STREAMS";
pub const CREDIT_CASE: &str =
    "a server stream longer than the client's window completes: the client grants more credit as it reads";
pub const UNKNOWN_IDS_CASE: &str =
    "stream messages for ids that are not open, and a StreamOpen from the server, are ignored";
pub const ERROR_CASE: &str = "an Error mid-stream ends the stream with its status, after the items before it";
pub const CLOSED_CASE: &str = "a connection that ends mid-stream ends the stream with a failure, not a hang";
pub const CANCEL_CASE: &str =
    "a reader that stops sends Cancel, and what the server sent after it does not disturb the connection";
pub const DEADLINE_CASE: &str =
    "a stream past its deadline ends with a time-out, and the client sends Cancel";
pub const UPLOAD_CASE: &str =
    "a client stream waits for credit, sends no item beyond it, then StreamEnd; the Reply ends it";
pub const UPLOAD_ERROR_CASE: &str =
    "a client stream answered with an Error before its end ends with that status";
pub const BOTH_CASE: &str = "a both-way stream sends under the server's credit and reads its items in order";

/// The items the cases send, one byte each (`"i0"`.. as hex is `6930`..).
fn item(i: usize) -> Bytes {
    Bytes::from(format!("i{i}"))
}

fn items_json(n: usize) -> Vec<Value> {
    (0..n).map(|i| json!({"ok": hex(&item(i))})).collect()
}

fn server_call(extra: Value) -> Value {
    let mut call = json!({"stream": "server", "service": "echo", "method": "repeat", "payload": hex(b"go")});
    if let (Some(call), Value::Object(extra)) = (call.as_object_mut(), extra) {
        call.extend(extra);
    }
    call
}

/// The stream cases as the runner hands them out: `name`, `call`, `outcome`, and
/// `"stream_case": true`.
pub fn cases() -> Vec<Value> {
    let sends: Vec<String> = (0..3).map(|i| hex(&item(i))).collect();
    let cases = [
        (NO_STREAMS_CASE, server_call(json!({})), json!({"items": [], "end": {"failed": true}})),
        (CREDIT_CASE, server_call(json!({"window": 4})), json!({"items": items_json(10), "end": "ok"})),
        (UNKNOWN_IDS_CASE, server_call(json!({})), json!({"items": items_json(2), "end": "ok"})),
        (ERROR_CASE, server_call(json!({})), json!({"items": items_json(2), "end": {"code": 4}})),
        (CLOSED_CASE, server_call(json!({})), json!({"items": items_json(1), "end": {"failed": true}})),
        (
            CANCEL_CASE,
            server_call(
                json!({"take": 2, "then_call": {"service": "echo", "method": "echo", "payload": hex(b"hi")}}),
            ),
            json!({"items": items_json(2), "end": "dropped", "then": {"ok": hex(b"hi")}}),
        ),
        (
            DEADLINE_CASE,
            server_call(json!({"timeout_ms": 300})),
            json!({"items": items_json(1), "end": {"timeout": true}}),
        ),
        (
            UPLOAD_CASE,
            json!({"stream": "client", "service": "echo", "method": "gather", "send": sends}),
            json!({"ok": hex(b"done")}),
        ),
        (
            UPLOAD_ERROR_CASE,
            json!({"stream": "client", "service": "echo", "method": "gather", "send": sends}),
            json!({"code": 4}),
        ),
        (
            BOTH_CASE,
            json!({"stream": "both", "service": "echo", "method": "each", "send": sends, "window": 2}),
            json!({"items": items_json(3), "end": "ok"}),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, call, outcome)| json!({"name": name, "call": call, "outcome": outcome, "stream_case": true}))
        .collect()
}

/// Whether a driver's report of a stream case is the expected one: items exactly, an end or
/// result with `failed` or `timeout` by its kind (the text is the client's own), the rest
/// exactly.
pub fn outcome_matches(want: &Value, got: &Value) -> bool {
    match want {
        Value::Object(w) if w.contains_key("failed") => got.get("failed").is_some(),
        Value::Object(w) if w.contains_key("timeout") => got.get("timeout").is_some(),
        Value::Object(w) => {
            let Value::Object(g) = got else { return false };
            w.len() == g.len() && w.iter().all(|(k, v)| g.get(k).is_some_and(|gv| outcome_matches(v, gv)))
        }
        Value::Array(w) => {
            let Value::Array(g) = got else { return false };
            w.len() == g.len() && w.iter().zip(g).all(|(w, g)| outcome_matches(w, g))
        }
        _ => want == got,
    }
}

/// Plays the server's side of case `name` on a connection the client under test opened for
/// it; `Err` with what the client did wrong.
pub async fn play(name: &str, stream: BoxStream) -> Result<(), String> {
    let features = if name == NO_STREAMS_CASE { 0 } else { FEATURE_STREAMS };
    let mut c = Peer::new(stream, features).await?;
    match name {
        NO_STREAMS_CASE => no_streams(&mut c).await,
        CREDIT_CASE => credit(&mut c).await,
        UNKNOWN_IDS_CASE => unknown_ids(&mut c).await,
        ERROR_CASE => error(&mut c).await,
        CLOSED_CASE => closed(c).await,
        CANCEL_CASE => cancel(&mut c).await,
        DEADLINE_CASE => deadline(&mut c).await,
        UPLOAD_CASE => upload(&mut c, false).await,
        UPLOAD_ERROR_CASE => upload(&mut c, true).await,
        BOTH_CASE => both(&mut c).await,
        _ => Err(format!("no script for the case {name:?}")),
    }
}

/// The runner's end of a case's connection, read message by message.
struct Peer {
    stream: BoxStream,
    decoder: Decoder,
    buf: BytesMut,
    ready: std::collections::VecDeque<Message>,
}

impl Peer {
    async fn new(mut stream: BoxStream, features: u8) -> Result<Peer, String> {
        let hello = if features == 0 { PREAMBLE } else { preamble(features) };
        stream.write_all(&hello).await.map_err(|e| format!("i/o: {e}"))?;
        let ready = Default::default();
        Ok(Peer { stream, decoder: Decoder::new(Limits::default()), buf: BytesMut::new(), ready })
    }

    async fn send(&mut self, build: impl FnOnce(&mut FrameBuilder)) -> Result<(), String> {
        let mut fb = FrameBuilder::new(Limits::default());
        build(&mut fb);
        let mut out = Vec::new();
        fb.take_into(&mut out);
        self.stream.write_all(&out.concat()).await.map_err(|e| format!("i/o: {e}"))
    }

    /// The next message from the client (its preamble taken; Pings answered, Pongs dropped);
    /// `None` once it closed the connection.
    async fn recv(&mut self) -> Result<Option<Message>, String> {
        loop {
            if let Some(m) = self.ready.pop_front() {
                match m {
                    Message::Ping { token } => self.send(|fb| fb.pong(token)).await?,
                    Message::Pong { .. } => {}
                    m => return Ok(Some(m)),
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
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(_) => {}
            }
        }
    }

    /// The next message, failing if the client closed first.
    async fn expect(&mut self, what: &str) -> Result<Message, String> {
        self.recv().await?.ok_or_else(|| format!("the client closed the connection; expected {what}"))
    }

    /// A message that arrives within [`QUIET`], if any (reading is cancel-safe: what was read
    /// stays in the buffer).
    async fn within_quiet(&mut self) -> Result<Option<Message>, String> {
        match tokio::time::timeout(QUIET, self.recv()).await {
            Ok(m) => m,
            Err(_) => Ok(None),
        }
    }

    /// The client's `StreamOpen`: its id, shape, credit and payload.
    async fn open(&mut self, want_shape: u8) -> Result<(u64, u32, Bytes), String> {
        match self.expect("a StreamOpen").await? {
            Message::StreamOpen { id, shape, credit, payload, .. } => {
                if shape != want_shape {
                    return Err(format!("a StreamOpen of shape {shape}, the call is of shape {want_shape}"));
                }
                if shape != shape::SERVER && !payload.is_empty() {
                    return Err(format!(
                        "a StreamOpen of shape {shape} with a payload ({} bytes; §6.12: empty)",
                        payload.len()
                    ));
                }
                Ok((id, credit, payload))
            }
            m => Err(format!("expected a StreamOpen, got {}", describe(&m))),
        }
    }

    async fn items(&mut self, id: u64, from: usize, to: usize) -> Result<(), String> {
        let mut fb_items = Vec::new();
        for i in from..to {
            fb_items.push(item(i));
        }
        self.send(|fb| {
            for it in fb_items {
                fb.stream_item(id, |b| {
                    b.extend_from_slice(&it);
                    Ok::<(), std::convert::Infallible>(())
                })
                .expect("a small item");
            }
        })
        .await
    }
}

fn describe(m: &Message) -> String {
    crate::json::to_json(m).to_string()
}

async fn no_streams(c: &mut Peer) -> Result<(), String> {
    // Whatever the client does (fail at once, or close), no StreamOpen may come.
    while let Some(m) = c.recv().await? {
        if matches!(m, Message::StreamOpen { .. }) {
            return Err(format!("a StreamOpen toward a server without STREAMS (§9.9): {}", describe(&m)));
        }
    }
    Ok(())
}

/// Sends items `0..n` of stream `id`, never beyond the credit the client granted (`credit` at
/// the open, then its `StreamCredit`s), then `StreamEnd`; fails on any other message of it.
async fn serve_items(c: &mut Peer, id: u64, mut credit: u64, n: usize) -> Result<(), String> {
    let mut sent = 0;
    while sent < n {
        if credit == 0 {
            match c.expect("a StreamCredit").await? {
                Message::StreamCredit { id: s, credit: more } if s == id => credit += u64::from(more),
                m => {
                    return Err(format!(
                        "after {sent} items, with the credit spent, expected a StreamCredit, got {}",
                        describe(&m)
                    ));
                }
            }
            continue;
        }
        let now = (credit as usize).min(n - sent);
        c.items(id, sent, sent + now).await?;
        sent += now;
        credit -= now as u64;
    }
    c.send(|fb| fb.stream_end(id)).await
}

async fn credit(c: &mut Peer) -> Result<(), String> {
    let (id, credit, _) = c.open(shape::SERVER).await?;
    serve_items(c, id, credit.into(), 10).await
}

async fn unknown_ids(c: &mut Peer) -> Result<(), String> {
    let (id, credit, _) = c.open(shape::SERVER).await?;
    if credit < 2 {
        return Err(format!("the open granted {credit} items: this case needs 2"));
    }
    let other = id.wrapping_add(1_000);
    c.send(|fb| {
        fb.stream_item(other, |b| {
            b.extend_from_slice(b"stray");
            Ok::<(), std::convert::Infallible>(())
        })
        .expect("a small item");
        fb.stream_credit(other, 5);
        fb.stream_end(other);
        fb.stream_open(
            other + 1,
            0,
            &volley::proto::Extensions::NONE,
            ("echo", "repeat"),
            (shape::SERVER, 4),
            |b| {
                b.extend_from_slice(b"go");
                Ok::<(), std::convert::Infallible>(())
            },
        )
        .expect("a small open");
        fb.error(other + 2, Code::Application, "not a stream of this client");
    })
    .await?;
    c.items(id, 0, 2).await?;
    c.send(|fb| fb.stream_end(id)).await?;
    // Nothing more is asked of the client; reading on until it closes answers its Pings.
    while c.recv().await?.is_some() {}
    Ok(())
}

async fn error(c: &mut Peer) -> Result<(), String> {
    let (id, credit, _) = c.open(shape::SERVER).await?;
    if credit < 2 {
        return Err(format!("the open granted {credit} items: this case needs 2"));
    }
    c.items(id, 0, 2).await?;
    c.send(|fb| fb.error(id, Code::Application, "the producer failed")).await?;
    while c.recv().await?.is_some() {}
    Ok(())
}

async fn closed(mut c: Peer) -> Result<(), String> {
    let (id, _, _) = c.open(shape::SERVER).await?;
    c.items(id, 0, 1).await?;
    // Gone without a word: no StreamEnd, no GoAway.
    drop(c);
    Ok(())
}

async fn cancel(c: &mut Peer) -> Result<(), String> {
    let (id, credit, _) = c.open(shape::SERVER).await?;
    if credit < 2 {
        return Err(format!("the open granted {credit} items: this case needs 2"));
    }
    c.items(id, 0, 2).await?;
    let (mut cancelled, mut answered) = (false, false);
    while !(cancelled && answered) {
        match c.recv().await? {
            None if !cancelled => {
                return Err(
                    "the client closed the connection without a Cancel for the stream it stopped reading"
                        .into(),
                );
            }
            None => return Err("the client closed the connection before the call after the stream".into()),
            Some(Message::Cancel { id: s }) if s == id => {
                cancelled = true;
                // What crossed the Cancel: items in flight, and the Error(Cancelled) a server
                // MAY send. The client drops them.
                let spent = credit.saturating_sub(2).min(2) as usize;
                c.items(id, 2, 2 + spent).await?;
                c.send(|fb| fb.error(id, Code::Cancelled, "cancelled")).await?;
            }
            Some(Message::StreamCredit { id: s, .. }) if s == id => {}
            Some(Message::Request { id: call, payload, .. }) => {
                c.send(|fb| fb.reply_bytes(call, payload).expect("a small reply")).await?;
                answered = true;
            }
            Some(m) => return Err(format!("expected a Cancel of stream {id}, got {}", describe(&m))),
        }
    }
    Ok(())
}

async fn deadline(c: &mut Peer) -> Result<(), String> {
    let (id, _, _) = c.open(shape::SERVER).await?;
    c.items(id, 0, 1).await?;
    // The server never ends it: the client's own deadline must.
    loop {
        match c.recv().await? {
            None => {
                return Err(
                    "the client closed the connection without a Cancel for the stream past its deadline"
                        .into(),
                );
            }
            Some(Message::Cancel { id: s }) if s == id => return Ok(()),
            Some(Message::StreamCredit { id: s, .. }) if s == id => {}
            Some(m) => return Err(format!("expected a Cancel of stream {id}, got {}", describe(&m))),
        }
    }
}

/// Reads the client's items of stream `id`: `Ok(Some(item))`, `Ok(None)` at its `StreamEnd`.
async fn next_item(c: &mut Peer, id: u64, what: &str) -> Result<Option<Bytes>, String> {
    loop {
        match c.expect(what).await? {
            Message::StreamItem { id: s, payload } if s == id => return Ok(Some(payload)),
            Message::StreamEnd { id: s } if s == id => return Ok(None),
            Message::StreamCredit { id: s, .. } if s == id => {}
            m => return Err(format!("expected {what}, got {}", describe(&m))),
        }
    }
}

/// No item of stream `id` within the quiet time (a credit of it is fine).
async fn quiet(c: &mut Peer, id: u64, why: &str) -> Result<(), String> {
    while let Some(m) = c.within_quiet().await? {
        match m {
            Message::StreamCredit { id: s, .. } if s == id => {}
            Message::StreamItem { id: s, .. } if s == id => {
                return Err(format!("an item {why} (§9.9: not beyond the credit granted)"));
            }
            m => return Err(format!("{why}, the client sent {}", describe(&m))),
        }
    }
    Ok(())
}

async fn upload(c: &mut Peer, fail_early: bool) -> Result<(), String> {
    let (id, _, _) = c.open(shape::CLIENT).await?;
    quiet(c, id, "before the server granted any credit").await?;
    if fail_early {
        c.send(|fb| fb.stream_credit(id, 10)).await?;
        match next_item(c, id, "the first item").await? {
            Some(got) if got == item(0) => {}
            other => return Err(format!("expected the first item {:?}, got {other:?}", item(0))),
        }
        c.send(|fb| fb.error(id, Code::Application, "refused after one item")).await?;
        // The client may still send what it had under credit, its StreamEnd or a Cancel.
        while c.recv().await?.is_some() {}
        return Ok(());
    }
    c.send(|fb| fb.stream_credit(id, 2)).await?;
    for i in 0..2 {
        match next_item(c, id, "an item").await? {
            Some(got) if got == item(i) => {}
            other => return Err(format!("expected item {:?}, got {other:?}", item(i))),
        }
    }
    quiet(c, id, "beyond the credit of 2").await?;
    c.send(|fb| fb.stream_credit(id, 5)).await?;
    match next_item(c, id, "the third item").await? {
        Some(got) if got == item(2) => {}
        other => return Err(format!("expected item {:?}, got {other:?}", item(2))),
    }
    if let Some(more) = next_item(c, id, "the StreamEnd after the last item").await? {
        return Err(format!("an item after the last one: {more:?}"));
    }
    c.send(|fb| fb.reply_bytes(id, Bytes::from_static(b"done")).expect("a small reply")).await?;
    while c.recv().await?.is_some() {}
    Ok(())
}

async fn both(c: &mut Peer) -> Result<(), String> {
    let (id, credit, _) = c.open(shape::BOTH).await?;
    let mut credit = u64::from(credit);
    quiet(c, id, "before the server granted any credit").await?;
    for i in 0..3 {
        // One item of credit at a time: the client must wait for each.
        c.send(|fb| fb.stream_credit(id, 1)).await?;
        let got = loop {
            match c.expect("an item").await? {
                Message::StreamItem { id: s, payload } if s == id => break payload,
                Message::StreamCredit { id: s, credit: more } if s == id => credit += u64::from(more),
                m => return Err(format!("expected item {:?}, got {}", item(i), describe(&m))),
            }
        };
        if got != item(i) {
            return Err(format!("expected item {:?}, got {got:?}", item(i)));
        }
        if i == 0 {
            quiet(c, id, "beyond the credit of 1").await?;
        }
        while credit == 0 {
            match c.expect("a StreamCredit").await? {
                Message::StreamCredit { id: s, credit: more } if s == id => credit += u64::from(more),
                m => {
                    return Err(format!(
                        "with the client's credit spent, expected a StreamCredit, got {}",
                        describe(&m)
                    ));
                }
            }
        }
        c.send(|fb| {
            fb.stream_item(id, |b| {
                b.extend_from_slice(&got);
                Ok::<(), std::convert::Infallible>(())
            })
            .expect("a small item")
        })
        .await?;
        credit -= 1;
    }
    loop {
        match c.expect("the client's StreamEnd").await? {
            Message::StreamEnd { id: s } if s == id => break,
            Message::StreamCredit { id: s, .. } if s == id => {}
            m => {
                return Err(format!(
                    "expected the client's StreamEnd after its 3 items, got {}",
                    describe(&m)
                ));
            }
        }
    }
    c.send(|fb| fb.stream_end(id)).await?;
    while c.recv().await?.is_some() {}
    Ok(())
}
