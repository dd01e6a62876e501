//! One unix or tcp connection of a client: a writer task draining the outbox, a reader task
//! completing waiters, and the call path between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;

use super::clock;
use super::fingerprint::{Sent, Source};
use super::flow::{FlowControl, FlowLimits, InFlightBytes};
use super::pending::{Inserted, Outcome, Pending, Reply, Waiter, waiter};
use super::stream_table::{Event as StreamEvent, Registered, Streams};
use crate::codec::Wire;
use crate::error::{Error, Status};
use crate::liveness::{Action, Keepalive, Liveness};
use crate::method::Method;
use crate::metrics::stats::Counters;
use crate::proto::encode::{BuildError, FrameBuilder, ZERO_COPY_MIN};
use crate::proto::extensions::{FEATURE_EXTENSIONS, FEATURE_FINGERPRINTS};
use crate::proto::message::as_str;
use crate::proto::preamble::FEATURE_STREAMS;
use crate::proto::{Code, Extensions, ItemResult, Limits, Message, TraceParent};
use crate::transport::outbox::{Outbox, lifo_runtime};
use crate::transport::reader::{FrameReader, ReadError};
use crate::transport::stream::ByteStream;
use tokio::time::Instant;

pub(crate) struct StreamConn {
    /// Cancelled when the connection fails: stops the keepalive task (and the reader while it
    /// waits for the preamble).
    dead: tokio_util::sync::CancellationToken,
    /// The read loop's task while it waits for bytes, woken when the connection fails
    /// elsewhere (`ended` set). Polling the token's wait each time the reader parked cost
    /// ~140 instructions more per lone call's round trip (its waiter list sits behind a lock)
    /// than this compare-and-swap and load (scripts/callcost.py, tcp-1).
    reader: AtomicWaker,
    /// Read turns so far (the keepalive task compares it between its ticks).
    reads: AtomicU64,
    outbox: Outbox,
    pending: Pending,
    alive: AtomicBool,
    /// Why the connection ended (the first failure), for calls that find it closed: a server
    /// that refused the token must read as `Unauthenticated`, not as a closed connection.
    ended: std::sync::OnceLock<Error>,
    counters: Arc<Counters>,
    peer: String,
    sweeper: Sweeper,
    flow: FlowControl,
    /// Whether the server's preamble said it accepts request extensions (its time budget, its
    /// trace context).
    peer_extensions: AtomicBool,
    /// Whether the server's preamble was read: until then a request that has extensions to send
    /// waits (on `preamble_event`), since it may not carry them unannounced (§4.4) and would
    /// otherwise go without. A flag beside the event, because the event's own check takes a lock.
    preamble_read: AtomicBool,
    preamble_event: tokio_util::sync::CancellationToken,
    /// Whether requests carry their time budget (when the server accepts extensions).
    wants_deadlines: bool,
    /// Whether the server's preamble said it accepts streams.
    peer_streams: AtomicBool,
    /// Whether the server's preamble said it checks schema fingerprints, and the methods whose
    /// fingerprints this connection sent it.
    peer_fingerprints: AtomicBool,
    fingerprints_sent: Sent,
    /// The streams open on this connection.
    streams: Streams,
    /// Whether calls write bundles early (see `send_and_wait`): only where the writer task
    /// cannot run beside them, on a current-thread runtime.
    early_bundles: bool,
    /// The frame limits, to read back the requests of frames never sent.
    limits: Limits,
}

/// The server's `DeadlineExceeded` for a request that carried this call's budget is this call's
/// timeout, seen first by the server: the caller gets the same error whichever side noticed
/// first.
fn timed_out(e: Error, sent_budget: bool, timeout: Duration) -> Error {
    match e {
        Error::Remote(s) if s.code == Code::DeadlineExceeded && sent_budget => Error::Timeout(timeout),
        e => e,
    }
}

/// Settings of a new connection (from [`ClientConfig`](super::ClientConfig)).
#[derive(Debug, Clone)]
pub(crate) struct ConnOptions {
    pub limits: Limits,
    pub flow: FlowLimits,
    pub token: Option<Vec<u8>>,
    pub keepalive: Option<Keepalive>,
    pub send_deadlines: bool,
    /// How long the server's preamble may take: it is sent on accept, so a server that sends
    /// none (a frozen process, whose kernel still accepts) fails the connection after this.
    pub preamble_within: Duration,
}

