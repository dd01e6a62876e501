//! The ceiling: the echo with no framework at all, over the same sockets as the frameworks.
//!
//! - [`bundled`] (throughput scenarios): two plain blocking threads, no runtime. The client
//!   writes the scenario's N messages in one `write` and reads their N echoes; the server
//!   echoes every complete message it holds in one `write`. No ids, no allocation per
//!   message, no per-call completion: what the kernel and the loopback cost, and nothing else.
//! - [`PingPong`] against [`serve`] (latency scenario): one message at a time on tokio, the
//!   bare floor under a framework's single call, on the same runtimes as the frameworks.
//!
//! A message is a 4-byte big-endian length and the payload, nothing else.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::load::{Caller, CpuMeter, Sample, new_histogram, percentiles};
use crate::scenario::{Scenario, Settings, pin, unix_path};

const HEADER: usize = 4;
/// A length above this is a broken stream, not a payload.
const MAX_MESSAGE: usize = 64 << 20;

/// Bytes received and not yet echoed (or, on the ping-pong client, not yet taken).
struct Inbox {
    buf: Vec<u8>,
    held: usize,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox { buf: vec![0; 64 << 10], held: 0 }
    }

    /// Room to read into; doubled when a partial message fills the buffer.
    fn spare(&mut self) -> &mut [u8] {
        if self.held == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        &mut self.buf[self.held..]
    }

    fn filled(&mut self, n: usize) {
        self.held += n;
    }

    /// The complete messages at the front: their bytes and how many there are.
    fn complete(&self) -> io::Result<(usize, usize)> {
        let held = &self.buf[..self.held];
        let (mut at, mut count) = (0, 0);
        while let Some(&[a, b, c, d]) = held.get(at..at + HEADER) {
            let len = u32::from_be_bytes([a, b, c, d]) as usize;
            if len > MAX_MESSAGE {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a message of {len} bytes")));
            }
            if held.len() - at - HEADER < len {
                break;
            }
            (at, count) = (at + HEADER + len, count + 1);
        }
        Ok((at, count))
    }

    /// Drops the first `n` bytes, keeping a partial message for the next read.
    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.held, 0);
        self.held -= n;
    }
}

/// A message of `payload` bytes with its length in front.
fn message(out: &mut Vec<u8>, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(io::Error::other)?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

// ---- Bundled: blocking threads ----

/// A socket the blocking threads use.
trait Conn: Read + Write + AsRawFd + Send + 'static {}
impl<T: Read + Write + AsRawFd + Send + 'static> Conn for T {}

/// A connected (client, server) pair over `transport`; the client's side is non-blocking so
/// it can keep reading echoes while a bundle larger than the socket buffers is still going out.
fn connected(transport: &str) -> io::Result<(Box<dyn Conn>, Box<dyn Conn>)> {
    match transport {
        "tcp" => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            let client = std::net::TcpStream::connect(listener.local_addr()?)?;
            let (server, _) = listener.accept()?;
            client.set_nodelay(true)?;
            server.set_nodelay(true)?;
            client.set_nonblocking(true)?;
            Ok((Box::new(client), Box::new(server)))
        }
        "unix" => {
            let path = unix_path("raw");
            let listener = std::os::unix::net::UnixListener::bind(&path)?;
            let client = std::os::unix::net::UnixStream::connect(&path);
            // The connection outlives the name.
            let _ = std::fs::remove_file(&path);
            let client = client?;
            let (server, _) = listener.accept()?;
            client.set_nonblocking(true)?;
            Ok((Box::new(client), Box::new(server)))
        }
        other => Err(io::Error::other(format!("no raw echo over {other}"))),
    }
}

/// The server: reads whatever has arrived and echoes every complete message in one write.
fn echo_blocking(mut conn: Box<dyn Conn>) -> io::Result<()> {
    let mut inbox = Inbox::new();
    loop {
        let n = conn.read(inbox.spare())?;
        if n == 0 {
            return Ok(());
        }
        inbox.filled(n);
        let (done, _) = inbox.complete()?;
        if done > 0 {
            conn.write_all(&inbox.buf[..done])?;
            inbox.consume(done);
        }
    }
}

