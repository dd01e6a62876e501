//! Handlers: the user's typed function for one method, and the two faces the server gives it —
//! requests as bytes (unix, tcp, tls) and requests as values (inproc).
//!
//! Every handler is a batch handler underneath: a single call is a batch of one. Panics in a
//! handler become [`Code::Panicked`] error replies; the connection and the server live on.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, MaybeDone};
use tokio::time::Instant;

use super::batch::{BatchFn, BatchResult};
use super::config::DEFAULT_MAX_BATCH;
use super::host::Host;
use super::local::LocalQueue;
use super::replies::{Replies, ReplyTo, Results, encode_payload, expire, write_result};
use crate::chunks::chunks;
use crate::codec::{CodecError, Wire};
use crate::error::Status;
use crate::metrics::method::code_index;
use crate::metrics::{Meter, MethodMetrics, Timing};
use crate::proto::encode::FrameBuilder;
use crate::proto::{BatchItems, Code};
use crate::transport::inproc::{LocalMethod, Started};

type ItemFn<Req, Resp> = dyn Fn(Req) -> BoxFuture<'static, Result<Resp, Status>> + Send + Sync;
type SyncFn<Req, Resp> = dyn Fn(Req) -> Result<Resp, Status> + Send + Sync;

/// The user's function, in the form it was registered in (panics already caught in all three).
enum Func<Req, Resp> {
    /// `handle_fn`: never waits; a batch is a loop, an inproc call a function call.
    Sync(Box<SyncFn<Req, Resp>>),
    /// `handle`: one future per request; a batch runs them concurrently.
    Item(Arc<ItemFn<Req, Resp>>),
    /// `handle_batch`: one future for the whole batch.
    Batch(Arc<BatchFn<Req, Resp>>),
}

/// How many requests of a group a synchronous handler serves between two reads of the clock.
const CLOCK_EVERY: usize = 16;

/// The handler of one method, typed.
pub(crate) struct TypedHandler<Req, Resp> {
    func: Func<Req, Resp>,
    /// Where inproc callers of a batch handler wait to be served together.
    queue: Arc<LocalQueue<Req, Resp>>,
    /// The server, once built: the queue's dispatcher runs on it.
    server: OnceLock<Weak<Host>>,
    /// The method's metrics, set when the server is built if it keeps them.
    metrics: OnceLock<Arc<MethodMetrics>>,
}

impl<Req: Wire, Resp: Wire> TypedHandler<Req, Resp> {
    fn new(func: Func<Req, Resp>) -> Self {
        TypedHandler { func, queue: LocalQueue::new(), server: OnceLock::new(), metrics: OnceLock::new() }
    }

    pub(crate) fn from_batch_fn<F, Fut>(f: F) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = BatchResult<Resp>> + Send + 'static,
    {
        Self::new(Func::Batch(Arc::new(move |reqs| {
            let n = reqs.len();
            match std::panic::catch_unwind(AssertUnwindSafe(|| f(reqs))) {
                Ok(fut) => Box::pin(AssertUnwindSafe(fut).catch_unwind().map(move |r| match r {
                    Ok(results) => exactly(n, results),
                    Err(p) => all_failed(n, &p),
                })),
                Err(p) => Box::pin(std::future::ready(all_failed(n, &p))),
            }
        })))
    }

    pub(crate) fn from_item_fn<F, Fut>(f: F) -> Self
    where
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        Self::new(Func::Item(Arc::new(move |r| {
            let fut = std::panic::catch_unwind(AssertUnwindSafe(|| f(r)));
            Box::pin(async move {
                match fut {
                    Ok(fut) => {
                        AssertUnwindSafe(fut).catch_unwind().await.unwrap_or_else(|p| Err(panicked(&p)))
                    }
                    Err(p) => Err(panicked(&p)),
                }
            })
        })))
    }

    pub(crate) fn from_sync_fn<F>(f: F) -> Self
    where
        F: Fn(Req) -> Result<Resp, Status> + Send + Sync + 'static,
    {
        Self::new(Func::Sync(Box::new(move |r| {
            std::panic::catch_unwind(AssertUnwindSafe(|| f(r))).unwrap_or_else(|p| Err(panicked(&p)))
        })))
    }

    /// Runs the handler on a batch; exactly one result per request.
    pub(crate) fn run(&self, reqs: Vec<Req>) -> BoxFuture<'static, BatchResult<Resp>> {
        match &self.func {
            Func::Sync(f) => Box::pin(std::future::ready(reqs.into_iter().map(f).collect())),
            Func::Item(f) => Box::pin(JoinItems::new(reqs.into_iter().map(|r| f(r)))),
            Func::Batch(f) => f(reqs),
        }
    }

    /// Runs the handler on a batch of any size, in parts of at most `max` requests (so that a
    /// handler never sees more than `max_batch` at once), the results concatenated.
    pub(crate) fn run_bounded(&self, reqs: Vec<Req>, max: usize) -> BoxFuture<'static, BatchResult<Resp>> {
        if reqs.len() <= max {
            return self.run(reqs);
        }
        let parts: Vec<_> = chunks(reqs, max).map(|part| self.run(part)).collect();
        Box::pin(async move { futures_util::future::join_all(parts).await.into_iter().flatten().collect() })
    }

    /// Starts measuring a batch of `n` requests, if the server keeps metrics.
    fn meter(&self, n: usize) -> Option<Meter<Arc<MethodMetrics>>> {
        self.metrics.get().map(|m| Meter::start(m.clone(), n, Timing::Batch))
    }

    fn max_batch(&self) -> usize {
        self.server.get().and_then(Weak::upgrade).map_or(DEFAULT_MAX_BATCH, |s| s.max_batch)
    }
}

