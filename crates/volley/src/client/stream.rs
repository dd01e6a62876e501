//! Server streams on the client (PROTOCOL.md §9.9): the streams a connection has open, by id,
//! and [`Streaming`], the `Stream` a caller reads one from.
//!
//! The reader hands a stream's items to its channel; the caller's `Streaming` grants the server
//! credit again each time it has taken half of its window, so items the caller has not taken
//! are bounded by the window, whatever the server's pace.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc};

use super::conn::StreamConn;
use super::stream_table::Event;
use super::{Client, Conn};
use crate::codec::Wire;
use crate::error::Error;
use crate::method::{BidiStreamMethod, ClientStreamMethod, StreamMethod};
use crate::proto::message::shape;
use crate::trace;
use crate::transport::inproc::{
    LocalBidiStream, LocalClientStream, LocalInput, LocalItems, LocalServer, LocalServerStream,
};

/// Default window of a stream: items the server may send ahead of the caller.
pub const DEFAULT_WINDOW: u32 = 256;

/// Options of one stream.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct StreamOptions {
    /// How long the whole stream may last; `None` (the default): until it ends or is dropped
    /// (a stream opened by a handler still ends at that handler's deadline). Sent to the server
    /// as the stream's budget, so it stops producing at the same time.
    pub timeout: Option<Duration>,
    /// Items the server may send before the caller takes them (the stream's credit window);
    /// at least 2. Default 256.
    pub window: u32,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions { timeout: None, window: DEFAULT_WINDOW }
    }
}

impl StreamOptions {
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    pub fn window(mut self, items: u32) -> Self {
        self.window = items.max(2);
        self
    }
}

/// A server stream being read: a [`Stream`] of the server's items, each a `Result` (a
/// failed stream yields its error once, then ends). Dropping it before the end cancels the
/// stream: the server stops its producer.
pub struct Streaming<T> {
    from: Source<T>,
    /// Keeps the connection open while the stream is read, even if every other handle to the
    /// client is gone.
    _client: Client,
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
    /// The task sending a both-way stream's requests ([`fed_by`](Self::fed_by)): stopped with
    /// the stream.
    feeder: Option<tokio::task::AbortHandle>,
    /// Whether the server was sent the stream's budget (its `DeadlineExceeded` is then the
    /// stream's time-out, seen first by the server).
    sent_budget: bool,
    done: bool,
}

/// Where a stream's items come from.
enum Source<T> {
    /// A server over a connection: encoded items, credit granted back as they are taken.
    Peer {
        rx: mpsc::UnboundedReceiver<Event>,
        conn: Arc<StreamConn>,
        id: u64,
        window: u32,
        /// Items taken since credit was last granted.
        taken: u32,
        _item: PhantomData<fn() -> T>,
    },
    /// A server of this process: its handler's items as values, pulled as they are read (so
    /// nothing is buffered between the two), and the server's shutdown, which ends them.
    /// (`None` once cancelled.)
    Local { items: Option<LocalItems<T>>, closed: BoxFuture<'static, ()> },
}

impl<T> Streaming<T> {
    pub(crate) fn new(
        (conn, client): (Arc<StreamConn>, Client),
        (id, rx): (u64, mpsc::UnboundedReceiver<Event>),
        window: u32,
        timeout: Option<Duration>,
        sent_budget: bool,
    ) -> Self {
        let from = Source::Peer { rx, conn, id, window, taken: 0, _item: PhantomData };
        Self::from_source(from, client, timeout, sent_budget)
    }

    /// A stream from a server of this process.
    fn local(
        items: LocalItems<T>,
        server: &dyn LocalServer,
        client: Client,
        timeout: Option<Duration>,
    ) -> Self {
        let from = Source::Local { items: Some(items), closed: server.closed() };
        Self::from_source(from, client, timeout, false)
    }

