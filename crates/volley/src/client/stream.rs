//! Server streams on the client (PROTOCOL.md §9.9): the streams a connection has open, by id,
//! and [`Streaming`], the `Stream` a caller reads one from.
//!
//! The reader hands a stream's items to its channel; the caller's `Streaming` grants the server
//! credit again each time it has taken half of its window, so items the caller has not taken
//! are bounded by the window, whatever the server's pace.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::{Semaphore, mpsc};

use super::conn::StreamConn;
use super::stream_table::Event;
use super::{Client, Conn};
use crate::codec::Wire;
use crate::error::Error;
use crate::method::{BidiStreamMethod, ClientStreamMethod, StreamMethod};
use crate::proto::message::shape;
use crate::trace;

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
    rx: mpsc::UnboundedReceiver<Event>,
    conn: Arc<StreamConn>,
    /// Keeps the connection open while the stream is read, even if every other handle to the
    /// client is gone.
    _client: Client,
    id: u64,
    window: u32,
    /// Items taken since credit was last granted.
    taken: u32,
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
    /// Whether the server was sent the stream's budget (its `DeadlineExceeded` is then the
    /// stream's time-out, seen first by the server).
    sent_budget: bool,
    done: bool,
    _item: PhantomData<fn() -> T>,
}

impl<T> Streaming<T> {
    pub(crate) fn new(
        (conn, client): (Arc<StreamConn>, Client),
        (id, rx): (u64, mpsc::UnboundedReceiver<Event>),
        window: u32,
        timeout: Option<Duration>,
        sent_budget: bool,
    ) -> Self {
        Streaming {
            rx,
            conn,
            _client: client,
            id,
            window,
            taken: 0,
            deadline: timeout.map(|t| (Box::pin(tokio::time::sleep(t)), t)),
            sent_budget,
            done: false,
            _item: PhantomData,
        }
    }

    /// The stream's request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Ends the stream here: the server is told to stop (its producer is dropped), and what
    /// is still in flight is dropped.
    fn cancel(&mut self) {
        if !self.done {
            self.done = true;
            self.conn.cancel_stream(self.id);
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
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Event::Item(payload))) => {
                this.taken += 1;
                if this.taken >= this.window / 2 {
                    this.conn.grant(this.id, std::mem::take(&mut this.taken));
                }
                Poll::Ready(Some(T::decode(payload).map_err(|e| Error::Decode(e.0))))
            }
            Poll::Ready(Some(Event::End | Event::Reply(_) | Event::Credit(_))) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Event::Failed(e))) => {
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
                Poll::Ready(Some(Err(Error::Connection("the connection dropped the stream".into()))))
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
    }
}

impl<T> std::fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming").field("id", &self.id).field("done", &self.done).finish()
    }
}

/// The sending half of a client or both-way stream: `send` waits for the server's credit (a
/// server whose handler reads slowly holds the sender back), `finish` says the last item was
/// sent. Dropped unfinished, it finishes.
pub struct StreamSender<T> {
    conn: Arc<StreamConn>,
    _client: Client,
    id: u64,
    credit: Arc<Semaphore>,
    finished: bool,
    _item: PhantomData<fn(T)>,
}

impl<T: Wire> StreamSender<T> {
    pub(crate) fn new(conn: Arc<StreamConn>, client: Client, id: u64, credit: Arc<Semaphore>) -> Self {
        StreamSender { conn, _client: client, id, credit, finished: false, _item: PhantomData }
    }

    /// Sends `item` once the server has room for it. Fails once the stream has ended (the
    /// stream's reader, or `finish` of a client stream, says why) or was finished here.
    pub async fn send(&mut self, item: T) -> Result<(), Error> {
        if self.finished {
            return Err(Error::Usage("the stream was finished: it takes no more items".into()));
        }
        self.credit
            .acquire()
            .await
            .map_err(|_| Error::Usage("the stream has ended: it takes no more items".into()))?
            .forget();
        self.conn.send_item(self.id, &item)
    }

    /// Sends the end of the items (the server's handler sees its stream of requests end).
    pub fn finish(&mut self) {
        if !std::mem::replace(&mut self.finished, true) {
            self.conn.end_items(self.id);
        }
    }
}

impl<T> Drop for StreamSender<T> {
    fn drop(&mut self) {
        if !std::mem::replace(&mut self.finished, true) {
            self.conn.end_items(self.id);
        }
    }
}

impl<T> std::fmt::Debug for StreamSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSender").field("id", &self.id).field("finished", &self.finished).finish()
    }
}

/// A client stream being written: `send` its items, then `finish` for the server's one
/// reply. Dropped before `finish`, it cancels the stream.
pub struct Upload<Req, Resp> {
    sender: StreamSender<Req>,
    rx: mpsc::UnboundedReceiver<Event>,
    timeout: Option<(tokio::time::Instant, Duration)>,
    sent_budget: bool,
    done: bool,
    _reply: PhantomData<fn() -> Resp>,
}

