//! The inproc path: callers in this process hand typed request values to a per-method queue;
//! a dispatcher task on the server's runtime drains it in batches of up to `max_batch`, runs
//! the handler, and hands each typed reply straight back. Nothing is encoded.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::Shared;
use super::handler::{BatchResult, TypedHandler};
use crate::codec::Wire;
use crate::error::{Error, Status};
use crate::method::Method;
use crate::proto::Code;

pub(crate) type ReplyTx<Resp> = oneshot::Sender<Result<Resp, Error>>;

/// The queue of inproc requests for one method.
pub(crate) struct InprocQueue<Req, Resp> {
    state: Mutex<QueueState<Req, Resp>>,
}

struct QueueState<Req, Resp> {
    items: Vec<(Req, ReplyTx<Resp>)>,
    dispatcher: Option<Waker>,
    running: bool,
    closed: bool,
}

/// What `push` asks the caller to do next.
enum Pushed {
    /// The dispatcher is running (and was woken if it slept).
    Queued,
    /// No dispatcher runs yet: start one.
    StartDispatcher,
}

impl<Req, Resp> InprocQueue<Req, Resp> {
    pub(crate) fn new() -> Self {
        InprocQueue {
            state: Mutex::new(QueueState {
                items: Vec::new(),
                dispatcher: None,
                running: false,
                closed: false,
            }),
        }
    }

    fn push(&self, req: Req, tx: ReplyTx<Resp>) -> Result<Pushed, Error> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(Error::Connection("inproc server is shutting down".into()));
        }
        st.items.push((req, tx));
        if !st.running {
            st.running = true;
            return Ok(Pushed::StartDispatcher);
        }
        let w = st.dispatcher.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
        Ok(Pushed::Queued)
    }

    /// Refuses new requests; the dispatcher still serves those already queued, then stops.
    pub(crate) fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        let w = st.dispatcher.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Ready once something is queued or the queue is closed.
    fn poll_queued(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if !st.items.is_empty() || st.closed {
            return Poll::Ready(());
        }
        st.dispatcher = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Takes up to `max` queued requests; `false` once closed and drained.
    fn take(&self, out: &mut Vec<(Req, ReplyTx<Resp>)>, max: usize) -> bool {
        let mut st = self.state.lock();
        if st.items.is_empty() {
            st.running = false;
            return false;
        }
        if st.items.len() <= max {
            std::mem::swap(&mut st.items, out);
        } else {
            out.extend(st.items.drain(..max));
        }
        true
    }
}

/// The dispatcher: drains the queue in batches and completes each caller's reply.
async fn dispatch_loop<Req: Wire, Resp: Wire>(handler: Arc<TypedHandler<Req, Resp>>, shared: Arc<Shared>) {
    let max = shared.config.max_batch;
    let mut batch = Vec::new();
    let yield_first = crate::transport::outbox::lifo_runtime();
    loop {
        if crate::transport::outbox::wait(|cx| handler.inproc.poll_queued(cx)).await && yield_first {
            // As in the outbox writer: let the other callers queue before taking the batch.
            tokio::task::yield_now().await;
        }
        if !handler.inproc.take(&mut batch, max) {
            break;
        }
        let (reqs, txs): (Vec<Req>, Vec<ReplyTx<Resp>>) = batch.drain(..).unzip();
        let mut fut = handler.run(reqs);
        // Fast handlers finish on the first poll: complete them here without a task hop.
        // The noop waker is safe: a pending future is spawned, and its task polls it again.
        match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(results) => complete(txs, results),
            Poll::Pending => {
                shared.tasks.spawn(async move { complete(txs, fut.await) });
            }
        }
    }
}

fn complete<Resp>(txs: Vec<ReplyTx<Resp>>, results: BatchResult<Resp>) {
    for (tx, r) in txs.into_iter().zip(results) {
        // A caller that timed out has dropped its receiver: the reply is dropped with it.
        let _ = tx.send(r.map_err(Error::Remote));
    }
}

/// Calls `m` on an inproc server.
pub(crate) async fn call<Req: Wire, Resp: Wire>(
    shared: &Arc<Shared>,
    m: &Method<Req, Resp>,
    req: Req,
    timeout: Duration,
) -> Result<Resp, Error> {
    let route = shared.router.lookup(m.service(), m.name()).map_err(Error::Remote)?;
    let Some(handler) = route.typed.downcast_ref::<TypedHandler<Req, Resp>>() else {
        return Err(Error::Remote(Status::new(
            Code::BadRequest,
            format!("{m:?} is registered with other request/reply types than the caller's"),
        )));
    };
    if let Some(f) = &handler.sync_item {
        if shared.shutdown.is_cancelled() {
            return Err(Error::Connection("inproc server is shutting down".into()));
        }
        let result = f(req);
        // Never waits, so it must still count against the cooperative budget (see call_direct).
        tokio::task::consume_budget().await;
        return result.map_err(Error::Remote);
    }
    if let Some(item) = &handler.item {
        return call_direct(shared, item(req), timeout).await;
    }
    let (tx, rx) = oneshot::channel();
    if let Pushed::StartDispatcher = handler.inproc.push(req, tx)? {
        let typed = route.typed.clone().downcast::<TypedHandler<Req, Resp>>().expect("checked above");
        let shared2 = shared.clone();
        shared.spawn(dispatch_loop(typed, shared2));
    }
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(Error::Connection("inproc server dropped the request".into())),
        Err(_) => Err(Error::Timeout(timeout)),
    }
}

