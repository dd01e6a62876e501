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
use tokio::time::{Duration, Instant};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

use super::batch::poll_now;
use super::fingerprint::Refused;
use super::offload::offloaded;
use super::peer::Peer;
use super::replies::{Replies, expire};
use super::running::Running;
use super::shared::{DROPPED_AT_DEADLINE, Shared};
use super::stream::ConnStreams;
use crate::proto::encode::FrameBuilder;
use crate::proto::message::{as_str, shape};
use crate::proto::{BatchItems, Code, Limits, Message, Names, ProtocolError};
use crate::trace;
use crate::transport::outbox::Outbox;

/// The error of a request whose client cancelled it while its handler ran.
const CANCELLED: &str = "the client cancelled the request";

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
    /// Whether the turn's replies may be written at once by this task (the read ended at a
    /// frame boundary: nothing more of the peer's bundle is on its way).
    pub write_now: bool,
}

/// A connection's scratch for its turns, reused from turn to turn.
#[derive(Default)]
pub(super) struct Dispatch {
    /// Consecutive requests for one method, handed to its handler together.
    group: Vec<(u64, Bytes)>,
    /// The group's service and method, and whether its payloads are large enough to be
    /// decoded and encoded on the codec pool (large and small requests are grouped apart).
    key: Option<(Names, bool)>,
    /// The ids of the requests handed to the handler being started (see [`Dispatch::start`]).
    started: Vec<u64>,
    /// The turn's pings, answered after its requests.
    pings: Vec<u64>,
    /// The peer, the [`current_peer`](super::current_peer) of its handlers.
    peer: Option<Arc<Peer>>,
    /// The latest deadline among the group's requests, unless one of them has none.
    deadline: GroupDeadline,
    /// When the turn started, read once per turn and only if a request has a deadline.
    now: Option<Instant>,
    /// Work of this connection still running, for the client's cancels.
    running: Arc<Running>,
    /// With a concurrency limit: when the turn's messages were read, and how many of its
    /// requests were admitted and answered within the turn (their replies leave at its end).
    turn: Option<(Instant, usize)>,
    /// The span of the group being built, when a subscriber records served requests: such a
    /// request is served as a group of its own, so that the handler runs in its span.
    span: Option<Span>,
    /// The streams this connection has open, for the client's credit and cancels; they end
    /// when the connection stops reading (this is dropped).
    streams: ConnStreams,
    /// Methods whose caller's schema fingerprints differ from this server's.
    refused: Refused,
}

/// The deadline a group of requests runs under: the latest of theirs, so that no request is
/// cut short; none if any request of the group came without one.
#[derive(Default, Clone, Copy)]
enum GroupDeadline {
    #[default]
    Empty,
    At(Instant),
    None,
}

impl GroupDeadline {
    fn add(&mut self, d: Option<Instant>) {
        *self = match (*self, d) {
            (GroupDeadline::Empty, Some(d)) => GroupDeadline::At(d),
            (GroupDeadline::At(a), Some(d)) => GroupDeadline::At(a.max(d)),
            _ => GroupDeadline::None,
        };
    }

    fn take(&mut self) -> Option<Instant> {
        match std::mem::take(self) {
            GroupDeadline::At(d) => Some(d),
            _ => None,
        }
    }
}

/// Runs `f` (a handler's start) with `peer` and `deadline` as what the handler sees of its
/// request ([`current_peer`](super::current_peer), [`current_deadline`](crate::current_deadline)),
/// inside `span` if the request has one.
fn with_context<R>(
    peer: &Option<Arc<Peer>>,
    deadline: Option<Instant>,
    span: Option<&Span>,
    f: impl FnOnce() -> R,
) -> R {
    let _entered = span.map(Span::enter);
    super::peer::with_peer(peer.as_ref(), || crate::context::with_deadline(deadline, f))
}

/// `fut` polled inside `span`, if there is one (a box more per traced request only).
fn in_span<T: 'static>(fut: BoxFuture<'static, T>, span: Option<Span>) -> BoxFuture<'static, T> {
    match span {
        Some(span) => Box::pin(fut.instrument(span)),
        None => fut,
    }
}

