//! Shared memory between processes of one host (`shm:///PATH` or `shm://NAME`; Linux).
//!
//! A connection is set up over a unix socket — the server listens, accepts and (with a token)
//! authenticates exactly as on `unix://` — and then carries Volley's byte format
//! (docs/PROTOCOL.md) through two single-producer single-consumer byte rings in a memory file
//! that the client creates and passes to the server with `SCM_RIGHTS`. The frame decoder, the
//! outbox's bundling and the reader's batching see a byte stream, as on a socket; under load a
//! bundle crosses without any syscall, because a side is woken (through a wake-up channel, a
//! unix socket pair that is never written to in a way that could block) only when it said it
//! sleeps. The unix socket stays open and silent: when the peer exits or is killed
//! it closes, and the connection ends at once.
//!
//! - [`layout`]: where the header, control blocks and rings sit in the mapping.
//! - [`ring`]: one ring's positions and their validation, sans-IO.
//! - [`spin`]: whether a reader polls before it sleeps.
//! - [`sys`]: the mapping itself and the wake-up channels' registration — the only `unsafe`
//!   code.
//! - [`wake`]: the wake-up channels, and why they are sockets (never a blocking call on a file
//!   the peer shares).
//! - [`handshake`]: the set-up messages and the passing of file descriptors.
//! - [`stream`]: the halves a connection reads and writes through.

mod handshake;
pub(crate) mod layout;
pub(crate) mod ring;
mod spin;
mod stream;
pub(crate) mod sys;
mod wake;

use std::path::PathBuf;

use tokio::net::UnixStream;

use stream::Side;
pub use stream::{ShmRead, ShmStream, ShmWrite};

use crate::Error;

/// The unix socket an `shm://` address is set up over: `shm:///PATH` is the socket file at
/// `PATH`; `shm://NAME` is the abstract socket `volley-shm/NAME` (no file; gone with its
/// listener).
pub(crate) fn socket_path(rest: &str) -> PathBuf {
    if rest.starts_with('/') { PathBuf::from(rest) } else { PathBuf::from(format!("\0volley-shm/{rest}")) }
}

/// Whether `rest` (what follows `shm://`) names a socket: an absolute path, or a name of
/// letters, digits, `.`, `_` and `-` short enough for an abstract socket address.
pub(crate) fn check_rest(rest: &str) -> Result<(), &'static str> {
    let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    match rest {
        "" => Err("shm:// needs a socket path (shm:///run/x.sock) or a name (shm://NAME)"),
        r if r.starts_with('/') => Ok(()),
        r if r.len() <= 90 && r.chars().all(name_ok) => Ok(()),
        _ => Err(
            "shm://NAME takes up to 90 letters, digits, '.', '_' or '-' (or an absolute path: shm:///PATH)",
        ),
    }
}

/// Connects to the shm server whose set-up socket is at `rest` (see [`socket_path`]), with
/// rings of `ring` bytes each way.
pub(crate) async fn connect(rest: &str, ring: usize) -> Result<ShmStream, Error> {
    let addr = format!("shm://{rest}");
    let sock = UnixStream::connect(socket_path(rest))
        .await
        .map_err(|e| Error::io(&format!("connect to {addr}"), e))?;
    let set_up = handshake::client(&sock, ring, &addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => Error::Usage(format!("connect to {addr}: {e}")),
        std::io::ErrorKind::ConnectionRefused => Error::Connection(format!("{addr}: {e}")),
        _ => Error::io(&format!("set up {addr}"), e),
    })?;
    ShmStream::new(set_up, sock, Side::Client, addr.clone())
        .map_err(|e| Error::io(&format!("set up {addr}"), e))
}

/// The server's side of the set-up, on a socket just accepted; the client's rings may hold at
/// most `max_ring` bytes each.
pub(crate) async fn accept(sock: UnixStream, max_ring: usize) -> std::io::Result<ShmStream> {
    let peer = match sock.peer_cred().ok().and_then(|c| c.pid()) {
        Some(pid) => format!("shm peer (pid {pid})"),
        None => "shm peer".to_string(),
    };
    let set_up = handshake::server(&sock, max_ring).await?;
    ShmStream::new(set_up, sock, Side::Server, peer)
}

#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod tests;
