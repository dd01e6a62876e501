//! A real server on `shm://` against a hand-driven peer that misbehaves: garbage in the ring,
//! a corrupt write or read position, a peer that never reads, one that makes its wake-up
//! channels blocking and full, one that asks for rings larger than the server takes, hellos
//! with the wrong file descriptors. Each ends or stalls only its own connection; a
//! well-behaved client beside it (a canary, on unix) is served throughout.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;

use super::*;
use crate::proto::{Extensions, FrameBuilder, Limits, PREAMBLE};
use crate::transport::stream::{ByteStream, ReadHalf};
use crate::{Client, Method, Server};

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

/// Generous: the machine is shared.
const DEADLINE: Duration = Duration::from_secs(60);

async fn server(tag: &str) -> (Server, String) {
    let server = Server::builder().handle(&ECHO, |b: Bytes| async move { Ok(b) }).build();
    let addr =
        format!("shm://{}/volley-shm-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id());
    let bound = server.listen(&addr).await.unwrap().to_string();
    (server, bound)
}

/// A peer that speaks the set-up but then drives its rings by hand.
async fn raw_peer(addr: &str, ring: usize) -> ShmStream {
    let rest = addr.strip_prefix("shm://").unwrap();
    let sock = UnixStream::connect(socket_path(rest)).await.unwrap();
    let set_up = handshake::client(&sock, ring, "raw peer").await.unwrap();
    ShmStream::new(set_up, sock, Side::Client, "server".into()).unwrap()
}

/// Reads everything until the server ends the connection.
async fn read_to_end(rd: &mut ShmRead) -> BytesMut {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < DEADLINE, "the server never ended the connection");
        let _ = tokio::time::timeout(Duration::from_secs(1), rd.readable()).await;
        match rd.try_read_buf(&mut buf) {
            Ok(0) => return buf,
            Ok(_) if buf.capacity() == buf.len() => buf.reserve(64 * 1024),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return buf,
        }
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        // The poll of a wait for a condition (the machine's clock: real threads and sockets).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_ring_ends_that_connection_with_a_protocol_error_and_no_other() {
    let (server, addr) = server("garbage").await;
    let good = Client::connect(&addr).await.unwrap();
    // Bytes that are not frames: the decoder's limits refuse them.
    let peer = raw_peer(&addr, 4096).await;
    let (mut rd, mut wr) = peer.into_halves();
    wr.write_all(&PREAMBLE).await.unwrap();
    wr.write_all(&[0xff; 64]).await.unwrap();
    let said = read_to_end(&mut rd).await;
    assert!(contains(&said, "exceeds the limit"), "a go-away naming the frame limit: {said:?}");
    // A write position the peer corrupted, past anything the ring can hold.
    let peer = raw_peer(&addr, 4096).await;
    let link = peer.link.clone();
    let (mut rd, mut wr) = peer.into_halves();
    wr.write_all(&PREAMBLE).await.unwrap();
    link.region.u64_at(layout::CONTROL_A + ring::WRITE_POS).store(1 << 40, Ordering::Release);
    link.wake_peer_reader();
    let said = read_to_end(&mut rd).await;
    assert!(contains(&said, "corrupt shared-memory ring"), "a go-away with the ring error: {said:?}");
    // The good client never noticed.
    assert_eq!(good.call(&ECHO, Bytes::from_static(b"still here")).await.unwrap(), &b"still here"[..]);
    wait_for("the broken connections to close", || server.connections().served == 1).await;
    drop(good);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_stalls_only_its_own_connection() {
    let (server, addr) = server("noread").await;
    let good = Client::connect(&addr).await.unwrap();
    let peer = raw_peer(&addr, 4096).await;
    let (rd, mut wr) = peer.into_halves();
    wr.write_all(&PREAMBLE).await.unwrap();
    // Frames of 100 requests of 1 KiB each, sent until the server stops taking them: its
    // replies fill our 4 KiB ring, then its bounded outbox, then it stops reading.
    let mut fb = FrameBuilder::new(Limits::default());
    let payload = Bytes::from(vec![0x5a; 1024]);
    let (mut sent, mut id) = (0usize, 0u64);
    let stalled = loop {
        for _ in 0..100 {
            id += 1;
            fb.request_bytes(id, 0, &Extensions::default(), ("echo", "echo"), payload.clone()).unwrap();
        }
        let mut frames = Vec::new();
        fb.take_into(&mut frames);
        let bytes: Vec<u8> = frames.concat();
        match tokio::time::timeout(Duration::from_secs(2), wr.write_all(&bytes)).await {
            Ok(r) => r.unwrap(),
            Err(_) => break true,
        }
        sent += bytes.len();
        if sent > 256 << 20 {
            break false;
        }
    };
    assert!(stalled, "the server took {sent} bytes of requests whose replies no one reads");
    // Back-pressure, not unbounded buffering: the server stopped after its outbox bound.
    assert!(sent < 64 << 20, "{sent} bytes taken");
    // Everyone else is served as before.
    for i in 0..100u32 {
        let msg = Bytes::from(i.to_le_bytes().to_vec());
        assert_eq!(good.call(&ECHO, msg.clone()).await.unwrap(), msg);
    }
    assert_eq!(server.connections().served, 2, "the stalled connection stays until its peer goes");
    drop((rd, wr));
    wait_for("the stalled connection to close once its peer left", || server.connections().served == 1).await;
    drop(good);
    server.shutdown().await;
}

/// A client on another transport (unix) that calls the server back to back while a hostile
/// shm peer does its worst, and keeps its longest wait for one call.
struct Canary {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<(u64, Duration)>,
}

/// Calls a canary makes at least before it is stopped: it runs through the attack and on.
const CANARY_CALLS: u64 = 50;

/// Most a canary's call may wait while a hostile peer works. A quiet run waits well under
/// 100 ms (see the reports these tests print); this leaves room for a loaded machine, and is
/// still far below what a blocked runtime costs (the attack below holds it for 3 s).
const CANARY_BOUND: Duration = Duration::from_secs(2);

impl Canary {
    async fn start(server: &Server, tag: &str) -> Canary {
        let path =
            format!("{}/volley-shm-canary-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id());
        let addr = server.listen(&format!("unix://{path}")).await.unwrap().to_string();
        let client = Client::connect(&addr).await.unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, counted) = (stop.clone(), counted.clone());
            async move {
                let (mut calls, mut longest) = (0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let msg = Bytes::from(calls.to_le_bytes().to_vec());
                    let t = Instant::now();
                    assert_eq!(client.call(&ECHO, msg.clone()).await.unwrap(), msg);
                    longest = longest.max(t.elapsed());
                    calls += 1;
                    counted.store(calls, Ordering::Relaxed);
                    // A steady pace on the machine's clock: the canary's wait beside a real
                    // attacker is the measure.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                (calls, longest)
            }
        });
        Canary { stop, calls: counted, task }
    }

    /// Stops the canary; checks it was served throughout, and reports its longest wait.
    async fn finish(self, attack: &str) -> Duration {
        let calls = self.calls.clone();
        wait_for("the canary's calls", || calls.load(Ordering::Relaxed) >= CANARY_CALLS).await;
        self.stop.store(true, Ordering::Relaxed);
        let (calls, longest) = self.task.await.unwrap();
        eprintln!("canary beside {attack}: {calls} calls, longest wait {longest:?}");
        assert!(longest < CANARY_BOUND, "the canary waited {longest:?} beside {attack}");
        longest
    }
}

