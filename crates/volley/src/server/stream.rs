//! Server streams (PROTOCOL.md §9.9): the handler of a stream method, the streams a connection
//! has open, and the task that sends one stream's items as its credit allows.
//!
//! The producer is the handler's `Stream`. It is polled only while the client has granted
//! credit, so a client that stops reading holds the producer where it is: a stream's unsent
//! items never exceed its window. Items ready at once are encoded into one bundle.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, Stream, StreamExt};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::codec::Wire;
use crate::error::Status;
use crate::metrics::StreamCounts;
use crate::proto::Code;
use crate::proto::encode::BuildError;
use crate::proto::message::shape;
use crate::transport::inproc::{
    LocalBidiStream, LocalClientStream, LocalInput, LocalItems, LocalServerStream,
};
use crate::transport::outbox::Outbox;

/// Most items encoded into one bundle before it is handed to the writer: enough to amortize
/// the outbox's lock, small enough that other streams and calls interleave.
const MAX_BUNDLE: usize = 64;

/// Credit a stream may hold: far beyond any window, far below the semaphore's own limit (which
/// it would panic at), so a client that grants without end cannot crash the server.
const MAX_CREDIT: usize = 1 << 40;

type OpenFn<Req, Item> =
    dyn Fn(Req) -> BoxFuture<'static, Result<BoxStream<'static, Result<Item, Status>>, Status>> + Send + Sync;

/// The handler of one stream method, its types erased: it decodes the request (or takes the
/// client's items from `input`), sends its items through `sink`, and says how its side of the
/// stream ended.
pub(crate) trait StreamHandler: Send + Sync {
    /// The stream's shape (`proto::message::shape`).
    fn shape(&self) -> u8;
    /// The handler's face for callers of this process: a `transport::inproc` stream type of its
    /// request and item types, behind `Any`.
    fn local(&self) -> &(dyn Any + Send + Sync);
    fn serve(&self, request: Bytes, input: Option<Input>, sink: Sink) -> BoxFuture<'static, Finished>;
}

/// How a handler's side of a stream ended: `Ok(None)` for `StreamEnd`, `Ok(Some(reply))` for
/// a client stream's `Reply`, or the error.
pub(crate) type Finished = Result<Option<Bytes>, Status>;

/// Items the server grants a client (or both-way) stream at its open, and again each half of
/// it the handler takes.
pub(crate) const IN_WINDOW: u32 = 64;

/// The client's items of one stream as the connection hands them over (`None`: its end).
pub(crate) struct Input {
    rx: mpsc::UnboundedReceiver<Option<Bytes>>,
}

/// A stream method's handler, typed.
pub(crate) struct TypedStreamHandler<Req, Item> {
    open: Arc<OpenFn<Req, Item>>,
    /// A [`LocalServerStream`] of `Req` and `Item`.
    local: Box<dyn Any + Send + Sync>,
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
        let open: Arc<OpenFn<Req, Item>> = Arc::new(open);
        let opener = open.clone();
        let local: LocalServerStream<Req, Item> = Arc::new(move |req| local_items(opener(req)));
        TypedStreamHandler { open, local: Box::new(local) }
    }
}

impl<Req: Wire, Item: Wire> StreamHandler for TypedStreamHandler<Req, Item> {
    fn local(&self) -> &(dyn Any + Send + Sync) {
        &*self.local
    }

    fn shape(&self) -> u8 {
        shape::SERVER
    }

    fn serve(&self, request: Bytes, _: Option<Input>, sink: Sink) -> BoxFuture<'static, Finished> {
        let open = self.open.clone();
        Box::pin(async move {
            let req = Req::decode(request)
                .map_err(|e| Status::new(Code::BadRequest, format!("request does not decode: {}", e.0)))?;
            let items = open(req).await?;
            sink.send_all(items).await.map(|()| None)
        })
    }
}

type InFn<Req, Out> = dyn Fn(Incoming<Req>) -> BoxFuture<'static, Result<Out, Status>> + Send + Sync;

/// A client stream's handler (shape 2): the client's items in, one reply out.
pub(crate) struct ClientStreamHandler<Req, Resp> {
    f: Arc<InFn<Req, Resp>>,
    /// A [`LocalClientStream`] of `Req` and `Resp`.
    local: Box<dyn Any + Send + Sync>,
}

