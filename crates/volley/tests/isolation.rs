//! One connection cannot stall the others: a peer that never reads its replies, a peer that
//! pipelines without end, a flood of connections that never finish opening, peers stalled in
//! the middle of a frame while keepalive runs, a peer that half-closes and reads nothing.
//!
//! The servers here run on a current-thread runtime of their own, as `volley serve-echo` does:
//! there every connection shares one thread, so a connection that holds it starves all others.
//! Bounds on time are generous (a loaded machine can stall a thread for tens of milliseconds);
//! what the tests assert is that every call is answered and nobody waits for seconds.

use std::io::{Read, Write};
use std::net::TcpStream as StdTcp;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use volley::bytes::{Bytes, BytesMut};
use volley::proto::{Code, Decoder, Limits, Message, PREAMBLE, SERVER_PREAMBLE, decode_frame};
use volley::{Client, Keepalive, Method, Server, ServerBuilder};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_until_blocking;

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

/// A server running on a current-thread runtime on its own thread, until dropped.
struct Served {
    server: Server,
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    fn start(builder: ServerBuilder, listen: &str) -> Served {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listen = listen.to_string();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let server = builder.build();
                let addr = server.listen(&listen).await.unwrap().to_string();
                tx.send((server.clone(), addr)).unwrap();
                let _ = stopped.await;
                server.shutdown_within(Duration::from_secs(5)).await;
            });
        });
        let (server, addr) = rx.recv().unwrap();
        Served { server, addr, stop: Some(stop), thread: Some(thread) }
    }

    fn host_port(&self) -> String {
        self.addr.split_once("://").unwrap().1.to_string()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}

fn echo_server() -> ServerBuilder {
    Server::builder().handle_fn(&ECHO, Ok)
}

/// One frame of `n` echo requests with `payload`-byte payloads, ids from `first_id`.
fn request_frame(first_id: u64, n: usize, payload: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(n * (payload + 24));
    for i in 0..n as u64 {
        body.extend_from_slice(&[0x01, 0]);
        body.extend_from_slice(&(first_id + i).to_le_bytes());
        body.extend_from_slice(b"\x04echo\x04echo");
        body.extend_from_slice(&(payload as u32).to_le_bytes());
        body.resize(body.len() + payload, 0xab);
    }
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend(body);
    frame
}

/// Calls every 10 ms on its own runtime until `stop`, and returns (calls, longest time between
/// two answers). Every call must succeed.
fn steady_caller(addr: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, Duration)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let client = Client::connect(&addr).await.unwrap();
            let (mut calls, mut longest, mut last) = (0u64, Duration::ZERO, Instant::now());
            while !stop.load(Ordering::Relaxed) {
                let r = client.call(&ECHO, Bytes::from_static(b"steady")).await;
                assert_eq!(r.unwrap(), Bytes::from_static(b"steady"));
                calls += 1;
                longest = longest.max(last.elapsed());
                last = Instant::now();
                // A steady pace on the machine's clock: the gap between answers is the measure.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (calls, longest)
        })
    })
}

/// A client that sends 1 KiB echo requests as fast as the server takes them and never reads a
/// reply: the server parks that connection (no reading, no work) and keeps answering the
/// others. Before, it copied its whole queue of unsent replies again for every few KiB of
/// new ones, spun a core for seconds and answered nobody else.
#[test]
fn a_client_that_never_reads_is_parked_and_the_others_are_served() {
    let served = Served::start(echo_server(), "tcp://127.0.0.1:0");
    let stop = Arc::new(AtomicBool::new(false));
    let steady = steady_caller(served.addr.clone(), stop.clone());

    let mut hostile = StdTcp::connect(served.host_port()).unwrap();
    hostile.write_all(&PREAMBLE).unwrap();
    hostile.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
    let frame = request_frame(1, 1000, 1024);
    let (mut sent, mut at) = (0usize, 0usize);
    let hostile_started = Instant::now();
    // Write until the server stops taking bytes for a while: it has parked the connection.
    let mut blocked_since: Option<Instant> = None;
    loop {
        match hostile.write(&frame[at..]) {
            Ok(n) => {
                (sent, at, blocked_since) = (sent + n, (at + n) % frame.len(), None);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if blocked_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(1) {
                    break;
                }
            }
            Err(e) => panic!("the server closed a connection it should have parked: {e}"),
        }
        assert!(hostile_started.elapsed() < Duration::from_secs(60), "the server never stopped reading");
    }
    assert!(sent > 16 << 20, "the server took only {sent} bytes before parking");
    // Parked: the server reads nothing more from it, while the other caller keeps going.
    let received = served.server.counters().frames_received;
    // A window on the machine's clock in which the parked connection must add no frame (the
    // server's reader is a real thread on a real socket).
    std::thread::sleep(Duration::from_millis(500));
    let while_parked = served.server.counters().frames_received - received;
    // Leave with a reset (closing with unread replies), then let the caller run a little: the
    // calls right after the reset count too (real time, as the reset is the kernel's).
    drop(hostile);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (calls, longest) = steady.join().unwrap();

    // The steady caller sends a frame every ~10 ms: the parked connection adds none.
    assert!(while_parked <= 60, "{while_parked} frames read in 0.5 s: the hostile connection was still read");
    assert!(calls >= 20, "only {calls} calls answered beside the hostile client");
    assert!(longest < Duration::from_secs(2), "a call waited {longest:?} beside the hostile client");
    // Both are gone (the caller's client was dropped): the reset reached the parked connection.
    wait_until_blocking(Duration::from_secs(10), "the hostile connection to close", || {
        served.server.connections().served == 0
    });
}

