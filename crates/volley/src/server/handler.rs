//! Handlers: the user's typed functions, wrapped so that the server can call them on a batch of
//! raw payloads (unix, tcp) or of typed values (inproc).
//!
//! Every handler is a batch handler underneath: a single call is a batch of one. Panics in a
//! handler become [`Code::Panicked`] error replies; the connection and the server live on.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, MaybeDone};
use rustc_hash::FxHashMap;

use super::inproc::InprocQueue;
use crate::codec::Wire;
use crate::error::Status;
use crate::proto::encode::{BuildError, FrameBuilder, ZERO_COPY_MIN};
use crate::proto::{BatchItems, Code};

/// What a batch handler returns: one result per request, in request order.
pub type BatchResult<Resp> = Vec<Result<Resp, Status>>;

type BatchFn<Req, Resp> = dyn Fn(Vec<Req>) -> BoxFuture<'static, BatchResult<Resp>> + Send + Sync;
type ItemFn<Req, Resp> = dyn Fn(Req) -> BoxFuture<'static, Result<Resp, Status>> + Send + Sync;
type SyncFn<Req, Resp> = dyn Fn(Req) -> Result<Resp, Status> + Send + Sync;

/// The handler of one method, typed.
pub(crate) struct TypedHandler<Req, Resp> {
    f: Box<BatchFn<Req, Resp>>,
    /// For handlers registered per item: the item function itself, which inproc callers
    /// invoke directly (panics already caught).
    pub(crate) item: Option<Box<ItemFn<Req, Resp>>>,
    /// For handlers registered as plain functions: called directly by inproc callers, with no
    /// future and no allocation (panics already caught).
    pub(crate) sync_item: Option<Arc<SyncFn<Req, Resp>>>,
    pub(crate) inproc: InprocQueue<Req, Resp>,
}

impl<Req: Wire, Resp: Wire> TypedHandler<Req, Resp> {
    pub(crate) fn from_batch_fn<F, Fut>(f: F) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = BatchResult<Resp>> + Send + 'static,
    {
        TypedHandler {
            f: Box::new(move |reqs| Box::pin(f(reqs))),
            item: None,
            sync_item: None,
            inproc: InprocQueue::new(),
        }
    }

    pub(crate) fn from_item_fn<F, Fut>(f: F) -> Self
    where
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let f = Arc::new(f);
        let direct = f.clone();
        let mut h = Self::from_batch_fn(move |reqs: Vec<Req>| {
            let f = f.clone();
            JoinItems::new(reqs.into_iter().map(move |r| guard_item(&*f, r)))
        });
        h.item = Some(Box::new(move |r| Box::pin(guard_item(&*direct, r))));
        h
    }

    /// A synchronous handler for work that never waits (lookups, arithmetic, echo). A batch is a
    /// plain loop over its requests — no future per request — and an inproc call is a function
    /// call. It runs on the connection's task, so it must not block.
    pub(crate) fn from_sync_fn<F>(f: F) -> Self
    where
        F: Fn(Req) -> Result<Resp, Status> + Send + Sync + 'static,
    {
        let f: Arc<SyncFn<Req, Resp>> = Arc::new(move |r| {
            std::panic::catch_unwind(AssertUnwindSafe(|| f(r))).unwrap_or_else(|p| Err(panicked(&p)))
        });
        let batch = f.clone();
        let mut h = Self::from_batch_fn(move |reqs: Vec<Req>| {
            std::future::ready(reqs.into_iter().map(|r| batch(r)).collect::<BatchResult<Resp>>())
        });
        h.sync_item = Some(f);
        h
    }

    /// Runs the handler on a batch of any size, in parts of at most `max` requests (so a
    /// handler never sees more than `max_batch` at once), concatenating the results.
    pub(crate) fn run_bounded(&self, reqs: Vec<Req>, max: usize) -> BoxFuture<'static, BatchResult<Resp>> {
        if reqs.len() <= max {
            return self.run(reqs);
        }
        let mut parts = Vec::new();
        let mut rest = reqs.into_iter();
        loop {
            let part: Vec<Req> = rest.by_ref().take(max).collect();
            if part.is_empty() {
                break;
            }
            parts.push(self.run(part));
        }
        Box::pin(async move { futures_util::future::join_all(parts).await.into_iter().flatten().collect() })
    }

    /// Runs the handler on a batch; the result always has exactly one entry per request.
    pub(crate) fn run(&self, reqs: Vec<Req>) -> BoxFuture<'static, BatchResult<Resp>> {
        let n = reqs.len();
        let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| (self.f)(reqs))) {
            Ok(fut) => fut,
            Err(p) => return Box::pin(std::future::ready(all_failed(n, &p))),
        };
        Box::pin(AssertUnwindSafe(fut).catch_unwind().map(move |r| match r {
            Ok(mut results) => {
                if results.len() != n {
                    tracing::error!(
                        expected = n,
                        got = results.len(),
                        "batch handler returned the wrong number of results"
                    );
                    results.resize_with(n, || {
                        Err(Status::new(Code::Internal, "batch handler returned too few results"))
                    });
                    results.truncate(n);
                }
                results
            }
            Err(p) => all_failed(n, &p),
        }))
    }
}

