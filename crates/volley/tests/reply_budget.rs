//! Replies that peers do not read are counted in the server's budget: peers that flood
//! requests and read nothing hold, together, no more than the budget of the server's memory
//! (plus a small allowance per connection), however many they are; a canary on another
//! connection is served all along; and a peer that catches up gives its share back while its
//! connection stays open.
//!
//! The bound is on **live heap bytes** (counted by this binary's global allocator): the
//! replies queued for a peer are heap, while what the kernel buffers is not.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volley::bytes::Bytes;
use volley::proto::PREAMBLE;
use volley::{Client, Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_for;

#[path = "support/live_bytes.rs"]
mod live_bytes;
use live_bytes::live_bytes;

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

/// Payload of each flood request (and so of its reply): one request per read of the server.
const PAYLOAD: usize = 60 << 10;
/// Requests each flooding peer sends: 24 MiB of replies, more than a connection's own bound
/// (16 MiB) lets it queue.
const REQUESTS: usize = 400;

/// One frame holding one echo request, id `id`, with a `PAYLOAD`-byte payload.
fn request_frame(id: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(PAYLOAD + 32);
    body.extend_from_slice(&[0x01, 0]);
    body.extend_from_slice(&id.to_le_bytes());
    body.extend_from_slice(b"\x04echo\x04echo");
    body.extend_from_slice(&(PAYLOAD as u32).to_le_bytes());
    body.resize(body.len() + PAYLOAD, 0xab);
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend(body);
    frame
}

/// GETs `/metrics` and returns the value of the unlabelled sample `name`.
async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let text = tokio::time::timeout(Duration::from_secs(30), async {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8(out).unwrap()
    })
    .await
    .expect("/metrics answered");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// A peer that sends `REQUESTS` echo requests and reads nothing until `catch_up` fires; then it
/// reads every reply and stays connected, idle.
fn flooding_peer(addr: &str, catch_up: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    let addr = addr.trim_start_matches("tcp://").to_string();
    tokio::spawn(async move {
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let writer = tokio::spawn(async move {
            wr.write_all(&PREAMBLE).await.unwrap();
            for id in 1..=REQUESTS as u64 {
                // Blocks while the server reads nothing more of this peer.
                if wr.write_all(&request_frame(id)).await.is_err() {
                    return;
                }
            }
            std::future::pending::<()>().await;
        });
        let mut catch_up = catch_up;
        let _ = catch_up.wait_for(|&go| go).await;
        // Everything the server will send: its preamble and one reply per request.
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        while got < REQUESTS * PAYLOAD {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => panic!("the server closed a peer that was catching up"),
                Ok(n) => got += n,
            }
        }
        // The writer half stays open (pending): the connection stays, idle.
        drop(writer);
    })
}

/// Eight peers flood 60 KiB echo requests and read nothing, against a budget of 8 MiB: each
/// connection alone may queue up to 16 MiB, so without the budget they would hold over
/// 128 MiB of replies. The server's heap grows by no more than the budget and the
/// connections' allowances, the budget's metric shows it held, and a canary on another
/// connection is served all along. When the peers read their replies, the budget comes back
/// whole while their connections stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_peers_do_not_read_are_held_within_the_budget() {
    const BUDGET: usize = 8 << 20;
    const PEERS: usize = 8;
    /// Per connection, beyond the budget: the free allowance (1 MiB), a step of the budget,
    /// a turn's replies, read buffers. Generous.
    const PER_PEER: isize = 3 << 20;
    let server = Server::builder()
        .receive_budget(BUDGET)
        .read_timeout(Some(Duration::from_secs(300)))
        // Parked peers answer no ping: the test must not race the keepalive on a slow machine.
        .keepalive(None)
        .handle_fn(&ECHO, Ok)
        .admin("127.0.0.1:0")
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let admin = server.admin_address().unwrap();
    let canary = Client::connect(&addr).await.unwrap();
    let ping = Bytes::from_static(b"canary");
    assert_eq!(canary.call(&ECHO, ping.clone()).await.unwrap(), ping);
    metric(admin, "volley_server_receive_held_bytes").await;
    let base = live_bytes();

    let (catch_up, go) = tokio::sync::watch::channel(false);
    let peers: Vec<_> = (0..PEERS).map(|_| flooding_peer(&addr, go.clone())).collect();
    let bound = BUDGET as isize + PEERS as isize * PER_PEER;
    let (mut most_heap, mut most_held, mut calls) = (0isize, 0f64, 0);
    wait_for(Duration::from_secs(120), "the peers' replies to fill the budget", async || {
        let held = metric(admin, "volley_server_receive_held_bytes").await;
        let heap = live_bytes() - base;
        assert!(held <= BUDGET as f64, "{held} bytes held with a budget of {BUDGET}");
        assert!(
            heap <= bound,
            "the heap grew by {heap} bytes beside {PEERS} peers that read nothing (bound {bound})"
        );
        (most_heap, most_held) = (most_heap.max(heap), most_held.max(held));
        assert_eq!(canary.call(&ECHO, ping.clone()).await.unwrap(), ping, "the canary is served");
        calls += 1;
        most_held >= (BUDGET / 2) as f64 && calls >= 20
    })
    .await;
    // Parked now: a while longer, still within the bounds.
    for _ in 0..20 {
        let heap = live_bytes() - base;
        assert!(heap <= bound, "the heap grew by {heap} bytes (bound {bound})");
        most_heap = most_heap.max(heap);
        assert_eq!(canary.call(&ECHO, ping.clone()).await.unwrap(), ping);
    }
    eprintln!(
        "{PEERS} peers reading nothing: at most {most_heap} bytes of heap, {most_held} of the budget held"
    );
    assert_eq!(server.connections().served, PEERS + 1, "the flooding peers are kept, parked");

    // They catch up: the budget comes back whole, their connections open and idle.
    catch_up.send_replace(true);
    for p in peers {
        tokio::time::timeout(Duration::from_secs(120), p).await.expect("each peer read its replies").unwrap();
    }
    wait_for(Duration::from_secs(60), "the budget given back", async || {
        metric(admin, "volley_server_receive_held_bytes").await == 0.0
    })
    .await;
    assert_eq!(server.connections().served, PEERS + 1, "the peers stay connected");
    assert_eq!(canary.call(&ECHO, ping.clone()).await.unwrap(), ping);
    server.shutdown().await;
}
