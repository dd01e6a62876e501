//! A set-up shm connection as a byte stream: the read half drains the receive ring into the
//! reader's buffer, the write half copies into the send ring; the wake-up channels
//! ([`wake`](super::wake)) wake a side that sleeps, and the unix socket of the set-up tells
//! when the peer is gone.
//!
//! The peer may corrupt the mapping at any moment, so each half checks every position it
//! reads there — the read half also checks the peer's read position of the *send* ring, so
//! that corruption is found while we have nothing to write — and a violation found by either
//! half breaks the link for both: the reader reports it as a protocol error at once (the
//! server answers with a go-away), and the writer sends at most what still fits by the last
//! valid position, never waiting for room the peer might never give.

use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::AsyncWrite;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::sync::Notify;

use super::handshake::SetUp;
use super::layout::{CONTROL_A, CONTROL_B};
use super::ring::{self, RingAt, RingReader, RingWriter};
use super::spin::Spin;
use super::sys::{self, Region};
use super::wake::{self, Drained};
use crate::proto::ProtocolError;
use crate::transport::stream::{ByteStream, ReadHalf, WriteHalf};

/// Most bytes one read takes when the reader offers no room of its own.
const READ_CHUNK: usize = 64 * 1024;

/// What the set-up socket said.
const OPEN: u8 = 0;
/// The peer closed it: it exited, crashed or closed the connection.
const GONE: u8 = 1;
/// The peer broke the protocol (a byte on the set-up socket, a corrupt ring position): see
/// [`Link::broken`].
const BROKEN: u8 = 2;

/// Which end of the connection this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// What both halves of one connection share.
pub(super) struct Link {
    pub(super) region: Region,
    /// The set-up socket: watched for the peer's end.
    control: UnixStream,
    state: AtomicU8,
    /// Why the link is [`BROKEN`], once it is.
    broken: Mutex<Option<&'static str>>,
    /// Wakes the read half when the write half breaks the link.
    broke: Notify,
    /// Our ends of the wake-up channels, signalled by the peer: bytes in our receive ring,
    /// room in our send ring.
    bytes_ready: AsyncFd<OwnedFd>,
    room_ready: AsyncFd<OwnedFd>,
    /// The peer's ends, which we signal on.
    peer_bytes_ready: OwnedFd,
    peer_room_ready: OwnedFd,
    /// The send ring, and our write position in it as the write half publishes it: what the
    /// read half checks the peer's read position of it against.
    tx_at: RingAt,
    tx_published: Arc<AtomicU64>,
}

/// An established shm connection.
pub struct ShmStream {
    pub(super) link: Arc<Link>,
    rx: RingReader,
    tx: RingWriter,
    peer: String,
}

impl ShmStream {
    pub(super) fn new(set_up: SetUp, control: UnixStream, side: Side, peer: String) -> io::Result<ShmStream> {
        let SetUp { region, geometry: g, bytes_ready, room_ready, peer_bytes_ready, peer_room_ready } =
            set_up;
        let a = RingAt { control: CONTROL_A, data: g.data_a(), cap: g.a };
        let b = RingAt { control: CONTROL_B, data: g.data_b(), cap: g.b };
        let (rx, tx) = match side {
            Side::Client => (b, a),
            Side::Server => (a, b),
        };
        let tx = RingWriter::new(tx);
        let link = Link {
            region,
            control,
            state: AtomicU8::new(OPEN),
            broken: Mutex::new(None),
            broke: Notify::new(),
            bytes_ready: sys::register(bytes_ready)?,
            room_ready: sys::register(room_ready)?,
            peer_bytes_ready,
            peer_room_ready,
            tx_at: tx.at(),
            tx_published: tx.published(),
        };
        Ok(ShmStream { link: Arc::new(link), rx: RingReader::new(rx), tx, peer })
    }
}

impl ByteStream for ShmStream {
    type Read = ShmRead;
    type Write = ShmWrite;

    fn into_halves(self) -> (ShmRead, ShmWrite) {
        let read = ShmRead {
            link: self.link.clone(),
            state: Mutex::new(ReadState { ring: self.rx, last_bytes: Instant::now(), spin: Spin::new() }),
        };
        (read, ShmWrite { link: self.link, ring: self.tx })
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }
}

