//! A real server on `shm://` against a hand-driven peer that misbehaves: garbage in the ring,
//! a corrupt write position, a peer that never reads. Each ends or stalls only its own
//! connection; a well-behaved client beside it is served throughout.

use std::io;
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