/// Per-item handlers are invoked directly in the caller's task (seed's MF-light: components
/// call each other directly): no queue, no task switch, no timer unless the handler does not
/// finish on its first poll. There is no per-message cost to amortize in-process, so batching
/// would only add work here; batch handlers still receive batches through the queue.
async fn call_direct<Resp>(
    shared: &Arc<Shared>,
    mut fut: futures_util::future::BoxFuture<'static, Result<Resp, Status>>,
    timeout: Duration,
) -> Result<Resp, Error> {
    if shared.shutdown.is_cancelled() {
        return Err(Error::Connection("inproc server is shutting down".into()));
    }
    // Counts as in flight for graceful shutdown until the reply is handed back.
    let _in_flight = shared.tasks.token();
    let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
    let result = match first {
        Poll::Ready(r) => {
            // A call that completes without ever waiting must still count against the task's
            // cooperative budget, or a loop of inproc calls would never yield to the runtime.
            tokio::task::consume_budget().await;
            r
        }
        Poll::Pending => tokio::time::timeout(timeout, fut).await.map_err(|_| Error::Timeout(timeout))?,
    };
    result.map_err(Error::Remote)
}

/// Calls `m` on an inproc server with a chunk of requests: the handler gets the chunk as one
/// batch (split at `max_batch`), directly in the caller's task, nothing encoded.
pub(crate) async fn call_chunk<Req: Wire, Resp: Wire>(
    shared: &Arc<Shared>,
    m: &Method<Req, Resp>,
    chunk: Vec<Req>,
    timeout: Duration,
) -> Result<Vec<Result<Resp, Error>>, Error> {
    let route = shared.router.lookup(m.service(), m.name()).map_err(Error::Remote)?;
    let Some(handler) = route.typed.downcast_ref::<TypedHandler<Req, Resp>>() else {
        return Err(Error::Remote(Status::new(
            Code::BadRequest,
            format!("{m:?} is registered with other request/reply types than the caller's"),
        )));
    };
    if shared.shutdown.is_cancelled() {
        return Err(Error::Connection("inproc server is shutting down".into()));
    }
    let _in_flight = shared.tasks.token();
    let mut fut = handler.run_bounded(chunk, shared.config.max_batch);
    let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
    let results = match first {
        Poll::Ready(r) => {
            tokio::task::consume_budget().await;
            r
        }
        Poll::Pending => tokio::time::timeout(timeout, fut).await.map_err(|_| Error::Timeout(timeout))?,
    };
    Ok(results.into_iter().map(|r| r.map_err(Error::Remote)).collect())
}

/// Calls `service`/`method` on an inproc server with an encoded request and returns the
/// encoded reply: the byte path of a socket connection, minus the socket. Used by
/// [`Client::call_raw`](crate::Client::call_raw) (the registry's relay forwards calls whose
/// types it does not know). Not a fast path: the reply is written as a frame and decoded.
pub(crate) async fn call_raw(
    shared: &Arc<Shared>,
    service: &str,
    method: &str,
    payload: bytes::Bytes,
    timeout: Duration,
) -> Result<bytes::Bytes, Error> {
    use crate::proto::{Decoder, FrameBuilder, Message, decode_frame};

    if shared.shutdown.is_cancelled() {
        return Err(Error::Connection("inproc server is shutting down".into()));
    }
    let route = shared.router.lookup(service, method).map_err(Error::Remote)?.clone();
    let _in_flight = shared.tasks.token();
    let writer = tokio::time::timeout(timeout, route.erased.call(vec![(0, payload)]))
        .await
        .map_err(|_| Error::Timeout(timeout))?;
    let limits = shared.config.limits;
    let mut fb = FrameBuilder::new(limits);
    writer.write(&mut fb);
    let mut segments = Vec::new();
    fb.take_into(&mut segments);
    let mut buf = bytes::BytesMut::new();
    segments.iter().for_each(|s| buf.extend_from_slice(s));
    let mut messages = Vec::new();
    let mut decoder = Decoder::after_preamble(limits);
    while let Some(frame) = decoder.next_frame(&mut buf).map_err(Error::Protocol)? {
        decode_frame(&frame, &limits, &mut messages).map_err(Error::Protocol)?;
    }
    match messages.pop() {
        Some(Message::Reply { payload, .. }) => Ok(payload),
        Some(Message::Error { code, message, .. }) => {
            Err(Error::Remote(Status::new(code, crate::proto::message::as_str(&message))))
        }
        _ => Err(Error::Remote(Status::new(Code::Internal, "handler produced no reply"))),
    }
}