fn guard_item<Req, Resp, F, Fut>(
    f: &F,
    req: Req,
) -> impl Future<Output = Result<Resp, Status>> + use<Req, Resp, F, Fut>
where
    F: Fn(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let fut = std::panic::catch_unwind(AssertUnwindSafe(|| f(req)));
    async move {
        match fut {
            Ok(fut) => AssertUnwindSafe(fut).catch_unwind().await.unwrap_or_else(|p| Err(panicked(&p))),
            Err(p) => Err(panicked(&p)),
        }
    }
}

/// The reply to a request whose payload does not decode as the method's request type.
fn undecodable(e: crate::codec::CodecError) -> Status {
    Status::new(Code::BadRequest, format!("request could not be decoded: {e}"))
}

/// The text of a panic's payload.
pub(super) fn panic_message(p: &Box<dyn Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

fn panicked(p: &Box<dyn Any + Send>) -> Status {
    let what = panic_message(p);
    tracing::error!(panic = %what, "handler panicked");
    Status::new(Code::Panicked, format!("handler panicked: {what}"))
}

fn all_failed<Resp>(n: usize, p: &Box<dyn Any + Send>) -> BatchResult<Resp> {
    let status = panicked(p);
    (0..n).map(|_| Err(status.clone())).collect()
}

/// Joins the per-item futures of a batch, keeping them in one allocation.
///
/// Hand-written instead of `futures::future::join_all` because that one boxes every future in
/// a `FuturesOrdered` above 30 items — one allocation per request, on the hot path. Here all
/// futures live in one slice and are polled in place; handlers that finish on their first
/// poll (the common case) cost one pass.
struct JoinItems<F: Future> {
    items: Pin<Box<[MaybeDone<F>]>>,
}

impl<F: Future> JoinItems<F> {
    fn new(iter: impl Iterator<Item = F>) -> Self {
        JoinItems { items: Box::into_pin(iter.map(MaybeDone::Future).collect()) }
    }
}

impl<F: Future> Future for JoinItems<F> {
    type Output = Vec<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut all_done = true;
        for item in iter_pin_mut(self.items.as_mut()) {
            all_done &= item.poll(cx).is_ready();
        }
        if !all_done {
            return Poll::Pending;
        }
        let mut items = std::mem::replace(&mut self.items, Box::into_pin(Box::new([])));
        Poll::Ready(
            iter_pin_mut(items.as_mut()).map(|i| i.take_output().expect("every item is done")).collect(),
        )
    }
}

/// Pinned references to the elements of a pinned slice.
fn iter_pin_mut<T>(slice: Pin<&mut [T]>) -> impl Iterator<Item = Pin<&mut T>> {
    // SAFETY: the elements of a pinned slice are pinned too; we never move them out.
    unsafe { slice.get_unchecked_mut() }.iter_mut().map(|t| unsafe { Pin::new_unchecked(t) })
}

/// The type-erased face of a handler, used by byte transports.
pub(crate) trait ErasedHandler: Send + Sync {
    /// Decodes the payloads, runs the handler and returns a writer of the replies. Payloads
    /// that do not decode are answered with [`Code::BadRequest`] without reaching the handler.
    fn call(&self, reqs: Vec<(u64, Bytes)>) -> BoxFuture<'static, Box<dyn ReplyWriter>>;

