//! Idle connections pin no buffers: 1,000 TCP connections that each made one call and then sit
//! idle cost the server a few KiB each — the bound that keeps 10,000 under 100 MiB
//! (`volley-research idle --connections 10000` measures that in two processes).
//!
//! Server and clients share this process; the clients are bare std sockets (no user-space
//! state beyond a file descriptor), so what the heap grows by is the server's. The bound is on
//! **live heap bytes** (counted by this binary's global allocator), not on the resident set.
//! The resident set hides what is allocated but never touched: every idle connection once held
//! a whole 64 KiB receive buffer (its dispatcher kept a slice of it), which showed as 8.6 KiB of
//! resident memory and as 66.6 KiB of heap; and it moves with the allocator's layout (a few bytes
//! more in an unrelated struct took it to 11.8 KiB). The resident set is still printed, and
//! `volley-research idle` reports it across two processes.

use std::io::{Read, Write};
use std::net::TcpStream;

use volley::bytes::{BufMut, Bytes};
use volley::proto::{FrameBuilder, Limits, PREAMBLE};
use volley::{Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_until_blocking;

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");
const CONNECTIONS: usize = 1_000;
/// 100 MiB over 10,000 connections.
const PER_CONNECTION_MAX: usize = (100 << 20) / 10_000;

#[path = "support/live_bytes.rs"]
mod live_bytes;
use live_bytes::live_bytes;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Opens a connection, makes one echo call with a 64-byte payload, and keeps the socket.
fn connect_and_call(addr: &str, id: u64) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut fb = FrameBuilder::new(Limits::default());
    fb.request(id, 0, &volley::proto::Extensions::NONE, ("echo", "echo"), |b| {
        b.put_slice(&[id as u8; 64]);
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    s.write_all(&PREAMBLE).unwrap();
    for seg in &segs {
        s.write_all(seg).unwrap();
    }
    let mut preamble = [0u8; 8];
    s.read_exact(&mut preamble).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    assert!(body.ends_with(&[id as u8; 64]), "the reply carries the payload back");
    s
}

/// Waits until the heap holds the same bytes at ten polls in a row (a generous minute).
fn settle() {
    let (mut last, mut same) = (isize::MIN, 0);
    wait_until_blocking(std::time::Duration::from_secs(60), "the heap to settle", || {
        let now = live_bytes();
        same = if std::mem::replace(&mut last, now) == now { same + 1 } else { 0 };
        same >= 10
    });
}

#[test]
fn a_thousand_idle_connections_stay_small() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = Server::builder().handle_fn(&ECHO, |b: Bytes| Ok(b)).build();
    let bound = rt.block_on(server.listen("tcp://127.0.0.1:0")).unwrap().to_string();
    let addr = bound.trim_start_matches("tcp://").to_string();

    // Warm up: the runtime, the pools and the allocator reach their working size.
    let warm: Vec<_> = (0..50).map(|i| connect_and_call(&addr, i)).collect();
    drop(warm);
    // The server lets go of the warm-up's connections (their tasks end on other threads)
    // before the base is read: the heap is the same at ten polls in a row.
    settle();
    let (before, rss_before) = (live_bytes(), rss_bytes());

    let conns: Vec<_> = (0..CONNECTIONS).map(|i| connect_and_call(&addr, 1000 + i as u64)).collect();

    // Each call was answered, so each connection is idle or about to be: the server's tasks
    // reach their idle wait (and give their buffers back) on its runtime's thread.
    settle();
    let (after, rss_after) = (live_bytes(), rss_bytes());

    let per = (after - before).max(0) as usize / CONNECTIONS;
    let rss_per = rss_after.saturating_sub(rss_before) / CONNECTIONS;
    eprintln!(
        "{CONNECTIONS} idle connections: heap {before} -> {after} bytes, {per} bytes per connection \
         (bound {PER_CONNECTION_MAX}); resident set {rss_per} bytes per connection"
    );
    assert!(
        per < PER_CONNECTION_MAX,
        "{per} bytes per idle connection: 10,000 would take {} MiB",
        (per * 10_000) >> 20
    );
    drop(conns);
    rt.block_on(server.shutdown());
}
