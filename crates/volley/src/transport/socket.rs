//! Byte streams of every kind behind one type: what a client connects, what a server's listener
//! accepts (unix, tcp, TLS, shared memory). The client and the server never match on the kind
//! of transport; only [`connect`] and [`bind`] do (and, inside, one small `match` per operation
//! of the stream).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::Address;
use super::stream::{ByteStream, ReadHalf, WriteHalf};
use crate::Error;

/// A connected byte stream: unix, tcp, TLS over tcp, or shared memory. (A TLS session is large,
/// but a stream is split into its halves at once, so the enum is not worth boxing.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    Tls(super::tls::TlsStream),
    #[cfg(target_os = "linux")]
    Shm(super::shm::ShmStream),
    /// `tcp://` on a simulated host (`sim.rs`).
    #[cfg(feature = "sim")]
    Sim(turmoil::net::TcpStream),
}

/// The read half of a [`Stream`].
pub(crate) enum StreamRead {
    Unix(tokio::net::unix::OwnedReadHalf),
    Tcp(tokio::net::tcp::OwnedReadHalf),
    #[cfg(feature = "tls")]
    Tls(super::tls::TlsReadHalf),
    #[cfg(target_os = "linux")]
    Shm(super::shm::ShmRead),
    #[cfg(feature = "sim")]
    Sim(super::sim::SimRead),
}

/// The write half of a [`Stream`].
pub(crate) enum StreamWrite {
    Unix(tokio::net::unix::OwnedWriteHalf),
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    #[cfg(feature = "tls")]
    Tls(<super::tls::TlsStream as ByteStream>::Write),
    #[cfg(target_os = "linux")]
    Shm(super::shm::ShmWrite),
    #[cfg(feature = "sim")]
    Sim(turmoil::net::tcp::OwnedWriteHalf),
}

/// Calls the same method on whichever half an enum holds.
macro_rules! each {
    ($value:expr, $half:ident => $body:expr) => {
        match $value {
            Self::Unix($half) => $body,
            Self::Tcp($half) => $body,
            #[cfg(feature = "tls")]
            Self::Tls($half) => $body,
            #[cfg(target_os = "linux")]
            Self::Shm($half) => $body,
            #[cfg(feature = "sim")]
            Self::Sim($half) => $body,
        }
    };
}

impl ByteStream for Stream {
    type Read = StreamRead;
    type Write = StreamWrite;

    fn into_halves(self) -> (StreamRead, StreamWrite) {
        match self {
            Stream::Unix(s) => {
                let (r, w) = s.into_halves();
                (StreamRead::Unix(r), StreamWrite::Unix(w))
            }
            Stream::Tcp(s) => {
                let (r, w) = s.into_halves();
                (StreamRead::Tcp(r), StreamWrite::Tcp(w))
            }
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                let (r, w) = s.into_halves();
                (StreamRead::Tls(r), StreamWrite::Tls(w))
            }
            #[cfg(target_os = "linux")]
            Stream::Shm(s) => {
                let (r, w) = s.into_halves();
                (StreamRead::Shm(r), StreamWrite::Shm(w))
            }
            #[cfg(feature = "sim")]
            Stream::Sim(s) => {
                let (r, w) = s.into_halves();
                (StreamRead::Sim(r), StreamWrite::Sim(w))
            }
        }
    }

    fn peer(&self) -> String {
        each!(self, s => s.peer())
    }
}

impl ReadHalf for StreamRead {
    async fn readable(&self) -> io::Result<()> {
        // The trait's `readable`, not a socket half's own method of that name (see stream.rs).
        each!(self, r => ReadHalf::readable(r).await)
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        each!(self, r => ReadHalf::try_read_buf(r, buf))
    }
}

impl WriteHalf for StreamWrite {
    fn try_writes(&self) -> bool {
        each!(self, w => w.try_writes())
    }

    fn try_write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        each!(self, w => w.try_write_vectored(bufs))
    }
}

impl AsyncWrite for StreamWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), w => Pin::new(w).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), w => Pin::new(w).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        each!(self, w => w.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), w => Pin::new(w).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), w => Pin::new(w).poll_shutdown(cx))
    }
}