impl<Req: Wire, Resp: Wire> Upload<Req, Resp> {
    pub(crate) fn new(
        sender: StreamSender<Req>,
        rx: mpsc::UnboundedReceiver<Event>,
        timeout: Option<Duration>,
        sent_budget: bool,
    ) -> Self {
        let timeout = timeout.map(|t| (tokio::time::Instant::now() + t, t));
        Upload { sender, rx, timeout, sent_budget, done: false, _reply: PhantomData }
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

    /// Ends the items and waits for the server's reply.
    pub async fn finish(mut self) -> Result<Resp, Error> {
        self.sender.finish();
        let event = match self.timeout {
            None => self.rx.recv().await,
            Some((at, t)) => match tokio::time::timeout_at(at, self.rx.recv()).await {
                Ok(ev) => ev,
                Err(_) => return Err(Error::Timeout(t)),
            },
        };
        self.done = true;
        match event {
            Some(Event::Reply(payload)) => Resp::decode(payload).map_err(|e| Error::Decode(e.0)),
            Some(Event::Failed(Error::Remote(s)))
                if s.code == crate::Code::DeadlineExceeded && self.sent_budget && self.timeout.is_some() =>
            {
                Err(Error::Timeout(self.timeout.map(|(_, t)| t).unwrap_or_default()))
            }
            Some(Event::Failed(e)) => Err(e),
            Some(other) => Err(Error::Decode(format!("a client stream ended with {other:?}, not a reply"))),
            None => Err(Error::Connection("the connection dropped the stream".into())),
        }
    }
}

impl<Req, Resp> Drop for Upload<Req, Resp> {
    fn drop(&mut self) {
        if !self.done {
            self.sender.finished = true;
            self.sender.conn.cancel_stream(self.sender.id);
        }
    }
}

impl<Req, Resp> std::fmt::Debug for Upload<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload").field("id", &self.sender.id).finish()
    }
}

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
    /// server, which stops producing then) and the credit window.
    pub async fn open_stream_with<Req: Wire, Item: Wire>(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
        opts: StreamOptions,
    ) -> Result<Streaming<Item>, Error> {
        // Inside a handler, a stream ends with the request it serves at the latest.
        let timeout = match (opts.timeout, crate::context::current_deadline()) {
            (t, None) => t,
            (t, Some(_)) => Some(crate::context::budget(t.unwrap_or(Duration::MAX))),
        };
        let traced = trace::call_span(m.service(), m.name());
        let trace = traced.as_ref().map(|t| &t.parent);
        let conn = self.inner.connection().await?;
        let Conn::Stream(c) = &*conn else {
            return Err(Error::Usage(format!(
                "{m:?}: streams are not available over {} (inproc)",
                self.inner.addr
            )));
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
        let (c, id, (rx, credit), timeout, sent_budget) =
            self.open_sending(((m.service(), m.name()), shape::CLIENT), 0, opts).await?;
        let sender = StreamSender::new(c, self.clone(), id, credit);
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
        let window = opts.window.max(2);
        let (c, id, (rx, credit), timeout, sent_budget) =
            self.open_sending(((m.service(), m.name()), shape::BOTH), window, opts).await?;
        let sender = StreamSender::new(c.clone(), self.clone(), id, credit);
        Ok((sender, Streaming::new((c, self.clone()), (id, rx), window, timeout, sent_budget)))
    }

    /// Opens a stream on which the client sends items (an empty open payload).
    #[allow(clippy::type_complexity)]
    async fn open_sending(
        &self,
        names: ((&str, &str), u8),
        window: u32,
        opts: StreamOptions,
    ) -> Result<
        (
            Arc<StreamConn>,
            u64,
            (tokio::sync::mpsc::UnboundedReceiver<Event>, Arc<tokio::sync::Semaphore>),
            Option<Duration>,
            bool,
        ),
        Error,
    > {
        let timeout = match (opts.timeout, crate::context::current_deadline()) {
            (t, None) => t,
            (t, Some(_)) => Some(crate::context::budget(t.unwrap_or(Duration::MAX))),
        };
        let conn = self.inner.connection().await?;
        let Conn::Stream(c) = &*conn else {
            return Err(Error::Usage(format!(
                "{}/{}: streams are not available over {} (inproc)",
                names.0.0, names.0.1, self.inner.addr
            )));
        };
        let id = self.inner.next_id();
        let limits = (timeout, self.inner.config.connect_timeout);
        let (id, (rx, credit), sent_budget) =
            c.open_stream(id, || self.inner.next_id(), names, |_| Ok(()), window, limits, None).await?;
        let credit = credit.expect("a stream the client sends on has credit");
        Ok((c.clone(), id, (rx, credit), timeout, sent_budget))
    }
}