/// A client that pipelines and then parks (never reads, never answers a ping) is given up
/// within keepalive's interval + timeout of going quiet — not an interval later, nor after a
/// write stall (the read timeout, 30 s here) spent waiting for it to take its replies.
#[test]
fn a_parked_peer_is_given_up_within_keepalive_interval_plus_timeout() {
    let k = Keepalive::new(Duration::from_secs(1), Duration::from_secs(1));
    let served = Served::start(echo_server().keepalive(Some(k)), "tcp://127.0.0.1:0");
    let stop = Arc::new(AtomicBool::new(false));
    let steady = steady_caller(served.addr.clone(), stop.clone());
    wait_until_blocking(Duration::from_secs(30), "the steady caller to connect", || {
        served.server.connections().served == 1
    });

    let mut hostile = StdTcp::connect(served.host_port()).unwrap();
    hostile.write_all(&PREAMBLE).unwrap();
    hostile.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
    let frame = request_frame(1, 1000, 1024);
    let (mut at, mut quiet_since) = (0usize, Instant::now());
    // Write until the server takes nothing for a while (it parked the connection) or closes it.
    loop {
        match hostile.write(&frame[at..]) {
            Ok(n) => (at, quiet_since) = ((at + n) % frame.len(), Instant::now()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if quiet_since.elapsed() > Duration::from_millis(300) {
                    break;
                }
            }
            Err(_) => break,
        }
        assert!(quiet_since.elapsed() < Duration::from_secs(60), "the server never stopped reading");
    }
    wait_until_blocking(Duration::from_secs(90), "the parked connection to close", || {
        served.server.connections().served == 1
    });
    let took = quiet_since.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (calls, _) = steady.join().unwrap();
    drop(hostile);
    // interval + timeout is 2 s; before, it took up to 2 × interval + timeout + 30 s.
    assert!(took < Duration::from_secs(12), "the parked peer was given up {took:?} after it went quiet");
    assert!(calls >= 10, "only {calls} calls answered beside the parked peer");
}

/// A client that pipelines without end (and reads its replies) gets turns, and so does
/// everybody else: on one thread, a connection whose socket never runs dry yields between
/// turns.
#[test]
fn a_client_that_pipelines_without_end_gets_turns_like_everyone_else() {
    let sock = format!("unix:///tmp/volley-isolation-{}.sock", std::process::id());
    let served = Served::start(echo_server(), &sock);
    let path = served.addr.trim_start_matches("unix://").to_string();
    let stop = Arc::new(AtomicBool::new(false));

    let mut writer = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let mut reader = writer.try_clone().unwrap();
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0usize;
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    let pipeline = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            writer.write_all(&PREAMBLE).unwrap();
            let frame = request_frame(1, 1000, 16);
            let mut frames = 0u64;
            while !stop.load(Ordering::Relaxed) {
                writer.write_all(&frame).unwrap();
                frames += 1;
            }
            writer.shutdown(std::net::Shutdown::Write).unwrap();
            frames
        })
    };
    // Let the pipeline fill the server's thread, then call beside it for two seconds of the
    // machine's clock (the pipeline is a real socket written by a real thread).
    std::thread::sleep(Duration::from_millis(200));
    let steady = steady_caller(served.addr.clone(), stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let (calls, longest) = steady.join().unwrap();
    let frames = pipeline.join().unwrap();
    let replies = drain.join().unwrap();

    assert!(frames > 10, "the pipeline sent only {frames} frames of 1000 requests");
    assert!(replies > 0);
    assert!(calls >= 20, "only {calls} calls answered beside the pipeline");
    assert!(longest < Duration::from_secs(2), "a call waited {longest:?} beside the pipeline");
}