/// What the read loop keeps from one turn to the next.
#[derive(Default)]
struct Turn {
    /// The messages of the turn being read.
    batch: Vec<Message>,
    /// Waiters and their outcomes, completed outside the pending table's lock.
    done: Vec<(Waiter, Outcome)>,
    /// The reason the server gave before closing, if it did. Calls still pending then were
    /// never started by the server: it answers everything it started before saying goodbye.
    go_away: Option<String>,
    /// The server refused this client (its go-away said `Unauthenticated`).
    refused: bool,
    /// The server is shutting down (its go-away said `ShuttingDown`): it answered every request
    /// it handed to a handler, so what is still unanswered never ran.
    leaving: bool,
    /// The turn's messages for streams, handed over together.
    stream_events: Vec<(u64, StreamEvent)>,
}

/// Deadlines without a timer per call: each waiter's deadline sits in the pending table, and
/// one sweeper task per connection sleeps until the earliest one. Callers wake the sweeper
/// only when they bring an earlier deadline than the one it sleeps towards (the table decides,
/// under its lock) — under a steady load with one default timeout, about once per timeout
/// period.
///
/// Hand-written because a tokio timer per call (register, deregister, a clock read each) cost
/// about 15% of the client's CPU time in the echo benchmark.
///
/// Deadlines use the coarse monotonic clock (about 14 ns a read on the development machines,
/// against 60–80 ns for `std::time::Instant` where the clock source is a virtual machine's
/// TSC). It ticks every 1–4 ms, but lags the precise clock
/// whenever the kernel's tick is late: under heavy CPU steal it lagged by up to 65 ms, and a
/// deadline taken at such a moment fires that much early in real time.
#[derive(Default)]
struct Sweeper {
    wake: Notify,
}

impl StreamConn {
    /// Starts the reader and writer tasks of a freshly connected stream.
    pub fn start<S: ByteStream>(stream: S, opts: ConnOptions, counters: Arc<Counters>) -> Arc<StreamConn> {
        let (limits, flow, preamble_within) = (opts.limits, opts.flow, opts.preamble_within);
        let peer = stream.peer();
        let (rd, wr) = stream.into_halves();
        let outbox = Outbox::new(limits);
        if let Some(token) = &opts.token {
            // The first message of the connection (the server reads nothing before it).
            let _ = outbox.push(|fb| fb.auth(token));
        }
        let conn = Arc::new(StreamConn {
            dead: Default::default(),
            reader: AtomicWaker::new(),
            reads: AtomicU64::new(0),
            outbox,
            pending: Pending::default(),
            alive: AtomicBool::new(true),
            ended: std::sync::OnceLock::new(),
            counters,
            peer,
            sweeper: Sweeper::default(),
            flow: FlowControl::new(flow),
            peer_extensions: AtomicBool::new(false),
            preamble_read: AtomicBool::new(false),
            preamble_event: Default::default(),
            wants_deadlines: opts.send_deadlines,
            peer_streams: AtomicBool::new(false),
            peer_fingerprints: AtomicBool::new(false),
            fingerprints_sent: Sent::default(),
            streams: Streams::default(),
            early_bundles: !lifo_runtime(),
            limits,
        });
        let c = conn.clone();
        tokio::spawn(async move {
            if let Err(e) = c.outbox.write_loop(wr, &c.counters, true).await {
                c.fail(Error::io("write failed", e));
            }
        });
        let c = conn.clone();
        tokio::spawn(async move { c.read_loop(FrameReader::new(rd, limits), preamble_within).await });
        let c = conn.clone();
        tokio::spawn(async move { c.sweep_loop().await });
        if let Some(k) = opts.keepalive {
            let c = conn.clone();
            tokio::spawn(async move { c.keepalive_loop(k).await });
        }
        conn
    }