/// Connects to a socket address (not `inproc://`, which [`super::inproc::lookup`] finds).
/// `shm_ring` is the size of each ring of a `shm://` connection.
#[cfg_attr(not(feature = "tls"), allow(unused_variables))]
pub(crate) async fn connect(
    addr: &Address,
    shm_ring: usize,
    #[cfg(feature = "tls")] tls: Option<&super::tls::TlsClient>,
) -> Result<Stream, Error> {
    let fail = |e| Error::io(&format!("connect to {addr}"), e);
    match addr {
        #[cfg(feature = "sim")]
        Address::Tcp(a) if super::sim::active() => {
            Ok(Stream::Sim(turmoil::net::TcpStream::connect(a.as_str()).await.map_err(fail)?))
        }
        Address::Tcp(a) => {
            let s = TcpStream::connect(a.as_str()).await.map_err(fail)?;
            // Requests are bundled by the outbox already; Nagle would only add latency.
            let _ = s.set_nodelay(true);
            Ok(Stream::Tcp(s))
        }
        Address::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p).await.map_err(fail)?)),
        #[cfg(feature = "tls")]
        Address::Tls(a) => {
            let tls = tls.ok_or_else(|| {
                Error::Usage(format!("connect to {addr}: no TLS settings (ClientConfig::tls)"))
            })?;
            Ok(Stream::Tls(tls.connect(a).await?))
        }
        #[cfg(not(feature = "tls"))]
        Address::Tls(_) => Err(no_tls(addr)),
        #[cfg(target_os = "linux")]
        Address::Shm(rest) => Ok(Stream::Shm(super::shm::connect(rest, shm_ring).await?)),
        #[cfg(not(target_os = "linux"))]
        Address::Shm(_) => Err(no_shm(addr)),
        Address::Inproc(_) => unreachable!("inproc addresses are looked up, not connected"),
    }
}

#[cfg(not(target_os = "linux"))]
fn no_shm(addr: &Address) -> Error {
    Error::InvalidAddress { addr: addr.to_string(), reason: "shm:// (shared memory) needs Linux".into() }
}

#[cfg(not(feature = "tls"))]
fn no_tls(addr: &Address) -> Error {
    Error::InvalidAddress { addr: addr.to_string(), reason: "tls:// needs volley's `tls` feature".into() }
}

/// A listening socket.
pub(crate) enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
    #[cfg(feature = "tls")]
    Tls(TcpListener, super::tls::TlsServer),
    /// The unix socket connections to a `shm://` address are set up over, and the most bytes
    /// each of a connection's rings may hold.
    Shm(UnixListener, usize),
    #[cfg(feature = "sim")]
    Sim(turmoil::net::TcpListener),
}

/// A socket just accepted, before its handshake.
pub(crate) enum Accepted {
    Unix(UnixStream),
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    Tls(TcpStream, super::tls::TlsServer),
    Shm(UnixStream, usize),
    #[cfg(feature = "sim")]
    Sim(turmoil::net::TcpStream),
}

