//! One unix or tcp connection of a client: a writer task draining the outbox, a reader task
//! completing waiters, and the call path between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

use super::pending::{Outcome, Pending};
use crate::codec::Wire;
use crate::error::{Error, Status};
use crate::method::Method;
use crate::proto::encode::{BuildError, ZERO_COPY_MIN};
use crate::proto::message::as_str;
use crate::proto::{Limits, Message};
use crate::stats::Counters;
use crate::transport::outbox::Outbox;
use crate::transport::reader::FrameReader;
use crate::transport::stream::ByteStream;

pub(crate) struct StreamConn {
    outbox: Outbox,
    pending: Pending,
    alive: AtomicBool,
    counters: Arc<Counters>,
    peer: String,
}

impl StreamConn {
    /// Starts the reader and writer tasks of a freshly connected stream.
    pub fn start<S: ByteStream>(
        stream: S,
        limits: Limits,
        counters: Arc<Counters>,
    ) -> Arc<StreamConn> {
        let peer = stream.peer();
        let (rd, wr) = stream.into_halves();
        let conn = Arc::new(StreamConn {
            outbox: Outbox::new(limits),
            pending: Pending::default(),
            alive: AtomicBool::new(true),
            counters,
            peer,
        });
        let c = conn.clone();
        tokio::spawn(async move {
            if let Err(e) = c.outbox.write_loop(wr, &c.counters, true).await {
                c.fail(Error::io("write failed", e));
            }
        });
        let c = conn.clone();
        tokio::spawn(async move { c.read_loop(FrameReader::new(rd, limits)).await });
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
    }

    async fn read_loop<R: crate::transport::stream::ReadHalf>(
        self: Arc<Self>,
        mut reader: FrameReader<R>,
    ) {
        let mut batch = Vec::new();
        let mut done = Vec::new();
        let err = loop {
            match reader
                .read_batch(&mut batch, usize::MAX, &self.counters)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    break Error::Connection(format!("{} closed the connection", self.peer));
                }
                Err(e) => break Error::Connection(format!("{}: {e}", self.peer)),
            }
            let mut go_away = None;
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
            for (waiter, outcome) in done.drain(..) {
                let _ = waiter.send(outcome);
            }
            if !pings.is_empty() {
                let _ = self
                    .outbox
                    .push(|fb| pings.iter().for_each(|&t| fb.pong(t)));
            }
            if let Some(reason) = go_away {
                self.alive.store(false, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, %reason);
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
        let id = self.pending.insert(id, tx, next_id)?;
        let pushed = self.outbox.push(|fb| match req.as_bytes() {
            Some(b) if b.len() >= ZERO_COPY_MIN => fb
                .request_bytes(id, flags, m.service(), m.name(), b)
                .map_err(|e| match e {
                    BuildError::TooLarge { len, max } => Error::TooLarge { len, max },
                }),
            _ => fb
                .request(id, flags, m.service(), m.name(), |buf| req.encode(buf))
                .map_err(|e| match e {
                    BuildError::Payload(e) => Error::Encode(e.0),
                    BuildError::TooLarge { len, max } => Error::TooLarge { len, max },
                }),
        });
        let sent = match pushed {
            Ok(r) => r,
            Err(_closed) => Err(Error::Connection(format!(
                "connection to {} is closed",
                self.peer
            ))),
        };
        if let Err(e) = sent {
            self.pending.remove(id);
            return Err(e);
        }
        // From here the waiter is in the table; if this future is dropped (caller gave up) or
        // times out, the guard takes it out again so a late reply finds nobody.
        let guard = Unregister { conn: self, id };
        let outcome = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(Error::Connection("connection dropped the call".into())),
            Err(_) => {
                drop(guard);
                return Err(Error::Timeout(timeout));
            }
        };
        std::mem::forget(guard);
        Resp::decode(outcome?).map_err(|e| Error::Decode(e.0))
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
        if self.conn.pending.remove(self.id).is_some() {
            let id = self.id;
            let _ = self.conn.outbox.push(|fb| fb.cancel(id));
        }
    }
}
