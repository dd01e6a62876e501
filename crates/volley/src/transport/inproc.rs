//! In-process: servers of this process, found by name; a call hands the typed request value to
//! the handler and gets the typed reply back. Nothing is encoded, no byte moves.
//!
//! This is the transport's side of the seam between client and server: a server publishes
//! itself here as a [`LocalServer`], each of its methods as a [`LocalMethod`] of the method's
//! types, and a client finds them by name. Neither side names the other's types.
//!
//! How a call runs: per-item and synchronous handlers are invoked in the caller's task (the
//! components of one process call each other directly), so a call that does not wait costs a
//! function call; a batch handler's calls are queued and handed to it together by the server.
//! Either way the caller waits only for its own reply.

use std::any::Any;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, LazyLock, OnceLock, Weak};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::Instrument;

use crate::error::{Error, Status};
use crate::method::{Method, NamesKey};
use crate::proto::{Code, TraceParent};
use crate::trace;

/// A call started on a local method: finished at once (the common case), or a future.
pub(crate) enum Started<T> {
    Done(T),
    Waiting(BoxFuture<'static, T>),
}

/// One method of a local server, with its types.
pub(crate) trait LocalMethod<Req, Resp>: Send + Sync {
    /// Starts one call.
    fn call(&self, req: Req) -> Started<Result<Resp, Status>>;
    /// Starts a chunk of calls, handed to the handler together (in parts of at most the
    /// server's `max_batch`); one result per request, in order.
    fn call_chunk(&self, reqs: Vec<Req>) -> Started<Vec<Result<Resp, Status>>>;
}

/// The boxed form a local server hands out for each method: what a caller downcasts to.
pub(crate) type AnyMethod<Req, Resp> = Arc<dyn LocalMethod<Req, Resp>>;

/// A local handler's items, as values, pulled by the caller as it reads (so nothing waits
/// between the two: a caller that stops reading holds the producer where it is).
pub(crate) type LocalItems<Item> = futures_util::stream::BoxStream<'static, Result<Item, Status>>;
/// A local server stream method, as a caller downcasts it: the request in, the items out.
pub(crate) type LocalServerStream<Req, Item> = Arc<dyn Fn(Req) -> LocalItems<Item> + Send + Sync>;
/// A local client stream method: the caller's items in, the reply out.
pub(crate) type LocalClientStream<Req, Resp> =
    Arc<dyn Fn(LocalInput<Req>) -> BoxFuture<'static, Result<Resp, Status>> + Send + Sync>;
/// A local both-way stream method: the caller's items in, the handler's out.
pub(crate) type LocalBidiStream<Req, Item> = Arc<dyn Fn(LocalInput<Req>) -> LocalItems<Item> + Send + Sync>;

/// A local caller's items: a channel whose capacity is the credit the handler grants, and
/// whether the caller finished them when the channel closed (if not, it gave the stream up:
/// the handler must not take a cancelled upload for a whole one).
pub(crate) struct LocalInput<Req> {
    pub items: tokio::sync::mpsc::Receiver<Req>,
    pub finished: Arc<std::sync::atomic::AtomicBool>,
}

/// A server bound to an inproc name.
pub(crate) trait LocalServer: Send + Sync {
    /// The method `service/method`, as an [`AnyMethod`] of its types behind `Any`.
    fn method(&self, service: &str, method: &str) -> Result<&(dyn Any + Send + Sync), Status>;
    /// Stream method `service/method`: one of the `Local*Stream` types of its shape, request
    /// and item types, behind `Any`.
    fn stream_method(&self, service: &str, method: &str) -> Result<&(dyn Any + Send + Sync), Status>;
    /// Serves an already encoded request and returns the encoded reply: for layers that
    /// forward calls whose types they do not know (the registry's relay).
    fn call_raw(&self, service: &str, method: &str, payload: Bytes) -> Started<Result<Bytes, Status>>;
    /// Marks a call in flight, so that a graceful shutdown waits for it; `None` once the
    /// server is shutting down.
    fn enter(&self) -> Option<TaskTrackerToken>;
    /// Whether the server still takes calls.
    fn is_open(&self) -> bool;
    /// Completes when the server starts shutting down.
    fn closed(&self) -> BoxFuture<'static, ()>;
    /// Completes when a shutdown's drain deadline passed, with the answer a call still running
    /// then gets: its handler is dropped, as a socket server drops it.
    fn aborted(&self) -> BoxFuture<'static, Status>;
}

static SERVERS: LazyLock<Mutex<HashMap<String, Weak<dyn LocalServer>>>> = LazyLock::new(Default::default);

/// Publishes `server` under `name`. Fails if a live server already has the name.
pub(crate) fn bind(name: &str, server: Weak<dyn LocalServer>) -> Result<(), Error> {
    let mut table = SERVERS.lock();
    if table.get(name).is_some_and(|w| w.strong_count() > 0) {
        return Err(Error::InvalidAddress {
            addr: format!("inproc://{name}"),
            reason: "address in use by another server in this process".into(),
        });
    }
    table.insert(name.to_string(), server);
    Ok(())
}

/// Removes `name` if it still belongs to `server`.
pub(crate) fn unbind(name: &str, server: &Weak<dyn LocalServer>) {
    let mut table = SERVERS.lock();
    if table.get(name).is_some_and(|w| Weak::ptr_eq(w, server)) {
        table.remove(name);
    }
}

/// The live server named `name`.
pub(crate) fn lookup(name: &str) -> Option<Arc<dyn LocalServer>> {
    SERVERS.lock().get(name).and_then(Weak::upgrade)
}

/// Cache slots per connection (a power of two).
const SLOTS: usize = 8;

/// A client's connection to a server of this process: the server, and the methods called on it
/// so far. Finding a method by name in the server's router hashes and compares both names, some
/// 140 instructions, more than the rest of an inproc call to a synchronous handler; a hit here
/// is a few compares. A slot is filled once, by the first method that maps to it; a method
/// whose slot another method took is looked up each time.
pub(crate) struct LocalConn {
    pub server: Arc<dyn LocalServer>,
    methods: [Slot; SLOTS],
}

#[derive(Default)]
struct Slot {
    method: OnceLock<(NamesKey, Box<dyn Any + Send + Sync>)>,
    /// The addresses of the names the method was last found by (see [`NamesKey`]: the same
    /// names can sit at several addresses; the method's own key keeps the first). Any pair
    /// stored here points at the method's names, even one torn between two stores.
    seen: [AtomicUsize; 2],
}

impl Slot {
    #[inline]
    fn seen(&self, key: NamesKey) -> bool {
        let [s, m] = key.addresses();
        self.seen[0].load(Relaxed) == s && self.seen[1].load(Relaxed) == m
    }