    fn from_source(from: Source<T>, client: Client, timeout: Option<Duration>, sent_budget: bool) -> Self {
        Streaming {
            from,
            _client: client,
            deadline: timeout.map(|t| (Box::pin(tokio::time::sleep(t)), t)),
            feeder: None,
            sent_budget,
            done: false,
        }
    }

    /// The stream's request id (0 for a stream from a server of this process, which has none).
    pub fn id(&self) -> u64 {
        match &self.from {
            Source::Peer { id, .. } => *id,
            Source::Local { .. } => 0,
        }
    }

    /// A both-way stream whose requests are `items`, sent through `sender` by a task of their
    /// own as the server grants room (so reading this stream and sending never wait on each
    /// other), then finished. The task stops when `items` ends, when the stream ends, or when
    /// this `Streaming` is dropped.
    pub fn fed_by<Req, S>(mut self, mut sender: StreamSender<Req>, items: S) -> Self
    where
        Req: Wire,
        S: Stream<Item = Req> + Send + 'static,
    {
        let task = tokio::spawn(async move {
            let mut items = std::pin::pin!(items);
            while let Some(item) = futures_util::StreamExt::next(&mut items).await {
                if sender.send(item).await.is_err() {
                    // The stream ended: its reader learns why.
                    return;
                }
            }
            sender.finish();
        });
        self.feeder = Some(task.abort_handle());
        self
    }

    /// Ends the stream here: the server is told to stop (its producer is dropped), and what
    /// is still in flight is dropped.
    fn cancel(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            match &mut self.from {
                Source::Peer { conn, id, .. } => conn.cancel_stream(*id),
                // Dropping the items drops the handler's producer now.
                Source::Local { items, .. } => *items = None,
            }
        }
    }

    fn timed_out(&mut self) -> Option<Error> {
        let (sleep, t) = self.deadline.as_mut()?;
        if sleep.is_elapsed() {
            let t = *t;
            self.cancel();
            return Some(Error::Timeout(t));
        }
        None
    }
}

impl<T: Wire> Stream for Streaming<T> {
    type Item = Result<T, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(e) = this.timed_out() {
            return Poll::Ready(Some(Err(e)));
        }
        let polled = match &mut this.from {
            Source::Peer { rx, conn, id, window, taken, .. } => match rx.poll_recv(cx) {
                Poll::Ready(Some(Event::Item(payload))) => {
                    *taken += 1;
                    if *taken >= *window / 2 {
                        conn.grant(*id, std::mem::take(taken));
                    }
                    Poll::Ready(Some(T::decode(payload).map_err(|e| Error::Decode(e.0))))
                }
                Poll::Ready(Some(Event::End | Event::Reply(_) | Event::Credit(_))) => Poll::Ready(None),
                Poll::Ready(Some(Event::Failed(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    Poll::Ready(Some(Err(Error::Connection("the connection dropped the stream".into()))))
                }
                Poll::Pending => Poll::Pending,
            },
            Source::Local { items: None, .. } => Poll::Ready(None),
            Source::Local { items: Some(items), closed } => {
                if closed.as_mut().poll(cx).is_ready() {
                    Poll::Ready(Some(Err(Error::Connection("inproc server is shutting down".into()))))
                } else {
                    match items.as_mut().poll_next(cx) {
                        Poll::Ready(Some(Ok(item))) => return Poll::Ready(Some(Ok(item))),
                        Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(Error::Remote(status)))),
                        Poll::Ready(None) => Poll::Ready(None),
                        Poll::Pending => Poll::Pending,
                    }
                }
            }
        };
        match polled {
            Poll::Ready(Some(Ok(item))) => Poll::Ready(Some(Ok(item))),
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                let e = match (e, &this.deadline) {
                    (Error::Remote(s), Some((_, t)))
                        if s.code == crate::Code::DeadlineExceeded && this.sent_budget =>
                    {
                        Error::Timeout(*t)
                    }
                    (e, _) => e,
                };
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some((sleep, t)) = this.deadline.as_mut()
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    let t = *t;
                    this.cancel();
                    return Poll::Ready(Some(Err(Error::Timeout(t))));
                }
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for Streaming<T> {
    fn drop(&mut self) {
        self.cancel();
        if let Some(feeder) = &self.feeder {
            feeder.abort();
        }
    }
}

impl<T> std::fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming").field("id", &self.id()).field("done", &self.done).finish()
    }
}