/// One measurement of the bundled echo: `sc.concurrency` messages of `sc.payload` bytes per
/// write, server and client on their own (pinned) threads, torn down afterwards.
pub fn bundled(transport: &str, sc: Scenario, s: &Settings) -> Result<Sample, String> {
    let (client, server) = connected(transport).map_err(|e| format!("raw {transport} socket: {e}"))?;
    let (server_core, client_core) = s.cores.map_or((None, None), |(a, b)| (Some(a), Some(b)));
    let server = std::thread::Builder::new()
        .name("raw-server".into())
        .spawn(move || {
            pin(server_core);
            echo_blocking(server)
        })
        .map_err(|e| e.to_string())?;
    let s = s.clone();
    let client = std::thread::Builder::new()
        .name("raw-client".into())
        .spawn(move || {
            pin(client_core);
            drive_bundles(client, sc, &s)
        })
        .map_err(|e| e.to_string())?;
    let sample = client.join().map_err(|_| "raw client thread panicked".to_string())?;
    // The client's socket closed when it returned: the server reads the end and returns.
    let served = server.join().map_err(|_| "raw server thread panicked".to_string())?;
    match (sample, served) {
        (Ok(sample), Ok(())) => Ok(sample),
        (Err(e), Ok(())) => Err(e),
        (Ok(_), Err(e)) => Err(format!("raw server: {e}")),
        // One side's failure usually ends the other: say both.
        (Err(client), Err(server)) => Err(format!("{client}; raw server: {server}")),
    }
}

/// The client: bundles back to back, a warm-up, then the measured window. A message's
/// latency is its bundle's round trip.
fn drive_bundles(mut conn: Box<dyn Conn>, sc: Scenario, s: &Settings) -> Result<Sample, String> {
    let n = sc.concurrency.max(1);
    let body = vec![0xA5u8; sc.payload];
    let mut bundle = Vec::with_capacity(n * (HEADER + sc.payload));
    for _ in 0..n {
        message(&mut bundle, &body).map_err(|e| e.to_string())?;
    }
    let mut reply = vec![0u8; bundle.len()];
    let mut trip =
        |reply: &mut [u8]| round_trip(&mut *conn, &bundle, reply).map_err(|e| format!("raw client: {e}"));
    let warm_until = Instant::now() + s.warmup;
    while Instant::now() < warm_until {
        trip(&mut reply)?;
    }
    let mut hist = new_histogram();
    let mut out = Sample::default();
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let end = start + s.duration;
    let mut t0 = start;
    loop {
        trip(&mut reply)?;
        let t1 = Instant::now();
        // Only bundles that end inside the window count.
        if t1 > end {
            break;
        }
        let bad = wrong_lengths(&reply, sc.payload);
        if bad == 0 {
            hist.saturating_record(((t1 - t0).as_nanos() as u64).max(1));
        } else {
            out.first_error.get_or_insert(format!("{bad} of {n} echoes not of {} bytes", sc.payload));
        }
        out.calls += (n - bad) as u64;
        out.errors += bad as u64;
        t0 = t1;
    }
    out.calls_per_s = out.calls as f64 / s.duration.as_secs_f64().max(f64::MIN_POSITIVE);
    out.cpu_us_per_call = cpu.per_call(out.calls);
    percentiles(&mut out, &hist);
    Ok(out)
}

/// Echoes in a bundle's reply whose length is not `size`.
fn wrong_lengths(reply: &[u8], size: usize) -> usize {
    let want = (size as u32).to_be_bytes();
    reply.chunks_exact(HEADER + size).filter(|m| m[..HEADER] != want).count()
}

