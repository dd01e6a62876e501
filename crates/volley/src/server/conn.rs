//! Serving one unix or tcp connection: read a batch, dispatch it, write the replies as one
//! bundle (seeds/004: drain the socket up to `max_batch`, process together, answer together).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use subtle::ConstantTimeEq;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::sync::atomic::Ordering;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::handler::{ReplyWriter, TurnBox};
use super::offload::offloaded;
use crate::error::Status;
use crate::pool::{self, arena, arena::Bump};
use crate::proto::message::as_str;
use crate::proto::{BatchItems, Code, Message, ProtocolError};
use crate::transport::outbox::Outbox;
use crate::transport::reader::{FrameReader, ReadError};
use crate::transport::stream::ByteStream;

enum End {
    PeerClosed,
    Shutdown,
    Protocol(ProtocolError),
    Io(String),
    /// The peer sent part of a frame and then nothing for the read timeout.
    Stalled(String),
    /// Keepalive: nothing arrived within the timeout after a ping.
    Dead,
    /// The peer did not present a token the server accepts.
    Unauthenticated(&'static str),
}

/// Serves `stream` until the peer leaves, breaks the protocol, or the server shuts down.
pub(super) async fn serve<S: ByteStream>(shared: Arc<Shared>, stream: S) {
    // The accept loop counted this connection; it stops counting when serving ends.
    struct Counted(Arc<Shared>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let _counted = Counted(shared.clone());
    let peer = stream.peer();
    let (rd, wr) = stream.into_halves();
    let limits = shared.config.limits;
    let outbox = Arc::new(Outbox::new(limits));
    let mut writer = {
        let (outbox, shared) = (outbox.clone(), shared.clone());
        tokio::spawn(async move { outbox.write_loop(wr, &shared.counters, true).await })
    };
    // Handler batches that did not finish on their first poll run as tasks tracked here, so
    // the connection closes only after their replies are queued.
    let inflight = TaskTracker::new();
    let mut reader = FrameReader::new(rd, limits).with_read_timeout(shared.config.read_timeout);
    let mut batch = Vec::new();
    // Layers above see the connection close when this function returns (the guard drops).
    let (peer_scope, _closes_with_serve) = super::Peer::open(&peer);
    let mut dispatch = Dispatch { peer: Some(peer_scope), ..Dispatch::default() };
    let mut authenticated = shared.config.tokens.is_empty();
    // Keepalive without a clock read per batch: a timer fires every interval and compares a
    // count of reads with the count it saw last time.
    let keepalive = shared.config.keepalive;
    let tick = tokio::time::sleep(keepalive.map_or(Duration::from_secs(3600), |k| k.interval));
    tokio::pin!(tick);
    let (mut reads, mut reads_seen, mut ping_out) = (0u64, 0u64, false);
    let end = loop {
        let read = tokio::select! {
            biased;
            r = async {
                // A peer that does not read its replies stops us reading its requests.
                outbox.wait_queued_below(MAX_UNSENT).await;
                reader.read_batch(&mut batch, shared.config.max_batch, &shared.counters).await
            } => r,
            _ = shared.shutdown.cancelled() => break End::Shutdown,
            () = &mut tick, if keepalive.is_some() => {
                let k = keepalive.expect("checked by the branch condition");
                let now = tokio::time::Instant::now();
                if reads != reads_seen {
                    (reads_seen, ping_out) = (reads, false);
                    tick.as_mut().reset(now + k.interval);
                } else if !ping_out {
                    let _ = outbox.push(|fb| fb.ping(reads));
                    ping_out = true;
                    tick.as_mut().reset(now + k.timeout);
                } else {
                    break End::Dead;
                }
                continue;
            }
        };
        reads += 1;
        match read {
            Ok(true) => {
                if !authenticated {
                    match check_auth(&shared.config.tokens, &batch) {
                        Ok(()) => {
                            authenticated = true;
                            batch.remove(0);
                        }
                        Err(why) => break End::Unauthenticated(why),
                    }
                }
                if let Err(e) = dispatch.run(&shared, &outbox, &inflight, &mut batch) {
                    break End::Protocol(e);
                }
            }
            Ok(false) => break End::PeerClosed,
            Err(ReadError::Protocol(e)) => break End::Protocol(e),
            Err(e @ ReadError::Stalled(_)) => break End::Stalled(e.to_string()),
            Err(e) => break End::Io(e.to_string()),
        }
    };
    inflight.close();
    tokio::select! {
        _ = inflight.wait() => {}
        // Past the drain deadline the handler tasks drop their work (see `Dispatch::start`).
        _ = shared.abort.cancelled() => inflight.wait().await,
    }
    match &end {
        End::PeerClosed => tracing::debug!(%peer, "peer closed the connection"),
        End::Shutdown => {
            let _ = outbox.push(|fb| fb.go_away(Code::ShuttingDown, "server is shutting down"));
        }
        End::Protocol(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: protocol error");
            let _ = outbox.push(|fb| fb.go_away(Code::Protocol, &e.to_string()));
        }
        End::Io(e) => tracing::debug!(%peer, error = %e, "connection failed"),
        End::Stalled(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: read timeout");
            let _ = outbox.push(|fb| fb.go_away(Code::Protocol, e));
        }
        End::Dead => tracing::info!(%peer, "closing connection: no answer to a keepalive ping"),
        End::Unauthenticated(why) => {
            tracing::warn!(%peer, reason = why, "refusing connection: not authenticated");
            let _ = outbox.push(|fb| fb.go_away(Code::Unauthenticated, why));
        }
    }
    outbox.close();
    let written = tokio::select! {
        r = &mut writer => Some(r),
        _ = async {
            shared.abort.cancelled().await;
            tokio::time::sleep(LINGER).await;
        } => None,
    };
    match written {
        Some(Ok(Ok(()))) => {}
        Some(Ok(Err(e))) => tracing::debug!(%peer, error = %e, "write failed"),
        Some(Err(e)) => tracing::error!(%peer, error = %e, "writer task failed"),
        None => writer.abort(),
    }
    if !matches!(end, End::PeerClosed | End::Io(_) | End::Dead) {
        // We closed first, with a go-away: let the peer read it before the socket goes.
        reader.drain(LINGER).await;
    }
}

/// Whether the first message of a connection presents one of the server's tokens.
fn check_auth(tokens: &[Vec<u8>], batch: &[Message]) -> Result<(), &'static str> {
    match batch.first() {
        Some(Message::Auth { token }) => {
            // Every configured token is compared, in constant time, whatever matches.
            let ok = tokens.iter().fold(subtle::Choice::from(0), |ok, t| ok | t.as_slice().ct_eq(token));
            if bool::from(ok) { Ok(()) } else { Err("the token presented is not accepted") }
        }
        _ => Err("this server requires a token (none was presented)"),
    }
}

/// Refuses a connection over the server's connection limit: a go-away, then close.
pub(super) async fn refuse<S: ByteStream>(shared: Arc<Shared>, stream: S) {
    let peer = stream.peer();
    let max = shared.config.max_connections.unwrap_or(0);
    tracing::warn!(%peer, max, "refusing connection: connection limit reached");
    let (rd, wr) = stream.into_halves();
    let limits = shared.config.limits;
    let outbox = Outbox::new(limits);
    let why = format!("server is at its limit of {max} connections");
    let _ = outbox.push(|fb| fb.go_away(Code::Overloaded, &why));
    outbox.close();
    let _ = tokio::time::timeout(LINGER, outbox.write_loop(wr, &shared.counters, true)).await;
    FrameReader::new(rd, limits).drain(LINGER).await;
}

/// The error a request still running at a shutdown's drain deadline gets. Its handler may have
/// partly run.
const DROPPED_AT_DEADLINE: &str = "the server shut down: its drain deadline passed before this request finished (the handler may have partly run)";

/// Unsent reply bytes above which a connection stops reading requests until its peer catches up.
const MAX_UNSENT: usize = 16 << 20;

/// How long a connection we close keeps reading (and discarding) so its go-away arrives.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Scratch space for dispatching batches, reused across turns.
#[derive(Default)]
struct Dispatch {
    /// Consecutive requests for one method, handed to its handler together.
    group: Vec<(u64, Bytes)>,
    /// The group's service and method, and whether its payloads are large enough to be
    /// decoded and encoded on the codec pool (large and small requests are grouped apart).
    key: Option<(Bytes, Bytes, bool)>,
    errors: Vec<(u64, Status)>,
    pongs: Vec<u64>,
    /// The ids of the requests handed to the handler being started (see [`Dispatch::start`]).
    started: Vec<u64>,
    /// The peer, the [`current_peer`](super::current_peer) of its handlers.
    peer: Option<Arc<super::Peer>>,
}

/// A handler's finished replies, waiting for the end of the turn.
enum Ready<'a> {
    /// A synchronous handler's, in the turn's arena.
    Turn(TurnBox<'a>),
    /// An async handler's (or any handler's with the pools off).
    Boxed(Box<dyn ReplyWriter>),
}

/// One turn: the connection's context, and the arena its scratch lives in until the replies
/// are written (the per-batch arena of `pool::arena`, released in one step after the turn).
struct Turn<'a, 'c> {
    arena: &'a Bump,
    ready: bumpalo::collections::Vec<'a, Ready<'a>>,
    shared: &'c Arc<Shared>,
    outbox: &'c Arc<Outbox>,
    inflight: &'c TaskTracker,
}

impl Dispatch {
    fn run(
        &mut self,
        shared: &Arc<Shared>,
        outbox: &Arc<Outbox>,
        inflight: &TaskTracker,
        batch: &mut Vec<Message>,
    ) -> Result<(), ProtocolError> {
        arena::with_turn(|arena| {
            let mut t =
                Turn { arena, ready: bumpalo::collections::Vec::new_in(arena), shared, outbox, inflight };
            let violation = self.dispatch(&mut t, batch);
            self.push_replies(&mut t);
            violation.map_or(Ok(()), Err)
        })
    }