/// The sending half of a client or both-way stream: `send` waits for the server's credit (a
/// server whose handler reads slowly holds the sender back), `finish` says the last item was
/// sent. Dropped unfinished, it finishes.
pub struct StreamSender<T> {
    to: Sink<T>,
    finished: bool,
}

/// Where a sender's items go.
enum Sink<T> {
    /// A server over a connection, under the credit it grants.
    Peer { conn: Arc<StreamConn>, _client: Client, id: u64, credit: Arc<Semaphore> },
    /// A handler of this process, through a channel whose capacity is its credit (`None`
    /// once ended), and the flag that tells its end from a cancel.
    Local(Option<mpsc::Sender<T>>, Arc<AtomicBool>),
}

impl<T: Wire> StreamSender<T> {
    pub(crate) fn new(conn: Arc<StreamConn>, client: Client, id: u64, credit: Arc<Semaphore>) -> Self {
        StreamSender { to: Sink::Peer { conn, _client: client, id, credit }, finished: false }
    }

    /// Sends `item` once the server has room for it. Fails once the stream has ended (the
    /// stream's reader, or `finish` of a client stream, says why) or was finished here.
    pub async fn send(&mut self, item: T) -> Result<(), Error> {
        let ended = || Error::Usage("the stream has ended: it takes no more items".into());
        if self.finished {
            return Err(Error::Usage("the stream was finished: it takes no more items".into()));
        }
        match &self.to {
            Sink::Peer { conn, id, credit, .. } => {
                credit.acquire().await.map_err(|_| ended())?.forget();
                conn.send_item(*id, &item)
            }
            Sink::Local(tx, _) => match tx {
                Some(tx) => tx.send(item).await.map_err(|_| ended()),
                None => Err(ended()),
            },
        }
    }

    /// Sends the end of the items (the server's handler sees its stream of requests end).
    pub fn finish(&mut self) {
        if !std::mem::replace(&mut self.finished, true) {
            self.end();
        }
    }
}

impl<T> StreamSender<T> {
    /// A sender to a handler of this process, and the items it reads.
    fn local() -> (Self, LocalInput<T>) {
        let (tx, items) = mpsc::channel(LOCAL_CREDIT);
        let finished = Arc::new(AtomicBool::new(false));
        let sender = StreamSender { to: Sink::Local(Some(tx), finished.clone()), finished: false };
        (sender, LocalInput { items, finished })
    }

    fn end(&mut self) {
        match &mut self.to {
            Sink::Peer { conn, id, .. } => conn.end_items(*id),
            Sink::Local(tx, finished) => {
                finished.store(true, Ordering::Release);
                *tx = None;
            }
        }
    }

    /// Gives the whole stream up (its reply too).
    fn cancel(&mut self) {
        self.finished = true;
        match &mut self.to {
            Sink::Peer { conn, id, .. } => conn.cancel_stream(*id),
            Sink::Local(tx, _) => *tx = None,
        }
    }

    fn id(&self) -> Option<u64> {
        match &self.to {
            Sink::Peer { id, .. } => Some(*id),
            Sink::Local(..) => None,
        }
    }
}

impl<T> Drop for StreamSender<T> {
    fn drop(&mut self) {
        if !std::mem::replace(&mut self.finished, true) {
            self.end();
        }
    }
}

impl<T> std::fmt::Debug for StreamSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSender").field("id", &self.id()).field("finished", &self.finished).finish()
    }
}