    /// Pings when nothing arrived for `k.interval` (for `k.busy` while calls are pending); fails
    /// the connection (and with it every pending call, once, with a connection error that a
    /// `ServiceClient` fails idempotent calls over on) when nothing arrives within `k.timeout`
    /// after the ping.
    async fn keepalive_loop(self: Arc<Self>, k: Keepalive) {
        let mut live = Liveness::new(k, Instant::now().into_std());
        loop {
            tokio::select! {
                _ = self.dead.cancelled() => return,
                () = tokio::time::sleep_until(Instant::from_std(live.deadline())) => {}
            }
            let reads = self.reads.load(Ordering::Relaxed);
            let busy = self.pending.len() > 0 || !self.streams.is_empty();
            match live.poll_busy(Instant::now().into_std(), reads, busy) {
                Action::Wait => {}
                Action::Ping => {
                    if self.outbox.push(|fb| fb.ping(reads)).is_err() {
                        return;
                    }
                }
                Action::Dead => {
                    tracing::warn!(peer = %self.peer, "connection dead: no answer to a keepalive ping");
                    self.fail(Error::Connection(format!(
                        "{}: no answer to a keepalive ping within {:?}",
                        self.peer,
                        live.timeout()
                    )));
                    return;
                }
            }
        }
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Completes when the connection has failed or closed.
    pub async fn closed(&self) {
        self.dead.cancelled().await
    }

    /// Closes the connection from this side: queued requests are still written, then the
    /// write side is shut down; replies still arrive until the server closes its side.
    pub fn close(&self) {
        self.outbox.close();
    }

    fn fail(&self, err: Error) {
        let _ = self.ended.set(err.clone());
        self.dead.cancel();
        self.reader.wake();
        self.alive.store(false, Ordering::Relaxed);
        // What no write was handed yet never left this process: those calls never ran, and a
        // `ServiceClient` sends them elsewhere whatever their method. What was handed to the
        // socket may have reached the server: those get `err`.
        let unsent = self.outbox.close_and_take_unsent();
        if matches!(err, Error::Connection(_)) {
            let never_sent = never_sent(err.clone());
            self.pending.fail_ids(request_ids(unsent, self.limits), &never_sent);
        }
        self.pending.fail_all(err.clone());
        self.streams.fail_all(&err);
        self.sweeper.wake.notify_one();
    }

    /// Times out waiters whose deadline passed, and tells the server (cancel) about them.
    async fn sweep_loop(self: Arc<Self>) {
        let mut expired = Vec::new();
        while self.is_alive() {
            // Tokio's clock, not the machine's, so a paused or simulated clock sees a sweep
            // take no time and the gap stays the same from run to run.
            let started = Instant::now();
            let now = clock::now();
            let next = self.pending.expire(now, &mut expired);
            if !expired.is_empty() {
                let _ = self.outbox.push(|fb| expired.drain(..).for_each(|id| fb.cancel(id)));
            }
            // Rescanning a huge table often would cost more than the calls: keep sweeps under
            // about 5% of the time, and at least 1 ms apart. Wall time also counts the time this
            // thread was preempted or its vCPU stolen, so the gap is capped: uncapped, a sweep
            // of 200 entries stalled for 45 ms would hold the next one back for 900 ms (CI saw
            // deadlines fire up to 900 ms late).
            let min_gap = (started.elapsed() * 20).clamp(Duration::from_millis(1), MAX_SWEEP_GAP);
            let sleep = next.map(|d| Duration::from(d.duration_since(now)).max(min_gap));
            tokio::select! {
                _ = self.sweeper.wake.notified() => tokio::time::sleep(min_gap).await,
                _ = tokio::time::sleep(sleep.unwrap_or(Duration::MAX)), if sleep.is_some() => {}
            }
        }
    }

    async fn read_loop<R: crate::transport::stream::ReadHalf>(
        self: Arc<Self>,
        mut reader: FrameReader<R>,
        preamble_within: Duration,
    ) {
        let mut read = tokio::select! {
            r = self.read_preamble(&mut reader, preamble_within) => match r {
                Some(r) => r,
                None => return,
            },
            () = self.failed_elsewhere() => return,
        };
        let mut turn = Turn::default();
        let err = loop {
            self.reads.fetch_add(1, Ordering::Relaxed);
            if let Some(err) = self.ended(read, &turn) {
                break err;
            }
            self.deliver(&mut turn);
            read = tokio::select! {
                // The read first: the failure is looked at only when there is nothing to read.
                biased;
                r = reader.read_batch(&mut turn.batch, usize::MAX, &self.counters) => r,
                // Failed elsewhere (keepalive, writer): `fail` already ended every call.
                () = self.failed_elsewhere() => return,
            };
        };
        self.fail(err);
    }

    /// Completes once the connection has failed (`fail` sets `ended`, then wakes `reader`).
    fn failed_elsewhere(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            self.reader.register(cx.waker());
            if self.ended.get().is_some() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
        })
    }

    /// Reads the server's preamble on its own, before any frame: calls that have extensions to
    /// send wait for it (`features`), and must not also wait for the server's first frame. It
    /// reads as an empty turn: a closed or broken stream ends the read loop. Without a bound
    /// here, a call waiting for it (and the keepalive, which counts only calls sent) would wait
    /// out the call's whole timeout on a server that accepted and never answers; `None` when
    /// that bound passed (the connection has failed).
    async fn read_preamble<R: crate::transport::stream::ReadHalf>(
        &self,
        reader: &mut FrameReader<R>,
        within: Duration,
    ) -> Option<Result<bool, ReadError>> {
        let Ok(read) = tokio::time::timeout(within, reader.preamble()).await else {
            let why = format!("{}: no preamble from the server within {within:?}", self.peer);
            tracing::warn!(peer = %self.peer, "connection dead: the server sent no preamble");
            self.fail(Error::Connection(why));
            return None;
        };
        self.peer_extensions.store(reader.peer_features() & FEATURE_EXTENSIONS != 0, Ordering::Relaxed);
        self.peer_streams.store(reader.peer_features() & FEATURE_STREAMS != 0, Ordering::Relaxed);
        self.peer_fingerprints.store(reader.peer_features() & FEATURE_FINGERPRINTS != 0, Ordering::Relaxed);
        self.preamble_read.store(true, Ordering::Release);
        self.preamble_event.cancel();
        Some(read)
    }

    /// The error that ends the connection after `read`, if it ended it (the stream closed or
    /// broke, or the server broke the protocol).
    fn ended(&self, read: Result<bool, ReadError>, turn: &Turn) -> Option<Error> {
        Some(match read {
            Ok(true) => return None,
            Ok(false) if turn.refused => {
                let why = turn.go_away.as_deref().unwrap_or("refused");
                Error::Unauthenticated(format!("{}: {why}", self.peer))
            }
            Ok(false) if turn.leaving => {
                let why = turn.go_away.as_deref().unwrap_or("going away");
                Error::NotRun(format!("{}: {why}", self.peer))
            }
            Ok(false) => {
                let why = turn.go_away.as_deref().unwrap_or("closed the connection");
                Error::Connection(format!("{}: {why}", self.peer))
            }
            Err(ReadError::Protocol(e)) => {
                tracing::warn!(peer = %self.peer, error = %e, "closing connection: server broke the protocol");
                let _ = self.outbox.push(|fb| fb.go_away(Code::Protocol, &e.to_string()));
                Error::Protocol(e)
            }
            Err(e) if turn.refused => Error::Unauthenticated(format!("{}: {e}", self.peer)),
            // The stream broke after the go-away: the server had still answered everything it
            // ran before sending it.
            Err(e) if turn.leaving => Error::NotRun(format!("{}: {e} after its go-away", self.peer)),
            Err(e) => Error::Connection(format!("{}: {e}", self.peer)),
        })
    }

    /// Hands the turn's replies to their callers, answers the server's pings, and takes note of
    /// a go-away.
    fn deliver(&self, turn: &mut Turn) {
        let mut pings = Vec::new();
        let Turn { batch, done, go_away, refused, leaving, stream_events } = turn;
        let streams = !self.streams.is_empty();
        let replies = batch.drain(..).filter_map(|m| match m {
            Message::StreamItem { id, payload } => {
                stream_events.push((id, StreamEvent::Item(payload)));
                None
            }
            Message::StreamEnd { id } => {
                stream_events.push((id, StreamEvent::End));
                None
            }
            // An error ends a stream as it ends a call: the stream's, if one has its id; and
            // a reply ends a client stream.
            Message::Error { id, code, message } if streams && self.streams.contains(id) => {
                let e = Error::Remote(Status::new(code, as_str(&message)));
                stream_events.push((id, StreamEvent::Failed(e)));
                None
            }
            Message::Reply { id, payload } if streams && self.streams.contains(id) => {
                stream_events.push((id, StreamEvent::Reply(payload)));
                None
            }
            Message::StreamCredit { id, credit } => {
                stream_events.push((id, StreamEvent::Credit(credit)));
                None
            }
            Message::Reply { id, payload } => Some((id, Ok(Reply::One(payload)))),
            Message::BatchReply { id, items } => Some((id, Ok(Reply::Batch(items)))),
            Message::Error { id, code, message } => {
                Some((id, Err(Error::Remote(Status::new(code, as_str(&message))))))
            }
            Message::Ping { token } => {
                pings.push(token);
                None
            }
            Message::GoAway { code, message } => {
                *refused |= code == Code::Unauthenticated;
                *leaving |= code == Code::ShuttingDown;
                *go_away = Some(format!("server going away ({code}): {}", as_str(&message)));
                None
            }
            Message::Auth { .. }
            | Message::Pong { .. }
            | Message::Request { .. }
            | Message::BatchRequest { .. }
            | Message::Cancel { .. }
            | Message::StreamOpen { .. } => None,
        });
        let late = self.pending.take_batch(replies, done);
        self.streams.deliver(stream_events);
        if late > 0 {
            tracing::trace!(late, "dropped replies nobody waits for (timed out)");
        }
        if let Some(reason) = go_away {
            // Before waking anyone: a caller woken by this batch must not send its next call on
            // a connection the server is closing.
            self.alive.store(false, Ordering::Relaxed);
            tracing::debug!(peer = %self.peer, %reason);
        }
        for (waiter, outcome) in done.drain(..) {
            waiter.send(outcome);
        }
        if !pings.is_empty() {
            let _ = self.outbox.push(|fb| pings.iter().for_each(|&t| fb.pong(t)));
        }
    }

    /// Sends one request and waits for its reply. `sending`: the call's timeout, and the trace
    /// context its request carries (when the server accepts extensions).
    pub async fn call<Req: Wire, Resp: Wire>(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        m: &Method<Req, Resp>,
        req: &Req,
        flags: u8,
        sending: (Duration, Option<&TraceParent>),
    ) -> Result<Resp, Error> {
        let reply = self
            .roundtrip(id, next_id, 1, (sending, Source::of(m)), |fb, id, ext| match req.as_bytes() {
                Some(b) if b.len() >= ZERO_COPY_MIN => {
                    fb.request_bytes(id, flags, ext, (m.service(), m.name()), b).map_err(build_error)
                }
                _ => fb
                    .request(id, flags, ext, (m.service(), m.name()), |buf| req.encode(buf))
                    .map_err(build_error),
            })
            .await?;
        match reply {
            Reply::One(payload) => Resp::decode(payload).map_err(|e| Error::Decode(e.0)),
            Reply::Batch(_) => Err(Error::Decode("the server sent a batch reply to a single request".into())),
        }
    }

    /// Sends a chunk of requests as one batch message and waits for its one reply. The outer
    /// error ends the whole chunk (connection, deadline, a chunk-level error reply); otherwise
    /// each item has its own result, in order.
    pub async fn call_chunk<Req: Wire, Resp: Wire>(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        m: &Method<Req, Resp>,
        items: &[Req],
        flags: u8,
        sending: (Duration, Option<&TraceParent>),
    ) -> Result<Vec<Result<Resp, Error>>, Error> {
        let reply = self
            .roundtrip(id, next_id, items.len(), (sending, Source::of(m)), |fb, id, ext| {
                fb.batch_request(id, flags, ext, (m.service(), m.name()), items, |r, buf| r.encode(buf))
                    .map_err(build_error)
            })
            .await?;
        let Reply::Batch(replies) = reply else {
            return Err(Error::Decode("the server sent a single reply to a batch request".into()));
        };
        let mut out: Vec<Result<Resp, Error>> = replies
            .replies()
            .map(|r| match r {
                ItemResult::Ok(b) => Resp::decode(b).map_err(|e| Error::Decode(e.0)),
                ItemResult::Err { code, message } => Err(Error::Remote(Status::new(code, as_str(&message)))),
            })
            .collect();
        if out.len() != items.len() {
            let why = format!("batch reply carried {} results for {} requests", out.len(), items.len());
            out.truncate(items.len());
            out.resize_with(items.len(), || Err(Error::Decode(why.clone())));
        }
        Ok(out)
    }

    /// The path every request takes: wait for room, register a waiter, queue the message
    /// (`push` encodes it under id `id`, with its extensions), wait for the outcome.
    /// `fingerprints`: where the method's schema fingerprints come from, if it has any.
    async fn roundtrip(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        items: usize,
        ((timeout, trace), fingerprints): ((Duration, Option<&TraceParent>), Option<Source>),
        push: impl FnOnce(&mut FrameBuilder, u64, &Extensions) -> Result<(), Error>,
    ) -> Result<Reply, Error> {
        // A call that finds no room waits for it within its timeout, and has what is left of
        // the timeout once admitted: under overload, callers queued here give up on time
        // instead of being sent late, to a server that would work on them for nobody.
        let (_held, left) = match self.flow.try_admit(items)? {
            Some(held) => (held, timeout),
            None => {
                let t0 = Instant::now();
                let admitted = tokio::time::timeout(timeout, self.flow.admit(items)).await;
                (admitted.map_err(|_| Error::Timeout(timeout))??, timeout.saturating_sub(t0.elapsed()))
            }
        };
        // A fast-tier method waits too: sent before the server's preamble says whether it
        // checks fingerprints, its first request would go unchecked.
        let left = if self.preamble_read.load(Ordering::Acquire)
            || (trace.is_none() && !self.wants_deadlines && fingerprints.is_none())
        {
            left
        } else {
            // Boxed: its timer would otherwise enlarge every call's future.
            Box::pin(self.features(left)).await.map_err(|()| Error::Timeout(timeout))?
        };
        // The extensions are made where the request is written, not held across the wait:
        // a trace context there would enlarge every call's future.
        let sent_budget = self.sends_budget(left);
        let outcome = self
            .send_and_wait(id, next_id, timeout, left, |fb, id| {
                let mut ext = self.extensions(left, trace);
                let source = fingerprints.filter(|_| self.checks_fingerprints());
                if let Some(source) = &source {
                    ext.fingerprints = self.fingerprints_sent.due(source).map(Box::new);
                }
                let pushed = push(fb, id, &ext);
                // Recorded once queued (under the outbox's lock, so no request of the method
                // queued after it can overtake it): a request refused locally sent nothing.
                if let (Ok(()), Some(source), Some(_)) = (&pushed, &source, &ext.fingerprints) {
                    self.fingerprints_sent.sent(source);
                }
                pushed
            })
            .await;
        outcome.map_err(|e| timed_out(e, sent_budget, timeout))
    }

    /// Waits up to `left` for the server's preamble, which says whether it accepts extensions;
    /// returns what is left. It is sent on accept, so it is on its way when a new connection's
    /// first calls are made; a connection that fails meanwhile fails the call right after.
    #[cold]
    async fn features(&self, left: Duration) -> Result<Duration, ()> {
        if self.ended.get().is_some() {
            return Ok(left);
        }
        let t0 = Instant::now();
        tokio::select! {
            _ = self.preamble_event.cancelled() => {}
            _ = self.dead.cancelled() => {}
            () = tokio::time::sleep(left) => return Err(()),
        }
        Ok(left.saturating_sub(t0.elapsed()))
    }

    /// Registers a waiter that gives up after `left` (reporting the call's `timeout`), queues
    /// the message, and waits for the outcome.
    async fn send_and_wait(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        timeout: Duration,
        left: Duration,
        push: impl FnOnce(&mut FrameBuilder, u64) -> Result<(), Error>,
    ) -> Result<Reply, Error> {
        let (tx, rx) = waiter();
        let deadline = clock::now() + clock::Ticks::from(left);
        let Inserted { id, wake_sweeper } =
            self.pending.insert(id, tx, deadline, timeout, next_id).map_err(never_sent)?;
        if wake_sweeper {
            self.sweeper.wake.notify_one();
        }
        let append = |fb: &mut FrameBuilder| {
            let before = fb.queued_len();
            push(fb, id).map(|()| fb.queued_len().saturating_sub(before))
        };
        // The only call in flight writes its request itself; with others in flight the writer
        // task bundles them. On a current-thread runtime that task runs only once every call
        // of the round has queued, and the server would idle until then: there, once the
        // bundle holds half of the calls in flight, the call that fills it writes it, and the
        // server starts on it while the other half is made (`docs/BENCHMARKS.md`, "Bundles
        // written early"). On a multi-threaded runtime the writer task runs beside the calls
        // and takes what they queue as they go.
        let pushed = if self.flow.idle() {
            self.outbox.push_and_write(&self.counters, append)
        } else if self.early_bundles {
            let at = (self.flow.in_flight() as u64 / 2).max(EARLY_BUNDLE_MIN);
            self.outbox.push_and_flush_at(&self.counters, at, append)
        } else {
            self.outbox.push(append)
        };
        let size = match pushed {
            Ok(Ok(size)) => size,
            Ok(Err(e)) => {
                self.pending.remove(id);
                return Err(e);
            }
            Err(_closed) => {
                self.pending.remove(id);
                let why = self.ended.get().cloned();
                return Err(never_sent(why.unwrap_or_else(|| {
                    Error::Connection(format!("connection to {} is closed", self.peer))
                })));
            }
        };
        let _bytes = InFlightBytes::add(&self.flow, size);
        // From here the waiter is in the table and ends by a reply, its deadline (the sweeper)
        // or a connection failure. If the caller drops this future first, the guard takes the
        // waiter out again so a late reply finds nobody.
        let guard = Unregister { conn: self, id };
        let outcome =
            rx.await.unwrap_or_else(|_| Err(Error::Connection("connection dropped the call".into())));
        std::mem::forget(guard);
        outcome
    }

    /// Sends a request whose names and payload are already bytes, and returns the reply's
    /// payload undecoded (for forwarding layers such as the registry's relay).
    #[allow(clippy::too_many_arguments)]
    pub async fn call_raw(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        service: &str,
        method: &str,
        payload: bytes::Bytes,
        flags: u8,
        sending: (Duration, Option<&TraceParent>),
    ) -> Result<bytes::Bytes, Error> {
        let reply = self
            .roundtrip(id, next_id, 1, (sending, None), |fb, id, ext| {
                fb.request_bytes(id, flags, ext, (service, method), payload).map_err(build_error)
            })
            .await?;
        match reply {
            Reply::One(payload) => Ok(payload),
            Reply::Batch(_) => Err(Error::Decode("the server sent a batch reply to a single request".into())),
        }
    }

    /// The extensions of a request whose call may take `timeout`, when the server accepts them:
    /// its budget in microseconds, when this connection sends budgets, and its `trace` context
    /// (`None` unless a subscriber records the call's span). A budget beyond the field's range
    /// (about 71 minutes) is not sent: the server then sets no deadline rather than an early one.
    #[inline]
    fn extensions(&self, timeout: Duration, trace: Option<&TraceParent>) -> Extensions {
        if !self.peer_extensions.load(Ordering::Relaxed) {
            return Extensions::NONE;
        }
        let deadline_micros =
            if self.wants_deadlines { u32::try_from(timeout.as_micros()).ok() } else { None };
        Extensions { deadline_micros, trace_parent: trace.map(|t| Box::new(*t)), fingerprints: None }
    }

    /// Whether the server checks schema fingerprints (it announced them, and extensions to carry
    /// them in).
    fn checks_fingerprints(&self) -> bool {
        self.peer_fingerprints.load(Ordering::Relaxed) && self.peer_extensions.load(Ordering::Relaxed)
    }

    /// Whether a request whose call may take `timeout` carries it as its budget.
    fn sends_budget(&self, timeout: Duration) -> bool {
        self.extensions(timeout, None).deadline_micros.is_some()
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Opens a stream of `names` and `shape` (PROTOCOL.md §9.9) under id `id` (or the next
    /// free one): `window` items of credit for the server, `timeout` as the stream's budget,
    /// `request` writing the open's payload. Returns the id taken, the stream's events (and
    /// credit, if the client sends items) and whether the budget was sent.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_stream(
        &self,
        mut id: u64,
        mut next_id: impl FnMut() -> u64,
        (names, shape): ((&str, &str), u8),
        request: impl FnOnce(&mut bytes::BytesMut) -> Result<(), crate::codec::CodecError>,
        window: u32,
        (timeout, preamble_within): (Option<Duration>, Duration),
        trace: Option<&TraceParent>,
    ) -> Result<(u64, Registered, bool), Error> {
        // Only the server's preamble says whether it takes streams.
        let wait = timeout.unwrap_or(preamble_within).min(preamble_within);
        let left = if self.preamble_read.load(Ordering::Acquire) {
            timeout
        } else {
            let t0 = Instant::now();
            if Box::pin(self.features(wait)).await.is_err() {
                return Err(Error::Timeout(wait));
            }
            timeout.map(|t| t.saturating_sub(t0.elapsed()))
        };
        if let Some(e) = self.ended.get() {
            return Err(e.clone());
        }
        if !self.peer_streams.load(Ordering::Relaxed) {
            return Err(Error::Usage(format!(
                "{}: the server does not accept streams (its preamble did not announce the STREAMS feature)",
                self.peer
            )));
        }
        let sends = shape != crate::proto::message::shape::SERVER;
        let registered = loop {
            match self.streams.insert(id, sends) {
                Some(r) => break r,
                None => id = next_id(),
            }
        };
        // A failure between the check above and the insert would have missed this stream.
        if let Some(e) = self.ended.get() {
            self.streams.remove(id);
            return Err(e.clone());
        }
        let ext = self.extensions(left.unwrap_or(Duration::MAX), trace);
        let pushed = self.outbox.push(|fb| fb.stream_open(id, 0, &ext, names, (shape, window), request));
        match pushed {
            Ok(Ok(())) => Ok((id, registered, ext.deadline_micros.is_some())),
            Ok(Err(e)) => {
                self.streams.remove(id);
                Err(build_error(e))
            }
            Err(_closed) => {
                self.streams.remove(id);
                Err(self
                    .ended
                    .get()
                    .cloned()
                    .unwrap_or_else(|| Error::Connection(format!("connection to {} is closed", self.peer))))
            }
        }
    }

    /// Sends one item of stream `id` (its credit taken by the caller).
    pub fn send_item<T: Wire>(&self, id: u64, item: &T) -> Result<(), Error> {
        match self.outbox.push(|fb| fb.stream_item(id, |b| item.encode(b))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(build_error(e)),
            Err(_closed) => Err(self
                .ended
                .get()
                .cloned()
                .unwrap_or_else(|| Error::Connection(format!("connection to {} is closed", self.peer)))),
        }
    }

    /// Sends the end of the client's items on stream `id`.
    pub fn end_items(&self, id: u64) {
        let _ = self.outbox.push(|fb| fb.stream_end(id));
    }

    /// Grants stream `id` `credit` more items.
    pub fn grant(&self, id: u64, credit: u32) {
        let _ = self.outbox.push(|fb| fb.stream_credit(id, credit));
    }

    /// The caller gave stream `id` up: forget it and tell the server (when it was still open).
    pub fn cancel_stream(&self, id: u64) {
        if self.streams.remove(id) {
            let _ = self.outbox.push(|fb| fb.cancel(id));
        }
    }
}