    fn dispatch<'a>(&mut self, t: &mut Turn<'a, '_>, batch: &mut Vec<Message>) -> Option<ProtocolError> {
        let mut violation = None;
        for msg in batch.drain(..) {
            match msg {
                Message::Request { id, service, method, payload, .. } => {
                    let large = payload.len() >= t.shared.config.offload_min_bytes;
                    let same = self
                        .key
                        .as_ref()
                        .is_some_and(|(s, m, l)| *s == service && *m == method && *l == large);
                    if !same || self.group.len() >= t.shared.config.max_batch {
                        self.flush(t);
                        self.key = Some((service, method, large));
                    }
                    self.group.push((id, payload));
                }
                Message::Ping { token } => self.pongs.push(token),
                // Cancels are advisory in protocol version 1: the reply is still sent, and the
                // client drops it.
                // Auth was checked when the connection opened (a repeated one changes nothing).
                Message::Cancel { .. } | Message::Pong { .. } | Message::Auth { .. } => {}
                Message::GoAway { code, message } => {
                    tracing::debug!(%code, message = as_str(&message), "client is going away");
                }
                Message::BatchRequest { id, service, method, items, .. } => {
                    self.chunk(t, id, &service, &method, items);
                    self.key = None;
                }
                Message::Reply { .. } | Message::Error { .. } | Message::BatchReply { .. } => {
                    // Requests before the violation are still answered; nothing after it runs.
                    violation = Some(ProtocolError::Malformed("a client sent a reply to the server"));
                    break;
                }
            }
        }
        batch.clear();
        self.flush(t);
        violation
    }