/// 160,000 requests pipelined on one connection are all answered, and a connection opened
/// meanwhile is served. Before, the work per request grew with the queue: 40,000 took 16 ms,
/// 160,000 took 11 s.
#[test]
fn a_deep_pipeline_is_answered_in_full_while_a_newcomer_is_served() {
    let served = Served::start(echo_server(), "tcp://127.0.0.1:0");
    let total = 160_000usize;
    let mut s = StdTcp::connect(served.host_port()).unwrap();
    let mut r = s.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes).unwrap();
        bytes
    });
    let mut all = PREAMBLE.to_vec();
    for first in (1..=total as u64).step_by(1000) {
        all.extend(request_frame(first, 1000, 8));
    }
    let started = Instant::now();
    let newcomer = {
        let addr = served.addr.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let c = Client::connect(&addr).await.unwrap();
                c.call(&ECHO, Bytes::from_static(b"new")).await.unwrap()
            })
        })
    };
    s.write_all(&all).unwrap();
    assert_eq!(newcomer.join().unwrap(), Bytes::from_static(b"new"));
    let newcomer_done = started.elapsed();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let bytes = reader.join().unwrap();

    let mut ids = replies_in(&bytes);
    ids.sort_unstable();
    assert_eq!(ids.len(), total, "every pipelined request is answered once");
    assert!(ids.windows(2).all(|w| w[0] + 1 == w[1]));
    assert!(newcomer_done < Duration::from_secs(10), "the newcomer waited {newcomer_done:?}");
}

/// The ids of the replies in a server's byte stream (after its preamble).
fn replies_in(bytes: &[u8]) -> Vec<u64> {
    let limits = Limits::default();
    let (mut d, mut buf, mut msgs) = (Decoder::new(limits), BytesMut::from(bytes), Vec::new());
    while let Some(frame) = d.next_frame(&mut buf).unwrap() {
        decode_frame(&frame, &limits, &mut msgs).unwrap();
    }
    msgs.iter()
        .filter_map(|m| match m {
            Message::Reply { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// Connections that connect and never send a byte fill the bound on opening connections; the
/// oldest make room for newcomers, so real clients keep being served, and they do not count
/// toward the served connections.
#[test]
fn connections_that_never_open_cannot_lock_real_clients_out() {
    let served = Served::start(
        echo_server().handshakes(64, Duration::from_secs(30)).max_connections(Some(32)),
        "tcp://127.0.0.1:0",
    );
    let stalled: Vec<_> = (0..500).map(|_| StdTcp::connect(served.host_port()).unwrap()).collect();
    wait_until_blocking(Duration::from_secs(20), "the stalled connections to be accepted", || {
        served.server.connections().opening_evicted >= 500 - 64
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for i in 0..20 {
            let c = Client::connect(&served.addr).await.unwrap();
            let r = c.call(&ECHO, Bytes::from(format!("real {i}"))).await;
            assert_eq!(r.unwrap(), Bytes::from(format!("real {i}")), "real client {i}");
        }
    });
    let counts = served.server.connections();
    assert!(counts.opening <= 64, "{counts:?}");
    assert!(counts.served <= 20, "stalled connections count as served: {counts:?}");
    drop(stalled);
}

/// A connection that does not finish opening in time is closed.
#[test]
fn a_connection_that_does_not_open_in_time_is_closed() {
    let served = Served::start(echo_server().handshakes(64, Duration::from_millis(200)), "tcp://127.0.0.1:0");
    let mut s = StdTcp::connect(served.host_port()).unwrap();
    s.write_all(&PREAMBLE[..4]).unwrap(); // half a preamble, then nothing
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let read = s.read_to_end(&mut got);
    assert!(read.is_ok(), "the server did not close the connection: {read:?}");
    assert_eq!(got, SERVER_PREAMBLE, "only the server's preamble, no go-away");
    wait_until_blocking(Duration::from_secs(10), "the opening place to be given back", || {
        served.server.connections().opening == 0
    });
}

/// Peers stalled in the middle of a frame are closed by the read timeout with a go-away,
/// whatever keepalive does: a keepalive tick used to restart the read timeout.
#[test]
fn the_read_timeout_fires_whatever_keepalive_does() {
    let t = Duration::from_millis(300);
    let keepalive = Keepalive::new(t, Duration::from_secs(30));
    let served =
        Served::start(echo_server().read_timeout(Some(t)).keepalive(Some(keepalive)), "tcp://127.0.0.1:0");
    let peers: Vec<_> = (0..240)
        .map(|_| {
            let mut s = StdTcp::connect(served.host_port()).unwrap();
            s.write_all(&PREAMBLE).unwrap();
            s.write_all(&100u32.to_le_bytes()).unwrap();
            s.write_all(&[0x01; 10]).unwrap(); // 10 of the 100 bytes announced
            s
        })
        .collect();
    let started = Instant::now();
    let ends: Vec<_> = peers
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(25))).unwrap();
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                got
            })
        })
        .collect();
    for (i, end) in ends.into_iter().enumerate() {
        let got = end.join().unwrap();
        let limits = Limits::default();
        let (mut d, mut buf, mut msgs) = (Decoder::new(limits), BytesMut::from(&got[..]), Vec::new());
        while let Ok(Some(frame)) = d.next_frame(&mut buf) {
            decode_frame(&frame, &limits, &mut msgs).unwrap();
        }
        let go_away = msgs.iter().find_map(|m| match m {
            Message::GoAway { code, .. } => Some(*code),
            _ => None,
        });
        assert_eq!(go_away, Some(Code::Protocol), "peer {i} got {msgs:?}");
    }
    // The keepalive's own limit (interval + 30 s) is far beyond this.
    assert!(started.elapsed() < Duration::from_secs(20), "closed only after {:?}", started.elapsed());
}