/// A batch result of the wrong length (a batch handler's bug) made right, so that every
/// request still gets exactly one answer.
fn exactly<Resp>(n: usize, mut results: BatchResult<Resp>) -> BatchResult<Resp> {
    if results.len() != n {
        tracing::error!(
            expected = n,
            got = results.len(),
            "batch handler returned the wrong number of results"
        );
        results.resize_with(n, || Err(Status::new(Code::Internal, "batch handler returned too few results")));
        results.truncate(n);
    }
    results
}

/// The reply to a request whose payload does not decode as the method's request type.
fn undecodable(e: CodecError) -> Status {
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

/// The byte face of a handler, the same for every request and reply type: what a connection's
/// turn calls.
pub(crate) trait Handler: Send + Sync {
    /// Serves consecutive requests for this method (drained from `reqs`); `deadline` is the
    /// latest of theirs, if they all have one. A synchronous handler answers them at once,
    /// into `out`, and `None` is returned; otherwise the future of the replies. Payloads that
    /// do not decode are answered [`Code::BadRequest`] without reaching the handler.
    fn serve(
        &self,
        reqs: &mut Vec<(u64, Bytes)>,
        out: &mut FrameBuilder,
        deadline: Option<Instant>,
    ) -> Option<BoxFuture<'static, Box<dyn Replies>>>;
    /// Serves the items of batch request `id`: one batch reply, an item per request.
    fn serve_batch(
        &self,
        id: u64,
        items: BatchItems,
        max_batch: usize,
    ) -> BoxFuture<'static, Box<dyn Replies>>;
    /// Serves one encoded request from this process and encodes the reply (for inproc callers
    /// that forward bytes).
    fn serve_raw(&self, payload: Bytes) -> Started<Result<Bytes, Status>>;
    /// Ties the handler to its server, once built, and to its metrics if they are kept.
    fn attach(&self, server: Weak<Host>, metrics: Option<Arc<MethodMetrics>>);
    /// The server is shutting down: inproc callers queued from now on are refused.
    fn close(&self);
}

/// Decodes payloads: the values for the handler, and each undecodable one's position and error.
fn decode_all<Req: Wire>(payloads: impl Iterator<Item = Bytes>) -> (Vec<Req>, Vec<(usize, Status)>) {
    let mut values = Vec::with_capacity(payloads.size_hint().0);
    let mut bad = Vec::new();
    for (i, payload) in payloads.enumerate() {
        match Req::decode(payload) {
            Ok(v) => values.push(v),
            Err(e) => bad.push((i, undecodable(e))),
        }
    }
    (values, bad)
}

/// The handler's results for the requests that decoded, with the errors of those that did not
/// put back in their places.
fn merge<Resp>(n: usize, results: BatchResult<Resp>, bad: Vec<(usize, Status)>) -> BatchResult<Resp> {
    if bad.is_empty() {
        return results;
    }
    let (mut results, mut bad) = (results.into_iter(), bad.into_iter().peekable());
    (0..n)
        .map(|i| match bad.next_if(|(at, _)| *at == i) {
            Some((_, status)) => Err(status),
            None => results
                .next()
                .unwrap_or_else(|| Err(Status::new(Code::Internal, "handler returned too few results"))),
        })
        .collect()
}

/// Runs the handler on the requests that decoded and answers them all, to `to`.
fn answer<Req: Wire, Resp: Wire>(
    run: impl FnOnce(Vec<Req>) -> BoxFuture<'static, BatchResult<Resp>>,
    to: ReplyTo,
    n: usize,
    (values, bad): (Vec<Req>, Vec<(usize, Status)>),
    meter: Option<Meter<Arc<MethodMetrics>>>,
) -> BoxFuture<'static, Box<dyn Replies>> {
    if values.is_empty() {
        // Nothing for the handler (no request decoded): do not call it.
        let results = merge(n, Vec::new(), bad);
        if let Some(m) = meter {
            m.answered(&results);
        }
        let replies: Box<dyn Replies> = Box::new(Results::<Resp> { to, results });
        return Box::pin(std::future::ready(replies));
    }
    let fut = run(values);
    Box::pin(async move {
        let results = merge(n, fut.await, bad);
        if let Some(m) = meter {
            m.answered(&results);
        }
        Box::new(Results { to, results }) as Box<dyn Replies>
    })
}

