//! One turn of a connection: the messages read together are grouped into runs of requests for
//! the same method, each run goes to its handler as one batch, and every answer that is ready
//! at once leaves together.
//!
//! A turn never waits. Its answers are encoded into a builder of the thread's, outside the
//! connection's send lock, and linked into the outbox in one step at the end (no copy). A
//! handler that does not finish on its first poll continues as a task of its own; its replies
//! follow when ready.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::handler::poll_now;
use super::offload::offloaded;
use super::replies::Replies;
use crate::proto::encode::FrameBuilder;
use crate::proto::message::as_str;
use crate::proto::{BatchItems, Code, Limits, Message, ProtocolError};
use crate::transport::outbox::Outbox;

/// The error a request still running at a shutdown's drain deadline gets. Its handler may have
/// partly run.
const DROPPED_AT_DEADLINE: &str = "the server shut down: its drain deadline passed before this request finished (the handler may have partly run)";

thread_local! {
    /// The answers of the turn running on this thread. One per thread, not per connection: a
    /// turn never waits, so connections served by a thread take turns with it, and an idle
    /// connection holds none of its memory.
    static TURN: RefCell<FrameBuilder> = RefCell::new(FrameBuilder::new(Limits::default()));
}

/// The connection a turn serves.
pub(super) struct Conn<'c> {
    pub shared: &'c Arc<Shared>,
    pub outbox: &'c Arc<Outbox>,
    /// Handler tasks of this connection (it closes only after their replies are queued).
    pub inflight: &'c TaskTracker,
}

/// A connection's scratch for its turns, reused from turn to turn.
#[derive(Default)]
pub(super) struct Dispatch {
    /// Consecutive requests for one method, handed to its handler together.
    group: Vec<(u64, Bytes)>,
    /// The group's service and method, and whether its payloads are large enough to be
    /// decoded and encoded on the codec pool (large and small requests are grouped apart).
    key: Option<(Bytes, Bytes, bool)>,
    /// The ids of the requests handed to the handler being started (see [`Dispatch::start`]).
    started: Vec<u64>,
    /// The turn's pings, answered after its requests.
    pings: Vec<u64>,
    /// The peer, the [`current_peer`](super::current_peer) of its handlers.
    peer: Option<Arc<super::Peer>>,
}

impl Dispatch {
    pub(super) fn new(peer: Arc<super::Peer>) -> Self {
        Dispatch { peer: Some(peer), ..Dispatch::default() }
    }

    /// Runs one turn over `batch` (drained) and queues its answers. Requests before a protocol
    /// violation are still answered; nothing after it runs.
    pub(super) fn run(&mut self, c: &Conn<'_>, batch: &mut Vec<Message>) -> Result<(), ProtocolError> {
        TURN.with(|cell| match cell.try_borrow_mut() {
            Ok(mut out) => self.run_into(c, batch, &mut out),
            // A turn inside a turn (a handler's first poll that serves another connection):
            // it gets a builder of its own.
            Err(_) => self.run_into(c, batch, &mut FrameBuilder::new(c.shared.config.limits)),
        })
    }

    fn run_into(
        &mut self,
        c: &Conn<'_>,
        batch: &mut Vec<Message>,
        out: &mut FrameBuilder,
    ) -> Result<(), ProtocolError> {
        out.set_limits(c.shared.config.limits);
        let violation = self.dispatch(c, batch, out);
        if c.outbox.push(|fb| fb.append_from(out)).is_err() {
            // The connection is going away; what the turn wrote goes nowhere.
            out.take_frames();
        }
        violation.map_or(Ok(()), Err)
    }

    fn dispatch(
        &mut self,
        c: &Conn<'_>,
        batch: &mut Vec<Message>,
        out: &mut FrameBuilder,
    ) -> Option<ProtocolError> {
        let mut violation = None;
        for msg in batch.drain(..) {
            match msg {
                Message::Request { id, service, method, payload, .. } => {
                    let large = payload.len() >= c.shared.config.offload_min_bytes;
                    let same = self
                        .key
                        .as_ref()
                        .is_some_and(|(s, m, l)| *s == service && *m == method && *l == large);
                    if !same || self.group.len() >= c.shared.config.max_batch {
                        self.flush(c, out);
                        self.key = Some((service, method, large));
                    }
                    self.group.push((id, payload));
                }
                Message::Ping { token } => self.pings.push(token),
                // Cancels are advisory in protocol version 1: the reply is still sent, and the
                // client drops it. Auth was checked when the connection opened (a repeated one
                // changes nothing).
                Message::Cancel { .. } | Message::Pong { .. } | Message::Auth { .. } => {}
                Message::GoAway { code, message } => {
                    tracing::debug!(%code, message = as_str(&message), "client is going away");
                }
                Message::BatchRequest { id, service, method, items, .. } => {
                    self.flush(c, out);
                    self.key = None;
                    self.batch(c, out, id, &service, &method, items);
                }
                Message::Reply { .. } | Message::Error { .. } | Message::BatchReply { .. } => {
                    violation = Some(ProtocolError::Malformed("a client sent a reply to the server"));
                    break;
                }
            }
        }
        batch.clear();
        self.flush(c, out);
        self.pings.drain(..).for_each(|token| out.pong(token));
        // The key's names are slices of the receive buffer: kept past the turn, they would pin
        // the whole buffer (64 KiB) for as long as the connection stays idle.
        self.key = None;
        violation
    }

