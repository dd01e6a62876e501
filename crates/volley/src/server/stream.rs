//! Server streams (PROTOCOL.md §9.9): the handler of a stream method, the streams a connection
//! has open, and the task that sends one stream's items as its credit allows.
//!
//! The producer is the handler's `Stream`. It is polled only while the client has granted
//! credit, so a client that stops reading holds the producer where it is: a stream's unsent
//! items never exceed its window. Items ready at once are encoded into one bundle.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, Stream, StreamExt};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use crate::codec::Wire;
use crate::error::Status;
use crate::metrics::StreamCounts;
use crate::proto::Code;
use crate::proto::encode::BuildError;
use crate::transport::outbox::Outbox;

/// Most items encoded into one bundle before it is handed to the writer: enough to amortize
/// the outbox's lock, small enough that other streams and calls interleave.
const MAX_BUNDLE: usize = 64;

/// Credit a stream may hold: far beyond any window, far below the semaphore's own limit (which
/// it would panic at), so a client that grants without end cannot crash the server.
const MAX_CREDIT: usize = 1 << 40;

type OpenFn<Req, Item> =
    dyn Fn(Req) -> BoxFuture<'static, Result<BoxStream<'static, Result<Item, Status>>, Status>> + Send + Sync;

/// The handler of one stream method, its types erased: it decodes the request, opens the
/// handler's stream and sends its items through `sink`, and says how the stream ended.
pub(crate) trait StreamHandler: Send + Sync {
    fn serve(&self, request: Bytes, sink: Sink) -> BoxFuture<'static, Result<(), Status>>;
}

/// A stream method's handler, typed.
pub(crate) struct TypedStreamHandler<Req, Item> {
    open: Arc<OpenFn<Req, Item>>,
}

impl<Req: Wire, Item: Wire> TypedStreamHandler<Req, Item> {
    pub(crate) fn new<F, Fut, S>(f: F) -> Self
    where
        F: Fn(Req) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<S, Status>> + Send + 'static,
        S: Stream<Item = Result<Item, Status>> + Send + 'static,
    {
        let open = move |req| -> BoxFuture<'static, _> {
            let fut = f(req);
            Box::pin(async move { fut.await.map(|s| Box::pin(s) as BoxStream<'static, _>) })
        };
        TypedStreamHandler { open: Arc::new(open) }
    }
}

impl<Req: Wire, Item: Wire> StreamHandler for TypedStreamHandler<Req, Item> {
    fn serve(&self, request: Bytes, sink: Sink) -> BoxFuture<'static, Result<(), Status>> {
        let open = self.open.clone();
        Box::pin(async move {
            let req = Req::decode(request)
                .map_err(|e| Status::new(Code::BadRequest, format!("request does not decode: {}", e.0)))?;
            let items = open(req).await?;
            // A producer that panics ends the stream with `Panicked` after the items it made.
            let items = AssertUnwindSafe(items).catch_unwind().map(|r| r.unwrap_or_else(|_| Err(panicked())));
            sink.send_all(Box::pin(items)).await
        })
    }
}

/// Where one stream's items go: its connection's outbox, under its credit.
pub(crate) struct Sink {
    id: u64,
    outbox: Arc<Outbox>,
    open: Arc<Open>,
    shared: Arc<Shared>,
}

impl Sink {
    /// Sends every item of `items` as credit allows; the stream's end is the caller's to send.
    async fn send_all<Item: Wire>(
        &self,
        mut items: BoxStream<'static, Result<Item, Status>>,
    ) -> Result<(), Status> {
        let mut ready: Vec<Item> = Vec::new();
        loop {
            // Credit first: a consumer that stopped taking items stops the producer here.
            self.open.credit.acquire().await.map_err(|_| gone())?.forget();
            let Some(first) = items.next().await else { return Ok(()) };
            ready.push(first?);
            let mut end = None;
            while ready.len() < MAX_BUNDLE {
                let Ok(permit) = self.open.credit.try_acquire() else { break };
                match items.next().now_or_never() {
                    Some(Some(Ok(item))) => {
                        permit.forget();
                        ready.push(item);
                    }
                    Some(Some(Err(status))) => {
                        end = Some(Err(status));
                        break;
                    }
                    Some(None) => {
                        end = Some(Ok(()));
                        break;
                    }
                    None => break,
                }
            }
            self.send(&mut ready)?;
            if let Some(end) = end {
                return end;
            }
        }
    }

    /// Encodes `ready` (drained) into the outbox as one bundle.
    fn send<Item: Wire>(&self, ready: &mut Vec<Item>) -> Result<(), Status> {
        let (id, n) = (self.id, ready.len());
        let pushed = self.outbox.push(|fb| {
            for item in ready.drain(..) {
                fb.stream_item(id, |b| item.encode(b))?;
            }
            Ok(())
        });
        match pushed {
            Ok(Ok(())) => {
                self.shared.observe.streams.items.fetch_add(n as u64, Ordering::Relaxed);
                Ok(())
            }
            Ok(Err(BuildError::Payload(e))) => {
                Err(Status::new(Code::Internal, format!("a stream item could not be encoded: {}", e.0)))
            }
            Ok(Err(BuildError::TooLarge { len, max })) => Err(Status::new(
                Code::TooLarge,
                format!("a stream item of {len} bytes does not fit in a frame of {max}"),
            )),
            Ok(Err(BuildError::TooManyItems { .. })) => Err(gone()),
            Err(_closed) => Err(gone()),
        }
    }
}

fn gone() -> Status {
    Status::new(Code::Cancelled, "the connection closed")
}

/// One open stream: the credit its client granted, and whether it still wants the stream.
pub(super) struct Open {
    credit: Semaphore,
    cancelled: CancellationToken,
}

/// The streams of one connection, by id, for the client's credit and cancels.
#[derive(Default)]
pub(super) struct OpenStreams {
    by_id: Mutex<FxHashMap<u64, Arc<Open>>>,
    /// Cancelled when the connection stops reading: its client can grant no more credit.
    gone: CancellationToken,
}

impl OpenStreams {
    /// Registers stream `id` with `credit`; `None` if a stream of that id is open already.
    fn open(&self, id: u64, credit: u32) -> Option<Arc<Open>> {
        let open = Arc::new(Open {
            credit: Semaphore::new((credit as usize).min(MAX_CREDIT)),
            cancelled: self.gone.child_token(),
        });
        let mut by_id = self.by_id.lock();
        if by_id.contains_key(&id) {
            return None;
        }
        by_id.insert(id, open.clone());
        Some(open)
    }

