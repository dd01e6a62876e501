//! One unix or tcp connection of a client: a writer task draining the outbox, a reader task
//! completing waiters, and the call path between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use super::pending::{Outcome, Pending};
use crate::codec::Wire;
use crate::error::{Error, Status};
use crate::method::Method;
use crate::proto::encode::{BuildError, ZERO_COPY_MIN};
use crate::proto::message::as_str;
use crate::proto::{Code, Limits, Message};
use crate::stats::Counters;
use crate::transport::outbox::Outbox;
use crate::transport::reader::{FrameReader, ReadError};
use crate::transport::stream::ByteStream;

pub(crate) struct StreamConn {
    outbox: Outbox,
    pending: Pending,
    alive: AtomicBool,
    counters: Arc<Counters>,
    peer: String,
    sweeper: Sweeper,
}

/// Deadlines without a timer per call: each waiter's deadline sits in the pending table, and
/// one sweeper task per connection sleeps until the earliest one. Callers wake the sweeper
/// only when they bring an earlier deadline than the one it sleeps towards — under a steady
/// load with one default timeout, about once per timeout period.
///
/// Hand-written because a tokio timer per call (register, deregister, a clock read each) cost
/// about 15% of the client's CPU time in the echo benchmark.
#[derive(Default)]
struct Sweeper {
    /// Coarse-clock ticks of the deadline the sweeper sleeps towards (`u64::MAX`: none).
    target: AtomicU64,
    wake: Notify,
}