    fn remember(&self, key: NamesKey) {
        let [s, m] = key.addresses();
        self.seen[0].store(s, Relaxed);
        self.seen[1].store(m, Relaxed);
    }
}

/// The connection to the live server named `name`.
pub(crate) fn connect(name: &str) -> Option<LocalConn> {
    lookup(name).map(|server| LocalConn { server, methods: Default::default() })
}

impl LocalConn {
    /// `m`'s typed face on this connection's server. A hit is always inlined: out of line, it
    /// cost twice its ~30 instructions (scripts/callcost.py, inproc-256).
    #[inline(always)]
    fn method<Req: 'static, Resp: 'static>(
        &self,
        m: &Method<Req, Resp>,
    ) -> Result<&AnyMethod<Req, Resp>, Error> {
        let key = NamesKey::of(m.service(), m.name());
        let slot = &self.methods[key.slot(SLOTS)];
        // A hit with other types than the caller's falls through to the lookup, whose error
        // says so.
        if let Some((_, any)) = slot.method.get()
            && slot.seen(key)
            && let Some(found) = any.downcast_ref::<AnyMethod<Req, Resp>>()
        {
            return Ok(found);
        }
        self.fill(slot, key, m)
    }

    /// Not found by address: the method's names at other addresses, or a lookup by name (and
    /// the slot filled if it is free).
    #[cold]
    fn fill<'a, Req: 'static, Resp: 'static>(
        &'a self,
        slot: &'a Slot,
        key: NamesKey,
        m: &Method<Req, Resp>,
    ) -> Result<&'a AnyMethod<Req, Resp>, Error> {
        if let Some((k, any)) = slot.method.get()
            && k.same_text(key)
            && let Some(found) = any.downcast_ref::<AnyMethod<Req, Resp>>()
        {
            slot.remember(key);
            return Ok(found);
        }
        let found = method(&*self.server, m)?;
        if slot.method.get().is_none() && slot.method.set((key, Box::new(found.clone()))).is_ok() {
            slot.remember(key);
        }
        Ok(found)
    }
}

fn shutting_down() -> Error {
    Error::Connection("inproc server is shutting down".into())
}

/// The method `m` of `server`, checked against the caller's types.
fn method<'s, Req: 'static, Resp: 'static>(
    server: &'s dyn LocalServer,
    m: &Method<Req, Resp>,
) -> Result<&'s AnyMethod<Req, Resp>, Error> {
    let any = server.method(m.service(), m.name()).map_err(Error::Remote)?;
    any.downcast_ref::<AnyMethod<Req, Resp>>().ok_or_else(|| {
        Error::Remote(Status::new(
            Code::BadRequest,
            format!("{m:?} is registered with other request/reply types than the caller's"),
        ))
    })
}