/// Completes at `deadline`; never without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Dispatch {
    pub(super) fn new(peer: Arc<Peer>) -> Self {
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
        // A turn's replies are one bundle already: written at once when the socket is free,
        // unless more requests are arriving, whose replies the writer task can send with these.
        let append = |fb: &mut FrameBuilder| fb.append_from(out);
        let pushed = if c.write_now {
            c.outbox.push_and_write(&c.shared.counters, append)
        } else {
            c.outbox.push(append)
        };
        if pushed.is_err() {
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
        if c.shared.limiter.is_some() {
            self.turn = Some((Instant::now(), 0));
        }
        for msg in batch.drain(..) {
            match msg {
                Message::Request { id, names, payload, ext, .. } => {
                    if let Some(status) =
                        self.refused.check(&c.shared.router, &names, ext.fingerprints.as_deref().copied())
                    {
                        out.error(id, status.code, &status.message);
                        continue;
                    }
                    let Some(deadline) = self.deadline_of(c, out, id, ext.deadline_micros) else {
                        continue;
                    };
                    let span = trace::serve_span(&names, ext.trace_parent.as_deref().copied());
                    let large = payload.len() >= c.shared.config.offload_min_bytes;
                    let same =
                        span.is_none() && self.key.as_ref().is_some_and(|(n, l)| *n == names && *l == large);
                    if !same || self.group.len() >= c.shared.config.max_batch {
                        self.flush(c, out);
                        self.key = Some((names, large));
                    }
                    self.group.push((id, payload));
                    self.deadline.add(deadline);
                    if span.is_some() {
                        self.span = span;
                        self.flush(c, out);
                    }
                }
                Message::Ping { token } => self.pings.push(token),
                Message::Cancel { id } => {
                    self.running.cancel(id);
                    self.streams.cancel(id);
                }
                Message::StreamOpen { id, shape, credit, names, ext, payload, .. } => {
                    self.flush(c, out);
                    self.key = None;
                    if let Some(deadline) = self.deadline_of(c, out, id, ext.deadline_micros) {
                        self.open_stream(c, out, (id, shape, credit), &names, payload, deadline);
                    }
                }
                Message::StreamCredit { id, credit } => self.streams.credit(id, credit),
                Message::StreamItem { id, payload } => self.streams.item(id, Some(payload)),
                Message::StreamEnd { id } => self.streams.item(id, None),
                // Auth was checked when the connection opened (a repeated one changes nothing).
                Message::Pong { .. } | Message::Auth { .. } => {}
                Message::GoAway { code, message } => {
                    tracing::debug!(%code, message = as_str(&message), "client is going away");
                }
                Message::BatchRequest { id, names, items, ext, .. } => {
                    self.flush(c, out);
                    self.key = None;
                    if let Some(status) =
                        self.refused.check(&c.shared.router, &names, ext.fingerprints.as_deref().copied())
                    {
                        out.error(id, status.code, &status.message);
                        continue;
                    }
                    if let Some(deadline) = self.deadline_of(c, out, id, ext.deadline_micros) {
                        let span = trace::serve_span(&names, ext.trace_parent.as_deref().copied());
                        self.batch(c, out, id, &names, items, (deadline, span));
                    }
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
        if let (Some(limiter), Some((read_at, answered))) = (&c.shared.limiter, self.turn.take()) {
            let now = Instant::now();
            limiter.done(answered, now - read_at, now);
        }
        // The key's names are slices of the receive buffer: kept past the turn, they would pin
        // the whole buffer (64 KiB) for as long as the connection stays idle.
        self.key = None;
        self.now = None;
        violation
    }

    /// The deadline of request `id` from the budget its caller sent: `Some(None)` for none,
    /// `Some(Some(at))`, or `None` when the budget is spent already — the request is then
    /// answered `DeadlineExceeded` at once and never runs.
    fn deadline_of(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        id: u64,
        budget_micros: Option<u32>,
    ) -> Option<Option<Instant>> {
        match budget_micros {
            None => Some(None),
            Some(0) => {
                expire(&c.shared.host, out, &[id]);
                None
            }
            Some(us) => {
                Some(Some(*self.now.get_or_insert_with(Instant::now) + Duration::from_micros(us.into())))
            }
        }
    }

    /// Hands the current group to its handler.
    fn flush(&mut self, c: &Conn<'_>, out: &mut FrameBuilder) {
        if self.group.is_empty() {
            return;
        }
        let (names, large) = self.key.as_ref().expect("a group has a key");
        let large = *large;
        let span = self.span.take();
        let deadline = self.deadline.take();
        // A long turn (a big read under load) can outlast its requests' budgets: those whose
        // caller has given up are not run.
        if deadline.is_some_and(|d| d <= Instant::now()) {
            let ids: Vec<u64> = self.group.drain(..).map(|(id, _)| id).collect();
            return expire(&c.shared.host, out, &ids);
        }
        let route = match c.shared.router.lookup(names.service(), names.method()) {
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
        // A route served request by request holds long polls, outside the limit (see
        // `ServerBuilder::handle_each`).
        if !route.alone && !self.admit_group(c, out) {
            return;
        }
        if route.alone && self.group.len() > 1 {
            for item in std::mem::take(&mut self.group) {
                self.group.push(item);
                self.serve(c, out, route, large, None, deadline);
            }
            return;
        }
        self.serve(c, out, route, large, span, deadline);
    }

    /// Starts the handler of `route` on the current group.
    fn serve(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        route: &super::router::Route,
        large: bool,
        span: Option<Span>,
        deadline: Option<Instant>,
    ) {
        // The ids are copied on every dispatch (into a reused buffer) because the requests move
        // into the handler; only a handler that waits needs them (see `start`).
        self.started.clear();
        self.started.extend(self.group.iter().map(|(id, _)| *id));
        let n = self.group.len();
        let fut = if large {
            let group = std::mem::take(&mut self.group);
            offloaded(route.handler.clone(), self.started.clone(), c.shared.config.limits, move |h, out| {
                let mut group = group;
                h.serve(&mut group, out, deadline)
            })
        } else {
            let handler = &route.handler;
            let group = &mut self.group;
            match with_context(&self.peer, deadline, span.as_ref(), || handler.serve(group, out, deadline)) {
                Some(fut) => fut,
                None => return, // a synchronous handler answered already
            }
        };
        // Under the limit, unless the route is outside it (`flush`).
        let charge = if route.alone { 0 } else { n };
        self.start(c, out, in_span(fut, span), Counted { items: n, batch: false, charge }, deadline);
    }

    /// Opens stream `id` of `names` (PROTOCOL.md §9.9), or answers why it cannot be.
    fn open_stream(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        (id, shape, credit): (u64, u8, u32),
        names: &Names,
        request: Bytes,
        deadline: Option<Instant>,
    ) {
        let route = match c.shared.router.lookup_stream(names.service(), names.method()) {
            Ok(route) => route,
            Err(status) => return out.error(id, status.code, &status.message),
        };
        let served = route.handler.shape();
        if shape != served {
            let name = |s| match s {
                shape::SERVER => "a server stream",
                shape::CLIENT => "a client stream",
                shape::BOTH => "a both-way stream",
                _ => "an unknown shape",
            };
            let why = format!(
                "{names:?} is {} (shape {served}); it was opened as {} ({shape})",
                name(served),
                name(shape)
            );
            return out.error(id, Code::BadRequest, &why);
        }
        let opened = super::stream_task::start(
            &self.streams.0,
            c.shared,
            c.outbox,
            c.inflight,
            route.handler.clone(),
            (id, credit, request),
            deadline,
        );
        match opened {
            // A stream that takes the client's items grants it its first window at once.
            Ok(()) if shape != shape::SERVER => out.stream_credit(id, super::stream::IN_WINDOW),
            Ok(()) => {}
            Err(status) => out.error(id, status.code, &status.message),
        }
    }

    /// Hands the items of batch request `id` to its handler.
    fn batch(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        id: u64,
        names: &Names,
        items: BatchItems,
        (deadline, span): (Option<Instant>, Option<Span>),
    ) {
        let route = match c.shared.router.lookup(names.service(), names.method()) {
            Ok(route) => route,
            Err(status) => return out.error(id, status.code, &status.message),
        };
        let n = items.len().max(1);
        if !c.shared.admits_chunk(n) {
            let status = c.shared.overloaded(n);
            return out.error(id, status.code, &status.message);
        }
        let Some(charge) = self.admit_batch(c, out, id, n) else {
            return;
        };
        let max_batch = c.shared.config.max_batch;
        let fut = if items.body_len() >= c.shared.config.offload_min_bytes {
            offloaded(route.handler.clone(), vec![id], c.shared.config.limits, move |h, _| {
                Some(h.serve_batch(id, items, max_batch))
            })
        } else {
            with_context(&self.peer, deadline, span.as_ref(), || {
                route.handler.serve_batch(id, items, max_batch)
            })
        };
        self.started.clear();
        self.started.push(id);
        self.start(c, out, in_span(fut, span), Counted { items: n, batch: true, charge }, deadline);
    }

    /// Admits the group under the concurrency limit (if the server has one), refusing the
    /// requests beyond it; false if none is left.
    fn admit_group(&mut self, c: &Conn<'_>, out: &mut FrameBuilder) -> bool {
        let (Some(limiter), Some((_, admitted))) = (&c.shared.limiter, &mut self.turn) else {
            return true;
        };
        let n = self.group.len();
        let take = limiter.admit(n, false);
        if take < n {
            let status = c.shared.over_limit(n - take, limiter.limit());
            self.group.drain(take..).for_each(|(id, _)| out.error(id, status.code, &status.message));
        }
        *admitted += take;
        take > 0
    }

    /// Admits batch request `id` of `n` items whole under the concurrency limit, or refuses it;
    /// what it counts as under the limit (`n` without one).
    fn admit_batch(&mut self, c: &Conn<'_>, out: &mut FrameBuilder, id: u64, n: usize) -> Option<usize> {
        let (Some(limiter), Some((_, admitted))) = (&c.shared.limiter, &mut self.turn) else {
            return Some(n);
        };
        let charge = limiter.admit(n, true);
        if charge == 0 {
            let status = c.shared.over_limit(n, limiter.limit());
            out.error(id, status.code, &status.message);
            return None;
        }
        *admitted += charge;
        Some(charge)
    }

    /// Runs the replies' future for the requests in `self.started`: if it finishes on its first
    /// poll, its replies join this turn's; if not, it continues as its own task, and its `n`
    /// requests (a batch request counts its items) count as queued work until its replies are
    /// queued. At `deadline` the task drops the handler's work: its callers have given up.
    fn start(
        &mut self,
        c: &Conn<'_>,
        out: &mut FrameBuilder,
        mut fut: BoxFuture<'static, Box<dyn Replies>>,
        Counted { items: n, batch, charge }: Counted,
        deadline: Option<Instant>,
    ) {
        if let Some(replies) = with_context(&self.peer, deadline, None, || poll_now(&mut fut)) {
            return replies.write(out);
        }
        c.shared.queued.fetch_add(n, Ordering::Relaxed);
        if batch {
            c.shared.queued_in_batches.fetch_add(n, Ordering::Relaxed);
        }
        // Under a concurrency limit the requests stay admitted until the task ends, not the turn.
        let read_at = self.turn.as_mut().map(|(read_at, admitted)| {
            *admitted -= charge;
            *read_at
        });
        let (shared, outbox, running) = (c.shared.clone(), c.outbox.clone(), self.running.clone());
        // Cloned only here, on the slow path, which spawns a task anyway.
        let ids = self.started.clone();
        let work = running.start(&ids);
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
                () = sleep_until_some(deadline) => {
                    shared.observe.expired_running.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    let _ = outbox.push(|fb| expire(&shared.host, fb, &ids));
                }
                // The client cancelled every request of this work: it stops. The answer is
                // for this side's books; the client has forgotten the ids.
                () = work.cancelled.cancelled() => {
                    shared.cancelled.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    let _ = outbox.push(|fb| ids.iter().for_each(|&id| fb.error(id, Code::Cancelled, CANCELLED)));
                }
            }
            running.finish(&ids);
            if batch {
                shared.queued_in_batches.fetch_sub(n, Ordering::Relaxed);
            }
            shared.queued.fetch_sub(n, Ordering::Relaxed);
            if let (Some(limiter), Some(read_at)) = (&shared.limiter, read_at) {
                let now = Instant::now();
                limiter.done(charge, now - read_at, now);
            }
        });
    }
}

/// What a started piece of work counts: `items` against `max_queued` (as batch items if
/// `batch`), `charge` under the concurrency limit (a batch request counts at most half of it).
struct Counted {
    items: usize,
    batch: bool,
    charge: usize,
}
