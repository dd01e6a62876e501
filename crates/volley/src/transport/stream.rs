//! Unix and tcp sockets behind one trait, so connections are written once.

use std::future::Future;
use std::io;

use bytes::BytesMut;
use tokio::io::AsyncWrite;
use tokio::net::{TcpStream, UnixStream, tcp, unix};

/// The read half of a byte stream, read by readiness so an idle connection needs no buffer.
pub trait ReadHalf: Send + Sync + Unpin + 'static {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize>;
}

/// A connected byte stream that splits into independently owned halves.
pub trait ByteStream: Send + 'static {
    type Read: ReadHalf;
    type Write: AsyncWrite + Send + Unpin + 'static;
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

/// What turns an accepted socket into the byte stream the protocol runs over: nothing for unix
/// and tcp, a TLS handshake for `tls://`. The server bounds how long it may take.
pub trait Handshake<S>: Clone + Send + Sync + 'static {
    type Stream: ByteStream;
    fn run(&self, accepted: S) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

/// No handshake: the accepted socket is the stream.
#[derive(Debug, Clone, Copy)]
pub struct Plain;

impl<S: ByteStream + Send> Handshake<S> for Plain {
    type Stream = S;
    async fn run(&self, accepted: S) -> io::Result<S> {
        Ok(accepted)
    }
}

/// A listening socket that yields byte streams.
pub trait Listener: Send + Sync + 'static {
    type Stream: ByteStream;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Stream = TcpStream;
    async fn accept(&self) -> io::Result<TcpStream> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        // Requests are bundled by the outbox already; Nagle would only add latency.
        s.set_nodelay(true)?;
        Ok(s)
    }
}

impl Listener for tokio::net::UnixListener {
    type Stream = UnixStream;
    async fn accept(&self) -> io::Result<UnixStream> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}