fn ring_error(e: ProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Link {
    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// Looks at the set-up socket without waiting: its end means the peer is gone, a byte on
    /// it is a protocol violation.
    fn check_control(&self) {
        let mut byte = [0u8; 1];
        match self.control.try_read(&mut byte) {
            Ok(0) => self.gone(),
            Ok(_) => self.break_with("the peer wrote on the set-up socket after the set-up"),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.gone(),
        }
    }

    fn gone(&self) {
        let _ = self.state.compare_exchange(OPEN, GONE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Marks the link broken by the peer (the first reason stays) and wakes the read half to
    /// report it.
    fn break_with(&self, why: &'static str) {
        self.broken.lock().get_or_insert(why);
        let _ = self.state.compare_exchange(OPEN, BROKEN, Ordering::AcqRel, Ordering::Acquire);
        self.broke.notify_one();
    }

    /// Checks the peer's read position of our send ring against what we wrote
    /// ([`ring::check_read_pos`]); a violation breaks the link.
    fn check_send_ring(&self) {
        let before = self.tx_published.load(Ordering::Acquire);
        let read = self.region.u64_at(self.tx_at.control + ring::READ_POS).load(Ordering::Acquire);
        let after = self.tx_published.load(Ordering::Acquire);
        if let Err(ProtocolError::Ring(why)) =
            ring::check_read_pos(self.tx_at.cap as u64, before, read, after)
        {
            self.break_with(why);
        }
    }

    /// The error of a connection that is no longer open, if it is not.
    fn ended(&self) -> Option<io::Error> {
        match self.state() {
            OPEN => None,
            GONE => Some(io::ErrorKind::BrokenPipe.into()),
            _ => Some(self.broken_error()),
        }
    }

    /// The protocol error of a broken link.
    fn broken_error(&self) -> io::Error {
        let why = self.broken.lock().unwrap_or("the peer broke the shared-memory protocol");
        ring_error(ProtocolError::Ring(why))
    }

    /// Takes the wake-ups waiting on one of our channels; a channel the peer closed means it
    /// can no longer wake us: as good as gone.
    fn drain(&self, guard: &mut tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>) {
        match wake::drain(guard.get_inner()) {
            Drained::Empty => guard.clear_ready(),
            // Readiness stays: the next wait returns at once and drains the rest.
            Drained::More => {}
            Drained::Closed => self.gone(),
        }
    }

    /// Waits for a wake-up from the peer (bytes for us), for news on the set-up socket, or for
    /// the write half to find the link broken.
    async fn wait_bytes(&self) -> io::Result<()> {
        tokio::select! {
            guard = self.bytes_ready.readable() => self.drain(&mut guard?),
            r = self.control.readable() => {
                r?;
                self.check_control();
            }
            () = self.broke.notified() => {}
        }
        Ok(())
    }

    /// Polls for room (a wake-up from the peer) or news on the set-up socket.
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.control.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {
                    // Nothing there clears the readiness, so the next poll registers us.
                    self.check_control();
                    if self.state() != OPEN {
                        return Poll::Ready(Ok(()));
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        let mut guard = ready!(self.room_ready.poll_read_ready(cx))?;
        self.drain(&mut guard);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
impl Link {
    /// Wakes the peer's reader as a write would: for tests that change the ring by hand.
    pub(super) fn wake_peer_reader(&self) {
        wake::signal(&self.peer_bytes_ready);
    }
}

/// The read half: the receive ring, read by readiness like a socket.
pub struct ShmRead {
    link: Arc<Link>,
    state: Mutex<ReadState>,
}

struct ReadState {
    ring: RingReader,
    /// When bytes last came: a reader that just got some looks for more before sleeping.
    last_bytes: Instant,
    spin: Spin,
}

impl ShmRead {
    /// Whether a read would return something now: bytes, the end, or an error.
    fn has_news(&self) -> bool {
        let region = &self.link.region;
        self.link.check_send_ring();
        let st = self.state.lock();
        self.link.state() != OPEN || st.ring.ready(region) != Ok(0) || st.ring.closed(region)
    }
}

impl ReadHalf for ShmRead {
    /// Polls the ring for a while after the last bytes (yielding to the runtime's other tasks
    /// between looks; see [`Spin`]), then sleeps until the peer wakes us or goes away.
    async fn readable(&self) -> io::Result<()> {
        let spin_until = {
            let mut st = self.state.lock();
            let last_bytes = st.last_bytes;
            st.spin.until(last_bytes)
        };
        let mut spun = false;
        loop {
            if self.has_news() {
                if spun {
                    self.state.lock().spin.paid();
                }
                return Ok(());
            }
            if spin_until.is_some_and(|t| Instant::now() < t) {
                spun = true;
                tokio::task::yield_now().await;
                continue;
            }
            self.state.lock().ring.announce_sleep(&self.link.region);
            if self.has_news() {
                self.state.lock().ring.cancel_sleep(&self.link.region);
                return Ok(());
            }
            if std::mem::take(&mut spun) {
                self.state.lock().spin.failed();
            }
            self.link.wait_bytes().await?;
        }
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let region = &self.link.region;
        // A broken link is reported before any more bytes: the peer is not to be served on.
        self.link.check_send_ring();
        if self.link.state() == BROKEN {
            return Err(self.link.broken_error());
        }
        let mut st = self.state.lock();
        let room = buf.capacity() - buf.len();
        let max = if room == 0 { READ_CHUNK } else { room };
        let mut read = st.ring.read(region, buf, max).map_err(ring_error)?;
        if read.n == 0 {
            if let Some(e) = self.link.ended().filter(|e| e.kind() != io::ErrorKind::BrokenPipe) {
                return Err(e);
            }
            if self.link.state() == OPEN && !st.ring.closed(region) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            // The peer is gone or wrote its last byte: what it wrote before is visible now.
            read = st.ring.read(region, buf, max).map_err(ring_error)?;
            if read.n == 0 {
                return Ok(0);
            }
        }
        st.last_bytes = Instant::now();
        if read.wake_writer {
            wake::signal(&self.link.peer_room_ready);
        }
        Ok(read.n)
    }
}

/// The write half: copies into the send ring; waits for room when it is full.
pub struct ShmWrite {
    link: Arc<Link>,
    ring: RingWriter,
}

impl AsyncWrite for ShmWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        loop {
            if let Some(n) = this.write_now(bufs)? {
                return Poll::Ready(Ok(n));
            }
            this.ring.announce_wait(&this.link.region);
            if this.room()? > 0 {
                continue;
            }
            ready!(this.link.poll_room(cx))?;
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Bytes are in the ring as soon as a write returns: nothing to flush.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Ends this direction: the peer reads what is in the ring, then the end of the stream.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().end();
        Poll::Ready(Ok(()))
    }
}

impl WriteHalf for ShmWrite {
    fn try_writes(&self) -> bool {
        true
    }

    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.write_now(bufs)?.ok_or_else(|| io::ErrorKind::WouldBlock.into())
    }
}

impl ShmWrite {
    /// Room in the ring now. A corrupt read position breaks the link (the read half reports
    /// it); the room left by the last valid one is still used, so that a go-away can go out,
    /// but once that is spent the write fails instead of waiting for the peer.
    fn room(&mut self) -> io::Result<usize> {
        let room = match self.ring.room(&self.link.region) {
            Ok(room) => room,
            Err(ProtocolError::Ring(why)) => {
                self.link.break_with(why);
                self.ring.room(&self.link.region).map_err(ring_error)?
            }
            Err(e) => return Err(ring_error(e)),
        };
        if room == 0 && self.ring.violated() {
            return Err(self.link.broken_error());
        }
        Ok(room)
    }

    /// Copies what fits into the ring and wakes the peer if it sleeps; `None` when the ring
    /// is full.
    fn write_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        // A peer that broke the protocol may still be told why (a go-away); one that is gone
        // reads nothing more.
        if self.link.state() == GONE {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = self.room()?;
        if room == 0 {
            return Ok(None);
        }
        let written = self.ring.write(&self.link.region, bufs, room);
        if written.wake_reader {
            wake::signal(&self.link.peer_bytes_ready);
        }
        Ok(Some(written.n))
    }

    fn end(&mut self) {
        if self.ring.close(&self.link.region) {
            wake::signal(&self.link.peer_bytes_ready);
        }
    }
}

/// Dropping the write half ends the direction, as dropping a socket's write half does: the
/// peer's reader sees the end of the stream instead of waiting for bytes that cannot come.
impl Drop for ShmWrite {
    fn drop(&mut self) {
        self.end();
    }
}