impl<Req: Wire, Resp: Wire> Handler for TypedHandler<Req, Resp> {
    fn serve(
        &self,
        reqs: &mut Vec<(u64, Bytes)>,
        out: &mut FrameBuilder,
        deadline: Option<Instant>,
    ) -> Option<BoxFuture<'static, Box<dyn Replies>>> {
        let n = reqs.len();
        if let Func::Sync(f) = &self.func {
            // A long group of slow requests can outlast its callers' budgets: the clock is read
            // every few requests (a read per request would cost more than a fast handler), and
            // once the latest deadline has passed, the rest are not run.
            let meter = self.metrics.get().map(|m| Meter::start(&**m, n, Timing::Batch));
            let mut expired = Vec::new();
            for (i, (id, payload)) in reqs.drain(..).enumerate() {
                let check = i % CLOCK_EVERY == CLOCK_EVERY - 1;
                if !expired.is_empty() || (check && deadline.is_some_and(|d| d <= Instant::now())) {
                    expired.push(id);
                    continue;
                }
                let result = Req::decode(payload).map_err(undecodable).and_then(f);
                if let (Some(m), Err(e)) = (&meter, &result) {
                    m.method().error(code_index(e.code));
                }
                write_result(out, id, result);
            }
            if !expired.is_empty() {
                // The turn that called us holds the server, so it is there to count them.
                if let Some(server) = self.server.get().and_then(Weak::upgrade) {
                    expire(&server, out, &expired);
                }
                if let Some(m) = &meter {
                    m.method().errors(code_index(Code::DeadlineExceeded), expired.len() as u64);
                }
            }
            if let Some(m) = meter {
                m.end();
            }
            return None;
        }
        let meter = self.meter(n);
        let (ids, payloads): (Vec<u64>, Vec<Bytes>) = reqs.drain(..).unzip();
        Some(answer(|v| self.run(v), ReplyTo::Each(ids), n, decode_all::<Req>(payloads.into_iter()), meter))
    }

    fn serve_batch(
        &self,
        id: u64,
        items: BatchItems,
        max_batch: usize,
    ) -> BoxFuture<'static, Box<dyn Replies>> {
        let n = items.len();
        let decoded = decode_all::<Req>(items.requests());
        answer(|v| self.run_bounded(v, max_batch), ReplyTo::Batch(id), n, decoded, self.meter(n))
    }

    fn serve_raw(&self, payload: Bytes) -> Started<Result<Bytes, Status>> {
        let req = match Req::decode(payload) {
            Ok(req) => req,
            Err(e) => return Started::Done(Err(undecodable(e))),
        };
        match LocalMethod::call(self, req) {
            Started::Done(r) => Started::Done(r.and_then(|v| encode_payload(&v))),
            Started::Waiting(fut) => {
                Started::Waiting(Box::pin(fut.map(|r| r.and_then(|v| encode_payload(&v)))))
            }
        }
    }

    fn attach(&self, server: Weak<Host>, metrics: Option<Arc<MethodMetrics>>) {
        let _ = self.server.set(server);
        if let Some(m) = metrics {
            let _ = self.metrics.set(m);
        }
    }

    fn close(&self) {
        self.queue.close();
    }
}

impl<Req: Wire, Resp: Wire> LocalMethod<Req, Resp> for TypedHandler<Req, Resp> {
    fn call(&self, req: Req) -> Started<Result<Resp, Status>> {
        match &self.func {
            Func::Sync(f) => Started::Done(f(req)),
            Func::Item(f) => Started::Waiting(f(req)),
            Func::Batch(f) => match self.server.get().and_then(Weak::upgrade) {
                Some(server) => self.queue.push(req, f, &server),
                None => Started::Done(Err(Status::new(Code::ShuttingDown, "inproc server is gone"))),
            },
        }
    }

    fn call_chunk(&self, reqs: Vec<Req>) -> Started<BatchResult<Resp>> {
        match &self.func {
            Func::Sync(f) => Started::Done(reqs.into_iter().map(f).collect()),
            _ => Started::Waiting(self.run_bounded(reqs, self.max_batch())),
        }
    }
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
