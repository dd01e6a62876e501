//! The send side of a byte connection: many producers append messages, one writer task drains
//! everything queued into one (vectored) write.
//!
//! This is smart batching in the LMAX/Aeron sense: the writer never waits on a timer. When it
//! wakes it takes whatever is queued *now*; while its write is in flight, producers keep
//! appending, and the next write carries all of that. A lone message leaves at once; under load
//! bundles grow by themselves, and the number of frames and syscalls falls far below the
//! number of messages.
//!
//! A producer that knows it is alone (a client's only call in flight, a server's whole turn)
//! may also write itself ([`Outbox::push_and_write`]): when nothing is queued and no write is in
//! progress, its bytes go to the socket from its own task, without the hop through the writer
//! task (a wake-up and a poll, the larger part of what a lone call paid beyond a bare
//! ping-pong). Whoever writes holds the write half, taken out of the outbox's state under its
//! lock, so one write runs at a time and the stream's order is the order of the appends; what
//! a direct write leaves unwritten goes to the writer task, ahead of anything queued since.
//!
//! Producers that come in rounds (a client's callers, all woken by one bundle of replies) may
//! also write a bundle early, once it holds enough messages ([`Outbox::push_and_flush_at`]):
//! the peer starts on the first part of the round while the rest is made, instead of both ends
//! taking turns, each idle while the other works.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;

use super::stream::WriteHalf;
use crate::metrics::stats::Counters;
use crate::proto::{FrameBuilder, Limits, PREAMBLE};

/// The write half of the stream, whatever its kind.
type Sink = Box<dyn WriteHalf>;

/// Frames, messages and bytes taken from the builder, to be counted as sent.
type SentCounts = (u64, u64, u64);

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
    /// Bytes taken from the queue by a write (the writer task's or a direct one), written or
    /// not yet: with `written`, what a write holds that the peer has not taken.
    handed: AtomicU64,
    /// Direct writes made, for tests to check they exercised the path.
    #[cfg(test)]
    direct: AtomicU64,
}

struct State {
    builder: FrameBuilder,
    writer: Option<Waker>,
    closed: bool,
    /// Frame and message counts already reported to the counters.
    reported: (u64, u64),
    /// The write half between writes: whoever writes takes it out (the writer task, or a
    /// producer writing directly) and puts it back, so one write runs at a time. `None` before
    /// the writer task has sent the preamble, and while a write is in progress.
    sink: Option<Sink>,
    /// What a direct write left unwritten: it goes before everything in `builder`.
    carry: Vec<Bytes>,
    /// The writer task has ended: a write half given back is dropped (which ends the stream's
    /// write side), not kept.
    writer_gone: bool,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queued_len())
            .field("closed", &self.closed)
            .field("writing", &self.sink.is_none())
            .finish_non_exhaustive()
    }
}

impl State {
    fn is_empty(&self) -> bool {
        self.carry.is_empty() && self.builder.is_empty()
    }

    /// The write half is free and its stream can write without waiting.
    fn can_write_now(&self) -> bool {
        self.sink.as_ref().is_some_and(|s| s.try_writes())
    }

    fn queued_len(&self) -> usize {
        self.carry.iter().map(Bytes::len).sum::<usize>() + self.builder.queued_len()
    }