/// Binds a socket address (not `inproc://`); returns the listener and the address it is bound
/// to (with the real port for `tcp://HOST:0`). `tls` is the server's certificate, which a
/// `tls://` address needs; `shm_max_ring` the most bytes a `shm://` client's ring may hold.
#[cfg_attr(not(feature = "tls"), allow(unused_variables))]
pub(crate) async fn bind(
    addr: &Address,
    shm_max_ring: usize,
    #[cfg(feature = "tls")] tls: Option<&super::tls::TlsServer>,
) -> Result<(Listener, Address), Error> {
    let fail = |e| Error::io(&format!("listen on {addr}"), e);
    let local =
        |l: &TcpListener| l.local_addr().map(|a| a.to_string()).map_err(|e| Error::io("local address", e));
    match addr {
        #[cfg(feature = "sim")]
        Address::Tcp(a) if super::sim::active() => {
            let (l, bound) = super::sim::bind(a).await.map_err(fail)?;
            Ok((Listener::Sim(l), Address::Tcp(bound)))
        }
        Address::Tcp(a) => {
            let l = TcpListener::bind(a.as_str()).await.map_err(fail)?;
            let bound = Address::Tcp(local(&l)?);
            Ok((Listener::Tcp(l), bound))
        }
        Address::Unix(path) => {
            remove_stale_socket(path).await;
            Ok((Listener::Unix(UnixListener::bind(path).map_err(fail)?), addr.clone()))
        }
        #[cfg(feature = "tls")]
        Address::Tls(a) => {
            let tls = tls.cloned().ok_or_else(|| {
                Error::Usage(format!(
                    "listen on {addr}: the server has no TLS certificate (ServerBuilder::tls)"
                ))
            })?;
            let l = TcpListener::bind(a.as_str()).await.map_err(fail)?;
            let bound = Address::Tls(local(&l)?);
            Ok((Listener::Tls(l, tls), bound))
        }
        #[cfg(not(feature = "tls"))]
        Address::Tls(_) => Err(no_tls(addr)),
        #[cfg(target_os = "linux")]
        Address::Shm(rest) => {
            let path = super::shm::socket_path(rest);
            remove_stale_socket(&path).await;
            Ok((Listener::Shm(UnixListener::bind(&path).map_err(fail)?, shm_max_ring), addr.clone()))
        }
        #[cfg(not(target_os = "linux"))]
        Address::Shm(_) => Err(no_shm(addr)),
        Address::Inproc(_) => unreachable!("inproc addresses are bound in the inproc table"),
    }
}

impl Listener {
    pub(crate) async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?.0)),
            Listener::Tcp(l) => Ok(Accepted::Tcp(nodelay(l.accept().await?.0)?)),
            #[cfg(feature = "tls")]
            Listener::Tls(l, tls) => Ok(Accepted::Tls(nodelay(l.accept().await?.0)?, tls.clone())),
            Listener::Shm(l, max_ring) => Ok(Accepted::Shm(l.accept().await?.0, *max_ring)),
            #[cfg(feature = "sim")]
            Listener::Sim(l) => Ok(Accepted::Sim(l.accept().await?.0)),
        }
    }
}

fn nodelay(s: TcpStream) -> io::Result<TcpStream> {
    s.set_nodelay(true)?;
    Ok(s)
}

impl Accepted {
    /// The peer's address, for logs.
    pub(crate) fn peer(&self) -> String {
        match self {
            Accepted::Unix(s) => s.peer(),
            Accepted::Tcp(s) => s.peer(),
            #[cfg(feature = "tls")]
            Accepted::Tls(s, _) => s.peer().replacen("tcp://", "tls://", 1),
            Accepted::Shm(..) => "shm peer".into(),
            #[cfg(feature = "sim")]
            Accepted::Sim(s) => s.peer(),
        }
    }

    /// Runs the handshake (TLS; the set-up of shared memory; nothing for the others) and
    /// returns the stream.
    pub(crate) async fn handshake(self) -> io::Result<Stream> {
        match self {
            Accepted::Unix(s) => Ok(Stream::Unix(s)),
            Accepted::Tcp(s) => Ok(Stream::Tcp(s)),
            #[cfg(feature = "tls")]
            Accepted::Tls(s, tls) => Ok(Stream::Tls(tls.accept(s).await?)),
            #[cfg(target_os = "linux")]
            Accepted::Shm(s, max_ring) => Ok(Stream::Shm(super::shm::accept(s, max_ring).await?)),
            #[cfg(not(target_os = "linux"))]
            Accepted::Shm(..) => unreachable!("shm:// is bound on Linux only"),
            #[cfg(feature = "sim")]
            Accepted::Sim(s) => Ok(Stream::Sim(s)),
        }
    }
}

/// Cleans up after a listener on `addr` is gone: removes a unix socket's file (an abstract
/// socket has none).
pub(crate) fn unbind(addr: &Address) {
    match addr {
        Address::Unix(path) => {
            let _ = std::fs::remove_file(path);
        }
        Address::Shm(rest) if rest.starts_with('/') => {
            let _ = std::fs::remove_file(rest);
        }
        _ => {}
    }
}

/// A socket file left by a process that died is removed; a live one is left alone (bind then
/// fails with "address in use", as it should).
async fn remove_stale_socket(path: &std::path::Path) {
    if path.is_absolute() && path.exists() && UnixStream::connect(path).await.is_err() {
        let _ = std::fs::remove_file(path);
    }
}
