//! Connecting and listening on the addresses the runners take: `tcp://HOST:PORT` (or a bare
//! `HOST:PORT`) and `unix:///PATH`.

use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

pub type BoxStream = Pin<Box<dyn Stream>>;

enum Addr<'a> {
    Tcp(&'a str),
    Unix(&'a str),
}

fn parse(addr: &str) -> Result<Addr<'_>, String> {
    if let Some(path) = addr.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(format!("{addr}: unix:// needs an absolute path, as in unix:///tmp/x.sock"));
        }
        return Ok(Addr::Unix(path));
    }
    let hostport = addr.strip_prefix("tcp://").unwrap_or(addr);
    if hostport.contains("://") || !hostport.contains(':') {
        return Err(format!("{addr}: expected tcp://HOST:PORT or unix:///PATH"));
    }
    Ok(Addr::Tcp(hostport))
}

pub async fn connect(addr: &str) -> Result<BoxStream, String> {
    let fail = |e: std::io::Error| format!("connecting to {addr}: {e}");
    Ok(match parse(addr)? {
        Addr::Tcp(a) => Box::pin(TcpStream::connect(a).await.map_err(fail)?),
        Addr::Unix(p) => Box::pin(UnixStream::connect(p).await.map_err(fail)?),
    })
}

/// A bound listener and the address it is reachable at (the port filled in).
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, String),
}

impl Listener {
    pub async fn bind(addr: &str) -> Result<Listener, String> {
        let fail = |e: std::io::Error| format!("listening on {addr}: {e}");
        Ok(match parse(addr)? {
            Addr::Tcp(a) => Listener::Tcp(TcpListener::bind(a).await.map_err(fail)?),
            Addr::Unix(p) => Listener::Unix(UnixListener::bind(p).map_err(fail)?, format!("unix://{p}")),
        })
    }

    pub fn address(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| format!("tcp://{a}")).unwrap_or_default(),
            Listener::Unix(_, a) => a.clone(),
        }
    }

    pub async fn accept(&self) -> std::io::Result<BoxStream> {
        Ok(match self {
            Listener::Tcp(l) => Box::pin(l.accept().await?.0),
            Listener::Unix(l, _) => Box::pin(l.accept().await?.0),
        })
    }
}