/// The longest the sweeper waits between two sweeps because the last one was slow.
const MAX_SWEEP_GAP: Duration = Duration::from_millis(50);

/// The smallest bundle a call writes early (see `send_and_wait`): below it, the writes a
/// round would take cost more than the overlap gains.
const EARLY_BUNDLE_MIN: u64 = 16;

/// Removes a waiter whose call ended without a reply, and tells the server (best effort).
struct Unregister<'a> {
    conn: &'a StreamConn,
    id: u64,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if self.conn.pending.remove(self.id) {
            let id = self.id;
            let _ = self.conn.outbox.push(|fb| fb.cancel(id));
        }
    }
}

/// Maps a failure to queue a message to the caller's error.
fn build_error<E: std::fmt::Display>(e: BuildError<E>) -> Error {
    match e {
        BuildError::Payload(e) => Error::Encode(e.to_string()),
        BuildError::TooLarge { len, max } => Error::TooLarge { len, max },
        BuildError::TooManyItems { count, max } => {
            Error::Usage(format!("a batch message of {count} items exceeds the protocol limit of {max}"))
        }
    }
}

/// A connection's failure, for a call whose request was never written: it never ran.
fn never_sent(e: Error) -> Error {
    match e {
        Error::Connection(why) => Error::NotRun(format!("{why} (the request was never sent)")),
        other => other,
    }
}