    /// More credit for stream `id`; unknown ids are fine (the credit crossed the stream's end).
    pub fn credit(&self, id: u64, credit: u32) {
        if let Some(open) = self.by_id.lock().get(&id) {
            let room = MAX_CREDIT.saturating_sub(open.credit.available_permits());
            open.credit.add_permits((credit as usize).min(room));
        }
    }

    /// The client no longer wants stream `id`: its producer is dropped.
    pub fn cancel(&self, id: u64) {
        if let Some(open) = self.by_id.lock().remove(&id) {
            open.cancelled.cancel();
        }
    }

    /// Ends every stream: the connection reads no more.
    fn end_all(&self) {
        self.gone.cancel();
    }

    fn close(&self, id: u64) {
        self.by_id.lock().remove(&id);
    }
}

/// A connection's streams, ended when it is dropped: the connection reads no more, so its
/// client can neither grant credit nor cancel.
#[derive(Default)]
pub(super) struct ConnStreams(pub Arc<OpenStreams>);

impl std::ops::Deref for ConnStreams {
    type Target = OpenStreams;
    fn deref(&self) -> &OpenStreams {
        &self.0
    }
}

impl Drop for ConnStreams {
    fn drop(&mut self) {
        self.0.end_all();
    }
}

/// How a stream ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The producer finished: `StreamEnd`.
    Done,
    /// The handler (or the framework on its behalf: a bad request, a panic) sent an error.
    Failed,
    /// The client cancelled it, or its connection closed.
    Cancelled,
    /// Its deadline passed.
    Deadline,
    /// The server shut down.
    Shutdown,
}

/// The error of a stream whose handler panicked.
fn panicked() -> Status {
    Status::new(Code::Panicked, "the stream's handler panicked")
}

/// Opens stream `id` and runs it as a task of the connection: `handler` produces, the task
/// sends its end (`StreamEnd` or `Error`) unless the client cancelled it. Answers at once, in
/// `out`, a stream that cannot be opened.
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    streams: &Arc<OpenStreams>,
    shared: &Arc<Shared>,
    outbox: &Arc<Outbox>,
    inflight: &tokio_util::task::TaskTracker,
    handler: Arc<dyn StreamHandler>,
    (id, credit, request): (u64, u32, Bytes),
    deadline: Option<Instant>,
) -> Result<(), Status> {
    let Some(open) = streams.open(id, credit) else {
        return Err(Status::new(Code::BadRequest, format!("stream id {id:#x} is open already")));
    };
    let stats = &shared.observe.streams;
    stats.opened.fetch_add(1, Ordering::Relaxed);
    let sink = Sink { id, outbox: outbox.clone(), open: open.clone(), shared: shared.clone() };
    let work = AssertUnwindSafe(handler.serve(request, sink)).catch_unwind();
    let (streams, shared, outbox) = (streams.clone(), shared.clone(), outbox.clone());
    inflight.spawn(async move {
        let (how, ended) = tokio::select! {
            r = work => {
                let r = r.unwrap_or_else(|_| Err(panicked()));
                (if r.is_ok() { Ended::Done } else { Ended::Failed }, r)
            }
            _ = open.cancelled.cancelled() => {
                if shared.is_closing() {
                    (Ended::Shutdown, Err(Status::new(Code::ShuttingDown, "server is shutting down")))
                } else {
                    (Ended::Cancelled, Err(gone()))
                }
            }
            () = super::dispatch::sleep_until_some(deadline) => {
                (Ended::Deadline, Err(Status::new(Code::DeadlineExceeded, "the stream's deadline passed")))
            }
        };
        streams.close(id);
        shared.observe.streams.ended(how);
        // A cancelled stream's client has forgotten its id, or its connection is gone.
        if how != Ended::Cancelled {
            let _ = outbox.push(|fb| match &ended {
                Ok(()) => fb.stream_end(id),
                Err(s) => fb.error(id, s.code, &s.message),
            });
        }
    });
    Ok(())
}

/// What a server counts of its streams (shown by its metrics).
#[derive(Default)]
pub(crate) struct StreamStats {
    pub opened: AtomicU64,
    pub items: AtomicU64,
    /// By [`Ended`], in its order.
    ended: [AtomicU64; 5],
}

impl StreamStats {
    fn ended(&self, how: Ended) {
        self.ended[how as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> StreamCounts {
        let n = |how: Ended| self.ended[how as usize].load(Ordering::Relaxed);
        StreamCounts {
            opened: self.opened.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            ended: [
                ("done", n(Ended::Done)),
                ("error", n(Ended::Failed)),
                ("cancelled", n(Ended::Cancelled)),
                ("deadline", n(Ended::Deadline)),
                ("shutdown", n(Ended::Shutdown)),
            ],
        }
    }
}