/// A client stream being written: `send` its items, then `finish` for the server's one
/// reply. Dropped before `finish`, it cancels the stream.
pub struct Upload<Req, Resp> {
    sender: StreamSender<Req>,
    reply: Reply<Resp>,
    timeout: Option<(tokio::time::Instant, Duration)>,
    sent_budget: bool,
    done: bool,
}

/// Where a client stream's reply comes from.
enum Reply<Resp> {
    /// The connection's events for the stream (the reply is one of them).
    Peer(mpsc::UnboundedReceiver<Event>, PhantomData<fn() -> Resp>),
    /// The task running the handler of a server of this process.
    Local(tokio::task::JoinHandle<Result<Resp, crate::Status>>),
}

impl<Req: Wire, Resp: Wire> Upload<Req, Resp> {
    pub(crate) fn new(
        sender: StreamSender<Req>,
        rx: mpsc::UnboundedReceiver<Event>,
        timeout: Option<Duration>,
        sent_budget: bool,
    ) -> Self {
        Self::with_reply(sender, Reply::Peer(rx, PhantomData), timeout, sent_budget)
    }

    fn with_reply(
        sender: StreamSender<Req>,
        reply: Reply<Resp>,
        timeout: Option<Duration>,
        sent_budget: bool,
    ) -> Self {
        let timeout = timeout.map(|t| (tokio::time::Instant::now() + t, t));
        Upload { sender, reply, timeout, sent_budget, done: false }
    }

    /// Sends one item (see [`StreamSender::send`]); within the stream's timeout.
    pub async fn send(&mut self, item: Req) -> Result<(), Error> {
        match self.timeout {
            None => self.sender.send(item).await,
            Some((at, t)) => {
                tokio::time::timeout_at(at, self.sender.send(item)).await.map_err(|_| Error::Timeout(t))?
            }
        }
    }

    /// Sends every item of `items` (each once the server has room), then finishes: the
    /// server's one reply. A server that ends the stream before taking every item (its
    /// handler replied early, or failed) is answered with what it sent.
    pub async fn send_all(mut self, items: impl Stream<Item = Req> + Send) -> Result<Resp, Error> {
        let mut items = std::pin::pin!(items);
        while let Some(item) = futures_util::StreamExt::next(&mut items).await {
            match self.send(item).await {
                Ok(()) => {}
                Err(e @ Error::Timeout(_)) => return Err(e),
                // The stream ended at the server: its reply or error says how.
                Err(_) => break,
            }
        }
        self.finish().await
    }

    /// Ends the items and waits for the server's reply.
    pub async fn finish(mut self) -> Result<Resp, Error> {
        self.sender.finish();
        let timeout = self.timeout;
        let waited = match &mut self.reply {
            Reply::Peer(rx, _) => within(timeout, rx.recv()).await.map(Got::Event),
            Reply::Local(task) => within(timeout, task).await.map(Got::Local),
        };
        self.done = true;
        match waited? {
            Got::Event(Some(Event::Reply(payload))) => Resp::decode(payload).map_err(|e| Error::Decode(e.0)),
            Got::Event(Some(Event::Failed(Error::Remote(s))))
                if s.code == crate::Code::DeadlineExceeded && self.sent_budget && timeout.is_some() =>
            {
                Err(Error::Timeout(timeout.map(|(_, t)| t).unwrap_or_default()))
            }
            Got::Event(Some(Event::Failed(e))) => Err(e),
            Got::Event(Some(other)) => {
                Err(Error::Decode(format!("a client stream ended with {other:?}, not a reply")))
            }
            Got::Event(None) => Err(Error::Connection("the connection dropped the stream".into())),
            Got::Local(Ok(reply)) => reply.map_err(Error::Remote),
            Got::Local(Err(_)) => {
                Err(Error::Remote(crate::Status::new(crate::Code::Panicked, "the stream's handler panicked")))
            }
        }
    }
}