/// A batch request of the largest size the protocol allows is served by an idle server with
/// default settings (its item limit is above the default bound on queued requests).
#[test]
fn a_batch_request_at_the_item_limit_is_served_by_an_idle_default_server() {
    let handler = Server::builder().handle(&ECHO, |b: Bytes| async move {
        tokio::task::yield_now().await; // not finished on the first poll: the items are queued
        Ok(b)
    });
    let served = Served::start(handler, "tcp://127.0.0.1:0");
    let n = Limits::default().max_batch_items;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let results = rt.block_on(async {
        let c = Client::connect(&served.addr).await.unwrap();
        let items: Vec<Bytes> = (0..n).map(|i| Bytes::from((i as u32).to_le_bytes().to_vec())).collect();
        let opts = volley::BatchOptions::default().chunk_size(n);
        c.call_batch_with(&ECHO, items, opts).await
    });
    assert_eq!(results.len(), n);
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap(), Bytes::from((i as u32).to_le_bytes().to_vec()), "item {i}");
    }
}

/// A peer that sends requests, half-closes and never reads its replies is let go: parked, it
/// answers no keepalive ping, and once the server gives up on it, what is left unsent is
/// dropped after a read timeout without progress instead of holding a task and its replies
/// forever (its end of stream sits behind requests the parked server no longer reads).
#[test]
fn a_peer_that_half_closes_and_reads_nothing_is_let_go() {
    let t = Duration::from_millis(300);
    let keepalive = Keepalive::new(t, t);
    let served =
        Served::start(echo_server().read_timeout(Some(t)).keepalive(Some(keepalive)), "tcp://127.0.0.1:0");
    let mut s = StdTcp::connect(served.host_port()).unwrap();
    s.write_all(&PREAMBLE).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    // Enough requests that their replies fill the socket's buffers in both directions.
    let frame = request_frame(1, 1000, 1024);
    let started = Instant::now();
    while s.write_all(&frame).is_ok() && started.elapsed() < Duration::from_secs(30) {}
    // The server may have given the connection up already (keepalive: interval + timeout is
    // 600 ms): then the half-close fails, and what follows holds all the same.
    let _ = s.shutdown(std::net::Shutdown::Write);
    wait_until_blocking(Duration::from_secs(60), "the server to let the connection go", || {
        served.server.connections().served == 0
    });
    drop(s);
}
