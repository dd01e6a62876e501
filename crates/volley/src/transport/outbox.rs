//! The send side of a byte connection: many producers append messages, one writer task drains
//! everything queued into one (vectored) write.
//!
//! This is smart batching in the LMAX/Aeron sense: the writer never waits on a timer. When it
//! wakes it takes whatever is queued *now*; while its write is in flight, producers keep
//! appending, and the next write carries all of that. A lone message leaves at once; under load
//! bundles grow by themselves, and the number of frames and syscalls falls far below the
//! number of messages.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::proto::{FrameBuilder, Limits, PREAMBLE};
use crate::stats::Counters;

/// Most segments handed to one `writev`.
const MAX_IOV: usize = 64;

/// The queue of outgoing messages of one connection.
#[derive(Debug)]
pub struct Outbox {
    state: Mutex<State>,
    /// Signalled after every write, for producers waiting for the queue to shrink.
    drained: tokio::sync::Notify,
    /// Bytes written to the socket so far: a connection closing tells a peer that reads
    /// slowly from one that reads nothing.
    written: AtomicU64,
}

#[derive(Debug)]
struct State {
    builder: FrameBuilder,
    writer: Option<Waker>,
    closed: bool,
    /// Frame and message counts already reported to the counters.
    reported: (u64, u64),
}

/// The outbox was closed: the connection is going away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl Outbox {
    pub fn new(limits: Limits) -> Self {
        Outbox {
            state: Mutex::new(State {
                builder: FrameBuilder::new(limits),
                writer: None,
                closed: false,
                reported: (0, 0),
            }),
            drained: tokio::sync::Notify::new(),
            written: AtomicU64::new(0),
        }
    }

    /// Appends messages with `f` under the send lock and wakes the writer if it sleeps.
    /// Keep `f` short: it runs while other producers wait.
    pub fn push<R>(&self, f: impl FnOnce(&mut FrameBuilder) -> R) -> Result<R, Closed> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(Closed);
        }
        let r = f(&mut st.builder);
        let wake = if st.builder.is_empty() { None } else { st.writer.take() };
        drop(st);
        if let Some(w) = wake {
            w.wake();
        }
        Ok(r)
    }

    /// Stops accepting messages. What is already queued is still written.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        let w = st.writer.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Waits until fewer than `limit` bytes are queued (or the outbox is closed).
    pub async fn wait_queued_below(&self, limit: usize) {
        loop {
            let drained = self.drained.notified();
            {
                let st = self.state.lock();
                if st.closed || st.builder.queued_len() < limit {
                    return;
                }
            }
            drained.await;
        }
    }

    /// Bytes the writer has written so far.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Ready once something is queued or the outbox is closed.
    fn poll_queued(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if !st.builder.is_empty() || st.closed {
            return Poll::Ready(());
        }
        // Idle: the send buffer goes back to the pool.
        st.builder.release_buffer();
        st.writer = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Moves everything queued into `out` and returns the frames and messages taken; `None`
    /// once closed and drained.
    fn take(&self, out: &mut Vec<Bytes>) -> Option<(u64, u64)> {
        let mut st = self.state.lock();
        if st.builder.is_empty() {
            return None;
        }
        st.builder.take_into(out);
        let (frames, messages) = st.builder.counts();
        let delta = (frames - st.reported.0, messages - st.reported.1);
        st.reported = (frames, messages);
        Some(delta)
    }

    /// The writer task: sends the preamble (if asked), then drains the outbox into `wr` until
    /// the outbox is closed and empty, then shuts the write side down.
    pub async fn write_loop<W: AsyncWrite + Unpin>(
        &self,
        mut wr: W,
        counters: &Counters,
        send_preamble: bool,
    ) -> io::Result<()> {
        let result = self.drain_into(&mut wr, counters, send_preamble).await;
        // Whatever ended the loop, nothing more will be written: refuse further messages and
        // release anyone waiting for the queue to drain.
        self.close();
        self.drained.notify_waiters();
        result
    }

    async fn drain_into<W: AsyncWrite + Unpin>(
        &self,
        wr: &mut W,
        counters: &Counters,
        send_preamble: bool,
    ) -> io::Result<()> {
        if send_preamble {
            wr.write_all(&PREAMBLE).await?;
        }
        let mut segs = Vec::new();
        let yield_first = lifo_runtime();
        loop {
            let slept = wait(|cx| self.poll_queued(cx)).await;
            if slept && yield_first {
                // Woken by a producer: let the other producers that are ready now run and
                // queue too before we take the batch. On a multi-threaded runtime the waker's
                // LIFO slot would otherwise run us right after the first push, one message
                // per write.
                tokio::task::yield_now().await;
            }
            let Some((frames, messages)) = self.take(&mut segs) else { break };
            let bytes = segs.iter().map(Bytes::len).sum::<usize>() as u64;
            // Counted when handed to the socket, not after the write returns: the peer may
            // answer before this task runs again, and a reply must never be seen before the
            // request it answers is counted. A failed write ends the connection anyway.
            counters.sent(frames, messages, bytes);
            write_segments(wr, &mut segs, &self.written).await?;
            self.drained.notify_waiters();
        }
        wr.shutdown().await
    }
}

/// Writes all segments, vectored when there are several, adding what each write took to
/// `written`.
async fn write_segments<W: AsyncWrite + Unpin>(
    wr: &mut W,
    segs: &mut Vec<Bytes>,
    written: &AtomicU64,
) -> io::Result<()> {
    let mut first = 0;
    while first < segs.len() {
        let n = if segs.len() - first == 1 {
            wr.write(&segs[first]).await?
        } else {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let count = (segs.len() - first).min(MAX_IOV);
            for (slot, seg) in iov.iter_mut().zip(&segs[first..first + count]) {
                *slot = IoSlice::new(seg);
            }
            wr.write_vectored(&iov[..count]).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        written.fetch_add(n as u64, Ordering::Relaxed);
        let mut n = n;
        while n > 0 {
            let len = segs[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                segs[first].advance(n);
                n = 0;
            }
        }
    }
    segs.clear();
    Ok(())
}

/// Waits for `poll` to be ready; returns whether it had to wait (was pending at least once).
pub(crate) async fn wait(mut poll: impl FnMut(&mut Context<'_>) -> Poll<()>) -> bool {
    let mut slept = false;
    std::future::poll_fn(|cx| {
        let p = poll(cx);
        slept |= p.is_pending();
        p
    })
    .await;
    slept
}

/// Whether the current runtime runs a freshly woken task before the others (tokio's
/// multi-threaded scheduler does, through its LIFO slot). A single-threaded runtime already
/// queues woken tasks behind the ready ones, so there a yield would only cost an extra poll of
/// the IO driver.
pub(crate) fn lifo_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread)
}