    /// For synchronous handlers (`handle_fn`): decodes the payloads (draining `reqs`), runs the
    /// handler on each at once and keeps the results in `arena` — no future, no box, no vector
    /// from the heap. `None` (and `reqs` untouched) for async handlers.
    fn call_sync<'a>(&self, reqs: &mut Vec<(u64, Bytes)>, arena: &'a bumpalo::Bump) -> Option<TurnBox<'a>>;

    /// The same for the items of one batch request `id`; the writer produces one batch reply.
    fn call_chunk(
        &self,
        id: u64,
        items: BatchItems,
        max_batch: usize,
    ) -> BoxFuture<'static, Box<dyn ReplyWriter>>;
}

/// Writes a finished batch's replies into a connection's outgoing frames.
pub(crate) trait ReplyWriter: Send {
    fn write(self: Box<Self>, fb: &mut FrameBuilder);

    /// Encodes the reply payloads now, on this thread, into a writer that only links or copies
    /// bytes: the offload path calls it on the codec pool so that `write`, which runs under the
    /// connection's outbox lock, does no encoding.
    fn encoded(self: Box<Self>) -> Box<dyn ReplyWriter>;
}

/// One reply payload encoded on its own: a zero-copy type's bytes, or a fresh buffer.
fn encode_payload<Resp: Wire>(resp: &Resp) -> Result<Bytes, Status> {
    if let Some(b) = resp.as_bytes() {
        return Ok(b);
    }
    let mut buf = bytes::BytesMut::new();
    match resp.encode(&mut buf) {
        Ok(()) => Ok(buf.freeze()),
        Err(e) => Err(Status::new(Code::Internal, format!("reply could not be encoded: {e}"))),
    }
}

/// Replies of a synchronous handler kept in the turn's arena until they are written.
pub(crate) trait TurnReplies {
    /// Writes (and drops) the replies; a second call writes nothing.
    fn write(&mut self, fb: &mut FrameBuilder);
}

/// A synchronous handler's results for one turn, in the arena: (request id, result).
struct ArenaReplies<'a, Resp> {
    items: bumpalo::collections::Vec<'a, (u64, Result<Resp, Status>)>,
}

impl<Resp: Wire> TurnReplies for ArenaReplies<'_, Resp> {
    fn write(&mut self, fb: &mut FrameBuilder) {
        for (id, result) in self.items.drain(..) {
            match result {
                Ok(resp) => write_reply(fb, id, &resp),
                Err(status) => fb.error(id, status.code, &status.message),
            }
        }
    }
}

/// The arena-allocated, type-erased replies of one synchronous handler call.
pub(crate) type TurnBox<'a> = bumpalo::boxed::Box<'a, dyn TurnReplies + 'a>;

struct TypedReplies<Resp> {
    ids: Vec<u64>,
    results: BatchResult<Resp>,
    bad: Vec<(u64, Status)>,
}

impl<Resp: Wire> ReplyWriter for TypedReplies<Resp> {
    fn write(self: Box<Self>, fb: &mut FrameBuilder) {
        for (id, status) in self.bad {
            fb.error(id, status.code, &status.message);
        }
        for (id, result) in self.ids.into_iter().zip(self.results) {
            match result {
                Ok(resp) => write_reply(fb, id, &resp),
                Err(status) => fb.error(id, status.code, &status.message),
            }
        }
    }

    fn encoded(self: Box<Self>) -> Box<dyn ReplyWriter> {
        let TypedReplies { ids, results, bad } = *self;
        let replies = ids.into_iter().zip(results).map(|(id, r)| (id, r.and_then(|v| encode_payload(&v))));
        Box::new(EncodedReplies { bad, replies: replies.collect() })
    }
}

/// [`TypedReplies`] with their payloads already encoded.
struct EncodedReplies {
    bad: Vec<(u64, Status)>,
    replies: Vec<(u64, Result<Bytes, Status>)>,
}

impl ReplyWriter for EncodedReplies {
    fn write(self: Box<Self>, fb: &mut FrameBuilder) {
        for (id, status) in self.bad {
            fb.error(id, status.code, &status.message);
        }
        for (id, result) in self.replies {
            match result {
                Ok(payload) => {
                    let result = fb.reply_bytes(id, payload).map_err(widen::<std::convert::Infallible>);
                    report_reply_error(fb, id, result)
                }
                Err(status) => fb.error(id, status.code, &status.message),
            }
        }
    }

    fn encoded(self: Box<Self>) -> Box<dyn ReplyWriter> {
        self
    }
}

/// A build error of a ready-made payload (which cannot fail to encode) as any payload's.
fn widen<E>(e: BuildError<std::convert::Infallible>) -> BuildError<E> {
    match e {
        BuildError::TooLarge { len, max } => BuildError::TooLarge { len, max },
        BuildError::TooManyItems { count, max } => BuildError::TooManyItems { count, max },
    }
}

