//! The batch API: many requests for one method, split into chunks, every
//! chunk sent at once, one wait, one result per request in input order.
//!
//! Over unix and tcp each chunk is one `BatchRequest` message answered by one `BatchReply`:
//! a chunk of 128 costs one request id, one waiter and one wake-up. In-process, each chunk is
//! handed to the handler as one batch, without encoding.
//!
//! Very large batches stream: [`Client::call_batch_stream`] keeps a window of chunks in flight
//! and yields results in input order as they complete, so a million requests pass through
//! with memory bounded by the window, not the batch.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, Stream, StreamExt};

use super::{Client, Conn};
use crate::codec::Wire;
use crate::error::Error;
use crate::method::Method;
use crate::proto::message::FLAG_IDEMPOTENT;

/// How a batch is cut and sent.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BatchOptions {
    /// Requests per chunk (one message on the wire). Default 128, the MF report's chunk.
    pub chunk_size: usize,
    /// Chunks in flight at once for [`Client::call_batch_stream`] (default 256: 32,768 requests
    /// of the default chunk size). [`Client::call_batch`] sends every chunk at once.
    pub window: usize,
    /// Deadline of each chunk; the client's default when `None`.
    pub timeout: Option<Duration>,
    /// The requests are safe to repeat.
    pub idempotent: bool,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions { chunk_size: 128, window: 256, timeout: None, idempotent: false }
    }
}

impl BatchOptions {
    pub fn chunk_size(mut self, n: usize) -> Self {
        self.chunk_size = n.max(1);
        self
    }
    pub fn window(mut self, n: usize) -> Self {
        self.window = n.max(1);
        self
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
}

impl Client {
    /// Calls `m` once per request: splits them into chunks of 128, sends every chunk at once,
    /// waits once, and returns one result per request in input order. One request's failure
    /// does not fail the others.
    pub async fn call_batch<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        reqs: impl IntoIterator<Item = Req>,
    ) -> Vec<Result<Resp, Error>> {
        self.call_batch_with(m, reqs, BatchOptions::default()).await
    }

    /// [`call_batch`](Self::call_batch) with explicit options.
    pub async fn call_batch_with<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        reqs: impl IntoIterator<Item = Req>,
        opts: BatchOptions,
    ) -> Vec<Result<Resp, Error>> {
        let mut chunks = split_into_chunks(reqs.into_iter().collect(), opts.chunk_size.max(1));
        if chunks.len() <= 1 {
            return match chunks.pop() {
                Some(chunk) => self.chunk(m, chunk, opts).await,
                None => Vec::new(),
            };
        }
        let mut out = Vec::new();
        // All chunk futures are polled in the first pass, so every chunk is queued before the
        // writer runs: they leave together.
        let mut pending: FuturesOrdered<_> = chunks.into_iter().map(|c| self.chunk(m, c, opts)).collect();
        while let Some(results) = pending.next().await {
            out.extend(results);
        }
        out
    }

    /// The blocking form of [`call_batch`](Self::call_batch), for code that is not async.
    pub fn call_batch_blocking<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        reqs: impl IntoIterator<Item = Req>,
    ) -> Result<Vec<Result<Resp, Error>>, Error> {
        self.blocking_guard()?;
        Ok(self.inner.runtime.block_on(self.call_batch(m, reqs)))
    }

    /// Streams a batch of any size: pulls requests from `reqs` a chunk at a time, keeps
    /// `opts.window` chunks in flight, and yields one result per request, in input order, as
    /// chunks complete.
    pub fn call_batch_stream<'a, Req: Wire, Resp: Wire, I>(
        &'a self,
        m: &'a Method<Req, Resp>,
        reqs: I,
        opts: BatchOptions,
    ) -> BatchStream<'a, Resp>
    where
        I: IntoIterator<Item = Req>,
        I::IntoIter: Send + 'a,
    {
        let mut chunks = chunked(reqs.into_iter(), opts.chunk_size.max(1));
        BatchStream {
            next_chunk: Box::new(move || {
                chunks.next().map(|c| Box::pin(self.chunk(m, c, opts)) as ChunkFuture<'a, Resp>)
            }),
            in_flight: FuturesOrdered::new(),
            ready: VecDeque::new(),
            window: opts.window.max(1),
            exhausted: false,
        }
    }

    /// The blocking form of [`call_batch_stream`](Self::call_batch_stream): an iterator.
    pub fn call_batch_iter<'a, Req: Wire, Resp: Wire, I>(
        &'a self,
        m: &'a Method<Req, Resp>,
        reqs: I,
        opts: BatchOptions,
    ) -> Result<impl Iterator<Item = Result<Resp, Error>> + 'a, Error>
    where
        I: IntoIterator<Item = Req>,
        I::IntoIter: Send + 'a,
    {
        self.blocking_guard()?;
        let mut stream = self.call_batch_stream(m, reqs, opts);
        let rt = self.inner.runtime.clone();
        Ok(std::iter::from_fn(move || rt.block_on(stream.next())))
    }

    /// One chunk: its results, or its error repeated for each of its requests.
    async fn chunk<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        chunk: Vec<Req>,
        opts: BatchOptions,
    ) -> Vec<Result<Resp, Error>> {
        let n = chunk.len();
        let meter = self.inner.meter(m, n, crate::metrics::Timing::Batch);
        let timeout = crate::context::budget(opts.timeout.unwrap_or(self.inner.config.timeout));
        // A chunk is one request on the wire: one span (disabled unless a subscriber records it).
        let traced = crate::trace::call_span(m.service(), m.name()); // as in `call_with`
        let trace = traced.as_ref().map(|t| &t.parent);
        let result = match self.inner.connection().await {
            Err(e) => Err(e),
            Ok(conn) => match &*conn {
                Conn::Local(local) => {
                    crate::transport::inproc::call_chunk(local, m, chunk, timeout, trace).await
                }
                Conn::Stream(c) => {
                    let flags = if opts.idempotent { FLAG_IDEMPOTENT } else { 0 };
                    let id = self.inner.next_id();
                    c.call_chunk(id, || self.inner.next_id(), m, &chunk, flags, (timeout, trace)).await
                }
            },
        };
        let results = result.unwrap_or_else(|e| (0..n).map(|_| Err(e.clone())).collect());
        if let Some(meter) = meter {
            meter.finish_all(&results);
        }
        results
    }
}