/// What a client stream's finish got.
enum Got<Resp> {
    Event(Option<Event>),
    Local(Result<Result<Resp, crate::Status>, tokio::task::JoinError>),
}

/// `f`, within the stream's time-out if it has one.
async fn within<F: std::future::Future>(
    timeout: Option<(tokio::time::Instant, Duration)>,
    f: F,
) -> Result<F::Output, Error> {
    match timeout {
        None => Ok(f.await),
        Some((at, t)) => tokio::time::timeout_at(at, f).await.map_err(|_| Error::Timeout(t)),
    }
}

impl<Req, Resp> Drop for Upload<Req, Resp> {
    fn drop(&mut self) {
        if !self.done {
            self.sender.cancel();
            if let Reply::Local(task) = &self.reply {
                task.abort();
            }
        }
    }
}

impl<Req, Resp> std::fmt::Debug for Upload<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload").field("id", &self.sender.id()).finish()
    }
}

/// Items a client of this process may send ahead of a client or both-way stream's handler
/// (what the server grants a peer: `server::stream::IN_WINDOW`).
const LOCAL_CREDIT: usize = 64;

/// Opening streams.
impl Client {
    /// Opens server stream `m` with `req` (`docs/PROTOCOL.md` §9.9): the server's items, as
    /// they come, through the returned [`Streaming`]. Without a timeout: the stream lasts until
    /// the server ends it or the `Streaming` is dropped (see [`open_stream_with`](Self::open_stream_with)).
    pub async fn open_stream<Req: Wire, Item: Wire>(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
    ) -> Result<Streaming<Item>, Error> {
        self.open_stream_with(m, req, StreamOptions::default()).await
    }

    /// Opens server stream `m` with options: a timeout over the whole stream (sent to the
    /// server, which stops producing then) and the credit window. Over inproc the handler's
    /// items are handed over as values, each made as it is read (no window is needed).
    pub async fn open_stream_with<Req: Wire, Item: Wire>(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
        opts: StreamOptions,
    ) -> Result<Streaming<Item>, Error> {
        let timeout = stream_timeout(opts);
        let traced = trace::call_span(m.service(), m.name());
        let trace = traced.as_ref().map(|t| &t.parent);
        let conn = self.inner.connection().await?;
        let c = match &*conn {
            Conn::Stream(c) => c,
            Conn::Local(local) => {
                let open =
                    local_face::<LocalServerStream<Req, Item>>(&*local.server, (m.service(), m.name()))?;
                return Ok(Streaming::local(open(req), &*local.server, self.clone(), timeout));
            }
        };
        let window = opts.window.max(2);
        let id = self.inner.next_id();
        let limits = (timeout, self.inner.config.connect_timeout);
        let names = ((m.service(), m.name()), shape::SERVER);
        let (id, (rx, _), sent_budget) = c
            .open_stream(id, || self.inner.next_id(), names, |b| req.encode(b), window, limits, trace)
            .await?;
        Ok(Streaming::new((c.clone(), self.clone()), (id, rx), window, timeout, sent_budget))
    }

    /// Opens client stream `m` (`docs/PROTOCOL.md` §9.9): [`Upload::send`] its requests, then
    /// [`Upload::finish`] for the one reply. `opts.timeout` bounds the whole stream.
    pub async fn open_client_stream<Req: Wire, Resp: Wire>(
        &self,
        m: &ClientStreamMethod<Req, Resp>,
        opts: StreamOptions,
    ) -> Result<Upload<Req, Resp>, Error> {
        let timeout = stream_timeout(opts);
        let conn = self.inner.connection().await?;
        let c = match &*conn {
            Conn::Stream(c) => c,
            Conn::Local(local) => {
                let open =
                    local_face::<LocalClientStream<Req, Resp>>(&*local.server, (m.service(), m.name()))?;
                let (sender, input) = StreamSender::local();
                // The handler runs beside the sender: it takes the items as they come.
                let task = tokio::spawn(open(input));
                return Ok(Upload::with_reply(sender, Reply::Local(task), timeout, false));
            }
        };
        let names = ((m.service(), m.name()), shape::CLIENT);
        let (id, (rx, credit), sent_budget) = self.open_sending(c, names, 0, timeout).await?;
        let sender = StreamSender::new(c.clone(), self.clone(), id, credit);
        Ok(Upload::new(sender, rx, timeout, sent_budget))
    }

