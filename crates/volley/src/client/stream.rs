//! Server streams on the client (PROTOCOL.md §9.9): the streams a connection has open, by id,
//! and [`Streaming`], the `Stream` a caller reads one from.
//!
//! The reader hands a stream's items to its channel; the caller's `Streaming` grants the server
//! credit again each time it has taken half of its window, so items the caller has not taken
//! are bounded by the window, whatever the server's pace.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use super::conn::StreamConn;
use crate::codec::Wire;
use crate::error::Error;

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

/// What the reader hands a stream.
#[derive(Debug)]
pub(crate) enum Event {
    Item(Bytes),
    End,
    Failed(Error),
}

/// The streams of one connection, by id.
#[derive(Default)]
pub(crate) struct Streams {
    by_id: Mutex<FxHashMap<u64, mpsc::UnboundedSender<Event>>>,
    /// How many are open: the reader looks at the table only when some are.
    open: AtomicUsize,
}

impl Streams {
    /// Registers stream `id`; `None` if it is open already.
    pub fn insert(&self, id: u64) -> Option<mpsc::UnboundedReceiver<Event>> {
        let mut by_id = self.by_id.lock();
        if by_id.contains_key(&id) {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        by_id.insert(id, tx);
        self.open.store(by_id.len(), Ordering::Release);
        Some(rx)
    }

    /// Forgets stream `id`; whether it was open.
    pub fn remove(&self, id: u64) -> bool {
        let mut by_id = self.by_id.lock();
        let was = by_id.remove(&id).is_some();
        self.open.store(by_id.len(), Ordering::Release);
        was
    }

    pub fn is_empty(&self) -> bool {
        self.open.load(Ordering::Acquire) == 0
    }

    /// Whether `id` is an open stream.
    pub fn contains(&self, id: u64) -> bool {
        !self.is_empty() && self.by_id.lock().contains_key(&id)
    }

    /// Hands a turn's stream messages to their streams, under one lock; an end removes its
    /// stream. Messages for ids not open (crossing an end or a cancel) are dropped.
    pub fn deliver(&self, events: &mut Vec<(u64, Event)>) {
        if events.is_empty() {
            return;
        }
        let mut by_id = self.by_id.lock();
        for (id, ev) in events.drain(..) {
            let last = !matches!(ev, Event::Item(_));
            let Some(tx) = by_id.get(&id) else { continue };
            let _ = tx.send(ev);
            if last {
                by_id.remove(&id);
            }
        }
        self.open.store(by_id.len(), Ordering::Release);
    }

    /// The connection ended: every stream ends with `err`.
    pub fn fail_all(&self, err: &Error) {
        let mut by_id = self.by_id.lock();
        for (_, tx) in by_id.drain() {
            let _ = tx.send(Event::Failed(err.clone()));
        }
        self.open.store(0, Ordering::Release);
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
    _client: super::Client,
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
        (conn, client): (Arc<StreamConn>, super::Client),
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
            Poll::Ready(Some(Event::End)) => {
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