/// Writes `bundle` and reads exactly `reply.len()` bytes back, reading while the bundle is
/// still going out (a server blocked writing echoes would otherwise never read the rest).
fn round_trip(conn: &mut dyn Conn, bundle: &[u8], reply: &mut [u8]) -> io::Result<()> {
    let (mut sent, mut got) = (0, 0);
    let again = |e: &io::Error| matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted);
    while got < reply.len() {
        if sent < bundle.len() {
            match conn.write(&bundle[sent..]) {
                Ok(n) => sent += n,
                Err(e) if again(&e) => {}
                Err(e) => return Err(e),
            }
        }
        wait(conn.as_raw_fd(), sent < bundle.len())?;
        match conn.read(&mut reply[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if again(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Blocks until `fd` has bytes to read or, while `writing`, room to write.
fn wait(fd: RawFd, writing: bool) -> io::Result<()> {
    let events = libc::POLLIN | if writing { libc::POLLOUT } else { 0 };
    let mut p = libc::pollfd { fd, events, revents: 0 };
    loop {
        // SAFETY: `p` is one valid pollfd, borrowed for the duration of the call.
        if unsafe { libc::poll(&mut p, 1, -1) } >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

// ---- One at a time: tokio ping-pong ----

/// Where the ping-pong server listens.
#[derive(Debug, Clone)]
pub enum Addr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Starts the ping-pong server on the current runtime (`127.0.0.1:0` for tcp) and returns
/// its accept loop and the address bound.
pub async fn serve(addr: Addr) -> io::Result<(JoinHandle<()>, Addr)> {
    match addr {
        Addr::Tcp(a) => {
            let listener = tokio::net::TcpListener::bind(a).await?;
            let bound = listener.local_addr()?;
            let task = tokio::spawn(async move {
                while let Ok((s, _)) = listener.accept().await {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(echo_async(s));
                }
            });
            Ok((task, Addr::Tcp(bound)))
        }
        Addr::Unix(path) => {
            let listener = tokio::net::UnixListener::bind(&path)?;
            let task = tokio::spawn(async move {
                while let Ok((s, _)) = listener.accept().await {
                    tokio::spawn(echo_async(s));
                }
            });
            Ok((task, Addr::Unix(path)))
        }
    }
}

/// The ping-pong server's connection: the blocking server's loop, on tokio.
async fn echo_async<S: AsyncRead + AsyncWrite + Unpin>(mut conn: S) -> io::Result<()> {
    let mut inbox = Inbox::new();
    loop {
        let n = conn.read(inbox.spare()).await?;
        if n == 0 {
            return Ok(());
        }
        inbox.filled(n);
        let (done, _) = inbox.complete()?;
        if done > 0 {
            conn.write_all(&inbox.buf[..done]).await?;
            inbox.consume(done);
        }
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// The ping-pong client: one message, then its echo. Each clone opens its own connection on
/// its first call (a raw socket has no ids to tell interleaved callers' echoes apart), so
/// it is meant for one caller; the first call, in the warm-up, pays for the connect.
pub struct PingPong {
    addr: Addr,
    conn: Option<Stream>,
    out: Vec<u8>,
    inbox: Inbox,
}

impl PingPong {
    pub fn new(addr: Addr) -> PingPong {
        PingPong { addr, conn: None, out: Vec::new(), inbox: Inbox::new() }
    }

    async fn exchange(&mut self, payload: &[u8]) -> io::Result<usize> {
        let conn = match self.conn.take() {
            Some(c) => c,
            None => match &self.addr {
                Addr::Tcp(a) => {
                    let s = tokio::net::TcpStream::connect(a).await?;
                    s.set_nodelay(true)?;
                    Stream::Tcp(s)
                }
                Addr::Unix(p) => Stream::Unix(tokio::net::UnixStream::connect(p).await?),
            },
        };
        self.out.clear();
        message(&mut self.out, payload)?;
        match self.conn.insert(conn) {
            Stream::Tcp(s) => one_exchange(s, &self.out, &mut self.inbox).await,
            Stream::Unix(s) => one_exchange(s, &self.out, &mut self.inbox).await,
        }
    }
}

impl Clone for PingPong {
    fn clone(&self) -> PingPong {
        PingPong::new(self.addr.clone())
    }
}

impl Caller for PingPong {
    async fn call(&mut self, payload: Bytes) -> Result<usize, String> {
        self.exchange(&payload).await.map_err(|e| format!("raw ping-pong: {e}"))
    }
}

/// Writes one message and reads its echo; returns the echo's payload length.
async fn one_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    msg: &[u8],
    inbox: &mut Inbox,
) -> io::Result<usize> {
    s.write_all(msg).await?;
    loop {
        let n = s.read(inbox.spare()).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        inbox.filled(n);
        match inbox.complete()? {
            (_, 0) => {}
            (done, 1) => {
                inbox.consume(done);
                return Ok(done - HEADER);
            }
            (_, n) => return Err(io::Error::other(format!("{n} echoes of one message"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbox(bytes: &[u8]) -> Inbox {
        let mut i = Inbox::new();
        i.spare()[..bytes.len()].copy_from_slice(bytes);
        i.filled(bytes.len());
        i
    }

    #[test]
    fn complete_takes_whole_messages_only() {
        let mut wire = Vec::new();
        message(&mut wire, b"abc").unwrap();
        message(&mut wire, b"").unwrap();
        message(&mut wire, b"defgh").unwrap();
        // Every cut of the stream: the complete messages before it, never a partial one.
        let ends = [7, 11, 20];
        for cut in 0..=wire.len() {
            let count = ends.iter().filter(|&&e| e <= cut).count();
            let bytes = ends.iter().copied().filter(|&e| e <= cut).max().unwrap_or(0);
            assert_eq!(inbox(&wire[..cut]).complete().unwrap(), (bytes, count), "cut at {cut}");
        }
        let mut i = inbox(&wire[..15]);
        i.consume(11);
        assert_eq!(&i.buf[..i.held], &wire[11..15], "the partial message stays");
    }

    #[test]
    fn an_oversized_length_is_an_error() {
        let e = inbox(&u32::MAX.to_be_bytes()).complete().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_partial_message_larger_than_the_buffer_grows_it() {
        let mut i = Inbox::new();
        let cap = i.buf.len();
        i.spare()[..HEADER].copy_from_slice(&(cap as u32).to_be_bytes());
        i.filled(cap);
        assert_eq!(i.complete().unwrap(), (0, 0));
        assert!(i.spare().len() >= cap, "room for the rest of the message");
    }

    #[test]
    fn wrong_lengths_counts_echoes_of_another_size() {
        let mut reply = Vec::new();
        for len in [2u32, 2, 3] {
            reply.extend_from_slice(&len.to_be_bytes());
            reply.extend_from_slice(b"xx");
        }
        assert_eq!(wrong_lengths(&reply, 2), 1);
    }

    fn settings() -> Settings {
        Settings {
            warmup: std::time::Duration::from_millis(20),
            // Long enough for a 4 MiB bundle to come back inside it many times over, even in a
            // debug build on a loaded machine (only bundles that end inside the window count).
            duration: std::time::Duration::from_secs(1),
            rate: None,
            chunk_size: 1,
            chunk_window: 1,
            stream_window: 2,
            batch_max: std::time::Duration::ZERO,
            cores: None,
        }
    }

    /// A bundle of 4 MiB is far larger than a unix socket's buffers: the client must read
    /// echoes while it is still writing, or both sides block forever.
    #[test]
    fn a_bundle_larger_than_the_socket_buffers_completes() {
        let sc = Scenario {
            kind: crate::scenario::Kind::Throughput,
            concurrency: 1024,
            payload: 4096,
            requests: 0,
        };
        for transport in ["unix", "tcp"] {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(bundled(transport, sc, &settings()));
            });
            let s = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("no deadlock").unwrap();
            assert_eq!(s.errors, 0, "{transport}: {s:?}");
            assert!(s.calls > 0 && s.calls.is_multiple_of(1024), "{transport}: whole bundles: {s:?}");
            assert!(s.p50_us.is_some() && s.cpu_us_per_call.is_some(), "{transport}: {s:?}");
        }
    }

    #[tokio::test]
    async fn ping_pong_echoes_one_message_at_a_time() {
        for addr in [Addr::Tcp("127.0.0.1:0".parse().unwrap()), Addr::Unix(unix_path("raw-test"))] {
            let (task, bound) = serve(addr).await.unwrap();
            let mut c = PingPong::new(bound.clone());
            for len in [64, 0, 100_000] {
                assert_eq!(c.call(Bytes::from(vec![7u8; len])).await, Ok(len));
            }
            // A clone has a connection of its own.
            assert_eq!(c.clone().call(Bytes::from_static(b"x")).await, Ok(1));
            task.abort();
            if let Addr::Unix(p) = bound {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}
