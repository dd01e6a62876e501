//! What a connection needs of a byte stream: a read half read by readiness and a write half,
//! implemented for unix and tcp sockets (TLS in `tls.rs`; all of them together in
//! `socket.rs`).

use std::future::Future;
use std::io::{self, IoSlice};

use bytes::BytesMut;
use tokio::io::AsyncWrite;
use tokio::net::{TcpStream, UnixStream, tcp, unix};

/// The read half of a byte stream, read by readiness so an idle connection needs no buffer.
pub trait ReadHalf: Send + Sync + Unpin + 'static {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize>;
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

impl ReadHalf for tcp::OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        tcp::OwnedReadHalf::readable(self)
    }
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        tcp::OwnedReadHalf::try_read_buf(self, buf)
    }
}

impl ReadHalf for unix::OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        unix::OwnedReadHalf::readable(self)
    }
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        unix::OwnedReadHalf::try_read_buf(self, buf)
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