    /// Hands the current group to its handler.
    fn flush(&mut self, c: &Conn<'_>, out: &mut FrameBuilder) {
        if self.group.is_empty() {
            return;
        }
        let (service, method, large) = self.key.as_ref().expect("a group has a key");
        let large = *large;
        let route = match c.shared.router.lookup(as_str(service), as_str(method)) {
            Ok(route) => route,
            Err(status) => {
                self.group.drain(..).for_each(|(id, _)| out.error(id, status.code, &status.message));
                return;
            }
        };
        // Admit as many as there is room for; the rest are refused at once.
        let room = c.shared.room();
        if room < self.group.len() {
            let status = c.shared.overloaded(self.group.len() - room);
            self.group.drain(room..).for_each(|(id, _)| out.error(id, status.code, &status.message));
            if self.group.is_empty() {
                return;
            }
        }
        // The ids are copied on every dispatch (into a reused buffer) because the requests move
        // into the handler; only a handler that waits needs them (see `start`).
        self.started.clear();
        self.started.extend(self.group.iter().map(|(id, _)| *id));
        let n = self.group.len();
        let fut = if large {
            let group = std::mem::take(&mut self.group);
            offloaded(route.handler.clone(), self.started.clone(), c.shared.config.limits, move |h, out| {
                let mut group = group;
                h.serve(&mut group, out)
            })
        } else {
            let handler = &route.handler;
            match super::with_peer(self.peer.as_ref(), || handler.serve(&mut self.group, out)) {
                Some(fut) => fut,
                None => return, // a synchronous handler answered already
            }
        };
        self.start(c, out, fut, n);
    }

    /// Hands the items of batch request `id` to its handler.
    fn batch(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        id: u64,
        service: &Bytes,
        method: &Bytes,
        items: BatchItems,
    ) {
        let route = match c.shared.router.lookup(as_str(service), as_str(method)) {
            Ok(route) => route,
            Err(status) => return out.error(id, status.code, &status.message),
        };
        let n = items.len().max(1);
        if !c.shared.admits_chunk(n) {
            let status = c.shared.overloaded(n);
            return out.error(id, status.code, &status.message);
        }
        let max_batch = c.shared.config.max_batch;
        let fut = if items.body_len() >= c.shared.config.offload_min_bytes {
            offloaded(route.handler.clone(), vec![id], c.shared.config.limits, move |h, _| {
                Some(h.serve_batch(id, items, max_batch))
            })
        } else {
            route.handler.serve_batch(id, items, max_batch)
        };
        self.started.clear();
        self.started.push(id);
        self.start(c, out, fut, n);
    }

    /// Runs the replies' future for the requests in `self.started`: if it finishes on its first
    /// poll, its replies join this turn's; if not, it continues as its own task, and its `n`
    /// requests (a batch request counts its items) count as queued work until its replies are
    /// queued.
    fn start(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        mut fut: BoxFuture<'static, Box<dyn Replies>>,
        n: usize,
    ) {
        if let Some(replies) = super::with_peer(self.peer.as_ref(), || poll_now(&mut fut)) {
            return replies.write(out);
        }
        c.shared.queued.fetch_add(n, Ordering::Relaxed);
        let (shared, outbox) = (c.shared.clone(), c.outbox.clone());
        // Cloned only here, on the slow path, which spawns a task anyway.
        let ids = self.started.clone();
        c.inflight.spawn(async move {
            tokio::select! {
                replies = fut => {
                    let _ = outbox.push(|fb| replies.write(fb));
                }
                // The shutdown's drain deadline passed: the work is dropped, and each request
                // is answered so (before the connection's go-away).
                _ = shared.abort.cancelled() => {
                    let _ = outbox.push(|fb| ids.iter().for_each(|&id| fb.error(id, Code::ShuttingDown, DROPPED_AT_DEADLINE)));
                }
            }
            shared.queued.fetch_sub(n, Ordering::Relaxed);
        });
    }
}