    /// Opens both-way stream `m` (`docs/PROTOCOL.md` §9.9): a [`StreamSender`] for the
    /// requests and a [`Streaming`] of the server's items, used at once. Dropping the
    /// `Streaming` cancels the stream; dropping (or finishing) the sender ends the requests.
    pub async fn open_bidi_stream<Req: Wire, Resp: Wire>(
        &self,
        m: &BidiStreamMethod<Req, Resp>,
        opts: StreamOptions,
    ) -> Result<(StreamSender<Req>, Streaming<Resp>), Error> {
        let timeout = stream_timeout(opts);
        let conn = self.inner.connection().await?;
        let c = match &*conn {
            Conn::Stream(c) => c,
            Conn::Local(local) => {
                let open = local_face::<LocalBidiStream<Req, Resp>>(&*local.server, (m.service(), m.name()))?;
                let (sender, input) = StreamSender::local();
                let items = Streaming::local(open(input), &*local.server, self.clone(), timeout);
                return Ok((sender, items));
            }
        };
        let window = opts.window.max(2);
        let names = ((m.service(), m.name()), shape::BOTH);
        let (id, (rx, credit), sent_budget) = self.open_sending(c, names, window, timeout).await?;
        let sender = StreamSender::new(c.clone(), self.clone(), id, credit);
        Ok((sender, Streaming::new((c.clone(), self.clone()), (id, rx), window, timeout, sent_budget)))
    }

    /// Opens a stream on which the client sends items (an empty open payload): its id, events
    /// and credit, and whether the server was sent its budget.
    #[allow(clippy::type_complexity)]
    async fn open_sending(
        &self,
        c: &Arc<StreamConn>,
        names: ((&str, &str), u8),
        window: u32,
        timeout: Option<Duration>,
    ) -> Result<(u64, (mpsc::UnboundedReceiver<Event>, Arc<Semaphore>), bool), Error> {
        let id = self.inner.next_id();
        let limits = (timeout, self.inner.config.connect_timeout);
        let (id, (rx, credit), sent_budget) =
            c.open_stream(id, || self.inner.next_id(), names, |_| Ok(()), window, limits, None).await?;
        let credit = credit.expect("a stream the client sends on has credit");
        Ok((id, (rx, credit), sent_budget))
    }
}

/// A stream's time-out: its own, and inside a handler no later than the request it serves.
fn stream_timeout(opts: StreamOptions) -> Option<Duration> {
    match (opts.timeout, crate::context::current_deadline()) {
        (t, None) => t,
        (t, Some(_)) => Some(crate::context::budget(t.unwrap_or(Duration::MAX))),
    }
}

/// Stream method `service/method` of a server of this process, as the caller's shape and
/// types (`F`: a `Local*Stream` of them).
fn local_face<'s, F: 'static>(
    server: &'s dyn LocalServer,
    (service, method): (&str, &str),
) -> Result<&'s F, Error> {
    if !server.is_open() {
        return Err(Error::Connection("inproc server is shutting down".into()));
    }
    let any = server.stream_method(service, method).map_err(Error::Remote)?;
    any.downcast_ref::<F>().ok_or_else(|| {
        Error::Remote(crate::Status::new(
            crate::Code::BadRequest,
            format!("{service}/{method} is a stream of another shape, or of other types than the caller's"),
        ))
    })
}