/// Appends one encoded reply, or an error reply if it cannot be encoded or is too large.
pub(crate) fn write_reply<Resp: Wire>(fb: &mut FrameBuilder, id: u64, resp: &Resp) {
    let result = match resp.as_bytes() {
        Some(b) if b.len() >= ZERO_COPY_MIN => fb.reply_bytes(id, b).map_err(widen),
        _ => fb.reply(id, |buf| resp.encode(buf)),
    };
    report_reply_error(fb, id, result);
}

/// Replaces a reply that could not be appended with an error reply saying why.
fn report_reply_error<E: std::fmt::Display>(
    fb: &mut FrameBuilder,
    id: u64,
    result: Result<(), BuildError<E>>,
) {
    match result {
        Ok(()) => {}
        Err(BuildError::Payload(e)) => {
            fb.error(id, Code::Internal, &format!("reply could not be encoded: {e}"))
        }
        Err(BuildError::TooLarge { len, max }) => {
            fb.error(id, Code::TooLarge, &format!("reply of {len} bytes exceeds the frame limit of {max}"))
        }
        Err(BuildError::TooManyItems { .. }) => unreachable!("a single reply has no items"),
    }
}

/// The replies to one batch request: one batch reply with a result per item, in item order.
struct ChunkReplies<Resp> {
    id: u64,
    len: usize,
    /// Results of the items that decoded, in order.
    results: BatchResult<Resp>,
    /// Items that did not decode: (position, error), in position order.
    bad: Vec<(usize, Status)>,
}

impl<Resp: Wire> ChunkReplies<Resp> {
    /// Every item's result in position order: the handler's results merged with the items
    /// that did not decode.
    fn in_order(self) -> (u64, impl Iterator<Item = Result<Resp, Status>>) {
        let ChunkReplies { id, len, results, bad } = self;
        let mut results = results.into_iter();
        let mut bad = bad.into_iter().peekable();
        let items = (0..len).map(move |i| match bad.next_if(|(at, _)| *at == i) {
            Some((_, status)) => Err(status),
            None => results
                .next()
                .unwrap_or_else(|| Err(Status::new(Code::Internal, "handler returned too few results"))),
        });
        (id, items)
    }
}

impl<Resp: Wire> ReplyWriter for ChunkReplies<Resp> {
    fn write(self: Box<Self>, fb: &mut FrameBuilder) {
        let (id, results) = self.in_order();
        let written = fb.batch_reply(id, |items| {
            for result in results {
                match result {
                    Ok(resp) => items.ok(|buf| resp.encode(buf)),
                    Err(status) => items.err(status.code, &status.message),
                }
            }
        });
        report_chunk_error(fb, id, written);
    }

    fn encoded(self: Box<Self>) -> Box<dyn ReplyWriter> {
        let (id, results) = self.in_order();
        let results = results.map(|r| r.and_then(|v| encode_payload(&v))).collect();
        Box::new(EncodedChunk { id, results })
    }
}

/// [`ChunkReplies`] with their payloads already encoded.
struct EncodedChunk {
    id: u64,
    results: Vec<Result<Bytes, Status>>,
}

impl ReplyWriter for EncodedChunk {
    fn write(self: Box<Self>, fb: &mut FrameBuilder) {
        let EncodedChunk { id, results } = *self;
        let written = fb.batch_reply(id, |items| {
            for result in results {
                match result {
                    Ok(b) => items.ok(|buf| {
                        buf.extend_from_slice(&b);
                        Ok::<(), std::convert::Infallible>(())
                    }),
                    Err(status) => items.err(status.code, &status.message),
                }
            }
        });
        report_chunk_error(fb, id, written);
    }

    fn encoded(self: Box<Self>) -> Box<dyn ReplyWriter> {
        self
    }
}

/// Replaces a batch reply that could not be appended with an error reply saying why.
fn report_chunk_error<E>(fb: &mut FrameBuilder, id: u64, written: Result<(), BuildError<E>>) {
    if let Err(e) = written {
        let why = match e {
            BuildError::TooLarge { len, max } => {
                format!("batch reply of {len} bytes exceeds the frame limit of {max}")
            }
            BuildError::TooManyItems { count, max } => {
                format!("batch reply of {count} items exceeds the limit of {max}")
            }
            BuildError::Payload(_) => "batch reply could not be built".to_string(),
        };
        fb.error(id, Code::TooLarge, &why);
    }
}