    /// Queues this turn's finished replies, errors and pongs as one bundle.
    fn push_replies(&mut self, t: &mut Turn<'_, '_>) {
        if t.ready.is_empty() && self.errors.is_empty() && self.pongs.is_empty() {
            return;
        }
        let (ready, errors, pongs) = (&mut t.ready, &mut self.errors, &mut self.pongs);
        let _ = t.outbox.push(|fb| {
            for r in ready.drain(..) {
                match r {
                    Ready::Turn(mut w) => w.write(fb),
                    Ready::Boxed(w) => w.write(fb),
                }
            }
            for (id, status) in errors.drain(..) {
                fb.error(id, status.code, &status.message);
            }
            for token in pongs.drain(..) {
                fb.pong(token);
            }
        });
        // If the outbox was closed the connection is going away; drop what is left.
        t.ready.clear();
        self.errors.clear();
        self.pongs.clear();
    }

    /// Hands the current group to its handler.
    fn flush<'a>(&mut self, t: &mut Turn<'a, '_>) {
        if self.group.is_empty() {
            return;
        }
        let (service, method, large) = self.key.as_ref().expect("a group has a key");
        let large = *large;
        let route = match t.shared.router.lookup(as_str(service), as_str(method)) {
            Ok(route) => route.clone(),
            Err(status) => {
                self.errors.extend(self.group.drain(..).map(|(id, _)| (id, status.clone())));
                return;
            }
        };
        // Admit as many as there is room for; the rest are refused at once.
        let room = t.shared.room();
        if room < self.group.len() {
            let status = t.shared.overloaded();
            self.errors.extend(self.group.drain(room..).map(|(id, _)| (id, status.clone())));
            if self.group.is_empty() {
                return;
            }
        }
        // A synchronous handler runs right here, its scratch in the turn's arena (large
        // payloads go to the codec pool below instead).
        if !large
            && pool::enabled()
            && let Some(replies) =
                super::with_peer(self.peer.as_ref(), || route.erased.call_sync(&mut self.group, t.arena))
        {
            t.ready.push(Ready::Turn(replies));
            return;
        }
        self.started.clear();
        self.started.extend(self.group.iter().map(|(id, _)| *id));
        let items = std::mem::replace(&mut self.group, Vec::with_capacity(16));
        let fut = if large {
            offloaded(route.erased.clone(), self.started.clone(), move |h| h.call(items))
        } else {
            route.erased.call(items)
        };
        self.start(t, fut, self.started.len());
    }

    /// Hands the items of batch request `id` to its handler (after the group before it, so
    /// replies keep arrival order within a turn).
    fn chunk(&mut self, t: &mut Turn<'_, '_>, id: u64, service: &Bytes, method: &Bytes, items: BatchItems) {
        self.flush(t);
        let route = match t.shared.router.lookup(as_str(service), as_str(method)) {
            Ok(route) => route.clone(),
            Err(status) => return self.errors.push((id, status)),
        };
        let n = items.len().max(1);
        if t.shared.room() < n {
            return self.errors.push((id, t.shared.overloaded()));
        }
        let max_batch = t.shared.config.max_batch;
        let fut = if items.body_len() >= t.shared.config.offload_min_bytes {
            offloaded(route.erased.clone(), vec![id], move |h| h.call_chunk(id, items, max_batch))
        } else {
            route.erased.call_chunk(id, items, max_batch)
        };
        self.started.clear();
        self.started.push(id);
        self.start(t, fut, n);
    }

    /// Runs a handler's future for the requests in `self.started`: one that finishes on its
    /// first poll has its replies written with this turn's bundle; a slower one continues as
    /// its own task, and its `n` requests (a batch request counts its items) count as queued
    /// work until its replies are queued.
    fn start(&mut self, t: &mut Turn<'_, '_>, mut fut: BoxFuture<'static, Box<dyn ReplyWriter>>, n: usize) {
        // The noop waker is safe: a pending future is spawned, and its task polls it again
        // with a real waker.
        let first = super::with_peer(self.peer.as_ref(), || {
            fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        });
        match first {
            Poll::Ready(w) => t.ready.push(Ready::Boxed(w)),
            Poll::Pending => {
                t.shared.queued.fetch_add(n, Ordering::Relaxed);
                let (shared, outbox) = (t.shared.clone(), t.outbox.clone());
                // `started` is filled on every dispatch (a copy of the ids into a reused
                // buffer, since the items move into the future); it is cloned only here, on
                // the slow path, which spawns a task anyway.
                let ids = self.started.clone();
                t.inflight.spawn(async move {
                    tokio::select! {
                        w = fut => {
                            let _ = outbox.push(|fb| w.write(fb));
                        }
                        // The shutdown's drain deadline passed: the work is dropped, and each
                        // request is answered so (before the connection's go-away).
                        _ = shared.abort.cancelled() => {
                            let _ = outbox.push(|fb| {
                                for id in ids {
                                    fb.error(id, Code::ShuttingDown, DROPPED_AT_DEADLINE);
                                }
                            });
                        }
                    }
                    shared.queued.fetch_sub(n, Ordering::Relaxed);
                });
            }
        }
    }
}