impl<Req: Wire, Resp: Wire> ClientStreamHandler<Req, Resp> {
    pub(crate) fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(Incoming<Req>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let f: Arc<InFn<Req, Resp>> = Arc::new(move |input| -> BoxFuture<'static, _> { Box::pin(f(input)) });
        let g = f.clone();
        let local: LocalClientStream<Req, Resp> = Arc::new(move |input| {
            let reply = AssertUnwindSafe(g(Incoming::local(input))).catch_unwind();
            Box::pin(reply.map(|r| r.unwrap_or_else(|_| Err(panicked()))))
        });
        ClientStreamHandler { f, local: Box::new(local) }
    }
}

impl<Req: Wire, Resp: Wire> StreamHandler for ClientStreamHandler<Req, Resp> {
    fn local(&self) -> &(dyn Any + Send + Sync) {
        &*self.local
    }

    fn shape(&self) -> u8 {
        shape::CLIENT
    }

    fn serve(&self, _: Bytes, input: Option<Input>, sink: Sink) -> BoxFuture<'static, Finished> {
        let f = self.f.clone();
        Box::pin(async move {
            let reply = f(sink.incoming(input)).await?;
            let mut b = bytes::BytesMut::new();
            reply.encode(&mut b).map_err(|e| {
                Status::new(Code::Internal, format!("the reply could not be encoded: {}", e.0))
            })?;
            Ok(Some(b.freeze()))
        })
    }
}

/// A both-way stream's handler (shape 3): the client's items in, the handler's items out.
pub(crate) struct BidiStreamHandler<Req, Item> {
    f: Arc<InFn<Req, BoxStream<'static, Result<Item, Status>>>>,
    /// A [`LocalBidiStream`] of `Req` and `Item`.
    local: Box<dyn Any + Send + Sync>,
}

impl<Req: Wire, Item: Wire> BidiStreamHandler<Req, Item> {
    pub(crate) fn new<F, Fut, S>(f: F) -> Self
    where
        F: Fn(Incoming<Req>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<S, Status>> + Send + 'static,
        S: Stream<Item = Result<Item, Status>> + Send + 'static,
    {
        let f = move |input| -> BoxFuture<'static, _> {
            let fut = f(input);
            Box::pin(async move { fut.await.map(|s| Box::pin(s) as BoxStream<'static, _>) })
        };
        let f: Arc<InFn<Req, BoxStream<'static, Result<Item, Status>>>> = Arc::new(f);
        let g = f.clone();
        let local: LocalBidiStream<Req, Item> = Arc::new(move |input| local_items(g(Incoming::local(input))));
        BidiStreamHandler { f, local: Box::new(local) }
    }
}

impl<Req: Wire, Item: Wire> StreamHandler for BidiStreamHandler<Req, Item> {
    fn local(&self) -> &(dyn Any + Send + Sync) {
        &*self.local
    }

    fn shape(&self) -> u8 {
        shape::BOTH
    }

    fn serve(&self, _: Bytes, input: Option<Input>, sink: Sink) -> BoxFuture<'static, Finished> {
        let f = self.f.clone();
        Box::pin(async move {
            let items = f(sink.incoming(input)).await?;
            sink.send_all(items).await.map(|()| None)
        })
    }
}

/// A handler's items for a caller of this process: the stream it opens with, pulled by the
/// caller as it reads. An open that fails, or a producer that panics, ends it with the error.
fn local_items<Item: Send + 'static>(
    opened: BoxFuture<'static, Result<BoxStream<'static, Result<Item, Status>>, Status>>,
) -> LocalItems<Item> {
    let items = futures_util::stream::once(opened).flat_map(|r| match r {
        Ok(items) => items,
        Err(status) => futures_util::stream::iter([Err(status)]).boxed(),
    });
    AssertUnwindSafe(items).catch_unwind().map(|r| r.unwrap_or_else(|_| Err(panicked()))).boxed()
}

/// The client's items of a client or both-way stream, as its handler reads them: a `Stream`
/// of requests that ends after the client's last. Taking items grants the client credit for
/// more, so a handler that reads slowly holds the client's sender back.
pub struct Incoming<T> {
    from: From<T>,
    done: bool,
}

/// Where a handler's incoming items come from.
enum From<T> {
    /// A client over a connection: encoded items, and the outbox for the credit it is granted.
    Peer { rx: mpsc::UnboundedReceiver<Option<Bytes>>, outbox: Arc<Outbox>, id: u64, taken: u32 },
    /// A client of this process: the values themselves, through a channel whose capacity is
    /// the client's credit.
    Local(LocalInput<T>),
}

impl<T> Incoming<T> {
    /// The items of an inproc client.
    pub(crate) fn local(input: LocalInput<T>) -> Self {
        Incoming { from: From::Local(input), done: false }
    }
}

impl<T: Wire> Stream for Incoming<T> {
    type Item = Result<T, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let (rx, outbox, id, taken) = match &mut this.from {
            From::Peer { rx, outbox, id, taken } => (rx, outbox, *id, taken),
            From::Local(input) => {
                return match input.items.poll_recv(cx) {
                    Poll::Ready(Some(item)) => Poll::Ready(Some(Ok(item))),
                    Poll::Ready(None) => {
                        this.done = true;
                        if input.finished.load(Ordering::Acquire) {
                            Poll::Ready(None)
                        } else {
                            Poll::Ready(Some(Err(Status::new(
                                Code::Cancelled,
                                "the client gave the stream up",
                            ))))
                        }
                    }
                    Poll::Pending => Poll::Pending,
                };
            }
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(Some(payload))) => {
                *taken += 1;
                if *taken >= IN_WINDOW / 2 {
                    let n = std::mem::take(taken);
                    let _ = outbox.push(|fb| fb.stream_credit(id, n));
                }
                let item = T::decode(payload).map_err(|e| {
                    Status::new(Code::BadRequest, format!("a stream item does not decode: {}", e.0))
                });
                Poll::Ready(Some(item))
            }
            Poll::Ready(Some(None) | None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T> std::fmt::Debug for Incoming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = match &self.from {
            From::Peer { id, .. } => Some(*id),
            From::Local(_) => None,
        };
        f.debug_struct("Incoming").field("id", &id).field("done", &self.done).finish()
    }
}

/// Where one stream's items go: its connection's outbox, under its credit.
pub(crate) struct Sink {
    id: u64,
    outbox: Arc<Outbox>,
    open: Arc<Open>,
    stats: Arc<StreamStats>,
}

impl Sink {
    pub(super) fn new(id: u64, outbox: Arc<Outbox>, open: Arc<Open>, stats: Arc<StreamStats>) -> Sink {
        Sink { id, outbox, open, stats }
    }