    /// Frames and messages appended since the last call, to be reported as sent.
    fn unreported(&mut self) -> (u64, u64) {
        let (frames, messages) = self.builder.counts();
        let delta = (frames - self.reported.0, messages - self.reported.1);
        self.reported = (frames, messages);
        delta
    }
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
                sink: None,
                carry: Vec::new(),
                writer_gone: false,
            }),
            drained: tokio::sync::Notify::new(),
            written: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            #[cfg(test)]
            direct: AtomicU64::new(0),
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
        wake_writer(st);
        Ok(r)
    }

    /// Appends messages with `f` like [`push`](Self::push), and if nothing else is queued and
    /// no write is in progress, writes them to the stream at once from this task (a stream
    /// that cannot write without waiting leaves them to the writer task, as does a full
    /// socket; whatever does not go at once is left to it too). For a producer that knows it
    /// is alone: under load the writer task's bundles are what keeps syscalls few, and a
    /// producer that wrote its own message would take that away from the ones behind it.
    pub fn push_and_write<R>(
        &self,
        counters: &Counters,
        f: impl FnOnce(&mut FrameBuilder) -> R,
    ) -> Result<R, Closed> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(Closed);
        }
        let idle = st.is_empty() && st.can_write_now();
        let r = f(&mut st.builder);
        if idle && !st.builder.is_empty() {
            self.write_now(st, counters);
        } else {
            wake_writer(st);
        }
        Ok(r)
    }

    /// Appends messages with `f` like [`push`](Self::push); once `at` messages or more are
    /// queued and no write is in progress, writes everything queued from this task at once,
    /// instead of leaving it to the writer task.
    ///
    /// For producers that run in rounds (a client's callers, woken together by one bundle of
    /// replies): written whole, a round's bundle reaches the peer only when its last producer
    /// has run, and the two ends take turns, each idle while the other works. Written in parts
    /// as it grows, the peer works on the first part while the rest is made.
    pub fn push_and_flush_at<R>(
        &self,
        counters: &Counters,
        at: u64,
        f: impl FnOnce(&mut FrameBuilder) -> R,
    ) -> Result<R, Closed> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(Closed);
        }
        let r = f(&mut st.builder);
        let queued = st.builder.counts().1 - st.reported.1;
        if queued >= at && st.can_write_now() {
            self.write_now(st, counters);
        } else {
            wake_writer(st);
        }
        Ok(r)
    }

    /// Writes everything queued to the stream from this task (the write half is free: the
    /// caller checked, under the lock it passes in).
    fn write_now(&self, mut st: parking_lot::MutexGuard<'_, State>, counters: &Counters) {
        let mut sink = st.sink.take().expect("the caller checked the write half is free");
        // What a direct write left before goes first; the carry's vector (and its capacity)
        // then holds the segments.
        let mut segs = std::mem::take(&mut st.carry);
        let counted = segs.len();
        st.builder.take_into(&mut segs);
        let (frames, messages) = st.unreported();
        let bytes = segs[counted..].iter().map(Bytes::len).sum::<usize>() as u64;
        // Under the lock, as `take` does: `unsent` must not see them neither queued nor handed.
        self.handed.fetch_add(bytes, Ordering::Relaxed);
        drop(st);
        // Counted before the write, as the writer task does (see `drain_into`); what a direct
        // write left was counted by it.
        counters.sent(frames, messages, bytes);
        // An error is left to the writer task too: its write meets it again and ends the
        // connection the one way it always does.
        #[cfg(test)]
        self.direct.fetch_add(1, Ordering::Relaxed);
        if let Ok(n) = try_write_segments(sink.as_mut(), &segs) {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
            consume(&mut segs, n);
        }
        self.give_back(sink, segs);
    }

    /// Returns the write half after a direct write, with what it left unwritten, and wakes the
    /// writer task if it has something to do.
    fn give_back(&self, sink: Sink, carry: Vec<Bytes>) {
        let mut st = self.state.lock();
        st.carry = carry;
        let dropped = if st.writer_gone { Some(sink) } else { st.sink.replace(sink) };
        let wake = if !st.is_empty() || st.closed { st.writer.take() } else { None };
        if st.is_empty() {
            // As when the writer goes idle: an idle connection holds no send buffer.
            st.builder.release_buffer();
        }
        drop(st);
        drop(dropped);
        if let Some(w) = wake {
            w.wake();
        }
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

    /// Stops accepting messages, like [`close`](Self::close), and takes the frames queued that
    /// no write has been handed yet (a direct write's unwritten rest is not among them: part
    /// of it may have been written). On a failed connection, these never left the process.
    pub fn close_and_take_unsent(&self) -> Vec<Bytes> {
        let mut unsent = Vec::new();
        let mut st = self.state.lock();
        st.closed = true;
        st.builder.take_into(&mut unsent);
        let w = st.writer.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
        unsent
    }

    /// Bytes queued or being written that the stream has not taken yet; `None` once the
    /// writer has ended (nothing more is written; what is left goes with the outbox).
    pub fn unsent(&self) -> Option<usize> {
        let st = self.state.lock();
        if st.writer_gone {
            return None;
        }
        // Read under the lock that `take` and `write_now` add to `handed` under.
        let writing =
            self.handed.load(Ordering::Relaxed).saturating_sub(self.written.load(Ordering::Relaxed));
        Some(st.builder.queued_len() + writing as usize)
    }

    /// Completes after the next write (or the writer's end): for waiting until the peer took
    /// some replies. Enable it before looking at [`unsent`](Self::unsent), or a write in
    /// between is missed.
    pub fn drained(&self) -> tokio::sync::futures::Notified<'_> {
        self.drained.notified()
    }

    /// Bytes written to the stream so far (by the writer task and by direct writes).
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Ready once something is queued or the outbox is closed, and the write half is free (a
    /// direct write is not in progress).
    fn poll_queued(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if st.sink.is_some() {
            if !st.is_empty() || st.closed {
                return Poll::Ready(());
            }
            // Idle: the send buffer goes back to the pool.
            st.builder.release_buffer();
        }
        st.writer = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Takes the write half, and moves everything queued into `out` (what a direct write left
    /// first), returning the frames, messages and bytes to count as sent (what a direct write
    /// left was counted by it). Once closed and drained, the write half comes alone, to be shut
    /// down.
    ///
    /// `None` if there is nothing to do after all: since `poll_queued` saw the write half free
    /// and something queued, a producer may have written what was queued itself (a bundle
    /// written early, see [`push_and_flush_at`](Self::push_and_flush_at)), or be writing it
    /// now; it wakes this task again if it leaves anything.
    fn take(&self, out: &mut Vec<Bytes>) -> Option<(Sink, Option<SentCounts>)> {
        let mut st = self.state.lock();
        if st.is_empty() && !st.closed {
            return None;
        }
        let sink = st.sink.take()?;
        if st.is_empty() {
            return Some((sink, None));
        }
        out.append(&mut st.carry);
        let counted = out.len();
        st.builder.take_into(out);
        let bytes = out[counted..].iter().map(Bytes::len).sum::<usize>() as u64;
        self.handed.fetch_add(bytes, Ordering::Relaxed);
        let (frames, messages) = st.unreported();
        Some((sink, Some((frames, messages, bytes))))
    }

    /// The writer task: sends the preamble (if asked), then drains the outbox into `wr` until
    /// the outbox is closed and empty, then shuts the write side down.
    pub async fn write_loop(
        &self,
        wr: impl WriteHalf,
        counters: &Counters,
        send_preamble: bool,
    ) -> io::Result<()> {
        // Whatever ends the loop (its end, an error, or the task dropped), nothing more will be
        // written: the guard refuses further messages, drops the write half, and releases
        // anyone waiting for the queue to drain.
        let _gone = WriterGone(self);
        self.drain_into(Box::new(wr), counters, send_preamble).await
    }

    async fn drain_into(&self, mut wr: Sink, counters: &Counters, send_preamble: bool) -> io::Result<()> {
        if send_preamble {
            wr.write_all(&PREAMBLE).await?;
        }
        // From here on, producers may write directly too.
        self.state.lock().sink = Some(wr);
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
            let Some((mut wr, taken)) = self.take(&mut segs) else { continue };
            let Some((frames, messages, bytes)) = taken else { return wr.shutdown().await };
            // Counted when handed to the socket, not after the write returns: the peer may
            // answer before this task runs again, and a reply must never be seen before the
            // request it answers is counted. A failed write ends the connection anyway.
            counters.sent(frames, messages, bytes);
            write_segments(&mut wr, &mut segs, &self.written).await?;
            self.state.lock().sink = Some(wr);
            self.drained.notify_waiters();
        }
    }
}

/// Releases the lock and wakes the writer task if something is queued for it.
fn wake_writer(mut st: parking_lot::MutexGuard<'_, State>) {
    let wake = if st.builder.is_empty() { None } else { st.writer.take() };
    drop(st);
    if let Some(w) = wake {
        w.wake();
    }
}

/// Ends the outbox when the writer task ends (see [`Outbox::write_loop`]).
struct WriterGone<'a>(&'a Outbox);