type ChunkFuture<'a, Resp> = Pin<Box<dyn std::future::Future<Output = Vec<Result<Resp, Error>>> + Send + 'a>>;

/// Results of [`Client::call_batch_stream`], in input order.
pub struct BatchStream<'a, Resp> {
    next_chunk: Box<dyn FnMut() -> Option<ChunkFuture<'a, Resp>> + Send + 'a>,
    in_flight: FuturesOrdered<ChunkFuture<'a, Resp>>,
    ready: VecDeque<Result<Resp, Error>>,
    window: usize,
    exhausted: bool,
}

// Sound: nothing in the stream is pinned structurally (the futures are boxed; results are
// moved out by value), so it may move freely even when `Resp` is not `Unpin`.
impl<Resp> Unpin for BatchStream<'_, Resp> {}

impl<Resp> Stream for BatchStream<'_, Resp> {
    type Item = Result<Resp, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(r) = this.ready.pop_front() {
                return Poll::Ready(Some(r));
            }
            while !this.exhausted && this.in_flight.len() < this.window {
                match (this.next_chunk)() {
                    Some(f) => this.in_flight.push_back(f),
                    None => this.exhausted = true,
                }
            }
            match this.in_flight.poll_next_unpin(cx) {
                Poll::Ready(Some(results)) => this.ready.extend(results),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Cuts a vector into owned chunks of `size` (the last may be shorter), moving each request
/// once: chunks are split off the end, so nothing is copied twice.
fn split_into_chunks<T>(mut all: Vec<T>, size: usize) -> Vec<Vec<T>> {
    if all.len() <= size {
        return if all.is_empty() { Vec::new() } else { vec![all] };
    }
    let mut chunks = Vec::with_capacity(all.len().div_ceil(size));
    let last = (all.len() - 1) / size * size;
    let mut start = last;
    loop {
        chunks.push(all.split_off(start));
        if start == 0 {
            break;
        }
        start -= size;
    }
    chunks.reverse();
    chunks
}

/// Cuts an iterator into owned chunks.
fn chunked<T>(mut it: impl Iterator<Item = T>, size: usize) -> impl Iterator<Item = Vec<T>> {
    std::iter::from_fn(move || {
        let chunk: Vec<T> = it.by_ref().take(size).collect();
        (!chunk.is_empty()).then_some(chunk)
    })
}