    /// The client's items, for the handler (none if the shape has none).
    fn incoming<T>(&self, input: Option<Input>) -> Incoming<T> {
        let rx = input.map_or_else(|| mpsc::unbounded_channel().1, |i| i.rx);
        let from = From::Peer { rx, outbox: self.outbox.clone(), id: self.id, taken: 0 };
        Incoming { from, done: false }
    }

    /// Sends every item of `items` as credit allows; the stream's end is the caller's to send.
    /// A producer that panics ends the stream with `Panicked` after the items it made.
    async fn send_all<Item: Wire>(
        &self,
        items: BoxStream<'static, Result<Item, Status>>,
    ) -> Result<(), Status> {
        let mut items = AssertUnwindSafe(items).catch_unwind().map(|r| r.unwrap_or_else(|_| Err(panicked())));
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
                self.stats.items.fetch_add(n as u64, Ordering::Relaxed);
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

pub(super) fn gone() -> Status {
    Status::new(Code::Cancelled, "the connection closed")
}

/// One open stream: the credit its client granted, and whether it still wants the stream.
pub(super) struct Open {
    credit: Semaphore,
    pub(super) cancelled: CancellationToken,
    /// Where the client's items go (client and both-way streams).
    items: Option<mpsc::UnboundedSender<Option<Bytes>>>,
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
    /// (With a channel for its items if it `takes_items`.)
    pub(super) fn open(&self, id: u64, credit: u32, takes_items: bool) -> Option<(Arc<Open>, Option<Input>)> {
        let (items, input) = match takes_items {
            true => {
                let (tx, rx) = mpsc::unbounded_channel();
                (Some(tx), Some(Input { rx }))
            }
            false => (None, None),
        };
        let open = Arc::new(Open {
            credit: Semaphore::new((credit as usize).min(MAX_CREDIT)),
            cancelled: self.gone.child_token(),
            items,
        });
        let mut by_id = self.by_id.lock();
        if by_id.contains_key(&id) {
            return None;
        }
        by_id.insert(id, open.clone());
        Some((open, input))
    }

    /// An item of stream `id` from the client (`None`: its end). Ignored for a stream that
    /// takes none, or one that has ended (the item crossed the end).
    pub fn item(&self, id: u64, item: Option<Bytes>) {
        if let Some(tx) = self.by_id.lock().get(&id).and_then(|o| o.items.as_ref()) {
            let _ = tx.send(item);
        }
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

    pub(super) fn close(&self, id: u64) {
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
pub(super) fn panicked() -> Status {
    Status::new(Code::Panicked, "the stream's handler panicked")
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
    pub(crate) fn ended(&self, how: Ended) {
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