/// Sends a hello with `fds` attached; the server's answer: the file descriptors it passed, or
/// its reason for refusing.
async fn hello_with(
    addr: &str,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> (UnixStream, Result<Vec<std::os::fd::OwnedFd>, String>) {
    let sock = UnixStream::connect(socket_path(addr.strip_prefix("shm://").unwrap())).await.unwrap();
    handshake::send(&sock, &handshake::hello(), fds).await.unwrap();
    let mut head = [0u8; handshake::MESSAGE_LEN];
    let passed = handshake::recv(&sock, &mut head, 2).await.unwrap();
    let (status, len) = handshake::parse_reply(&head).unwrap();
    if status == handshake::ACCEPTED {
        return (sock, Ok(passed));
    }
    let mut reason = vec![0u8; len];
    handshake::recv(&sock, &mut reason, 0).await.unwrap();
    (sock, Err(String::from_utf8(reason).unwrap()))
}

/// A mapping as a client makes it, with rings of `a` and `b` bytes.
fn mapping(a: usize, b: usize) -> (sys::Region, std::os::fd::OwnedFd, layout::Geometry) {
    let g = layout::Geometry { a, b };
    let (region, file) = sys::Region::create(g.total_len(), "hostile peer").unwrap();
    region.copy_in(0, &g.header());
    (region, file, g)
}

fn clear_nonblock(fd: &std::os::fd::OwnedFd) {
    let flags = rustix::fs::fcntl_getfl(fd).unwrap();
    rustix::fs::fcntl_setfl(fd, flags - rustix::fs::OFlags::NONBLOCK).unwrap();
}

/// The attack that froze a whole server when wake-ups were eventfds: the peer keeps the
/// channels the server wakes it through, fills them, clears `O_NONBLOCK` on the file
/// descriptions it shares with the server, and then keeps asking to be woken. A server that
/// made one blocking call there would hold its runtime (here a single thread, so everything
/// on it) for the 3 s the peer holds out; the canary must not notice.
#[tokio::test]
async fn a_peer_that_makes_its_wake_up_channels_blocking_and_full_costs_no_one_else() {
    const HOLD: Duration = Duration::from_secs(3);
    let (server, addr) = server("blockwake").await;
    let canary = Canary::start(&server, "blockwake").await;
    let (region, file, g) = mapping(4096, 4096);
    let ((keep_bytes, give_bytes), (keep_room, give_room)) = (wake::pair().unwrap(), wake::pair().unwrap());
    let (sock, passed) = hello_with(&addr, &[file.as_fd(), give_bytes.as_fd(), give_room.as_fd()]).await;
    let [server_bytes, _server_room]: [std::os::fd::OwnedFd; 2] = passed.unwrap().try_into().unwrap();
    // The attacker runs on a thread of its own, with blocking calls: it cannot be held up by
    // the server's runtime, and it lets go after its hold whatever the server did.
    let attacker = std::thread::spawn(move || {
        for give in [&give_bytes, &give_room] {
            while rustix::net::send(give, &[0u8; 4096], rustix::net::SendFlags::DONTWAIT).is_ok() {}
            clear_nonblock(give);
        }
        let at_a = ring::RingAt { control: layout::CONTROL_A, data: g.data_a(), cap: g.a };
        let at_b = ring::RingAt { control: layout::CONTROL_B, data: g.data_b(), cap: g.b };
        let (mut requests, mut replies) = (ring::RingWriter::new(at_a), ring::RingReader::new(at_b));
        let sleeping = region.u32_at(layout::CONTROL_B + ring::READER_SLEEPING);
        let mut pending: Vec<u8> = PREAMBLE.to_vec();
        let (mut fb, mut id, mut woken) = (FrameBuilder::new(Limits::default()), 0u64, 0u32);
        let start = Instant::now();
        while start.elapsed() < HOLD {
            // Say we sleep, so that the server's next reply comes with a wake-up for us.
            if sleeping.swap(1, Ordering::AcqRel) == 0 && id > 0 {
                woken += 1;
            }
            id += 1;
            fb.request_bytes(id, 0, &Extensions::default(), ("echo", "echo"), Bytes::from_static(b"x"))
                .unwrap();
            let mut frames = Vec::new();
            fb.take_into(&mut frames);
            pending.extend(frames.concat());
            let room = requests.room(&region).unwrap();
            let n = requests.write(&region, &[std::io::IoSlice::new(&pending)], room).n;
            pending.drain(..n);
            wake::signal(&server_bytes);
            let _ = replies.read(&region, &mut BytesMut::new(), 1 << 20).unwrap();
            // The attacker's pace on the machine's clock, for its whole real-time hold.
            std::thread::sleep(Duration::from_millis(2));
        }
        // Let go: a server thread blocked on a full channel would be released now.
        for keep in [&keep_bytes, &keep_room] {
            while wake::drain(keep) == wake::Drained::More {}
        }
        woken
    });
    // Joined from the blocking pool: the runtime serves the canary meanwhile.
    let woken = tokio::task::spawn_blocking(move || attacker.join().unwrap()).await.unwrap();
    assert!(woken >= 10, "the server tried to wake the attacker only {woken} times");
    canary.finish("a peer with blocking, full wake-up channels").await;
    drop(sock);
    wait_for("the attacker's connection to close", || server.connections().served == 1).await;
    server.shutdown().await;
}

/// A peer that asks for a reply ring far larger than the server takes (64 MiB, which the
/// server would fill at the peer's word) is refused at the set-up with the server's limit in
/// the reason; a client within the limit is taken, and the canary never noticed.
#[tokio::test]
async fn rings_larger_than_the_server_takes_are_refused_with_the_limit_and_cost_no_one_else() {
    let (server, addr) = server("bigring").await;
    let canary = Canary::start(&server, "bigring").await;
    for (a, b) in [(64 << 10, 64 << 20), (64 << 20, 4096), (8 << 20, 8 << 20)] {
        let (_region, file, _) = mapping(a, b);
        let ((_k1, g1), (_k2, g2)) = (wake::pair().unwrap(), wake::pair().unwrap());
        let (_sock, answer) = hello_with(&addr, &[file.as_fd(), g1.as_fd(), g2.as_fd()]).await;
        let reason = answer.expect_err("refused");
        assert!(reason.contains(&format!("{}", 4 << 20)), "the reason names the limit: {reason}");
    }
    // The client's own way of asking gets the reason too.
    let config = crate::ClientConfig { shm_ring: 16 << 20, ..Default::default() };
    let err = Client::connect_with(&addr, config).await.err().expect("refused");
    assert!(err.to_string().contains("4194304 bytes per ring"), "{err}");
    let fine = Client::connect(&addr).await.unwrap();
    assert_eq!(fine.call(&ECHO, Bytes::from_static(b"ok")).await.unwrap(), &b"ok"[..]);
    canary.finish("oversized rings").await;
    drop(fine);
    server.shutdown().await;
}

/// A server's own limit on ring sizes: what it is set to, and nothing more, is taken.
#[tokio::test]
async fn the_servers_ring_limit_is_its_own_setting() {
    let server =
        Server::builder().handle(&ECHO, |b: Bytes| async move { Ok(b) }).shm_max_ring(64 << 10).build();
    let addr =
        server.listen(&format!("shm://volley-shm-limit-{}", std::process::id())).await.unwrap().to_string();
    let at = |ring: usize| {
        let config = crate::ClientConfig { shm_ring: ring, ..Default::default() };
        Client::connect_with(&addr, config)
    };
    let err = at(128 << 10).await.err().expect("over the limit");
    assert!(err.to_string().contains("65536 bytes per ring"), "{err}");
    let fine = at(64 << 10).await.unwrap();
    assert_eq!(fine.call(&ECHO, Bytes::from_static(b"ok")).await.unwrap(), &b"ok"[..]);
    drop(fine);
    server.shutdown().await;
}

/// A peer that sets the read position of the reply ring past what the server wrote: its
/// connection ends at once with a go-away naming the corruption (not later, not never), and
/// the canary never noticed.
#[tokio::test]
async fn a_read_position_past_the_servers_writes_ends_that_connection_at_once() {
    let (server, addr) = server("readpos").await;
    let canary = Canary::start(&server, "readpos").await;
    let peer = raw_peer(&addr, 4096).await;
    let link = peer.link.clone();
    let (mut rd, mut wr) = peer.into_halves();
    wr.write_all(&PREAMBLE).await.unwrap();
    // The server's preamble is in the reply ring once it served us: read it.
    let mut buf = BytesMut::with_capacity(64);
    wait_for("the server's preamble", || {
        let _ = rd.try_read_buf(&mut buf);
        buf.len() >= 8
    })
    .await;
    let read_pos = link.region.u64_at(layout::CONTROL_B + ring::READ_POS);
    read_pos.store(read_pos.load(Ordering::Acquire) + (1 << 20), Ordering::Release);
    let corrupted = Instant::now();
    // One request, so that the server looks (a peer that does nothing at all changes nothing).
    let mut fb = FrameBuilder::new(Limits::default());
    fb.request_bytes(1, 0, &Extensions::default(), ("echo", "echo"), Bytes::from_static(b"x")).unwrap();
    let mut frames = Vec::new();
    fb.take_into(&mut frames);
    wr.write_all(&frames.concat()).await.unwrap();
    wait_for("the corrupt connection to close", || server.connections().served == 1).await;
    let closed_after = corrupted.elapsed();
    let said = read_to_end(&mut rd).await;
    assert!(contains(&said, "read position is past the write position"), "a go-away naming it: {said:?}");
    assert!(!contains(&said, "\"x\""), "no reply to a request after the corruption");
    eprintln!("corrupt read position: connection closed {closed_after:?} after the corruption");
    assert!(closed_after < CANARY_BOUND, "closed only after {closed_after:?}");
    canary.finish("a corrupt read position").await;
    server.shutdown().await;
}

/// Hellos with the wrong number of file descriptors (none, two, four, many) are refused with
/// the reason, and cost no one else.
#[tokio::test]
async fn a_hello_with_the_wrong_number_of_file_descriptors_is_refused_with_the_reason() {
    let (server, addr) = server("fdcount").await;
    let canary = Canary::start(&server, "fdcount").await;
    let (_region, file, _) = mapping(4096, 4096);
    let ((_k1, g1), (_k2, g2), (_k3, g3)) =
        (wake::pair().unwrap(), wake::pair().unwrap(), wake::pair().unwrap());
    let many: Vec<_> = (0..40).map(|_| wake::pair().unwrap().1).collect();
    let many: Vec<_> = many.iter().map(|f| f.as_fd()).collect();
    let cases: [(&[std::os::fd::BorrowedFd<'_>], &str); 4] = [
        (&[], "expected 3 file descriptors, got 0"),
        (&[file.as_fd(), g1.as_fd()], "expected 3 file descriptors, got 2"),
        (&[file.as_fd(), g1.as_fd(), g2.as_fd(), g3.as_fd()], "expected 3 file descriptors, got 4"),
        (&many, "expected 3 file descriptors, got 40"),
    ];
    for (fds, why) in cases {
        let (sock, answer) = hello_with(&addr, fds).await;
        assert_eq!(answer.err().as_deref(), Some(why));
        // And the socket is closed after the refusal.
        let mut byte = [0u8; 1];
        sock.readable().await.unwrap();
        assert_eq!(sock.try_read(&mut byte).unwrap(), 0);
    }
    canary.finish("hellos with the wrong number of file descriptors").await;
    server.shutdown().await;
}