/// The ids of the requests in `frames` (whole frames, as an outbox queues them).
fn request_ids(frames: Vec<bytes::Bytes>, limits: Limits) -> Vec<u64> {
    let mut buf = bytes::BytesMut::with_capacity(frames.iter().map(bytes::Bytes::len).sum());
    frames.iter().for_each(|f| buf.extend_from_slice(f));
    let mut decoder = crate::proto::Decoder::after_preamble(limits);
    let (mut ids, mut messages) = (Vec::new(), Vec::new());
    while let Ok(Some(frame)) = decoder.next_frame(&mut buf) {
        messages.clear();
        if crate::proto::decode_frame(&frame, &limits, &mut messages).is_err() {
            break;
        }
        ids.extend(messages.iter().filter_map(|m| match m {
            Message::Request { id, .. } | Message::BatchRequest { id, .. } => Some(*id),
            _ => None,
        }));
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    const ECHO: Method<String, String> = Method::new("t", "echo");

    /// A call that finds its connection's outbox closed reports why the connection ended. A
    /// caller that registered its waiter just before the server refused the token, and queues
    /// its request just after, lands here (`fail` closes the outbox before it fails the
    /// waiters); CI once saw "connection ... is closed" instead of `Unauthenticated`.
    #[tokio::test]
    async fn a_call_that_finds_the_outbox_closed_gets_the_reason_it_failed() {
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let conn = StreamConn::start(ours, options(), Arc::default());
        // The moment inside `fail` between closing the outbox and failing the waiters.
        let _ = conn.ended.set(Error::Unauthenticated("the token presented is not accepted".into()));
        conn.outbox.close();
        let r = conn.call(1, || 2, &ECHO, &"x".to_string(), 0, (Duration::from_secs(5), None)).await;
        assert!(matches!(&r, Err(Error::Unauthenticated(_))), "{r:?}");
        assert_eq!(conn.pending_len(), 0);
    }

    fn options() -> ConnOptions {
        ConnOptions {
            limits: Limits::default(),
            flow: FlowLimits { max_items: 16, max_bytes: 1 << 20 },
            token: None,
            keepalive: None,
            send_deadlines: true,
            preamble_within: Duration::from_secs(5),
        }
    }

    /// After the connection failed, a new call gets the failure too.
    #[tokio::test]
    async fn a_call_on_a_failed_connection_gets_the_reason_it_failed() {
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let conn = StreamConn::start(ours, options(), Arc::default());
        conn.fail(Error::Unauthenticated("the token presented is not accepted".into()));
        let r = conn.call(1, || 2, &ECHO, &"x".to_string(), 0, (Duration::from_secs(5), None)).await;
        assert!(matches!(&r, Err(Error::Unauthenticated(_))), "{r:?}");
        assert_eq!(conn.pending_len(), 0);
    }
}