impl<Req: Wire, Resp: Wire> ErasedHandler for TypedHandler<Req, Resp> {
    fn call_sync<'a>(&self, reqs: &mut Vec<(u64, Bytes)>, arena: &'a bumpalo::Bump) -> Option<TurnBox<'a>> {
        let f = self.sync_item.as_ref()?;
        let mut items = bumpalo::collections::Vec::with_capacity_in(reqs.len(), arena);
        for (id, payload) in reqs.drain(..) {
            let result = match Req::decode(payload) {
                Ok(req) => f(req),
                Err(e) => Err(undecodable(e)),
            };
            items.push((id, result));
        }
        let replies: &'a mut ArenaReplies<'a, Resp> = arena.alloc(ArenaReplies { items });
        let replies: *mut (dyn TurnReplies + 'a) = replies;
        // SAFETY: the value was just allocated in `arena` and nothing else refers to it; the
        // box drops it in place when it goes (the arena never frees it separately).
        Some(unsafe { bumpalo::boxed::Box::from_raw(replies) })
    }

    fn call_chunk(
        &self,
        id: u64,
        items: BatchItems,
        max_batch: usize,
    ) -> BoxFuture<'static, Box<dyn ReplyWriter>> {
        let len = items.len();
        let mut values = Vec::with_capacity(len);
        let mut bad = Vec::new();
        for (i, payload) in items.requests().enumerate() {
            match Req::decode(payload) {
                Ok(v) => values.push(v),
                Err(e) => bad.push((i, undecodable(e))),
            }
        }
        if values.is_empty() {
            // Nothing for the handler (an empty chunk, or no item decoded): do not call it.
            let replies: Box<dyn ReplyWriter> =
                Box::new(ChunkReplies::<Resp> { id, len, results: Vec::new(), bad });
            return Box::pin(std::future::ready(replies));
        }
        let fut = self.run_bounded(values, max_batch);
        Box::pin(async move {
            let results = fut.await;
            Box::new(ChunkReplies { id, len, results, bad }) as Box<dyn ReplyWriter>
        })
    }

    fn call(&self, reqs: Vec<(u64, Bytes)>) -> BoxFuture<'static, Box<dyn ReplyWriter>> {
        let mut ids = Vec::with_capacity(reqs.len());
        let mut values = Vec::with_capacity(reqs.len());
        let mut bad = Vec::new();
        for (id, payload) in reqs {
            match Req::decode(payload) {
                Ok(v) => {
                    ids.push(id);
                    values.push(v);
                }
                Err(e) => bad.push((id, undecodable(e))),
            }
        }
        if values.is_empty() {
            let replies: Box<dyn ReplyWriter> =
                Box::new(TypedReplies::<Resp> { ids, results: Vec::new(), bad });
            return Box::pin(std::future::ready(replies));
        }
        let fut = self.run(values);
        Box::pin(async move {
            let results = fut.await;
            Box::new(TypedReplies { ids, results, bad }) as Box<dyn ReplyWriter>
        })
    }
}

/// One registered method: its byte-level face and, for inproc callers, its typed self.
pub(crate) struct Route {
    pub erased: Arc<dyn ErasedHandler>,
    pub typed: Arc<dyn Any + Send + Sync>,
    /// Closes the inproc queue at shutdown.
    pub close_inproc: Box<dyn Fn() + Send + Sync>,
}

/// Service name -> method name -> route. Built once; lookups take no lock.
#[derive(Default)]
pub(crate) struct Router {
    services: FxHashMap<Box<str>, FxHashMap<Box<str>, Arc<Route>>>,
}

impl Router {
    pub fn insert(&mut self, service: &str, method: &str, route: Route) -> bool {
        self.services.entry(service.into()).or_default().insert(method.into(), Arc::new(route)).is_none()
    }

    pub fn lookup(&self, service: &str, method: &str) -> Result<&Arc<Route>, Status> {
        let methods = self
            .services
            .get(service)
            .ok_or_else(|| Status::new(Code::UnknownService, format!("no service named {service:?}")))?;
        methods.get(method).ok_or_else(|| {
            Status::new(Code::UnknownMethod, format!("service {service:?} has no method {method:?}"))
        })
    }

    pub fn service_names(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(|s| &**s)
    }

    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.services.values().flat_map(|m| m.values())
    }
}
