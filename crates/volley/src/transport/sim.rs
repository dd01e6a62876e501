//! A simulated network (feature `sim`): inside a `turmoil` simulation, `tcp://HOST:PORT` is
//! connected and bound on turmoil's network — its hosts, links, latencies, partitions and
//! crashes — instead of the kernel's; outside one, nothing changes. The rest of the library
//! sees a byte stream as on a socket, so the client, the server, the registry and the
//! resilient client run unchanged on simulated hosts (`crates/volley-sim`).
//!
//! The switch is made per call (`turmoil::in_simulation`), not per build: a workspace build
//! that turns the feature on for the simulation crate also builds every other crate's tests
//! with it, and those must still meet real sockets.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use turmoil::net::TcpStream;
use turmoil::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::stream::{ByteStream, ReadHalf, WriteHalf};

/// Set once a process runs simulations ([`enable`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Lets `tcp://` and the deadlines' clock ask whether they run on a simulated host. Call it
/// before running a simulation. Until then they do not ask: turmoil's answer outside a
/// simulation allocates an error, which would cost every call of a process built with the
/// feature but not simulating (a workspace build unifies it into every test).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether the calling task runs on a simulated host.
#[inline]
pub(crate) fn active() -> bool {
    ENABLED.load(Ordering::Relaxed) && turmoil::in_simulation()
}

/// How long the simulation has run, in simulated time, the same on every host: the clock the
/// client's deadlines follow while simulated (`client/clock.rs`). `None` outside a simulation.
pub(crate) fn elapsed() -> Option<Duration> {
    if active() { turmoil::sim_elapsed() } else { None }
}

/// Listens on `HOST:PORT` of the calling simulated host, where `HOST` is the host's own name
/// (or `0.0.0.0`): turmoil binds only unspecified addresses, so the name is kept as the
/// listener's address, which other hosts resolve through the simulation's names. Port 0 takes
/// a free port.
pub(crate) async fn bind(addr: &str) -> io::Result<(turmoil::net::TcpListener, String)> {
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: not HOST:PORT")))?;
    let l = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
    let port = l.local_addr()?.port();
    Ok((l, format!("{host}:{port}")))
}

/// The read half of a simulated connection. Turmoil's streams are read only by `poll_read`,
/// so readiness is a read into a small stash that the next `try_read_buf` hands over first.
/// (Behind a lock because readiness is asked for through `&self`; only the connection's
/// reader uses the half, so the lock is never contended.)
pub struct SimRead(Mutex<Inner>);

struct Inner {
    half: OwnedReadHalf,
    stash: BytesMut,
    /// The peer closed its side (a read returned 0): every later read returns 0 at once.
    eof: bool,
}

const STASH: usize = 16 * 1024;

impl Inner {
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.stash.is_empty() || self.eof {
            return Poll::Ready(Ok(()));
        }
        // Straight into the stash's spare room: nothing to zero or copy per poll (most polls
        // find nothing to read, and a simulation polls millions of times).
        self.stash.reserve(STASH);
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.half), cx, &mut self.stash) {
            Poll::Ready(Ok(0)) => self.eof = true,
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        Poll::Ready(Ok(()))
    }
}

impl ReadHalf for SimRead {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        std::future::poll_fn(|cx| self.0.lock().poll_fill(cx))
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let inner = self.0.get_mut();
        let mut cx = Context::from_waker(Waker::noop());
        match inner.poll_fill(&mut cx) {
            Poll::Ready(Ok(())) => {
                let n = inner.stash.len();
                buf.extend_from_slice(&inner.stash);
                inner.stash.clear();
                Ok(n)
            }
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

// Turmoil's write half has no non-blocking write: every write goes through the connection's
// writer task (the trait's default).
impl WriteHalf for OwnedWriteHalf {}

impl ByteStream for TcpStream {
    type Read = SimRead;
    type Write = OwnedWriteHalf;
    fn into_halves(self) -> (SimRead, OwnedWriteHalf) {
        let (half, w) = self.into_split();
        (SimRead(Mutex::new(Inner { half, stash: BytesMut::new(), eof: false })), w)
    }
    fn peer(&self) -> String {
        self.peer_addr().map(|a| format!("tcp://{a}")).unwrap_or_else(|_| "tcp://?".into())
    }
}