impl Drop for WriterGone<'_> {
    fn drop(&mut self) {
        let sink = {
            let mut st = self.0.state.lock();
            st.writer_gone = true;
            st.sink.take()
        };
        drop(sink);
        self.0.close();
        self.0.drained.notify_waiters();
    }
}

/// Writes all segments, vectored when there are several, adding what each write took to
/// `written`.
async fn write_segments(wr: &mut Sink, segs: &mut Vec<Bytes>, written: &AtomicU64) -> io::Result<()> {
    while !segs.is_empty() {
        let n = if segs.len() == 1 {
            wr.write(&segs[0]).await?
        } else {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            wr.write_vectored(slices(segs, &mut iov)).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        written.fetch_add(n as u64, Ordering::Relaxed);
        consume(segs, n);
    }
    Ok(())
}

/// One write of the segments that does not wait: what the stream took at once.
fn try_write_segments(wr: &mut dyn WriteHalf, segs: &[Bytes]) -> io::Result<usize> {
    let mut iov = [IoSlice::new(&[]); MAX_IOV];
    wr.try_write_vectored(slices(segs, &mut iov))
}

/// The first segments (at most `MAX_IOV`) as the slices of one vectored write.
fn slices<'a>(segs: &'a [Bytes], iov: &'a mut [IoSlice<'a>; MAX_IOV]) -> &'a [IoSlice<'a>] {
    let count = segs.len().min(MAX_IOV);
    for (slot, seg) in iov.iter_mut().zip(&segs[..count]) {
        *slot = IoSlice::new(seg);
    }
    &iov[..count]
}

/// Drops the first `n` bytes of the segments: the ones written whole, and the front of a
/// segment written in part.
fn consume(segs: &mut Vec<Bytes>, mut n: usize) {
    let whole = segs.iter().take_while(|s| {
        let done = n >= s.len();
        if done {
            n -= s.len();
        }
        done
    });
    let whole = whole.count();
    segs.drain(..whole);
    if n > 0 {
        segs[0].advance(n);
    }
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

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
