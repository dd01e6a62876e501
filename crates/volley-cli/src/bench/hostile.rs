//! The hostile client of `volley bench --hostile`: one extra connection that misbehaves beside
//! the benchmark's callers, so the benchmark shows what it costs them.
//!
//! - `noread`: sends 1 KiB echo requests as fast as the server takes them and never reads a
//!   reply (the server should park the connection: no reading, no work);
//! - `pipeline`: sends frames of 1,000 small echo requests without end and reads (and drops)
//!   the replies (the server should give it turns like everyone else).
//!
//! It speaks the wire protocol by hand over a plain blocking socket on threads of its own, so
//! it costs the measured process no runtime work, and it ends with a reset (`noread`: closing
//! with unread replies) or a clean close (`pipeline`).

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::ValueEnum;
use serde::Serialize;

/// A client's preamble (docs/PROTOCOL.md §4.1): the magic `VLLY`, version 1, no optional
/// features, two reserved bytes. Written out like the frames below, so the product's benchmark
/// needs none of the library's internals.
const PREAMBLE: [u8; 8] = *b"VLLY\x01\0\0\0";

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hostile {
    /// Pipelines 1 KiB requests and never reads a reply.
    Noread,
    /// Pipelines frames of 1,000 small requests without end, reading the replies.
    Pipeline,
}

/// A running hostile client.
pub struct Running {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

/// Both socket kinds, as one blocking stream.
trait Socket: Read + Write + Send + 'static {
    fn try_clone_box(&self) -> std::io::Result<Box<dyn Socket>>;
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()>;
    fn shutdown_write(&self) -> std::io::Result<()>;
}

impl Socket for std::net::TcpStream {
    fn try_clone_box(&self) -> std::io::Result<Box<dyn Socket>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        std::net::TcpStream::set_nonblocking(self, on)
    }
    fn shutdown_write(&self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

impl Socket for std::os::unix::net::UnixStream {
    fn try_clone_box(&self) -> std::io::Result<Box<dyn Socket>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_nonblocking(self, on)
    }
    fn shutdown_write(&self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

fn connect(addr: &str) -> Result<Box<dyn Socket>, String> {
    let fail = |e: std::io::Error| format!("hostile client: connect to {addr}: {e}");
    if let Some(hp) = addr.strip_prefix("tcp://") {
        let s = std::net::TcpStream::connect(hp).map_err(fail)?;
        s.set_nodelay(true).map_err(fail)?;
        Ok(Box::new(s))
    } else if let Some(path) = addr.strip_prefix("unix://") {
        Ok(Box::new(std::os::unix::net::UnixStream::connect(path).map_err(fail)?))
    } else {
        Err(format!("--hostile needs a tcp:// or unix:// server, not {addr}"))
    }
}

/// One frame of `n` requests to `service`/`method` with `payload`-byte payloads.
fn request_frame(service: &str, method: &str, n: usize, payload: usize) -> Vec<u8> {
    let mut body = Vec::new();
    for id in 0..n as u64 {
        body.extend_from_slice(&[0x01, 0]);
        body.extend_from_slice(&(1 + id).to_le_bytes());
        body.push(service.len() as u8);
        body.extend_from_slice(service.as_bytes());
        body.push(method.len() as u8);
        body.extend_from_slice(method.as_bytes());
        body.extend_from_slice(&(payload as u32).to_le_bytes());
        body.resize(body.len() + payload, 0x5a);
    }
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend(body);
    frame
}

impl Running {
    /// Connects to `addr` and starts misbehaving against `service`/`method` (an echo).
    pub fn start(kind: Hostile, addr: &str, service: &str, method: &str) -> Result<Running, String> {
        let mut socket = connect(addr)?;
        socket.write_all(&PREAMBLE).map_err(|e| e.to_string())?;
        let (stop, sent, received) =
            (Arc::default(), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut threads = Vec::new();
        let frame = match kind {
            Hostile::Noread => request_frame(service, method, 1000, 1024),
            Hostile::Pipeline => request_frame(service, method, 1000, 16),
        };
        if kind == Hostile::Pipeline {
            let mut rd = socket.try_clone_box().map_err(|e| e.to_string())?;
            let (received, stop): (_, Arc<AtomicBool>) = (Arc::clone(&received), Arc::clone(&stop));
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                // The clone shares the socket's non-blocking flag (set below for the writer):
                // an empty socket is no end.
                loop {
                    match rd.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            received.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(_) => break,
                    }
                }
            }));
        }
        // Non-blocking writes, so that stopping is prompt even while the server is not reading.
        socket.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (stop2, sent2) = (Arc::clone(&stop), Arc::clone(&sent));
        threads.push(std::thread::spawn(move || write_until_stopped(socket, &frame, &stop2, &sent2)));
        Ok(Running { stop, sent, received, threads })
    }

    /// Stops: closes the socket (a `noread` client closes with unread replies: a reset) and
    /// returns (bytes sent, bytes received).
    pub fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        (self.sent.load(Ordering::Relaxed), self.received.load(Ordering::Relaxed))
    }
}

fn write_until_stopped(mut socket: Box<dyn Socket>, frame: &[u8], stop: &AtomicBool, sent: &AtomicU64) {
    let mut at = 0;
    while !stop.load(Ordering::Relaxed) {
        match socket.write(&frame[at..]) {
            Ok(n) => {
                sent.fetch_add(n as u64, Ordering::Relaxed);
                at = (at + n) % frame.len();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => return,
        }
    }
    // The end of the stream: a reading server answers what it has and closes, which ends the
    // reading thread (a frame cut short is its last); a parked one gets a reset when the socket
    // is dropped with its replies unread.
    let _ = socket.shutdown_write();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written preamble and frames are what a Volley server expects: it answers every
    /// request (a wrong byte anywhere would get the connection closed without a reply).
    #[test]
    fn pipeline_requests_are_answered_by_a_volley_server() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = crate::echo::server_named("echo");
        let addr = rt.block_on(server.listen("tcp://127.0.0.1:0")).unwrap().to_string();
        let client = Running::start(Hostile::Pipeline, &addr, "echo", crate::echo::ECHO.name()).unwrap();
        // One frame's replies: 1,000 replies, each larger than its 16-byte payload.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while client.received.load(Ordering::Relaxed) < 16_000 {
            assert!(std::time::Instant::now() < deadline, "no replies from the server");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (sent, received) = client.stop();
        assert!(
            sent >= request_frame("echo", crate::echo::ECHO.name(), 1000, 16).len() as u64,
            "sent {sent}"
        );
        assert!(received >= 16_000, "received {received}");
        rt.block_on(server.shutdown());
    }
}