/// A local call, started: its result, or what its caller waits for.
pub(crate) enum Begun<T> {
    Done(T),
    Waiting(Arc<dyn LocalServer>, BoxFuture<'static, T>),
}

/// Starts `m` on `conn`'s server with `req`, in the caller's task: a handler that does not wait
/// has run when this returns. Not async, so that a client can start the call while it borrows
/// its connection and let go of it before the call waits (holding a connection across a wait
/// takes a reference count; a borrow does not). `trace`: the call's context, when its span is
/// recorded.
#[inline]
pub(crate) fn start<Req: 'static, Resp: Send + 'static>(
    conn: &LocalConn,
    m: &Method<Req, Resp>,
    req: Req,
    trace: Option<&TraceParent>,
) -> Result<Begun<Result<Resp, Status>>, Error> {
    let (names, method) = ((m.service(), m.name()), conn.method(m)?);
    if !conn.server.is_open() {
        return Err(shutting_down());
    }
    Ok(match served(trace, names, || method.call(req)) {
        Started::Done(result) => Begun::Done(result),
        Started::Waiting(fut) => Begun::Waiting(conn.server.clone(), fut),
    })
}

/// Waits for a call [`start`] began, up to `timeout`.
pub(crate) async fn finish<Resp>(
    begun: Begun<Result<Resp, Status>>,
    timeout: Duration,
) -> Result<Resp, Error> {
    let result = match begun {
        Begun::Done(result) => done(result).await,
        Begun::Waiting(server, fut) => wait(&*server, fut, timeout).await?,
    };
    result.map_err(Error::Remote)
}

/// Calls `m` on `server` with a chunk of requests, handed to the handler as one batch.
pub(crate) async fn call_chunk<Req: 'static, Resp: Send + 'static>(
    conn: &LocalConn,
    m: &Method<Req, Resp>,
    reqs: Vec<Req>,
    timeout: Duration,
    trace: Option<&TraceParent>,
) -> Result<Vec<Result<Resp, Error>>, Error> {
    let (server, names, m) = (&*conn.server, (m.service(), m.name()), conn.method(m)?);
    if !server.is_open() {
        return Err(shutting_down());
    }
    let results = match served(trace, names, || m.call_chunk(reqs)) {
        Started::Done(results) => done(results).await,
        Started::Waiting(fut) => wait(server, fut, timeout).await?,
    };
    Ok(results.into_iter().map(|r| r.map_err(Error::Remote)).collect())
}

/// Calls `service/method` on `server` with an encoded request; returns the encoded reply.
pub(crate) async fn call_raw(
    server: &dyn LocalServer,
    service: &str,
    method: &str,
    payload: Bytes,
    timeout: Duration,
    trace: Option<&TraceParent>,
) -> Result<Bytes, Error> {
    if !server.is_open() {
        return Err(shutting_down());
    }
    let result = match served(trace, (service, method), || server.call_raw(service, method, payload)) {
        Started::Done(result) => done(result).await,
        Started::Waiting(fut) => wait(server, fut, timeout).await?,
    };
    result.map_err(Error::Remote)
}

/// Starts a call in the span that serves it, when the caller's span is recorded (`trace`):
/// a handler that runs at once runs inside it, one that waits is instrumented with it, so
/// either way the calls it makes are the span's children, as over a socket. (A batch handler's
/// requests are queued and served together elsewhere: the span covers the wait.) Without a
/// trace this is the bare call: no span is made and nothing is held across the wait.
#[inline]
fn served<T: Send + 'static>(
    trace: Option<&TraceParent>,
    (service, method): (&str, &str),
    start: impl FnOnce() -> Started<T>,
) -> Started<T> {
    let Some(span) = trace.and_then(|tp| trace::serve_span_named(service, method, Some(*tp))) else {
        return start();
    };
    match span.in_scope(start) {
        Started::Waiting(fut) => Started::Waiting(Box::pin(fut.instrument(span))),
        done => done,
    }
}

/// Immediate calls that count against tokio's cooperative budget: one in this many.
const BUDGET_EVERY: u8 = 8;

/// Whether this call, which finished at once, counts against tokio's cooperative budget: one
/// such call in [`BUDGET_EVERY`] on a thread does, so that a loop of calls that never wait
/// still yields to the runtime (after some 1,000 calls rather than 128). Counting every call
/// cost ~45 instructions, a twentieth of the call (scripts/callcost.py, inproc-256).
#[inline]
pub(crate) fn owes_budget() -> bool {
    thread_local!(static IMMEDIATE: Cell<u8> = const { Cell::new(0) });
    IMMEDIATE.with(|n| {
        n.set(n.get().wrapping_add(1));
        n.get() % BUDGET_EVERY == 0
    })
}

/// A call that finished at once: no timer, no bookkeeping, and its share of the budget.
async fn done<T>(v: T) -> T {
    if owes_budget() {
        tokio::task::consume_budget().await;
    }
    v
}

/// A call that waits, in the caller's task: the server's shutdown waits for it, and `timeout`
/// bounds it.
async fn wait<T>(
    server: &dyn LocalServer,
    mut fut: BoxFuture<'static, T>,
    timeout: Duration,
) -> Result<T, Error> {
    // Nothing of the call has run yet if the server is shutting down (futures are lazy; a
    // batch handler's request is queued already, and its reply is dropped with this future).
    let Some(_in_flight) = server.enter() else { return Err(shutting_down()) };
    if let Poll::Ready(v) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        tokio::task::consume_budget().await;
        return Ok(v);
    }
    // The handler runs in the caller's task, so the server cannot drop it itself when its
    // shutdown's deadline passes: the call watches for that.
    tokio::select! {
        biased;
        done = tokio::time::timeout(timeout, fut) => done.map_err(|_| Error::Timeout(timeout)),
        status = server.aborted() => Err(Error::Remote(status)),
    }
}