impl StreamConn {
    /// Starts the reader and writer tasks of a freshly connected stream.
    pub fn start<S: ByteStream>(stream: S, limits: Limits, counters: Arc<Counters>) -> Arc<StreamConn> {
        let peer = stream.peer();
        let (rd, wr) = stream.into_halves();
        let conn = Arc::new(StreamConn {
            outbox: Outbox::new(limits),
            pending: Pending::default(),
            alive: AtomicBool::new(true),
            counters,
            peer,
            sweeper: Sweeper { target: AtomicU64::new(u64::MAX), wake: Notify::new() },
        });
        let c = conn.clone();
        tokio::spawn(async move {
            if let Err(e) = c.outbox.write_loop(wr, &c.counters, true).await {
                c.fail(Error::io("write failed", e));
            }
        });
        let c = conn.clone();
        tokio::spawn(async move { c.read_loop(FrameReader::new(rd, limits)).await });
        let c = conn.clone();
        tokio::spawn(async move { c.sweep_loop().await });
        conn
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Closes the connection from this side: queued requests are still written, then the
    /// write side is shut down; replies still arrive until the server closes its side.
    pub fn close(&self) {
        self.outbox.close();
    }

    fn fail(&self, err: Error) {
        self.alive.store(false, Ordering::Relaxed);
        self.outbox.close();
        self.pending.fail_all(err);
        self.sweeper.wake.notify_one();
    }

    /// Times out waiters whose deadline passed, and tells the server (cancel) about them.
    async fn sweep_loop(self: Arc<Self>) {
        let mut expired = Vec::new();
        while self.is_alive() {
            let started = std::time::Instant::now();
            let now = coarsetime::Instant::now();
            let next = self.pending.expire(now, &mut expired);
            if !expired.is_empty() {
                let _ = self.outbox.push(|fb| expired.drain(..).for_each(|id| fb.cancel(id)));
            }
            self.sweeper.target.store(next.map_or(u64::MAX, |d| d.as_ticks()), Ordering::SeqCst);
            // Rescanning a huge table often would cost more than the calls: keep sweeps under
            // about 5% of the time, and at least 1 ms apart.
            let min_gap = (started.elapsed() * 20).max(Duration::from_millis(1));
            let sleep = next.map(|d| Duration::from(d.duration_since(now)).max(min_gap));
            tokio::select! {
                _ = self.sweeper.wake.notified() => tokio::time::sleep(min_gap).await,
                _ = tokio::time::sleep(sleep.unwrap_or(Duration::MAX)), if sleep.is_some() => {}
            }
        }
    }

    async fn read_loop<R: crate::transport::stream::ReadHalf>(self: Arc<Self>, mut reader: FrameReader<R>) {
        let mut batch = Vec::new();
        let mut done = Vec::new();
        // The reason the server gave before closing, if it did. Calls still pending then were
        // never started by the server: it answers everything it started before saying goodbye.
        let mut go_away: Option<String> = None;
        let err = loop {
            match reader.read_batch(&mut batch, usize::MAX, &self.counters).await {
                Ok(true) => {}
                Ok(false) => {
                    let why = go_away.as_deref().unwrap_or("closed the connection");
                    break Error::Connection(format!("{}: {why}", self.peer));
                }
                Err(ReadError::Protocol(e)) => {
                    tracing::warn!(peer = %self.peer, error = %e, "closing connection: server broke the protocol");
                    let _ = self.outbox.push(|fb| fb.go_away(Code::Protocol, &e.to_string()));
                    break Error::Protocol(e);
                }
                Err(e) => break Error::Connection(format!("{}: {e}", self.peer)),
            }
            let mut pings = Vec::new();
            let replies = batch.drain(..).filter_map(|m| match m {
                Message::Reply { id, payload } => Some((id, Ok(payload))),
                Message::Error { id, code, message } => {
                    Some((id, Err(Error::Remote(Status::new(code, as_str(&message))))))
                }
                Message::Ping { token } => {
                    pings.push(token);
                    None
                }
                Message::GoAway { code, message } => {
                    go_away = Some(format!("server going away ({code}): {}", as_str(&message)));
                    None
                }
                Message::Pong { .. } | Message::Request { .. } | Message::Cancel { .. } => None,
            });
            let late = self.pending.take_batch(replies, &mut done);
            if late > 0 {
                tracing::trace!(late, "dropped replies nobody waits for (timed out)");
            }
            if let Some(reason) = &go_away {
                // Before waking anyone: a caller woken by this batch must not send its next
                // call on a connection the server is closing.
                self.alive.store(false, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, %reason);
            }
            for (waiter, outcome) in done.drain(..) {
                let _ = waiter.send(outcome);
            }
            if !pings.is_empty() {
                let _ = self.outbox.push(|fb| pings.iter().for_each(|&t| fb.pong(t)));
            }
        };
        self.fail(err);
    }

    /// Sends one request and waits for its reply.
    pub async fn call<Req: Wire, Resp: Wire>(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        m: &Method<Req, Resp>,
        req: &Req,
        flags: u8,
        timeout: Duration,
    ) -> Result<Resp, Error> {
        let (tx, rx) = oneshot::channel::<Outcome>();
        let deadline = coarsetime::Instant::now() + coarsetime::Duration::from(timeout);
        let id = self.pending.insert(id, tx, deadline, timeout, next_id)?;
        if deadline.as_ticks() < self.sweeper.target.load(Ordering::SeqCst) {
            self.sweeper.wake.notify_one();
        }
        let pushed = self.outbox.push(|fb| match req.as_bytes() {
            Some(b) if b.len() >= ZERO_COPY_MIN => {
                fb.request_bytes(id, flags, m.service(), m.name(), b).map_err(|e| match e {
                    BuildError::TooLarge { len, max } => Error::TooLarge { len, max },
                })
            }
            _ => fb.request(id, flags, m.service(), m.name(), |buf| req.encode(buf)).map_err(|e| match e {
                BuildError::Payload(e) => Error::Encode(e.0),
                BuildError::TooLarge { len, max } => Error::TooLarge { len, max },
            }),
        });
        let sent = match pushed {
            Ok(r) => r,
            Err(_closed) => Err(Error::Connection(format!("connection to {} is closed", self.peer))),
        };
        if let Err(e) = sent {
            self.pending.remove(id);
            return Err(e);
        }
        // From here the waiter is in the table and ends by a reply, its deadline (the sweeper)
        // or a connection failure. If the caller drops this future first, the guard takes the
        // waiter out again so a late reply finds nobody.
        let guard = Unregister { conn: self, id };
        let outcome =
            rx.await.unwrap_or_else(|_| Err(Error::Connection("connection dropped the call".into())));
        std::mem::forget(guard);
        Resp::decode(outcome?).map_err(|e| Error::Decode(e.0))
    }

    /// Sends one request whose payload is already encoded and waits for the raw reply payload.
    /// The same path as [`call`](Self::call) with names known only at run time (the registry's
    /// relay forwards calls by the names it received).
    // Kept beside `call` rather than folded into it so the typed hot path stays untouched;
    // any change to how `call` registers, sends or unregisters must be mirrored here.
    #[allow(clippy::too_many_arguments)]
    pub async fn call_raw(
        &self,
        id: u64,
        next_id: impl FnMut() -> u64,
        service: &str,
        method: &str,
        payload: bytes::Bytes,
        flags: u8,
        timeout: Duration,
    ) -> Result<bytes::Bytes, Error> {
        let (tx, rx) = oneshot::channel::<Outcome>();
        let deadline = coarsetime::Instant::now() + coarsetime::Duration::from(timeout);
        let id = self.pending.insert(id, tx, deadline, timeout, next_id)?;
        if deadline.as_ticks() < self.sweeper.target.load(Ordering::SeqCst) {
            self.sweeper.wake.notify_one();
        }
        let pushed = self.outbox.push(|fb| {
            fb.request_bytes(id, flags, service, method, payload).map_err(|e| match e {
                BuildError::TooLarge { len, max } => Error::TooLarge { len, max },
            })
        });
        let sent = match pushed {
            Ok(r) => r,
            Err(_closed) => Err(Error::Connection(format!("connection to {} is closed", self.peer))),
        };
        if let Err(e) = sent {
            self.pending.remove(id);
            return Err(e);
        }
        let guard = Unregister { conn: self, id };
        let outcome =
            rx.await.unwrap_or_else(|_| Err(Error::Connection("connection dropped the call".into())));
        std::mem::forget(guard);
        outcome
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

/// Removes a waiter whose call ended without a reply, and tells the server (best effort).
struct Unregister<'a> {
    conn: &'a StreamConn,
    id: u64,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if self.conn.pending.remove(self.id) {
            let id = self.id;
            let _ = self.conn.outbox.push(|fb| fb.cancel(id));
        }
    }
}
