//! What a connection needs of a byte stream: a read half read by readiness and a write half,
//! implemented for unix and tcp sockets (TLS in `tls.rs`; all of them together in
//! `socket.rs`).

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream, tcp, unix};

/// The read half of a byte stream, read by readiness so an idle connection needs no buffer.
pub trait ReadHalf: Send + Sync + Unpin + 'static {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Reads what the stream holds now, without waiting: `WouldBlock` when it holds nothing.
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize>;
}

/// The write half of a byte stream: written by the connection's writer task, and, where the
/// stream allows it, directly by a task that finds the outbox idle (`transport/outbox.rs`).
pub trait WriteHalf: AsyncWrite + Send + Unpin + 'static {
    /// Whether [`try_write_vectored`](Self::try_write_vectored) can write at all.
    fn try_writes(&self) -> bool {
        false
    }

    /// Writes what the stream takes at once, without waiting: `WouldBlock` when it takes
    /// nothing now. A stream whose writes may leave bytes behind that only a later poll sends
    /// (TLS: the session's buffered records) keeps the default, which writes nothing.
    fn try_write_vectored(&mut self, _bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// A connected byte stream that splits into independently owned halves.
pub trait ByteStream: Send + 'static {
    type Read: ReadHalf;
    type Write: WriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write);
    /// The peer's address, for logs.
    fn peer(&self) -> String;
}

// Readiness is awaited through `poll_read_ready`, which keeps the one waker of the socket's
// reader, not through `readable()`, whose future joins and leaves the socket's list of waiters
// under its lock on every wait (~250 instructions each, two waits per lone round trip). Only
// the connection's reader task reads a socket, so the single waker is all it needs.
impl ReadHalf for tcp::OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::poll_fn(|cx| AsRef::<TcpStream>::as_ref(self).poll_read_ready(cx))
    }
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        read_now(self, buf)
    }
}

impl ReadHalf for unix::OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::poll_fn(|cx| AsRef::<UnixStream>::as_ref(self).poll_read_ready(cx))
    }
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        read_now(self, buf)
    }
}

/// Reads a socket without waiting through tokio's `poll_read`, not its `try_read_buf`: a read
/// that leaves part of the room offered empty tells tokio the socket is drained (epoll is
/// edge-triggered), so the reader's next attempt finds no readiness and waits, where
/// `try_read_buf` would first make a `recv` that fails with `EAGAIN` — one system call less each
/// time either side of a connection wakes up (two of eight per lone round trip). A pending
/// poll leaves the no-op waker in the socket's reader slot; the reader's wait through
/// `readable` (`poll_read_ready`, the same slot) then puts its own waker there.
fn read_now<R: AsyncRead + Unpin>(half: &mut R, buf: &mut BytesMut) -> io::Result<usize> {
    let mut cx = Context::from_waker(Waker::noop());
    match tokio_util::io::poll_read_buf(Pin::new(half), &mut cx, buf) {
        Poll::Ready(read) => read,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

impl WriteHalf for tcp::OwnedWriteHalf {
    fn try_writes(&self) -> bool {
        true
    }
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match bufs {
            // `send` costs the kernel less than a `writev` of one slice.
            [one] => tcp::OwnedWriteHalf::try_write(self, one),
            _ => tcp::OwnedWriteHalf::try_write_vectored(self, bufs),
        }
    }
}

impl WriteHalf for unix::OwnedWriteHalf {
    fn try_writes(&self) -> bool {
        true
    }
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match bufs {
            // `send` costs the kernel less than a `writev` of one slice.
            [one] => unix::OwnedWriteHalf::try_write(self, one),
            _ => unix::OwnedWriteHalf::try_write_vectored(self, bufs),
        }
    }
}

impl ByteStream for TcpStream {
    type Read = tcp::OwnedReadHalf;
    type Write = tcp::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    fn peer(&self) -> String {
        self.peer_addr().map(|a| format!("tcp://{a}")).unwrap_or_else(|_| "tcp://?".into())
    }
}

impl ByteStream for UnixStream {
    type Read = unix::OwnedReadHalf;
    type Write = unix::OwnedWriteHalf;
    fn into_halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    fn peer(&self) -> String {
        "unix peer".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A read that leaves room empty has drained the socket: the next one waits for readiness
    /// and makes no system call — bytes that arrived since stay unread until the reactor has
    /// seen them — and nothing is lost: the wait ends at once and the bytes follow. A read
    /// that fills its room keeps readiness, so what it left behind is read without a wait.
    #[tokio::test]
    async fn a_short_read_leaves_the_next_read_to_readiness() {
        let (ours, peer) = UnixStream::pair().unwrap();
        let (mut rd, _wr) = ours.into_split();
        let mut buf = BytesMut::with_capacity(4096);

        peer.try_write(&[1; 10]).unwrap();
        ReadHalf::readable(&rd).await.unwrap();
        assert_eq!(ReadHalf::try_read_buf(&mut rd, &mut buf).unwrap(), 10);

        // In the socket now, but the reactor has not run: a read finds no readiness.
        peer.try_write(&[2; 5]).unwrap();
        let err = ReadHalf::try_read_buf(&mut rd, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "no recv after a short read");

        tokio::time::timeout(Duration::from_secs(10), ReadHalf::readable(&rd))
            .await
            .expect("the bytes that came meanwhile make the half readable")
            .unwrap();
        assert_eq!(ReadHalf::try_read_buf(&mut rd, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..], &[[1; 10].as_slice(), &[2; 5]].concat()[..]);

        // A read that fills its room leaves readiness set: the rest is read at once.
        peer.try_write(&[3; 100]).unwrap();
        ReadHalf::readable(&rd).await.unwrap();
        let mut small = BytesMut::with_capacity(64);
        let first = ReadHalf::try_read_buf(&mut rd, &mut small).unwrap();
        assert_eq!(first, small.capacity(), "a full read");
        let mut rest = BytesMut::with_capacity(4096);
        assert_eq!(ReadHalf::try_read_buf(&mut rd, &mut rest).unwrap(), 100 - first, "read without a wait");
    }
}
